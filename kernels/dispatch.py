"""The dispatch table: operation name -> the implementation the engine runs.

`dispatch("rms_norm", x, w, eps)` calls whatever is registered for "rms_norm". The ops and their
PyTorch references are listed in `ops.py`; the defaults are the references except where a faster CPU
implementation with the same contract exists (`cpu.py`); a tuned variant can replace any of them. The
table imports no variant provider: the tuner installs the winners it picks from the registry
(`variants.py`). Swapping is one dict assignment, atomic under the GIL, so a tuner can install a winner
between engine steps without a restart.

Shape buckets: a winner can also be installed for one `kernels.recorder.Bucket` only
(`install`): it then serves the calls of that bucket and every other call keeps the op's default.
Installs are staged and take effect when the engine calls `apply_pending()` at the start of a step,
so one step never mixes two implementations of an op. With no recorder attached and no bucket
winner installed, `dispatch` is the plain table lookup it always was (one extra global read).
A default can be replaced the same staged way (`stage_default`, used by `kernels.cpu_defaults` to pick
the CPU's best kernel for buckets nobody tuned). Bucket winners are resolved once per exact shape and memoized, so a hooked call costs a key build
and two dict lookups (`benchmarks/bench_recorder.py` measures both paths).
"""

from __future__ import annotations

from typing import Callable

from kernels import cpu
from kernels.gguf_weight import GGUFWeight, packed_gated_mlp, packed_linear
from kernels.ops import REFERENCES, is_known_op, known_ops
from kernels.recorder import Bucket, ShapeRecorder, bucket_of, exact_key

_DEFAULTS: dict[str, Callable] = {
    **REFERENCES,
    "rms_norm": cpu.fused_rms_norm,
    "attention": cpu.sdpa_attention,
    "paged_attention": cpu.sdpa_paged_attention,
}
_table: dict[str, Callable] = dict(_DEFAULTS)
# Ops whose weight (the second argument) may be a `GGUFWeight`: such calls go to these, never to the table or
# its tuned variants (which take float tensors) and are not recorded for the tuner.
_PACKED: dict[str, Callable] = {"linear": packed_linear, "gated_mlp": packed_gated_mlp}

# Bucket winners: op -> {Bucket: (variant name, fn)}; replaced wholesale by `apply_pending` (atomic).
_winners: dict[str, dict[Bucket, tuple[str, Callable]]] = {}
_resolved: dict[tuple, Callable | None] = {}  # (op, exact key, model) -> the bucket winner or None
_pending: list[tuple[Bucket, str | None, Callable | None]] = []
_pending_defaults: list[tuple[str, str, Callable]] = []  # (op, name, fn): a new default, staged like a winner
_default_names: dict[str, str] = {}  # op -> name of the default installed by `stage_default` (absent: the static one)
_recorder: ShapeRecorder | None = None
_hooked = False  # a recorder is attached or a bucket winner is installed


def dispatch(op: str, *args, **kwargs):
    """Run the implementation registered for `op` (the bucket winner for this call's shape, if any).

    A "linear" or "gated_mlp" call on a `GGUFWeight` runs on the GGUF blocks (`kernels.gguf_weight`).
    Raises KeyError naming the known ops.
    """
    if op in _PACKED and isinstance(args[1], GGUFWeight):
        return _PACKED[op](*args, **kwargs)
    try:
        fn = _table[op]
    except KeyError:
        raise KeyError(f"no kernel registered for {op!r}; known: {sorted(_table)}") from None
    if _hooked:
        recorder = _recorder
        if recorder is not None:
            exact = recorder.record(op, args)
            if op in _winners and exact is not None:
                fn = _winner_for(op, exact, "") or fn
        elif op in _winners:
            exact = exact_key(op, args)
            if exact is not None:
                fn = _winner_for(op, exact, "") or fn
    return fn(*args, **kwargs)


def _winner_for(op: str, exact: tuple, model: str) -> Callable | None:
    memo = (op, exact, model)
    try:
        return _resolved[memo]
    except KeyError:
        found = _winners.get(op, {}).get(bucket_of(op, exact, model))
        fn = _resolved[memo] = found[1] if found else None
        return fn


def step_variant(op: str, batch_size: int, dtype, model: str = "") -> Callable | None:
    """Record one engine step of step op `op` (e.g. "decode_step") and return its bucket winner, or None
    for the default (the eager model forward). Called by the model runner once per decode-only step."""
    if not _hooked:
        return None
    exact = _recorder.record_step(op, batch_size, dtype, model) if _recorder is not None else (((batch_size,),), dtype)
    return _winner_for(op, exact, model) if op in _winners else None


def attach_recorder(recorder: ShapeRecorder | None) -> ShapeRecorder | None:
    """Count every dispatched call in `recorder` (None detaches); returns the previous recorder."""
    global _recorder, _hooked
    previous, _recorder = _recorder, recorder
    _hooked = _recorder is not None or bool(_winners)
    return previous


def recorder() -> ShapeRecorder | None:
    """The attached `ShapeRecorder`, or None."""
    return _recorder


def install(bucket: Bucket, name: str, fn: Callable | None) -> None:
    """Stage `fn` (variant `name`) as the winner for `bucket`; None stages its removal. It takes effect
    at the next `apply_pending()` (the engine calls it between steps).

    Raises:
        KeyError: an op that is neither a dispatch op nor a step op.
    """
    if not is_known_op(bucket.op):
        raise KeyError(f"unknown op {bucket.op!r}; known: {known_ops()}")
    _pending.append((bucket, name, fn))


def apply_pending() -> int:
    """Install every staged winner at once (one assignment each of the winner and memo tables); returns how many."""
    global _winners, _resolved, _hooked
    applied = _apply_defaults() if _pending_defaults else 0
    if not _pending:
        return applied
    staged = list(_pending)
    del _pending[: len(staged)]
    winners = {op: dict(found) for op, found in _winners.items()}
    for bucket, name, fn in staged:
        if fn is None:
            winners.get(bucket.op, {}).pop(bucket, None)
        else:
            winners.setdefault(bucket.op, {})[bucket] = (name, fn)
    _winners, _resolved = {op: found for op, found in winners.items() if found}, {}
    _hooked = _recorder is not None or bool(_winners)
    return applied + len(staged)


def stage_default(op: str, name: str, fn: Callable) -> None:
    """Stage `fn` (named `name`) as `op`'s default, what every call without a bucket winner runs; it takes
    effect at the next `apply_pending()`, so a step never mixes two defaults (`kernels.cpu_defaults`).

    Raises:
        KeyError: an unknown dispatch op.
    """
    if op not in REFERENCES:
        raise KeyError(f"unknown op {op!r}; known: {sorted(REFERENCES)}")
    _pending_defaults.append((op, name, fn))


def _apply_defaults() -> int:
    staged = list(_pending_defaults)
    del _pending_defaults[: len(staged)]
    for op, name, fn in staged:
        _table[op] = fn
        _default_names[op] = name
    return len(staged)


def default_names() -> dict[str, str]:
    """{op: name} of the defaults installed by `stage_default` (ops left out run their static default)."""
    return dict(_default_names)


def installed() -> dict[Bucket, str]:
    """{bucket: variant name} of the bucket winners in effect."""
    return {bucket: name for found in _winners.values() for bucket, (name, _) in found.items()}


def register(op: str, fn: Callable) -> Callable:
    """Install `fn` for `op` (it must take the reference's arguments); returns the previous one."""
    if op not in REFERENCES:
        raise KeyError(f"unknown op {op!r}; known: {sorted(REFERENCES)}")
    previous = _table[op]
    _table[op] = fn
    _default_names.pop(op, None)
    return previous


def registered(op: str) -> Callable:
    """The implementation currently installed for `op`."""
    return _table[op]


def reset() -> None:
    """Restore every op to its default implementation and drop every bucket winner (staged ones too)."""
    global _winners, _resolved, _hooked
    _table.clear()
    _table.update(_DEFAULTS)
    _pending.clear()
    _pending_defaults.clear()
    _default_names.clear()
    _winners, _resolved = {}, {}
    _hooked = _recorder is not None


def use_references() -> None:
    """Install the PyTorch reference of every op (the ground truth for parity checks); drops bucket winners."""
    reset()
    _table.update(REFERENCES)
