"""`ShapeRecorder`: counts what the engine runs, per (operation, shape bucket, dtype).

The dispatch (`kernels.dispatch`) calls `record(op, args)` on every op when a recorder is attached,
and the model runner calls `record_step(...)` once per decode-only engine step. A call is counted
under its exact key, `(op, shapes, dtype)`, with one dict increment; bucketing (the leading
token/batch dimension rounded up to a power of two, the other dimensions exact) happens only when
the counts are read (`snapshot`), so the hot path stays a tuple build and a dict update.
Overhead against the SmolLM2-135M decode step: `benchmarks/bench_recorder.py`.

    recorder = ShapeRecorder()
    kernels.dispatch.attach_recorder(recorder)
    ... engine steps ...
    recorder.snapshot()          # {Bucket: calls}
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

# The step-level ops: one call per engine step, recorded by the model runner, not by `dispatch`.
STEP_OPS = ("decode_step",)


def bucket_size(n: int) -> int:
    """n rounded up to a power of two (1, 2, 4, 8, ...); 0 stays 0."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


@dataclass(frozen=True)
class Bucket:
    """A shape bucket of one op: every call whose leading dimension rounds up to the same power of two.

    Attributes:
        op: the dispatch op ("linear", ...) or a step op ("decode_step").
        shapes: the shapes that identify the call, the first one's leading dimension bucketed
            (linear: ((N, in), (out, in)); decode_step: ((B,),)).
        dtype: the activation dtype name ("float32", "bfloat16").
        model: for step ops, the model name (a decode step is one model's); "" for kernel ops.
    """

    op: str
    shapes: tuple[tuple[int, ...], ...]
    dtype: str
    model: str = ""

    @property
    def label(self) -> str:
        """"16x576,960x576": the shapes as `link compile status` and /metrics show them."""
        return ",".join("x".join(str(d) for d in shape) for shape in self.shapes)

    @property
    def leading(self) -> int:
        """The bucketed leading dimension (tokens or sequences)."""
        return self.shapes[0][0]

    @classmethod
    def parse(cls, op: str, label: str, dtype: str, model: str = "") -> "Bucket":
        """The inverse of `label`. Raises ValueError on a malformed label."""
        shapes = tuple(tuple(int(d) for d in part.split("x")) for part in label.split(",") if part)
        return cls(op, shapes, dtype, model)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def exact_key(op: str, args: tuple) -> tuple | None:
    """The exact key of one dispatched call of `op` on `args`: (shapes, dtype); None for an op whose calls
    are not bucketed, and for a matmul whose weight is not a plain tensor. `bucket_of` maps it to its `Bucket`."""
    if op in ("linear", "gated_mlp", "attention"):
        x, w = args[0], args[1]
        if not isinstance(w, torch.Tensor):  # a packed weight (GGUF blocks) runs its own kernel: nothing to tune
            return None
        return (x.shape, w.shape[-2:] if op == "attention" else w.shape), x.dtype
    if op in ("rms_norm", "rotary"):
        return (args[0].shape,), args[0].dtype
    if op == "paged_attention":  # q rows and the cache's block layout; lengths vary every step
        return (args[0].shape, args[1].shape[1:]), args[0].dtype
    return None


def bucket_of(op: str, exact: tuple, model: str = "") -> Bucket:
    """The `Bucket` of an exact key (as `exact_key` builds it)."""
    shapes, dtype = exact
    first = tuple(shapes[0])
    first = (bucket_size(first[0]), *first[1:]) if first else first
    return Bucket(op, (first, *(tuple(s) for s in shapes[1:])), _dtype_name(dtype), model)


class ShapeRecorder:
    """Call counts per exact shape key, read as counts per `Bucket`.

    Thread-safety: increments happen on the engine's thread; `snapshot` copies the dict under a lock
    held by no writer, which is safe under the GIL (a concurrent increment is either in the copy or
    counted in the next snapshot).
    """

    def __init__(self) -> None:
        self.counts: dict[tuple, int] = {}
        self._lock = threading.Lock()
        self._marks: dict[Bucket, int] = {}

    def record(self, op: str, args: tuple) -> tuple | None:
        """Count one call of `op` on `args`; returns its exact key (None when not bucketed)."""
        exact = exact_key(op, args)
        if exact is not None:
            key = (op, exact)
            counts = self.counts
            counts[key] = counts.get(key, 0) + 1
        return exact

    def record_step(self, op: str, batch_size: int, dtype: torch.dtype, model: str = "") -> tuple:
        """Count one engine step of `op` (e.g. "decode_step") over `batch_size` sequences; returns its key."""
        exact = (((batch_size,),), dtype)
        key = (op, exact, model)
        self.counts[key] = self.counts.get(key, 0) + 1
        return exact

    def snapshot(self) -> dict[Bucket, int]:
        """Calls per bucket since the recorder was created (or `clear`ed)."""
        with self._lock:
            items = list(self.counts.items())
        out: dict[Bucket, int] = {}
        for key, count in items:
            bucket = bucket_of(key[0], key[1], key[2] if len(key) > 2 else "")
            out[bucket] = out.get(bucket, 0) + count
        return out

    def since_mark(self) -> dict[Bucket, int]:
        """Calls per bucket since the previous `since_mark` call (the traffic of the last period); sets a new mark."""
        now = self.snapshot()
        delta = {b: n - self._marks.get(b, 0) for b, n in now.items() if n > self._marks.get(b, 0)}
        self._marks = now
        return delta

    def clear(self) -> None:
        with self._lock:
            self.counts.clear()
            self._marks = {}
