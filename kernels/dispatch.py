"""The dispatch table: operation name -> the implementation the engine runs.

`dispatch("rms_norm", x, w, eps)` calls whatever is registered for "rms_norm". The defaults are the
PyTorch references (`ref.py`) except where a faster CPU variant with the same contract exists
(`cpu.py`); a tuned variant can replace any of them. Swapping is one dict assignment, atomic under the
GIL, so a tuner can install a winner between engine steps without a restart.
"""

from __future__ import annotations

from typing import Callable

from kernels import cpu, ref

_REFERENCES: dict[str, Callable] = {
    "rms_norm": ref.ref_rms_norm,
    "rotary_cos_sin": ref.ref_rotary_cos_sin,
    "rotary": ref.ref_rotary,
    "attention": ref.ref_attention,
    "paged_attention": ref.ref_paged_attention,
    "gated_mlp": ref.ref_gated_mlp,
    "linear": ref.ref_linear,
}
_DEFAULTS: dict[str, Callable] = {
    **_REFERENCES,
    "rms_norm": cpu.fused_rms_norm,
    "attention": cpu.sdpa_attention,
    "paged_attention": cpu.sdpa_paged_attention,
}
_table: dict[str, Callable] = dict(_DEFAULTS)


def dispatch(op: str, *args, **kwargs):
    """Run the implementation registered for `op`. Raises KeyError naming the known ops."""
    try:
        fn = _table[op]
    except KeyError:
        raise KeyError(f"no kernel registered for {op!r}; known: {sorted(_table)}") from None
    return fn(*args, **kwargs)


def register(op: str, fn: Callable) -> Callable:
    """Install `fn` for `op` (it must take the reference's arguments); returns the previous one."""
    if op not in _REFERENCES:
        raise KeyError(f"unknown op {op!r}; known: {sorted(_REFERENCES)}")
    previous = _table[op]
    _table[op] = fn
    return previous


def registered(op: str) -> Callable:
    """The implementation currently installed for `op`."""
    return _table[op]


def reset() -> None:
    """Restore every op to its default implementation."""
    _table.clear()
    _table.update(_DEFAULTS)


def use_references() -> None:
    """Install the PyTorch reference of every op (the ground truth for parity checks)."""
    _table.clear()
    _table.update(_REFERENCES)
