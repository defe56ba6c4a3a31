"""The traffic recorder (serving/tuning/traffic.py): its ring buffer, the JSONL round trip, what it records
from a finished request, and the mix fingerprint."""

from __future__ import annotations

import pytest

from serving.engine.outputs import CompletionOutput, RequestOutput
from serving.sampling.params import SamplingParams
from serving.tuning.traffic import (RequestShape, TrafficRecorder, burst_sizes, load_mix, mix_fingerprint, mix_signature,
                             save_mix, traffic_path)


def test_ring_buffer_keeps_the_last_requests_with_relative_arrivals():
    recorder = TrafficRecorder(capacity=3)
    for i in range(5):
        recorder.record(10 + i, 4, 100.0 + 0.5 * i, "greedy" if i % 2 == 0 else "sampled")
    assert len(recorder) == 3 and recorder.num_recorded == 5
    # requests 2, 3, 4 remain; arrivals relative to request 2's (101.0)
    assert recorder.shapes() == [RequestShape(12, 4, 0.0, "greedy"), RequestShape(13, 4, 0.5, "sampled"),
                                 RequestShape(14, 4, 1.0, "greedy")]
    recorder.clear()
    assert recorder.shapes() == []
    with pytest.raises(ValueError):
        TrafficRecorder(capacity=0)


def test_observe_takes_lengths_kind_and_arrival_of_a_finished_request():
    recorder = TrafficRecorder()
    out = RequestOutput("r", None, [1, 2, 3], [CompletionOutput(0, "ab", [7, 8], "length")], True,
                        {"arrival_time": 50.0, "num_output_tokens": 2})
    recorder.observe(out, SamplingParams(temperature=0))
    recorder.observe(RequestOutput("s", None, [1] * 9, [CompletionOutput(0, "x", [7] * 5, "stop")], True,
                                   {"arrival_time": 50.25, "num_output_tokens": 5}), SamplingParams(temperature=0.7))
    recorder.observe(RequestOutput("aborted", None, [1], [CompletionOutput(0, "", [], None)], True, {"arrival_time": 51.0}),
                     SamplingParams())
    assert recorder.shapes() == [RequestShape(3, 2, 0.0, "greedy"), RequestShape(9, 5, 0.25, "sampled")]


def test_jsonl_round_trip_and_errors(tmp_path):
    shapes = [RequestShape(120, 32, 0.0), RequestShape(7, 1, 1.25, "sampled"), RequestShape(300, 64, 0.5)]
    path = save_mix(shapes, tmp_path / "sub" / "mix.jsonl")
    assert load_mix(path) == sorted(shapes, key=lambda s: s.arrival_s)
    (tmp_path / "bad.jsonl").write_text('{"prompt_tokens": 5, "output_tokens": 0}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_mix(tmp_path / "bad.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no requests"):
        load_mix(tmp_path / "empty.jsonl")
    assert traffic_path("smollm2-135m-instruct", tmp_path) == tmp_path / "compile" / "traffic" / "smollm2-135m-instruct.jsonl"


def _bursts(num_bursts: int, size: int, prompt: int, output: int, period_s: float) -> list[RequestShape]:
    return [RequestShape(prompt + (j % 3), output, k * period_s + 0.001 * j) for k in range(num_bursts) for j in range(size)]


def _trickle(n: int, prompt: int, output: int, period_s: float) -> list[RequestShape]:
    return [RequestShape(prompt - (i % 5) * 20, output, i * period_s) for i in range(n)]


def test_burst_sizes_group_close_arrivals():
    shapes = [RequestShape(1, 1, t) for t in (0.0, 0.01, 0.02, 1.0, 2.0, 2.04)]
    assert burst_sizes(shapes) == [3, 3, 3, 1, 2, 2]


def test_fingerprint_matches_the_same_mix_and_separates_different_ones():
    bursts = _bursts(4, 14, 60, 32, 3.0)
    trickle = _trickle(12, 900, 48, 1.5)
    # hand-checked signatures: bursts of 14 (-> 16) with 60-62 token prompts (-> 64), 32 output tokens
    assert mix_signature(bursts) == "p64:1|o32:1|b16:1|s0"
    assert mix_signature(trickle) == "p1024:1|o64:1|b1:1|s0"
    assert mix_fingerprint(bursts) != mix_fingerprint(trickle)
    # the same traffic again (other burst times, shuffled order) has the same fingerprint
    again = list(reversed(_bursts(5, 14, 60, 32, 2.0)))
    assert mix_fingerprint(again) == mix_fingerprint(bursts)
    # the same lengths arriving one at a time are a different mix
    assert mix_fingerprint(_bursts(56, 1, 60, 32, 1.0)) != mix_fingerprint(bursts)
    with pytest.raises(ValueError):
        mix_fingerprint([])
