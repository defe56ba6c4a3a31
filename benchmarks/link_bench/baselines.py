"""The serving benchmark's baselines run once each in a spawned worker that times itself: `transformers`
(static batches through `generate`) and our own engine measured the way llama.cpp is (`link-engine`:
in-process, one request at a time, no HTTP). llama.cpp itself runs in a worker that stays up between
phases: benchmarks/link_bench/llama_session.py.

    levels = in_worker(transformers_worker, gguf_path, "float32", warmup_ids, slices, [1, 4], 64)
    levels = in_worker(engine_worker, "smollm2-135m-instruct", "float32", warmup_ids, prompts, 64)
Each returns one (records, wall seconds, peak RSS MiB) tuple per concurrency level.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Sequence

from benchmarks.link_bench.processes import self_peak_rss_mb
from benchmarks.link_bench.timing import TimedRequest, record_from_times


def transformers_worker(path: str, dtype: str, warmup: list[int], slices: list[list[list[int]]],
                        concurrencies: Sequence[int], max_tokens: int) -> list[tuple]:
    """`AutoModelForCausalLM` on the GGUF at `path`; at concurrency c, static left-padded batches of c prompts."""
    os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF dequantization progress bar
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, StoppingCriteria, StoppingCriteriaList
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    gguf = Path(path)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=getattr(torch, dtype)).eval()
    model.generation_config.eos_token_id = None  # with eos_token_id=None below: exactly max_new_tokens tokens

    class StepClock(StoppingCriteria):
        """Called after every generated token (the first one included): records when it came out."""

        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, input_ids, scores, **kwargs):
            self.times.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    def generate(batch: list[list[int]], num_tokens: int) -> list[TimedRequest]:
        width = max(len(p) for p in batch)  # left padding: every prompt ends where generation starts
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        clock = StepClock()
        config = GenerationConfig(max_new_tokens=num_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, generation_config=config, stopping_criteria=StoppingCriteriaList([clock]))
        return [record_from_times(len(p), out.shape[1] - width, start, clock.times[0], clock.times[-1]) for p in batch]

    generate([warmup], min(4, max_tokens))
    levels = []
    for prompts, concurrency in zip(slices, concurrencies):
        start, records = time.perf_counter(), []
        for i in range(0, len(prompts), concurrency):
            records += generate(prompts[i : i + concurrency], max_tokens)
        levels.append((records, time.perf_counter() - start, self_peak_rss_mb()))
    return levels


def engine_worker(model: str, dtype: str, warmup: list[int], prompts: list[list[int]], max_tokens: int) -> list[tuple]:
    """Our `LLMEngine` in this process, greedy, one request at a time (a single level), timed as
    `LlamaCppSession` times llama.cpp: each token when the step that made it returns. The engine installs
    the stored kernel winners of `model` (`LINK_COMPILE_DB`), as `link engine serve` does."""
    from serving.engine.llm_engine import EngineConfig, LLMEngine
    from serving.model_loader import load_model
    from serving.registry import default_registry
    from serving.sampling.params import SamplingParams

    engine = LLMEngine(load_model(default_registry().get(model), dtype), EngineConfig(tuned_kernels=True))

    def run(ids: list[int], num_tokens: int) -> TimedRequest:
        request_id = f"bench-{time.monotonic_ns()}"
        start, times = time.perf_counter(), []
        engine.add_request(request_id, ids, SamplingParams(temperature=0, max_tokens=num_tokens, ignore_eos=True))
        while engine.has_unfinished_requests:
            for output in engine.step():
                now = time.perf_counter()
                times.extend([now] * (len(output.outputs[0].token_ids) - len(times)))
        return record_from_times(len(ids), len(times), start, times[0], times[-1])

    run(warmup, min(4, max_tokens))
    start = time.perf_counter()
    records = [run(p, max_tokens) for p in prompts]
    return [(records, time.perf_counter() - start, self_peak_rss_mb())]
