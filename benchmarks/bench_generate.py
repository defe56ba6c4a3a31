"""Load time and greedy decode speed of `serving` against Hugging Face `transformers` on the same GGUF.

For each model and dtype, both systems load the same GGUF file and greedily continue the same prompt
token ids (encoded by our tokenizer) at batch 1:

- load time (s): ours is the construction of `LLM(model, dtype=...)` (checkpoint, model and
  tokenizer); Hugging Face's is `AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., dtype=...)`
  (the model only; it dequantizes on load). Before either is timed, the file is assembled if needed,
  read once into the page cache, and our tokenizer conversion cache is filled, so both times are
  steady-state loads.
- decode speed (tokens/s): after one warm-up generation, t1 is the time of a 1-token generation
  (prefill + first token) and tN+1 that of an (N+1)-token generation; decode speed is
  N / (tN+1 - t1), so prefill cancels out. Each t is the fastest of `--repeats` runs.
- the ratios ours/HF: above 1 means our load is slower, or our decode is faster.
- matching tokens: how many of the N+1 greedy tokens agree before the two systems first differ (a
  check that both did the same work; bfloat16 rounding may make them diverge).
- spread: (slowest - fastest) / fastest of the (N+1)-token runs, the worse of the two systems; a
  large spread means other processes shared the CPU during that row.

Run from the repository root (about 8 minutes for the default grid on an otherwise idle 2-core CPU):

    python benchmarks/bench_generate.py [--models ...] [--dtypes ...] [--num-tokens 64] [--json out.json]

`LINK_HOME` (default ~/.link) holds the assembled Gemma file and converted tokenizers.
`torch.set_num_threads` is left at PyTorch's default.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script from a checkout, without installing the package

from benchmarks.link_bench import show_and_save, time_call  # noqa: E402
from serving import LLM, SamplingParams, default_registry  # noqa: E402
from serving.loader.gguf_loader import open_gguf  # noqa: E402
from serving.text.tokenizer import Tokenizer  # noqa: E402

MODELS = ("smollm2-135m-instruct", "gemma-3-270m")
DTYPES = ("float32", "bfloat16")
NUM_TOKENS = 64
NUM_REPEATS = 3
PROMPT = "The capital of France is"

console = Console(stderr=True)


@dataclass(frozen=True)
class DecodeTiming:
    """Batch-1 greedy generation timings of one system.

    Attributes:
        ttft_seconds: fastest 1-token generation t1 (prefill + first token).
        tokens_per_second: num_tokens / (t(num_tokens + 1) - t1), each t the fastest of the repeats.
        spread: (slowest - fastest) / fastest of the (num_tokens + 1)-token runs.
        token_ids: the num_tokens + 1 generated ids.
    """

    ttft_seconds: float
    tokens_per_second: float
    spread: float
    token_ids: list[int]


def time_decode(generate: Callable[[int], list[int]], num_tokens: int, num_repeats: int) -> DecodeTiming:
    """Time `generate(n) -> n new token ids` as described in the module docstring.

    The fastest of `num_repeats` runs is kept for each length: on a shared CPU other processes only
    ever add time, so the minimum is the least noisy estimate.
    """
    token_ids = generate(num_tokens + 1)  # warm-up: first-call allocations and lazy initialisation
    if len(token_ids) != num_tokens + 1:
        raise RuntimeError(f"asked for {num_tokens + 1} tokens, got {len(token_ids)}")
    t1s, t_fulls = [], []
    for _ in range(num_repeats):
        t1s.append(time_call(generate, 1))
        t_fulls.append(time_call(generate, num_tokens + 1))
    t1 = min(t1s)
    t_full = min(t_fulls)
    return DecodeTiming(t1, num_tokens / (t_full - t1), max(t_fulls) / t_full - 1, token_ids)


def prepare(model: str) -> Path:
    """Fill the caches a first load would otherwise pay for; return the model's GGUF path."""
    path = default_registry().get(model).resolve_path()  # assembles gemma-3-270m once
    Tokenizer.from_gguf(path, open_gguf(path).metadata)  # converts the vocabulary once
    with open(path, "rb") as f:  # page cache: neither system pays for a cold read
        while f.read(1 << 24):
            pass
    return path


def bench_ours(model: str, dtype: str, prompt: str, num_tokens: int, num_repeats: int) -> tuple[float, list[int], DecodeTiming]:
    """Returns (load seconds, prompt token ids, decode timing)."""
    start = time.perf_counter()
    llm = LLM(model, dtype=dtype)
    load_seconds = time.perf_counter() - start
    prompt_ids = llm.tokenizer.encode(prompt)

    def generate(n: int) -> list[int]:
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        return llm.generate({"prompt_token_ids": prompt_ids}, params)[0].outputs[0].token_ids

    timing = time_decode(generate, num_tokens, num_repeats)
    del llm
    gc.collect()
    return load_seconds, prompt_ids, timing


def bench_hf(path: Path, dtype: str, prompt_ids: list[int], num_tokens: int, num_repeats: int) -> tuple[float, DecodeTiming]:
    """Returns (load seconds, decode timing) of `transformers` on the GGUF file at `path`."""
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=getattr(torch, dtype))
    load_seconds = time.perf_counter() - start
    model.eval()
    # No EOS at all: a None in the per-call config is filled from the model's defaults in transformers 5.
    model.generation_config.eos_token_id = None
    input_ids = torch.tensor([prompt_ids])

    def generate(n: int) -> list[int]:
        # eos_token_id=None: exactly n tokens, EOS included, as ignore_eos does for ours. Not
        # min_new_tokens=n: it bans EOS until the n-th token, so greedy decoding would differ from ours.
        config = GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
        with torch.inference_mode():
            out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config)
        return out[0, len(prompt_ids):].tolist()

    timing = time_decode(generate, num_tokens, num_repeats)
    del model
    gc.collect()
    return load_seconds, timing


def _num_matching(a: list[int], b: list[int]) -> int:
    count = 0
    for x, y in zip(a, b):
        if x != y:
            break
        count += 1
    return count


def bench_one(model: str, dtype: str, prompt: str, num_tokens: int, num_repeats: int) -> dict:
    """One row of the report: both systems on (model, dtype)."""
    path = prepare(model)
    console.log(f"{model} {dtype}: serving")
    ours_load, prompt_ids, ours = bench_ours(model, dtype, prompt, num_tokens, num_repeats)
    console.log(f"{model} {dtype}: transformers")
    hf_load, hf = bench_hf(path, dtype, prompt_ids, num_tokens, num_repeats)
    return {
        "model": model, "dtype": dtype, "num_prompt_tokens": len(prompt_ids), "num_tokens": num_tokens,
        "ours_load_seconds": ours_load, "hf_load_seconds": hf_load, "load_ratio": ours_load / hf_load,
        "ours_ttft_seconds": ours.ttft_seconds, "hf_ttft_seconds": hf.ttft_seconds,
        "ours_tokens_per_second": ours.tokens_per_second, "hf_tokens_per_second": hf.tokens_per_second,
        "decode_ratio": ours.tokens_per_second / hf.tokens_per_second,
        "num_matching_tokens": _num_matching(ours.token_ids, hf.token_ids),
        "spread": max(ours.spread, hf.spread),
    }


def run_benchmark(
    models: Sequence[str] = MODELS,
    dtypes: Sequence[str] = DTYPES,
    num_tokens: int = NUM_TOKENS,
    prompt: str = PROMPT,
    num_repeats: int = NUM_REPEATS,
) -> list[dict]:
    """Benchmark every (model, dtype); see the module docstring for what each field measures.

    A configuration that raises is reported as {"model", "dtype", "error"} (traceback on stderr) and
    the others still run.
    """
    rows = []
    for model in models:
        for dtype in dtypes:
            try:
                rows.append(bench_one(model, dtype, prompt, num_tokens, num_repeats))
            except Exception as exc:
                console.print(traceback.format_exc(), markup=False, highlight=False)
                rows.append({"model": model, "dtype": dtype, "error": f"{type(exc).__name__}: {exc}"})
            gc.collect()
    return rows


def render_table(rows: list[dict]) -> Table:
    num_tokens = next((r["num_tokens"] for r in rows if "error" not in r), NUM_TOKENS)
    table = Table(title=f"Greedy generation, batch 1, {num_tokens} new tokens (torch threads: {torch.get_num_threads()})")
    for header in ("model", "dtype", "load s ours", "load s HF", "load ours/HF",
                   "tok/s ours", "tok/s HF", "tok/s ours/HF", "TTFT ms ours", "TTFT ms HF", "same tokens", "spread"):
        table.add_column(header, justify="left" if header in ("model", "dtype") else "right")
    for r in rows:
        if "error" in r:
            table.add_row(r["model"], r["dtype"], f"[red]{r['error']}[/red]")
            continue
        table.add_row(
            r["model"], r["dtype"],
            f"{r['ours_load_seconds']:.2f}", f"{r['hf_load_seconds']:.2f}", f"{r['load_ratio']:.2f}",
            f"{r['ours_tokens_per_second']:.1f}", f"{r['hf_tokens_per_second']:.1f}", f"{r['decode_ratio']:.2f}",
            f"{r['ours_ttft_seconds'] * 1e3:.0f}", f"{r['hf_ttft_seconds'] * 1e3:.0f}",
            f"{r['num_matching_tokens']}/{r['num_tokens'] + 1}", f"{r['spread']:.0%}",
        )
    return table


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), help="registry names (default: %(default)s)")
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES, help="(default: %(default)s)")
    parser.add_argument("--num-tokens", type=int, default=NUM_TOKENS, help="decode tokens timed (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=NUM_REPEATS, help="timed runs of each length; the fastest is kept")
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    rows = run_benchmark(args.models, args.dtypes, args.num_tokens, args.prompt, args.repeats)
    show_and_save(render_table(rows), rows, args.json)
    return rows


if __name__ == "__main__":
    main()
