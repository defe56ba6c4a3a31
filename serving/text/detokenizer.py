"""Token ids -> text, incrementally, and token ids -> raw bytes.

`IncrementalDetokenizer` turns a growing list of output ids into text while decoding only a short
window of recent tokens per step (after vLLM's `detokenize_incrementally`, with a prefix offset and a
read offset): each step decodes ids[prefix_offset:read_offset] and ids[prefix_offset:]; the second
minus the first is the new text. Decoding a window, rather than the whole output, costs O(window) per
step instead of O(output length). A window whose text ends in U+FFFD (the first bytes of a multi-byte
character, e.g. half of an emoji) commits nothing; the next token completes it. `text` therefore holds
only complete characters, and is always a prefix of `tokenizer.decode(ids)`; the full decode of a
finished sequence is that prefix plus `pending_text(ids)`.

`TokenBytes` gives a token's own bytes, which can be part of a character (OpenAI logprobs `bytes`).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

_REPLACEMENT = "\ufffd"
_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@dataclass
class IncrementalDetokenizer:
    """Committed text of one sequence's output and the window offsets (indices into the output ids).

    Attributes:
        tokenizer: a `serving.text.tokenizer.Tokenizer` (anything with `decode(ids, skip_special_tokens)`).
        skip_special_tokens: passed to every decode.
        text: the output decoded so far, complete characters only.
        prefix_offset: first id of the window; its text is context, already in `text`.
        read_offset: ids before this are in `text`.
    """

    tokenizer: object
    skip_special_tokens: bool = True
    text: str = ""
    prefix_offset: int = 0
    read_offset: int = 0

    def step(self, token_ids: list[int]) -> str:
        """Account for the ids appended since the last call; return the newly committed text ("" if none)."""
        prefix_text, new_text = self._window(token_ids)
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT):
            return ""  # no new text yet, or a multi-byte character still incomplete
        delta = new_text[len(prefix_text):]
        self.prefix_offset, self.read_offset = self.read_offset, len(token_ids)
        self.text += delta
        return delta

    def pending_text(self, token_ids: list[int]) -> str:
        """The text of ids not yet committed, U+FFFD for partial characters included (for a finished sequence).

        `token_ids` must hold at least `read_offset` ids (the committed ones, then any others).
        """
        prefix_text, new_text = self._window(token_ids)
        return new_text[len(prefix_text):]

    def _window(self, token_ids: list[int]) -> tuple[str, str]:
        decode, skip = self.tokenizer.decode, self.skip_special_tokens
        prefix_text = decode(token_ids[self.prefix_offset:self.read_offset], skip_special_tokens=skip)
        return prefix_text, decode(token_ids[self.prefix_offset:], skip_special_tokens=skip)


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2 byte-level BPE: the printable character standing for each byte -> that byte (Radford et al. 2019).

    Printable Latin-1 bytes stand for themselves; the other 68 bytes map, in order, to chr(256 + i).
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


class TokenBytes:
    """The raw bytes a token contributes to the decoded text (possibly part of a UTF-8 character).

    Byte-level BPE (GPT-2, SmolLM2, Llama 3): the token string mapped back through the GPT-2 byte
    table. SentencePiece-style vocabularies (Gemma): "▁" is a space and "<0xNN>" byte-fallback tokens
    are one byte. Added/special tokens are their content in UTF-8.

        raw = TokenBytes(tokenizer)(token_id)
    """

    def __init__(self, tokenizer):
        self.backend = tokenizer.backend
        self.added = {i: t.content for i, t in self.backend.get_added_tokens_decoder().items()}
        decoder = self.backend.decoder
        self.is_byte_level = decoder is not None and "ByteLevel" in type(decoder).__name__

    def __call__(self, token_id: int) -> bytes:
        if token_id in self.added:
            return self.added[token_id].encode()
        piece = self.backend.id_to_token(token_id) or ""
        if self.is_byte_level:
            table = _byte_decoder()
            if all(c in table for c in piece):
                return bytes(table[c] for c in piece)
            return piece.encode()
        match = _BYTE_FALLBACK.match(piece)
        if match:
            return bytes([int(match.group(1), 16)])
        return piece.replace("▁", " ").encode()


def token_text(raw: bytes) -> str:
    """The best text for a token's bytes: the UTF-8 text, or `\\xNN` escapes for a partial character."""
    return raw.decode("utf-8", errors="backslashreplace")
