"""Deciding when a sequence is finished: EOS, stop token ids, stop strings, length.

Stop strings are matched on the detokenized text, so a stop string split across two or more tokens is
caught (the text of all output tokens is searched, starting a stop string's length before the newly
added characters). The text holds complete characters only (`serving.text.detokenizer`), so a stop string
ending in a multi-byte character (an emoji spread over several tokens) matches once its last byte
arrives. The matched string, and the text of a stop token (EOS or `stop_token_ids`), is cut from the
text (vLLM's `include_stop_str_in_output` keeps it). Before `min_tokens` output tokens nothing but the
length stops a sequence (vLLM's `StopChecker`).

After a tool result (`SamplingParams.echo_markers`), a small model often first repeats the result block it has
just read, then would end its turn: blocks before any answer text are an echo (`answer_start` skips them; the
harness cuts them from the answer), EOS is refused while nothing else was written (`refuses_eos`, applied where
the engine chooses a token), and the opening marker after answer text stops the output.
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
        if params.echo_markers:
            opener = params.echo_markers[0]
            begin = answer_start(text, params.echo_markers)
            pos = -1 if begin is None else text.find(opener, max(begin, previous_text_len - len(opener) + 1))
            if pos >= 0:  # a result block opened after answer text: the echo comes after the answer
                return StopResult("stop", opener, text[:pos + len(opener) if params.include_stop_str_in_output else pos])
    if params.max_tokens is not None and num_output_tokens >= params.max_tokens:
        return StopResult("length", None)
    return None


def answer_start(text: str, markers: tuple[str, ...]) -> int | None:
    """Where the answer begins in `text`: past the result blocks (`markers`: opening, closing), stray closing
    markers and whitespace it opens with; None while `text` is inside a leading block or could still be opening
    one. A leading block without a closing marker (`markers[1]` empty) runs to the end of the text."""
    opener, closer = markers
    pos = 0
    while True:
        start = len(text) - len(text[pos:].lstrip())
        rest = text[start:]
        if rest.startswith(opener):
            end = text.find(closer, start + len(opener)) if closer else -1
            if end < 0:
                return None
            pos = end + len(closer)
        elif closer and rest.startswith(closer):  # a stray closing marker is part of the echo too
            pos = start + len(closer)
        elif rest and (opener.startswith(rest) or closer.startswith(rest)):
            return None
        else:
            return start


def refuses_eos(params: SamplingParams, text: str) -> bool:
    """Whether EOS may not end an output that is `text` so far: after a tool result (`params.echo_markers`),
    while the output holds a result block and no answer text (see the module docstring), unless it holds a stray
    closing marker (a model that cannot answer here and repeats the marker would do so to its token limit)."""
    opener, closer = params.echo_markers or ("", "")
    if not opener or params.ignore_eos or not text.lstrip().startswith(opener):
        return False
    if closer and text.count(closer) > text.count(opener):
        return False  # refused once, it closed the block again instead of answering: a loop of markers, let it end
    begin = answer_start(text, params.echo_markers)
    return begin is None or not text[begin:].strip()
