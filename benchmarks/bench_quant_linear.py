"""Weight-only int8/int4 linears (`kernels/quant_cpu.py`) against float32 F.linear: speed and accuracy.

Three sections, each row carrying the 1-minute load average (`os.getloadavg`) when it was measured:

- kernels: median time (ms) of F.linear (fp32), int8 and int4 over `--repeats` calls for SmolLM2-135M's
  shapes (qkv 576->960, o 576->576, gate_up 576->3072, down 1536->576, lm_head 576->49152) at batch 1 and
  16; weights are random (time does not depend on the values) and packed before timing.
- accuracy: on SmolLM2-135M-Instruct's real weights (layers 0, 15, 29 and the tied lm_head) with
  activations x ~ N(0, 1) [16, K] (seed 0), the largest |y_q - y| - rtol * |y| over each weight kind for
  the variant and for deliberately wrong ones (int8 with the scales of the next row, int4 with the zero
  off by one step), in fp32 and bf16, against y = F.linear in fp32: what sets the tolerances in
  `quant_cpu.py`; also the relative RMS error ||y_q - y|| / ||y||.
- decode: greedy batch-1 decode tokens/s of SmolLM2-135M-Instruct (fp32) with "linear" (and
  "gated_mlp") swapped to each variant via `kernels.dispatch.register`, measured as in
  `bench_generate.py`; and how many of the first 64 greedy tokens on 5 prompts match fp32.
- gsm8k: accuracy on `--gsm8k-items` test items drawn with seed 0 (0-shot chat, greedy, 320 tokens, graded
  as `evals.suites.gsm8k` grades) of fp32, "W8A16 linear+mlp", "W4A16 linear+mlp" (every projection and the
  LM head), a bfloat16 engine and, with `--winners FILE`, an engine serving that `link compile tune` table's
  winners (what a tuned server runs), with each one's agreement with fp32 (same extracted answer, same
  reply); needs `LINK_DATASETS_DIR`.

Run from the repository root (about 6 minutes on an idle 2-core CPU):

    python benchmarks/bench_quant_linear.py [--sections kernels accuracy decode] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench_generate import time_decode  # noqa: E402
from kernels import quant_cpu  # noqa: E402
from kernels.dispatch import register, reset  # noqa: E402
from kernels.ref_quant import quantize_int4  # noqa: E402
from benchmarks.link_bench import show_and_save  # noqa: E402

MODEL = "smollm2-135m-instruct"
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}
BATCH_SIZES = (1, 16)
RTOL = 0.02
PROMPTS = (
    "The capital of France is",
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?\nAnswer:",
    "Write a short poem about the sea.",
    "def fibonacci(n):",
    "Explain why the sky is blue in two sentences.",
)
VARIANTS = {
    "fp32": {},
    "int8 linear": {"linear": quant_cpu.int8_weight_linear},
    "int4 linear": {"linear": quant_cpu.int4_weight_linear},
    "int8 linear+mlp": {"linear": quant_cpu.int8_weight_linear, "gated_mlp": quant_cpu.int8_weight_gated_mlp},
    "int4 linear+mlp": {"linear": quant_cpu.int4_weight_linear, "gated_mlp": quant_cpu.int4_weight_gated_mlp},
    "W8A16 linear+mlp": {"linear": quant_cpu.int8_weight_linear_a16, "gated_mlp": quant_cpu.int8_weight_gated_mlp_a16},
    "W4A16 linear+mlp": {"linear": quant_cpu.int4_weight_linear_a16, "gated_mlp": quant_cpu.int4_weight_gated_mlp_a16},
}
GSM8K_VARIANTS = ("fp32", "W8A16 linear+mlp", "W4A16 linear+mlp")


def load_average() -> float:
    return os.getloadavg()[0]


def _median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def bench_kernels(repeats: int) -> list[dict]:
    rows = []
    gen = torch.Generator().manual_seed(0)
    for name, (out_features, in_features) in SHAPES.items():
        weight = torch.randn(out_features, in_features, generator=gen) * 0.05
        int8, int4 = quant_cpu.pack_int8(weight), quant_cpu.pack_int4(weight)
        for batch in BATCH_SIZES:
            x = torch.randn(batch, in_features, generator=gen)
            fp32_ms = _median_ms(lambda: F.linear(x, weight), repeats)
            int8_ms = _median_ms(lambda: quant_cpu.int8_linear(x, int8), repeats)
            int4_ms = _median_ms(lambda: quant_cpu.int4_linear(x, int4), repeats)
            rows.append({"shape": name, "out": out_features, "in": in_features, "batch": batch, "fp32_ms": fp32_ms,
                         "int8_ms": int8_ms, "int4_ms": int4_ms, "load_average": load_average()})
    return rows


def _wrong_int8(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """int8 with each row's scale taken from the next row: a layout bug the tolerance must catch."""
    pack = quant_cpu.pack_int8(weight)
    return quant_cpu.int8_linear(x, quant_cpu.Int8Pack(pack.q, pack.scale.roll(1)))


def _wrong_int4(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """int4 with the zero off by one quantization step (q - 7 instead of q - 8)."""
    group_size = quant_cpu.INT4_GROUP_SIZE
    q, scale, zero = quantize_int4(weight, group_size)
    deq = (q.float() - 7) * scale.repeat_interleave(group_size, 1) + zero.repeat_interleave(group_size, 1)
    return F.linear(x.float(), deq).to(x.dtype)


def bench_accuracy(model) -> list[dict]:
    layers = [0, len(model.layers) // 2, len(model.layers) - 1]
    weights = {"lm_head": [model.embed_tokens.weight if model.lm_head is None else model.lm_head]}
    for i in layers:
        layer = model.layers[i]
        weights.setdefault("qkv", []).append(layer.self_attn.qkv_proj)
        weights.setdefault("o", []).append(layer.self_attn.o_proj)
        weights.setdefault("gate_up", []).append(layer.mlp.gate_up_proj)
        weights.setdefault("down", []).append(layer.mlp.down_proj)
    fns = {"int8": lambda x, w: quant_cpu.int8_linear(x, quant_cpu.pack_int8(w)),
           "int4": lambda x, w: quant_cpu.int4_linear(x, quant_cpu.pack_int4(w)),
           "wrong int8": _wrong_int8, "wrong int4": _wrong_int4}
    rows = []
    gen = torch.Generator().manual_seed(0)
    for kind, ws in weights.items():
        for dtype in (torch.float32, torch.bfloat16):
            worst = {name: 0.0 for name in fns}
            rel = {name: 0.0 for name in fns}
            max_ref = 0.0
            for w in ws:
                x = torch.randn(16, w.shape[1], generator=gen)
                ref = F.linear(x, w.float())
                max_ref = max(max_ref, ref.abs().max().item())
                for name, fn in fns.items():
                    err = (fn(x.to(dtype), w.to(dtype)).float() - ref).abs()
                    worst[name] = max(worst[name], (err - RTOL * ref.abs()).max().item())
                    rel[name] = max(rel[name], (err.norm() / ref.norm()).item())
            rows.append({"kind": kind, "dtype": str(dtype).removeprefix("torch."), "max_abs_ref": max_ref,
                         **{f"atol_needed {name}": worst[name] for name in fns},
                         **{f"rel_rms {name}": rel[name] for name in fns}, "load_average": load_average()})
    return rows


def _generate(llm, prompt_ids: list[int], num_tokens: int) -> list[int]:
    from serving import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=num_tokens, ignore_eos=True)
    return llm.generate({"prompt_token_ids": prompt_ids}, params)[0].outputs[0].token_ids


def bench_decode(llm, num_tokens: int, repeats: int) -> list[dict]:
    from serving import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    prompt_ids = llm.tokenizer.encode(PROMPTS[0])
    rows, reference = [], None
    for name, table in VARIANTS.items():
        reset()
        for op, fn in table.items():
            register(op, fn)
        try:
            timing = time_decode(lambda n: _generate(llm, prompt_ids, n), num_tokens, repeats)
            outputs = [o.outputs[0].token_ids for o in llm.generate(list(PROMPTS), params)]
        finally:
            reset()
        reference = reference or outputs
        matches = []
        for ours, ref in zip(outputs, reference):
            count = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), len(ref))
            matches.append(count)
        rows.append({"variant": name, "tokens_per_second": timing.tokens_per_second, "spread": timing.spread,
                     "matching_tokens": matches, "load_average": load_average()})
        gc.collect()
    return rows


def bench_gsm8k(llm, num_items: int, winners: Path | None = None) -> list[dict]:
    """GSM8K accuracy of fp32, int8 and int4 weight-only linears (swapped into `llm`) and of a bfloat16 engine, with
    each variant's agreement with fp32: the share of items whose extracted answer, and whose whole reply, equals
    fp32's (SmolLM2 scores near zero on GSM8K, so agreement is the more telling number)."""
    import random

    from evals.graders import extract_number, numbers_equal
    from evals.suites.gsm8k import GSM8K
    from serving import LLM, SamplingParams
    from serving.engine.llm_engine import EngineConfig

    suite = GSM8K(Path(os.environ.get("LINK_DATASETS_DIR", "~/.link/datasets")).expanduser())
    items = random.Random(0).sample(suite.load("test"), num_items)
    conversations = [suite.request(item)[1]["messages"] for item in items]
    params = SamplingParams(**suite.sampling)

    def run(engine, name: str, swaps: dict | None) -> tuple[dict, list[str]]:
        if swaps is not None:  # None: keep the engine's own installed winners
            reset()
            for op, fn in swaps.items():
                register(op, fn)
        start = time.perf_counter()
        try:
            outputs = engine.chat(conversations, params)
        finally:
            reset()
        texts = [o.outputs[0].text for o in outputs]
        correct = [numbers_equal(extract_number(t), item.reference) for item, t in zip(items, texts)]
        return ({"variant": name, "accuracy": sum(correct) / len(correct), "num_items": len(items),
                 "seconds": time.perf_counter() - start, "load_average": load_average()}, texts)

    rows, replies = [], {}
    for name in GSM8K_VARIANTS:
        row, replies[name] = run(llm, name, VARIANTS[name])
        rows.append(row)
    bf16 = LLM(MODEL, dtype="bfloat16", weights="float", engine_config=EngineConfig(tuned_kernels=False))
    row, replies["bf16 engine"] = run(bf16, "bf16 engine", {})
    rows.append(row)
    if winners is not None:
        reset()
        os.environ["LINK_COMPILE_DB"] = str(winners)
        tuned = LLM(MODEL, weights="float", engine_config=EngineConfig(tuned_kernels=True))  # installs the table's winners
        name = f"tuned winners ({winners.name})"
        row, replies[name] = run(tuned, name, None)
        rows.append(row)
    reference = replies["fp32"]
    for row in rows:
        texts = replies[row["variant"]]
        row["same_answer_as_fp32"] = sum(extract_number(a) == extract_number(b) for a, b in zip(texts, reference)) / len(texts)
        row["same_text_as_fp32"] = sum(a == b for a, b in zip(texts, reference)) / len(texts)
    return rows


def render(result: dict) -> Table:
    table = Table(title=f"weight-only quantized linear (torch threads: {torch.get_num_threads()})")
    table.add_column("section")
    table.add_column("row")
    table.add_column("numbers")
    table.add_column("load avg", justify="right")
    for section, rows in result.items():
        for r in rows:
            key = r.get("shape") or r.get("kind") or r.get("variant")
            extra = f"{r['batch']}" if "batch" in r else r.get("dtype", "")
            nums = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()
                             if k not in ("shape", "kind", "variant", "batch", "dtype", "load_average", "out", "in"))
            table.add_row(section, f"{key} {extra}", nums, f"{r['load_average']:.2f}")
    return table


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", nargs="+", default=["kernels", "accuracy", "decode"],
                        choices=["kernels", "accuracy", "decode", "gsm8k"])
    parser.add_argument("--gsm8k-items", type=int, default=50, help="GSM8K test items (seed 0)")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per kernel (median kept)")
    parser.add_argument("--decode-repeats", type=int, default=3, help="timed generations per length (fastest kept)")
    parser.add_argument("--num-tokens", type=int, default=64, help="decode tokens timed")
    parser.add_argument("--winners", type=Path, help="gsm8k: also an engine serving this `link compile tune` table")
    parser.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    result = {}
    if "kernels" in args.sections:
        result["kernels"] = bench_kernels(args.repeats)
    if {"accuracy", "decode", "gsm8k"} & set(args.sections):
        from serving import LLM

        from serving.engine.llm_engine import EngineConfig

        llm = LLM(MODEL, dtype="float32", weights="float", engine_config=EngineConfig(tuned_kernels=False))
        if "accuracy" in args.sections:
            result["accuracy"] = bench_accuracy(llm.loaded.model)
        if "decode" in args.sections:
            result["decode"] = bench_decode(llm, args.num_tokens, args.decode_repeats)
        if "gsm8k" in args.sections:
            result["gsm8k"] = bench_gsm8k(llm, args.gsm8k_items, args.winners)
    show_and_save(render(result), result, args.json)
    return result


if __name__ == "__main__":
    main()
