"""Prompt-lookup drafting: continue an earlier occurrence of the sequence's last n tokens.

Saxena 2023, "Prompt lookup decoding" (github.com/apoorvumang/prompt-lookup-decoding); the n-gram
proposer of vLLM does the same. For n from `ngram_max` down to `ngram_min`, find the most recent earlier
occurrence of the last n tokens in prompt + output and propose the (up to) k tokens that followed it.
Free when there is no match: no model runs. It pays off on outputs that quote their input (code
edits, summaries with citations, structured extraction) and on self-repeating text.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def propose_ngram(token_ids: Sequence[int], k: int, ngram_max: int, ngram_min: int = 1) -> list[int]:
    """Up to k draft tokens following the most recent earlier match of the longest suffix n-gram.

    Args:
        token_ids: the sequence so far (prompt then output).
        k: most tokens to propose, >= 0.
        ngram_max, ngram_min: suffix lengths tried, longest first (1 <= ngram_min <= ngram_max).

    Returns:
        token_ids[j + n : j + n + k] for the largest matching n and the largest start j < len - n with
        token_ids[j : j + n] == token_ids[-n:]; [] when no n matches or k == 0. Shorter than k when the
        match is near the end.
    """
    num_tokens = len(token_ids)
    if k <= 0 or num_tokens < 2:
        return []
    arr = np.asarray(token_ids, dtype=np.int64)
    for n in range(min(ngram_max, num_tokens - 1), ngram_min - 1, -1):
        # Windows start at j in [0, num_tokens - 1 - n]: each has a next token, and the suffix itself is excluded.
        windows = sliding_window_view(arr[: num_tokens - 1], n)
        hits = np.flatnonzero((windows == arr[num_tokens - n :]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return arr[start : start + k].tolist()
    return []
