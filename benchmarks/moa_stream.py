"""A streamed `link/moa` answer through a real gateway: time to first token, and the keep-alives before it.

    python benchmarks/moa_stream.py --config benchmarks/gsm8k_gateway.yaml --num-questions 3 --json moa.json

Starts `link serve --config CONFIG` on a free loopback port (LINK_HOME: a temporary folder unless set), then
sends GSM8K test questions (seeded sample, LINK_DATASETS_DIR else ../shared/data) one at a time, streamed,
to each `--model` (default link/moa), and reads the raw SSE bytes: every `: keep-alive` comment, the first
content delta (TTFT), the last frame. Prints per request TTFT, the keep-alives received before the first
token and the longest silence before it (a proxy with a 60 s idle timeout would cut a stream whose silence
exceeds that), total time and output size, then the same question once through the official `openai`
client, streamed, to show that it reads a stream with comments in it (its text must equal the raw one's
for a model that decodes greedily).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.link_bench.processes import ServerProcess, free_port, python_env  # noqa: E402

MASTER_KEY = "sk-link-bench-master-0123456789abcdef"
KEEPALIVE = ": keep-alive"


def gsm8k_questions(data_dir: Path, num: int, seed: int) -> list[str]:
    with open(data_dir / "gsm8k" / "test.jsonl") as f:
        rows = [json.loads(line)["question"] for line in f if line.strip()]
    return random.Random(seed).sample(rows, num)


def stream_once(url: str, model: str, question: str, max_tokens: int, timeout_s: float) -> dict:
    """One streamed chat completion read as raw SSE: {"ttft_s", "keepalives_before_first_token",
    "longest_silence_before_first_token_s", "total_s", "text", "served_by"} (times from the request's start)."""
    import httpx

    body = {"model": model, "stream": True, "temperature": 0, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": question}]}
    start = time.perf_counter()
    first = None
    keepalives, last_frame, silence, parts = 0, start, 0.0, []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=timeout_s,
                      headers={"Authorization": f"Bearer {MASTER_KEY}"}) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{model}: HTTP {response.status_code}: {response.read().decode()[:500]}")
        served = unquote(response.headers.get("x-link-model") or "") or None   # the gateway percent-encodes names
        for line in response.iter_lines():
            now = time.perf_counter()
            if not line:
                continue
            if first is None:
                silence = max(silence, now - last_frame)
            last_frame = now
            if line.startswith(KEEPALIVE):
                keepalives += first is None
                continue
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices") or []:
                text = (choice.get("delta") or {}).get("content")
                if text:
                    first = first or now
                    parts.append(text)
    return {"ttft_s": None if first is None else first - start, "keepalives_before_first_token": keepalives,
            "longest_silence_before_first_token_s": silence, "total_s": time.perf_counter() - start,
            "text": "".join(parts), "served_by": served}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "benchmarks" / "gsm8k_gateway.yaml")
    parser.add_argument("--model", action="append", help="repeatable (default: link/moa)")
    parser.add_argument("--num-questions", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=320, help="as the GSM8K suite asks (default: %(default)s)")
    parser.add_argument("--timeout-s", type=float, default=1800)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    data_dir = args.data_dir or Path(os.environ.get("LINK_DATASETS_DIR") or ROOT / "../shared/data")
    questions = gsm8k_questions(data_dir, args.num_questions, args.seed)
    models = args.model or ["link/moa"]
    with tempfile.TemporaryDirectory(prefix="moa-stream-") as tmp:
        port = free_port()
        env = python_env(LINK_HOME=os.environ.get("LINK_HOME") or tmp, LINK_MASTER_KEY=MASTER_KEY,
                         LINK_ENVIRONMENT="development", LINK_DATABASE_URL=f"sqlite:///{tmp}/link.db")
        server = ServerProcess([sys.executable, "-m", "cli", "serve", "--config", str(args.config),
                                "--port", str(port), "--log-level", "warning"], port, env=env, cwd=ROOT)
        try:
            server.wait_healthy("/health", timeout_s=600)
            results = {"config": str(args.config), "questions": len(questions), "runs": {}}
            for model in models:
                runs = []
                for i, question in enumerate(questions):
                    run = stream_once(server.url, model, question, args.max_tokens, args.timeout_s)
                    runs.append(run)
                    ttft = "none" if run["ttft_s"] is None else f"{run['ttft_s']:.1f} s"
                    print(f"{model} question {i}: TTFT {ttft}, {run['keepalives_before_first_token']} keep-alives "
                          f"before it (longest silence {run['longest_silence_before_first_token_s']:.1f} s), total "
                          f"{run['total_s']:.1f} s, {len(run['text'])} characters", flush=True)
                results["runs"][model] = runs
            from openai import OpenAI

            client = OpenAI(base_url=f"{server.url}/v1", api_key=MASTER_KEY, timeout=args.timeout_s)
            stream = client.chat.completions.create(model=models[0], stream=True, temperature=0, max_tokens=args.max_tokens,
                                                    messages=[{"role": "user", "content": questions[0]}])
            text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
            results["openai_client"] = {"text": text, "same_as_raw": text == results["runs"][models[0]][0]["text"]}
            print(f"openai client, {models[0]} question 0, streamed: {len(text)} characters, "
                  f"same text as the raw stream: {results['openai_client']['same_as_raw']}")
        finally:
            server.stop()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
