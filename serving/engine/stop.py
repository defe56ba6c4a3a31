"""Deciding when a sequence is finished: EOS, stop token ids, stop strings, length.

Stop strings are matched on the detokenized text, so a stop string split across two or more tokens is
caught (the text of all output tokens is searched, starting a stop string's length before the newly
added characters). The text holds complete characters only (`serving.text.detokenizer`), so a stop string
ending in a multi-byte character (an emoji spread over several tokens) matches once its last byte
arrives. The matched string, and the text of a stop token (EOS or `stop_token_ids`), is cut from the
text (vLLM's `include_stop_str_in_output` keeps it). Before `min_tokens` output tokens nothing but the
length stops a sequence (vLLM's `StopChecker`).
"""

from __future__ import annotations

from dataclasses import dataclass

from serving.sampling.params import SamplingParams


@dataclass
class StopResult:
    """Why a sequence stopped.

    Attributes:
        finish_reason: "stop" or "length".
        stop_reason: the stop string or stop token id that matched; None for EOS or length.
        text: the final text for a stop string; None otherwise: the text of the kept tokens (every
            output token, less the stop token unless `include_stop_str_in_output`).
        keeps_last_token_text: whether the last token's text belongs to the final text.
    """

    finish_reason: str
    stop_reason: int | str | None
    text: str | None = None
    keeps_last_token_text: bool = True


def check_stop(
    params: SamplingParams,
    token_id: int,
    num_output_tokens: int,
    text: str,
    previous_text_len: int,
    eos_token_ids: tuple[int, ...],
) -> StopResult | None:
    """Whether the sequence stops after appending `token_id` (its text is now `text`).

    Args:
        params: the request's sampling parameters.
        token_id: the token just generated.
        num_output_tokens: output tokens so far, including `token_id`.
        text: the detokenized output so far (complete characters only).
        previous_text_len: len(text) before `token_id` was added.
        eos_token_ids: the model's end-of-sequence and end-of-turn ids.
    Returns:
        None to continue, else a `StopResult`.
    """
    # Like vLLM (v1 `IncrementalDetokenizer.update`), a stop token's own text (EOS rendered with
    # skip_special_tokens=False, or a non-special stop_token_ids entry) is left out of the text
    # unless include_stop_str_in_output; its id stays in the token ids.
    if num_output_tokens >= params.min_tokens:
        keep = params.include_stop_str_in_output
        if not params.ignore_eos and token_id in eos_token_ids:
            return StopResult("stop", None, keeps_last_token_text=keep)
        if token_id in params.stop_token_ids:
            return StopResult("stop", token_id, keeps_last_token_text=keep)
        for stop in params.stop:
            start = max(0, previous_text_len - len(stop) + 1)
            pos = text.find(stop, start)
            if pos >= 0:
                end = pos + len(stop) if params.include_stop_str_in_output else pos
                return StopResult("stop", stop, text[:end])
    if params.max_tokens is not None and num_output_tokens >= params.max_tokens:
        return StopResult("length", None)
    return None
