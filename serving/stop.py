"""Deciding when a sequence is finished: EOS, stop token ids, stop strings, length.

Stop strings are matched on the detokenized text, so a stop string split across two or more tokens is
caught (the text of all output tokens is searched, starting a stop string's length before the newly
added characters). The matched string, and the text of a stop token (EOS or `stop_token_ids`), is
cut from the text (vLLM's `include_stop_str_in_output` keeps it).
"""

from __future__ import annotations

from dataclasses import dataclass

from serving.sampling_params import SamplingParams


@dataclass
class StopResult:
    finish_reason: str
    stop_reason: int | str | None
    text: str


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
        text: the detokenized output so far.
        previous_text_len: len(text) before `token_id` was added.
        eos_token_ids: the model's end-of-sequence and end-of-turn ids.
    Returns:
        None to continue, else the finish reason, stop reason and the final text.
    """
    # Like vLLM (v1 `IncrementalDetokenizer.update`), a stop token's own text (EOS rendered with
    # skip_special_tokens=False, or a non-special stop_token_ids entry) is left out of the text
    # unless include_stop_str_in_output; its id stays in the token ids.
    stop_token_text = text if params.include_stop_str_in_output else text[:previous_text_len]
    if not params.ignore_eos and token_id in eos_token_ids:
        return StopResult("stop", None, stop_token_text)
    if token_id in params.stop_token_ids:
        return StopResult("stop", token_id, stop_token_text)
    for stop in params.stop:
        start = max(0, previous_text_len - len(stop) + 1)
        pos = text.find(stop, start)
        if pos >= 0:
            end = pos + len(stop) if params.include_stop_str_in_output else pos
            return StopResult("stop", stop, text[:end])
    if params.max_tokens is not None and num_output_tokens >= params.max_tokens:
        return StopResult("length", None, text)
    return None
