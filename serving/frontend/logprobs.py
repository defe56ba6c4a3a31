"""OpenAI `logprobs` objects of chat and completions responses, from the engine's per-token entries.

A token can be part of a UTF-8 character (byte-level BPE splits an emoji over several tokens), so each
chat entry carries the token's raw `bytes` (`serving.text.detokenizer.TokenBytes`) and, as `token`, its text
when the bytes are whole characters or `\\xNN` escapes otherwise. Completions `text_offset` are
character offsets into the returned text: token i starts at the length of the text of tokens [0, i)
(complete characters only, from `IncrementalDetokenizer`), so a token continuing a character points at
that character.
"""

from __future__ import annotations

from serving.text.detokenizer import IncrementalDetokenizer, TokenBytes, token_text


def _entry(to_bytes: TokenBytes, token_id: int, logprob: float) -> dict:
    raw = to_bytes(token_id)
    return {"token": token_text(raw), "logprob": logprob, "bytes": list(raw)}


def chat_logprobs(token_ids: list[int], entries: list[dict], tokenizer, top_k: int) -> dict:
    """Chat `choices[].logprobs`: for each generated token its logprob and the `top_k` most likely tokens.

    Args:
        token_ids: the generated ids.
        entries: per token, {token id: Logprob} holding the chosen token and the top-k (engine output).
        tokenizer: a `serving.text.tokenizer.Tokenizer`.
        top_k: alternatives per token (`top_logprobs`).
    """
    to_bytes = TokenBytes(tokenizer)
    content = []
    for token_id, entry in zip(token_ids, entries):
        top = sorted((lp.rank, tid, lp.logprob) for tid, lp in entry.items() if lp.rank is not None and lp.rank <= top_k)
        item = _entry(to_bytes, token_id, entry[token_id].logprob)
        item["top_logprobs"] = [_entry(to_bytes, tid, lp) for _, tid, lp in top]
        content.append(item)
    return {"content": content}


class TextOffsets:
    """Character offsets where each token's text starts in `start` + the text of the tokens seen so far.

        offsets = TextOffsets(tokenizer, True, len(prompt_text)).extend(token_ids)

    `extend` takes the whole (growing) list of a sequence's ids and returns the offsets of the ids it
    had not seen, so a stream pays O(1) per token.
    """

    def __init__(self, tokenizer, skip_special_tokens: bool = True, start: int = 0):
        self.detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens)
        self.start, self.num_seen = start, 0

    def extend(self, token_ids: list[int]) -> list[int]:
        offsets = []
        for i in range(self.num_seen, len(token_ids)):
            offsets.append(self.start + len(self.detokenizer.text))
            self.detokenizer.step(token_ids[:i + 1])
        self.num_seen = len(token_ids)
        return offsets


def completion_logprobs(token_ids: list[int], entries: list[dict], tokenizer, k: int, offsets: list[int]) -> dict:
    """Completions `choices[].logprobs`: tokens, their logprobs, the top `k` of each, and `text_offset`.

    Args:
        offsets: `TextOffsets` of these tokens (character offsets into the response text).
    """
    to_bytes = TokenBytes(tokenizer)
    tokens, token_logprobs, top = [], [], []
    for tid, entry in zip(token_ids, entries):
        tokens.append(token_text(to_bytes(tid)))
        token_logprobs.append(entry[tid].logprob)
        top.append({token_text(to_bytes(t)): lp.logprob for t, lp in entry.items() if lp.rank and lp.rank <= k})
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": list(offsets)}
