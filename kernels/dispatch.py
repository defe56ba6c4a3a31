"""The dispatch table: operation name -> the implementation the engine runs.

`dispatch("rms_norm", x, w, eps)` calls whatever is registered for "rms_norm" (the PyTorch reference
until a tuned variant replaces it). Swapping is one dict assignment, atomic under the GIL, so a tuner
can install a winner between engine steps without a restart.
"""

from __future__ import annotations

from typing import Callable

from kernels import ref

_REFERENCES: dict[str, Callable] = {
    "rms_norm": ref.ref_rms_norm,
    "rotary_cos_sin": ref.ref_rotary_cos_sin,
    "rotary": ref.ref_rotary,
    "attention": ref.ref_attention,
    "paged_attention": ref.ref_paged_attention,
    "gated_mlp": ref.ref_gated_mlp,
    "linear": ref.ref_linear,
}
_table: dict[str, Callable] = dict(_REFERENCES)


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
    """Restore every op to its PyTorch reference."""
    _table.clear()
    _table.update(_REFERENCES)
