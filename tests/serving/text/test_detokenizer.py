"""Incremental detokenization on SmolLM2's real outputs: the same text as a full decode, a bounded window
per step, and stop strings made of multi-token characters (an emoji is 4 UTF-8 bytes over 2-3 tokens)."""

from __future__ import annotations

import itertools

import pytest

from serving.sampling.params import SamplingParams
from serving.text.detokenizer import IncrementalDetokenizer, TokenBytes

pytestmark = pytest.mark.slow  # loads a real model (tests/test_markers.py)

EMOJI_CHAT = [{"role": "user", "content": "Reply with five party emojis like 🎉🥳🎂 and the Chinese word 你好."}]


class CountingTokenizer:
    """A tokenizer that records how many ids each decode call received."""

    def __init__(self, tokenizer):
        self.tokenizer, self.sizes = tokenizer, []

    def decode(self, ids, skip_special_tokens=True):
        self.sizes.append(len(ids))
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


@pytest.fixture(scope="module")
def emoji_output(smollm2):
    out = smollm2.chat(EMOJI_CHAT, SamplingParams(temperature=0, max_tokens=40))
    return (out[0] if isinstance(out, list) else out).outputs[0]


def _multi_token_chars(tokenizer, token_ids) -> list[str]:
    """Characters whose UTF-8 bytes span two or more tokens, found from the tokens' bytes alone."""
    raws = [TokenBytes(tokenizer)(t) for t in token_ids]
    boundaries = set(itertools.accumulate(len(r) for r in raws))
    chars, start = [], 0
    for char in b"".join(raws).decode("utf-8", errors="ignore"):  # these outputs hold valid UTF-8
        end = start + len(char.encode())
        if any(start < b < end for b in boundaries):
            chars.append(char)
        start = end
    return chars


def test_incremental_text_is_the_full_decode_with_a_bounded_window(smollm2, emoji_output, real_prompts):
    tokenizer = smollm2.tokenizer
    sequences = [emoji_output.token_ids] + [tokenizer.encode(p, add_special_tokens=False) for p in real_prompts]
    sequences.append(tokenizer.encode("Chinese 你好世界, emoji 🎉🥳🎂👩‍👩‍👧, accents éàü, math ∑∫√."))
    assert any(_multi_token_chars(tokenizer, ids) for ids in sequences), "no multi-byte character split over tokens"
    for ids in sequences:
        counting = CountingTokenizer(tokenizer)
        detok = IncrementalDetokenizer(counting)
        for i in range(1, len(ids) + 1):
            detok.step(ids[:i])
            full, pending = tokenizer.decode(ids[:i]), detok.pending_text(ids[:i])
            assert detok.text + pending == full
            assert pending == "" or pending.endswith("\ufffd")  # only a partial character waits
        assert max(counting.sizes) <= 6, counting.sizes  # a window, never the whole output


def test_engine_text_equals_a_full_decode(smollm2, emoji_output):
    assert emoji_output.finish_reason in ("stop", "length")
    assert any(ord(c) > 0xFFFF for c in emoji_output.text), emoji_output.text  # an emoji came out
    assert emoji_output.text == smollm2.tokenizer.decode(emoji_output.token_ids)


def test_emoji_stop_string_spanning_several_tokens_matches(smollm2, emoji_output):
    split = [c for c in _multi_token_chars(smollm2.tokenizer, emoji_output.token_ids) if ord(c) > 0xFFFF]
    assert split, f"no emoji split over tokens in {emoji_output.text!r}"
    stop = split[0]
    out = smollm2.chat(EMOJI_CHAT, SamplingParams(temperature=0, max_tokens=40, stop=[stop]))
    stopped = (out[0] if isinstance(out, list) else out).outputs[0]
    assert (stopped.finish_reason, stopped.stop_reason) == ("stop", stop)
    assert stopped.text == emoji_output.text[:emoji_output.text.index(stop)]
