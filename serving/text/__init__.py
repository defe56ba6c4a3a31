"""Text in and out of token ids: the tokenizer, the incremental detokenizer that streams valid UTF-8,
and the chat formats that turn a conversation into a prompt.
"""
