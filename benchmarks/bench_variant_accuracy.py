"""GSM8K accuracy of SmolLM2-135M-Instruct per kernel configuration: the lossless tuned step against the
lossy ones (the bf16 and quantized variants' effect on GSM8K accuracy, reported).

    python benchmarks/bench_variant_accuracy.py [--limit 100] [--configs fp32 native w4a16 bf16] [--json out.json]

Each configuration answers the same seeded sample of GSM8K test questions (the `gsm8k` suite's chat
prompt, 0 shots, greedy, its 320-token limit), in one in-process `LLM.generate` call (the engine batches
them), and is graded by the suite's rule (the reply's final number equals the gold one):
- fp32: the float32 engine with no tuned kernels (the reference);
- native: float32 with our C++ decode step on the GGUF blocks (`native-gguf-t{threads}`) serving every
  decode batch and the LM head on Q8_0 blocks (`native-gguf`), both lossless;
- w4a16: float32 with the W4A16 decode step serving every decode batch (`compile-w4a16-*`, its regions run
  uncompiled: the same arithmetic without compile time): int4 weights, activations rounded to bfloat16 at
  every projection (lossy);
- bf16: the model loaded in bfloat16 (weights and activations), eager (lossy).
Prints per configuration: accuracy with its 95% Wilson interval, the share of questions whose extracted
answer equals fp32's, the share of replies identical to fp32's token for token, and output tokens/s.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODEL = "smollm2-135m-instruct"
CONFIGS = ("fp32", "native", "w4a16", "bf16")
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of k successes in n trials."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def install(config: str, model) -> None:
    """Install the configuration's decode step (and LM head) for every decode bucket."""
    import torch

    import kernels
    from kernels.recorder import Bucket

    from kernels.compiled import thread_candidates

    threads = max(n for n in thread_candidates() if n <= max(1, torch.get_num_threads()))  # a variant's count
    if config == "native":
        from kernels.native_step import native_variants

        variants = {(v.op, v.name): v for v in native_variants()}
        step = variants[("decode_step", f"native-gguf-t{threads}")].fn
        head = model.embed_tokens.weight if model.lm_head is None else model.lm_head
        for rows in BUCKETS:
            kernels.install(Bucket("linear", ((rows, head.shape[1]), tuple(head.shape)), "float32"), "native-gguf",
                            variants[("linear", "native-gguf")].fn)
    elif config == "w4a16":
        from kernels.compiled import quantized_step_variants

        step = next(v for v in quantized_step_variants() if v.name == f"compile-w4a16-t{threads}").fn.serving()
    else:
        return
    for size in BUCKETS:
        kernels.install(Bucket("decode_step", ((size,),), "float32", MODEL), config, step)


def run(config: str, prompts: list[list[int]], max_tokens: int) -> tuple[list[str], list[list[int]], float]:
    import kernels
    from serving import LLM, SamplingParams
    from serving.engine.llm_engine import EngineConfig

    kernels.reset()
    llm = LLM(MODEL, dtype="bfloat16" if config == "bf16" else "float32", weights="float",
              engine_config=EngineConfig(tuned_kernels=False))
    install(config, llm.loaded.model)
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    seconds = time.perf_counter() - start
    kernels.reset()
    return [o.outputs[0].text for o in outs], [list(o.outputs[0].token_ids) for o in outs], seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=100, help="GSM8K test questions (a seeded sample)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    parser.add_argument("--data-dir", type=Path, default=Path(os.environ.get("LINK_DATASETS_DIR", "../shared/data")))
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    if "fp32" not in args.configs:
        args.configs.insert(0, "fp32")  # the reference the others are compared with
    from evals.graders import extract_number, numbers_equal
    from evals.suites.gsm8k import GSM8K
    from serving.model_loader import load_model
    from serving.registry import default_registry

    suite = GSM8K(args.data_dir)
    items = suite.load("test")
    items = random.Random(args.seed).sample(items, min(args.limit, len(items)))
    loaded = load_model(default_registry().get(MODEL), "float32")
    prompts = []
    for item in items:
        _, request = suite.request(item)
        prompts.append(loaded.tokenizer.encode(loaded.chat_format.render(request["messages"]), add_special_tokens=False))
    del loaded
    results, report = {}, {"model": MODEL, "questions": len(items), "seed": args.seed, "configs": {}}
    for config in args.configs:
        print(f"{config}: {len(items)} questions ...", flush=True)
        texts, tokens, seconds = run(config, prompts, GSM8K.sampling["max_tokens"])
        answers = [extract_number(t) for t in texts]
        correct = sum(bool(numbers_equal(a, item.reference)) for a, item in zip(answers, items))
        results[config] = (answers, tokens)
        low, high = wilson(correct, len(items))
        row = {"correct": correct, "accuracy": correct / len(items), "wilson95": [low, high],
               "output_tokens_per_s": sum(map(len, tokens)) / seconds, "seconds": seconds}
        if config != "fp32":
            ref_answers, ref_tokens = results["fp32"]
            row["answers_equal_fp32"] = sum(a == b for a, b in zip(answers, ref_answers)) / len(items)
            row["replies_identical_fp32"] = sum(a == b for a, b in zip(tokens, ref_tokens)) / len(items)
        report["configs"][config] = row
        extra = (f", answers = fp32's {row['answers_equal_fp32']:.0%}, replies identical {row['replies_identical_fp32']:.0%}"
                 if config != "fp32" else "")
        print(f"  {config}: accuracy {correct}/{len(items)} = {row['accuracy']:.1%} (95% CI {low:.1%}-{high:.1%}), "
              f"{row['output_tokens_per_s']:.1f} output tok/s{extra}", flush=True)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
