"""Per-step detokenization cost: a full decode of the output every step against the incremental window.

The engine detokenizes once per generated token. Before `serving.text.detokenizer`, each step decoded the
whole output so far (O(step) per step, O(N^2) per sequence); `IncrementalDetokenizer` decodes a window
of a few recent tokens (O(1) per step). This replays the steps of one output, the token ids of a real
generation (`--ids FILE`, a JSON list) or, by default, SmolLM2's greedy answer to a prompt asking for
emojis and Chinese, and prints the mean and last-100-steps cost per step of both, in microseconds, and
checks that both give the same text.

    python benchmarks/bench_detokenize.py [--model smollm2-135m-instruct] [--num-tokens 500] [--ids ids.json]
"""

from __future__ import annotations

import argparse
import json
import time

from serving.text.detokenizer import IncrementalDetokenizer

PROMPT = [{"role": "user", "content": "Write a long party invitation full of emojis like 🎉🥳🎂 and Chinese words like 你好."}]


def _token_ids(model: str, num_tokens: int, ids_file: str | None) -> tuple[object, list[int]]:
    from serving import LLM, SamplingParams

    llm = LLM(model)
    if ids_file:
        return llm.tokenizer, json.load(open(ids_file))[:num_tokens]
    out = llm.chat(PROMPT, SamplingParams(temperature=0.8, seed=1, max_tokens=num_tokens, ignore_eos=True))
    return llm.tokenizer, out[0].outputs[0].token_ids


def replay(tokenizer, ids: list[int]) -> dict:
    """Seconds per step of both methods over every prefix of `ids`, and whether their texts agree."""
    full_times, window_times, same = [], [], True
    detok = IncrementalDetokenizer(tokenizer)
    for i in range(1, len(ids) + 1):
        start = time.perf_counter()
        full = tokenizer.decode(ids[:i])
        full_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        detok.step(ids[:i])
        window_times.append(time.perf_counter() - start)
        same &= detok.text + detok.pending_text(ids[:i]) == full
    return {"num_tokens": len(ids), "full": full_times, "window": window_times, "same_text": same}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--num-tokens", type=int, default=500)
    parser.add_argument("--ids", help="a JSON list of output token ids to replay instead of generating")
    args = parser.parse_args()
    tokenizer, ids = _token_ids(args.model, args.num_tokens, args.ids)
    result = replay(tokenizer, ids)
    for name in ("full", "window"):
        times = result[name]
        print(f"{name:>6}: mean {1e6 * sum(times) / len(times):8.1f} us/step, last 100 steps "
              f"{1e6 * sum(times[-100:]) / len(times[-100:]):8.1f} us/step, total {1e3 * sum(times):7.1f} ms")
    print(f"{result['num_tokens']} tokens, same text: {result['same_text']}")


if __name__ == "__main__":
    main()
