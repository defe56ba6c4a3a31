"""Greedy outputs of a GGUF model on its blocks (`weights="packed"`) against the same file decoded to float32.

    python benchmarks/bench_packed_parity.py [--model qwen2.5-coder-0.5b-instruct] [--prompts 16] [--max-tokens 64]
                                             [--json out.json]

Both engines run the same MT-Bench first turns (seeded sample, the model's chat template) greedily for
`--max-tokens` tokens, EOS ignored. A prompt whose two outputs differ is looked at where they first part: the
float model's logits there (`prefill_logits` over the prompt and the shared prefix) give the margin between its
top two tokens, and the packed model's logits at the same position give the largest difference between the two
models. A divergence is a near-tie when the margin is no larger than twice that difference: the two models
disagree by more than the float model prefers its token, as float32 rounding in a different order can do.
Anything else counts as a real divergence, which the kernels' error bound (docs/engine-and-kernels.md) rules out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.link_bench.workload import default_data_dir, load_workload, render_prompts  # noqa: E402
from serving import LLM, SamplingParams  # noqa: E402


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first index where the token lists differ (the shorter one's length if one is a prefix), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def classify(float_logits: torch.Tensor, packed_logits: torch.Tensor) -> dict:
    """Near-tie or not at one position: float_logits, packed_logits [V] float32 (see the module docstring)."""
    top2 = torch.topk(float_logits, 2).values
    margin = float(top2[0] - top2[1])
    gap = float((packed_logits - float_logits).abs().max())
    return {"margin": margin, "max_logit_diff": gap, "near_tie": margin <= 2 * gap}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    texts = load_workload(default_data_dir(), seed=args.seed)[: args.prompts]
    _, prompts = render_prompts(args.model, texts)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    outputs, seconds = {}, {}
    engines = {}
    for weights in ("packed", "float"):
        engines[weights] = LLM(args.model, dtype="float32", weights=weights)
        start = time.perf_counter()
        results = engines[weights].generate([{"prompt_token_ids": p} for p in prompts], params)
        seconds[weights] = time.perf_counter() - start
        outputs[weights] = [list(r.outputs[0].token_ids) for r in results]
    rows = []
    for i, prompt in enumerate(prompts):
        at = first_divergence(outputs["float"][i], outputs["packed"][i])
        row = {"prompt": i, "identical": at is None}
        if at is not None:
            prefix = prompt + outputs["float"][i][:at]
            with torch.inference_mode():
                want = engines["float"].loaded.model.prefill_logits(prefix)[-1]
                got = engines["packed"].loaded.model.prefill_logits(prefix)[-1]
            row.update(position=at, **classify(want, got))
        rows.append(row)
    summary = {
        "model": args.model, "prompts": len(prompts), "max_tokens": args.max_tokens,
        "identical": sum(r["identical"] for r in rows),
        "near_ties": sum(not r["identical"] and r["near_tie"] for r in rows),
        "real_divergences": sum(not r["identical"] and not r["near_tie"] for r in rows),
        "generate_seconds": seconds, "rows": rows,
    }
    print(f"{args.model}: {summary['prompts']} prompts x {args.max_tokens} tokens: {summary['identical']} identical, "
          f"{summary['near_ties']} near-ties, {summary['real_divergences']} real divergences "
          f"(packed {seconds['packed']:.1f} s, float {seconds['float']:.1f} s)")
    for r in rows:
        if not r["identical"]:
            print(f"  prompt {r['prompt']}: token {r['position']}, float top-2 margin {r['margin']:.2e}, "
                  f"max |logit diff| {r['max_logit_diff']:.2e} -> {'near-tie' if r['near_tie'] else 'REAL'}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
