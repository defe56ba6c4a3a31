"""Routing decision latency: a trained router deciding for 1,000 real prompts it has never embedded.

    python benchmarks/routing_latency.py                          # trains a kNN on routerbench:train (temp dir)
    python benchmarks/routing_latency.py --router routers/trained/link-auto.safetensors --json latency.json
    python benchmarks/routing_latency.py --encoder auto --encoder onnx-int8 --encoder torch   # each in turn
    python benchmarks/routing_latency.py --check-threads          # also: whose torch thread counts change

Prompts: GSM8K test questions, MMLU test questions with their four choices and AlpacaEval instructions (from
LINK_DATASETS_DIR, else ../shared/data), drawn with a seed, deduplicated and shuffled. None is in the embedding
cache: LINK_HOME points at a temporary folder while measuring, so every decision embeds its prompt (checked: one
encoder call per prompt). A decision is `RouterPolicy.decide`, what the gateway runs in a worker thread for each
request: the embedding (one prompt on the embedder's own one-thread OpenMP worker), the router's prediction
(numpy's BLAS limited to one thread when the router loads; routers/threads.py), the expected costs and the
rule. Prints p50/p90/p99/mean in milliseconds of the whole decision and of the embedding alone, with the
machine's load average (other processes slow both), and the decision's CPU time (the deciding and encoding
threads' own time: what a decision takes on a core nobody else uses).

--encoder (repeatable; default auto, the gateway's) is the router policy's `encoder` option
(link/policies/router.py). With several, each after the first is also compared with the first on the same
prompts: the share of the same choices, and the regret, the mean of (the first's objective of its own choice
- the first's objective of this encoder's choice), in quality points (0 when every choice is the same).

--check-threads shows why the embedder never calls `torch.set_num_threads`: a thread that starts torch work
while another thread has lowered the count keeps the lowered count for good (in the gateway: a worker thread
that then runs local engine steps), while the embedder's per-thread OpenMP setting leaves every other thread
and new threads at torch's default.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

NUM_PROMPTS = 1000
SHARES = {"gsm8k": 0.4, "mmlu": 0.4, "alpaca_eval": 0.2}


# --- prompts ----------------------------------------------------------------------------------------------

def gsm8k_questions(data_dir: Path) -> list[str]:
    with open(data_dir / "gsm8k" / "test.jsonl") as f:
        return [json.loads(line)["question"] for line in f if line.strip()]


def mmlu_questions(data_dir: Path) -> list[str]:
    """Every MMLU test row as a multiple-choice prompt (question, then A-D)."""
    out = []
    for path in sorted((data_dir / "mmlu" / "data" / "test").glob("*.csv")):
        with open(path, newline="") as f:
            for row in csv.reader(f):
                if len(row) >= 6:
                    out.append(row[0] + "".join(f"\n{letter}. {choice}" for letter, choice in zip("ABCD", row[1:5])))
    return out


def alpaca_instructions(data_dir: Path) -> list[str]:
    """The 805 AlpacaEval instructions (from the first model's outputs file: every file holds all of them)."""
    first = sorted((data_dir / "alpaca_eval" / "results").glob("*/model_outputs.json"))[0]
    return [row["instruction"] for row in json.loads(first.read_text())]


def real_prompts(data_dir: Path, num: int, seed: int) -> tuple[list[str], dict[str, int]]:
    """`num` distinct prompts, SHARES of each source, shuffled. Returns (prompts, count per source)."""
    rng = random.Random(seed)
    pools = {"gsm8k": gsm8k_questions(data_dir), "mmlu": mmlu_questions(data_dir),
             "alpaca_eval": alpaca_instructions(data_dir)}
    chosen: dict[str, str] = {}
    counts = {}
    for name, pool in pools.items():
        want = round(SHARES[name] * num) if name != "alpaca_eval" else num - sum(counts.values())
        picked = [p for p in rng.sample(pool, min(len(pool), 2 * want)) if p not in chosen][:want]
        chosen.update((p, name) for p in picked)
        counts[name] = len(picked)
    prompts = list(chosen)
    rng.shuffle(prompts)
    return prompts, counts


# --- the router -------------------------------------------------------------------------------------------

def train_knn(out: Path, data_dir: Path) -> Path:
    """A kNN router on routerbench:train (embeddings from the usual cache), as `link router train` makes it."""
    from evals.recorded import load_source
    from routers.offline.data import RoutingData
    from routers.offline.pipeline import train_and_save

    data = RoutingData.from_outcomes(load_source("routerbench:train", data_dir))  # what `--data routerbench:train` reads
    return train_and_save("knn", data, out,
                          info={"type": "knn", "data": ["routerbench:train"], "for": "benchmarks/routing_latency.py"})


def router_policy(path: Path, encoder: str = "auto"):
    """The gateway's `router` policy over every model of the file, with the given `encoder` option."""
    from link.config import PolicyConfig
    from link.policies.base import make_policy
    from routers.base import read_header

    models = read_header(path)["models"]
    return make_policy(PolicyConfig(name="link/auto", type="router", models=models,
                                    options={"path": str(path), "encoder": encoder}), models)


def percentiles(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms)
    return {"p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)), "p99": float(np.percentile(a, 99)),
            "mean": float(a.mean()), "max": float(a.max()), "n": int(a.size)}


def measure(path: Path, prompts: list[str], encoder: str, num_warmup: int) -> dict:
    """Decide every prompt once through `RouterPolicy.decide`; time the decisions and their encoder calls.
    "decisions" holds each prompt's chosen model and objectives, in order."""
    import torch

    from routers.request import RoutingRequest

    policy = router_policy(path, encoder)
    loaded = policy.router.get()                               # loads the file and the encoder, as at startup
    embedder = loaded.router.featurizer.embedder
    encode_ms: list[float] = []
    encode = embedder.encode

    def timed_encode(texts):
        start = time.perf_counter()
        try:
            return encode(texts)
        finally:
            encode_ms.append((time.perf_counter() - start) * 1000)

    embedder.encode = timed_encode
    encode_cpu_ms: list[float] = []
    inner = embedder._encode

    def cpu_timed_encode(model, texts):           # runs on the encoding thread: its own CPU time
        start = time.thread_time()
        try:
            return inner(model, texts)
        finally:
            encode_cpu_ms.append((time.thread_time() - start) * 1000)

    embedder._encode = cpu_timed_encode
    for i in range(num_warmup):
        warm_up = {"messages": [{"role": "user", "content": f"warm-up request number {i}"}]}
        policy.decide(RoutingRequest.from_body(warm_up))
    encode_ms.clear()
    encode_cpu_ms.clear()
    decision_ms, caller_cpu_ms, chosen, decisions = [], [], {}, []
    load_before = os.getloadavg()
    for prompt in prompts:
        body = {"model": policy.name, "messages": [{"role": "user", "content": prompt}]}
        start, start_cpu = time.perf_counter(), time.thread_time()
        decision = policy.decide(RoutingRequest.from_body(body))   # reading the body is part of the decision
        decision_ms.append((time.perf_counter() - start) * 1000)
        caller_cpu_ms.append((time.thread_time() - start_cpu) * 1000)
        chosen[decision["chosen"]] = chosen.get(decision["chosen"], 0) + 1
        decisions.append({"chosen": decision["chosen"], "objective": decision.get("objective")})
    if len(encode_ms) != len(prompts):
        raise RuntimeError(f"{len(encode_ms)} encoder calls for {len(prompts)} prompts: some prompt was cached")
    threads = embedder._workers[1].submit(torch.get_num_threads).result() if 1 in embedder._workers else None
    from threadpoolctl import threadpool_info

    blas = [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]
    cpu_ms = np.asarray(caller_cpu_ms) + np.asarray(encode_cpu_ms)
    return {"decision_ms": percentiles(decision_ms), "embedding_ms": percentiles(encode_ms),
            "decision_cpu_ms": percentiles(cpu_ms.tolist()), "embedding_cpu_ms": percentiles(encode_cpu_ms),
            "router": {"path": str(path), "type": loaded.router.type, "models": loaded.models},
            "encoder": encoder, "dtype": embedder.dtype, "backend": embedder.backend, "encoder_threads": threads, "torch_threads_elsewhere": torch.get_num_threads(),
            "numpy_blas_threads": blas,
            "chosen": dict(sorted(chosen.items(), key=lambda kv: -kv[1])),
            "load_average": {"before": list(load_before), "after": list(os.getloadavg())}, "decisions": decisions}


def agreement(first: list[dict], other: list[dict]) -> dict:
    """The share of prompts where `other` chose what `first` did, and the regret under `first`'s objectives
    (module docstring); both lists of `measure`'s "decisions", in the same prompt order."""
    same = [a["chosen"] == b["chosen"] for a, b in zip(first, other)]
    regret = [a["objective"][a["chosen"]] - a["objective"][b["chosen"]]
              for a, b in zip(first, other) if a["objective"] is not None]
    return {"same_choice": float(np.mean(same)), "regret_mean": float(np.mean(regret)) if regret else None,
            "regret_max": float(np.max(regret)) if regret else None}


# --- thread check -----------------------------------------------------------------------------------------

def check_threads() -> dict:
    """Thread counts seen by a thread that starts torch work while (a) another thread has called
    torch.set_num_threads(1), (b) the embedder encodes on its own thread."""
    import torch

    from routers.embedding import Embedder

    default = torch.get_num_threads()

    def step() -> None:                       # any parallel op sets up the calling thread's OpenMP count
        torch.get_num_threads()
        torch.ones(256, 256) @ torch.ones(256, 256)

    def first_torch_use() -> int:
        box = []
        thread = threading.Thread(target=lambda: (step(), box.append(torch.get_num_threads())))
        thread.start()
        thread.join()
        return box[0]

    inside, release = threading.Event(), threading.Event()

    def lowered_window():                      # what a process-wide set_num_threads around an encode does
        previous = torch.get_num_threads()
        torch.set_num_threads(1)
        inside.set()
        release.wait()
        torch.set_num_threads(previous)

    window = threading.Thread(target=lowered_window)
    window.start()
    inside.wait()
    late = {}
    started = threading.Event()

    def engine_worker():                      # starts torch work inside the window, steps again after it
        step()
        started.set()
        release.wait()
        time.sleep(0.05)
        late["after_window"] = torch.get_num_threads()

    worker = threading.Thread(target=engine_worker)
    worker.start()
    started.wait()
    release.set()
    window.join()
    worker.join()

    embedder = Embedder(use_cache=False)
    embedder.encode(["a warm-up prompt"])
    busy = threading.Thread(target=lambda: [embedder.encode([f"prompt {i}"]) for i in range(20)])
    busy.start()
    during = first_torch_use()
    busy.join()
    return {"torch_default_threads": default,
            "set_num_threads_window": {"thread_started_inside_keeps": late["after_window"]},
            "embedder_own_thread": {"encoder_thread": embedder._workers[1].submit(torch.get_num_threads).result(),
                                    "thread_started_during_encodes": during,
                                    "calling_thread_after": torch.get_num_threads()}}


def default_data_dir() -> Path:
    """LINK_DATASETS_DIR, else ../shared/data beside the repository."""
    return Path(os.environ.get("LINK_DATASETS_DIR") or Path(__file__).resolve().parents[1] / "../shared/data")


def write_json(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")


def report(encoder: str, run: dict) -> None:
    d, e, c = run["decision_ms"], run["embedding_ms"], run["decision_cpu_ms"]
    print(f"encoder {encoder}: {run['router']['type']} router over {len(run['router']['models'])} models, "
          f"{run['backend']}{'' if run['backend'] == 'onnx-int8' else ' ' + run['dtype']} on {run['encoder_threads']} "
          f"thread(s), numpy BLAS threads "
          f"{run['numpy_blas_threads']}, load average {run['load_average']['before'][0]:.2f}")
    print(f"  decision:  p50 {d['p50']:.2f} ms  p90 {d['p90']:.2f} ms  p99 {d['p99']:.2f} ms  mean {d['mean']:.2f} ms")
    print(f"  embedding: p50 {e['p50']:.2f} ms  p90 {e['p90']:.2f} ms  p99 {e['p99']:.2f} ms  mean {e['mean']:.2f} ms")
    print(f"  decision CPU time (what an idle core would take): p50 {c['p50']:.2f} ms  p99 {c['p99']:.2f} ms")
    for key, value in run.items():
        if key.startswith("agreement_with_"):
            regret = "" if value["regret_mean"] is None else (
                f", regret mean {value['regret_mean']:.5f} max {value['regret_max']:.4f} quality points")
            print(f"  same choice as {key.removeprefix('agreement_with_')}: {value['same_choice']:.1%}{regret}")


def main() -> None:
    from link.policies.router import ENCODERS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--router", type=Path, help="a router file (default: train a kNN on routerbench:train)")
    parser.add_argument("--num-prompts", type=int, default=NUM_PROMPTS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=20, help="decisions before timing (not in the prompts)")
    parser.add_argument("--encoder", action="append", choices=ENCODERS,
                        help="the router policy's encoder option, repeatable (default: auto, the gateway's)")
    parser.add_argument("--data-dir", type=Path, default=None, help="default: LINK_DATASETS_DIR, else ../shared/data")
    parser.add_argument("--check-threads", action="store_true", help="also run the torch thread-count check")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    encoders = args.encoder or ["auto"]
    data_dir = args.data_dir or default_data_dir()
    prompts, counts = real_prompts(data_dir, args.num_prompts, args.seed)
    with tempfile.TemporaryDirectory(prefix="routing-latency-") as tmp:
        path = args.router or train_knn(Path(tmp) / "knn.safetensors", data_dir)
        result = {"command": " ".join(["python", *sys.argv]), "num_prompts": len(prompts), "prompt_sources": counts,
                  "cpu_count": os.cpu_count(), "encoders": {}}
        print(f"{len(prompts)} prompts ({', '.join(f'{k} {v}' for k, v in counts.items())}), {os.cpu_count()} CPUs")
        for encoder in encoders:
            os.environ["LINK_HOME"] = str(Path(tmp) / f"home-{encoder}")     # an empty embedding cache for each
            run = measure(path, prompts, encoder, args.warmup)
            if args.router is None:
                run["router"]["path"] = "knn on routerbench:train (temporary)"
            if encoder != encoders[0]:
                run["agreement_with_" + encoders[0]] = agreement(result["encoders"][encoders[0]]["decisions"], run["decisions"])
            result["encoders"][encoder] = run
            report(encoder, run)
        if args.check_threads:
            result["threads"] = check_threads()
    if "threads" in result:
        print(f"threads: {json.dumps(result['threads'])}")
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
