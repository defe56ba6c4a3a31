"""Request shapes of served traffic: a bounded recorder, JSONL mixes and a fingerprint of a mix.

A *request shape* is what the configuration tuner needs to replay a request against the engine: its
prompt length and output length (tokens), its arrival time (seconds, relative to the mix's first
request) and its sampling kind ("greedy" or "sampled"); never its text. A *mix* is a list of shapes.

    recorder = TrafficRecorder(capacity=2048)
    async_engine.traffic = recorder          # AsyncLLMEngine records each finished request
    save_mix(recorder.shapes(), "$LINK_HOME/compile/traffic/smollm2-135m-instruct.jsonl")
    mix = load_mix(path); mix_fingerprint(mix)   # "p128:0.75,p256:0.25|o32:1|b16:1|s0" -> its hash

`link serve` writes each local model's recorded mix under `$LINK_HOME/compile/traffic/<model>.jsonl`
when it stops; `link bench serving --save-mix` writes a benchmark workload's; `link compile tune-config
--mix FILE` replays one (`serving/tuning/replay.py`, `serving/tuning/config_search.py`).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import Counter, deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

KINDS = ("greedy", "sampled")
# Requests arriving within this many seconds of the previous one belong to the same burst.
BURST_GAP_S = 0.05


@dataclass(frozen=True)
class RequestShape:
    """One request as the replay sees it.

    Attributes:
        prompt_tokens: prompt length in tokens (>= 1).
        output_tokens: generated tokens (>= 1).
        arrival_s: arrival time in seconds since the mix's first request (>= 0).
        kind: "greedy" (temperature 0) or "sampled".

    Raises:
        ValueError: a length below 1, a negative arrival or an unknown kind.
    """

    prompt_tokens: int
    output_tokens: int
    arrival_s: float = 0.0
    kind: str = "greedy"

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.output_tokens < 1 or self.arrival_s < 0 or self.kind not in KINDS:
            raise ValueError(f"bad request shape {self}: lengths >= 1, arrival_s >= 0, kind in {KINDS}")


class TrafficRecorder:
    """The shapes of the last `capacity` finished requests (a ring buffer: the oldest drop out).

    `record` is one tuple build and a deque append under a lock, called once per finished request.
    Arrival times are kept on the caller's clock (`time.monotonic()`) and made relative in `shapes`.

    Args:
        capacity: requests kept at most (>= 1).

    Raises:
        ValueError: capacity below 1.
    """

    def __init__(self, capacity: int = 2048):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._ring: deque[tuple[int, int, float, str]] = deque(maxlen=capacity)
        self._lock = threading.Lock()
        self.num_recorded = 0  # every request seen, including the ones that dropped out

    def __len__(self) -> int:
        return len(self._ring)

    def record(self, prompt_tokens: int, output_tokens: int, arrival_time: float, kind: str = "greedy") -> None:
        """Keep one finished request: lengths in tokens, its arrival on the monotonic clock (s)."""
        with self._lock:
            self._ring.append((prompt_tokens, output_tokens, arrival_time, kind))
            self.num_recorded += 1

    def observe(self, output, params) -> None:
        """Record a finished `serving.engine.outputs.RequestOutput` of a request with `SamplingParams` `params`.

        Requests that produced no token (aborted before their first) are skipped.
        """
        num_output = output.metrics.get("num_output_tokens") or sum(len(c.token_ids) for c in output.outputs)
        if not num_output or not output.prompt_token_ids:
            return
        kind = "greedy" if params.temperature == 0 else "sampled"
        self.record(len(output.prompt_token_ids), int(num_output), output.metrics.get("arrival_time", 0.0), kind)

    def shapes(self) -> list[RequestShape]:
        """The kept requests in arrival order, arrivals relative to the earliest kept one."""
        with self._lock:
            rows = sorted(self._ring, key=lambda r: r[2])
        if not rows:
            return []
        t0 = rows[0][2]
        return [RequestShape(p, o, round(t - t0, 6), k) for p, o, t, k in rows]

    def clear(self) -> None:
        with self._lock:
            self._ring.clear()


def save_mix(shapes: Iterable[RequestShape], path: str | Path) -> Path:
    """Write a mix as JSONL (one `RequestShape` per line), creating the folder; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(asdict(s)) + "\n" for s in shapes))
    os.replace(tmp, path)
    return path


def load_mix(path: str | Path) -> list[RequestShape]:
    """Read a JSONL mix, sorted by arrival.

    Raises:
        FileNotFoundError: no such file. ValueError: an empty mix, or a line that is not a shape
            (its line number in the message).
    """
    shapes = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            shapes.append(RequestShape(**json.loads(line)))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}:{number}: not a request shape ({exc})") from None
    if not shapes:
        raise ValueError(f"{path} holds no requests")
    return sorted(shapes, key=lambda s: s.arrival_s)


def traffic_path(model: str, home: str | Path | None = None) -> Path:
    """$LINK_HOME/compile/traffic/<model>.jsonl, where `link serve` writes a model's recorded mix."""
    home = Path(home or os.environ.get("LINK_HOME") or Path.home() / ".link")
    return home / "compile" / "traffic" / f"{model.replace('/', '_')}.jsonl"


def burst_sizes(shapes: list[RequestShape], gap_s: float = BURST_GAP_S) -> list[int]:
    """Per request, the size of its burst: consecutive arrivals at most `gap_s` apart form one burst."""
    arrivals = sorted(s.arrival_s for s in shapes)
    sizes, start = [], 0
    for i in range(1, len(arrivals) + 1):
        if i == len(arrivals) or arrivals[i] - arrivals[i - 1] > gap_s:
            sizes.extend([i - start] * (i - start))
            start = i
    return sizes


def _pow2(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length()


def mix_signature(shapes: list[RequestShape]) -> str:
    """A readable bucketed histogram of a mix: prompt lengths (p), output lengths (o) and burst sizes (b)
    rounded up to powers of two, each bucket's share rounded to a quarter (buckets under 1/8 dropped),
    and the share of sampled requests (s, quarters). Two samples of the same traffic land on the same
    signature; a mix whose typical lengths or concurrency differ by 2x or more does not.

    Raises:
        ValueError: an empty mix.
    """
    if not shapes:
        raise ValueError("an empty mix has no fingerprint")

    def histogram(prefix: str, values: list[int]) -> str:
        counts = Counter(_pow2(v) for v in values)
        shares = {b: round(4 * n / len(values)) / 4 for b, n in counts.items()}
        return ",".join(f"{prefix}{b}:{share:g}" for b, share in sorted(shares.items()) if share > 0)

    sampled = round(4 * sum(s.kind == "sampled" for s in shapes) / len(shapes)) / 4
    return "|".join((histogram("p", [s.prompt_tokens for s in shapes]), histogram("o", [s.output_tokens for s in shapes]),
                     histogram("b", burst_sizes(shapes)), f"s{sampled:g}"))


def mix_fingerprint(shapes: list[RequestShape]) -> str:
    """16 hex digits of the hash of `mix_signature(shapes)`: the key a tuned configuration is stored under."""
    return hashlib.blake2b(mix_signature(shapes).encode(), digest_size=8).hexdigest()
