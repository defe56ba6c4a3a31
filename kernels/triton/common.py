"""Checks and sizes shared by the Triton launchers.

A launcher refuses inputs its kernel cannot read (wrong rank, dtype, device, or a strided last
dimension) with a ValueError naming the argument, before anything is launched. Kernels run on CUDA
tensors, or on CPU tensors when Triton interprets them (`TRITON_INTERPRET=1`, read by Triton when a
kernel is decorated, so it must be set before `kernels.triton`'s kernel modules are imported).
"""

from __future__ import annotations

import os

import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def is_interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    try:
        from triton import knobs

        return bool(knobs.runtime.interpret)
    except ImportError:  # triton before 3.3 reads the variable directly
        return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def check_tensor(name: str, t: torch.Tensor, *, dim: int, dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES) -> None:
    """Raise ValueError unless `t` has `dim` dimensions, one of `dtypes`, and a unit-stride last dimension."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dim:
        raise ValueError(f"{name} must have {dim} dimensions, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} has dtype {t.dtype}; expected one of {[str(d) for d in dtypes]}")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} needs a contiguous last dimension, got strides {t.stride()}")


def check_devices(**tensors: torch.Tensor) -> None:
    """Raise ValueError unless all tensors share one device the kernels can run on (CUDA, or CPU when interpreting)."""
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        raise ValueError(f"tensors on different devices: {', '.join(f'{n}={d}' for n, d in devices.items())}")
    device = next(iter(devices.values()))
    if device.type == "cpu" and not is_interpreting():
        raise ValueError("Triton kernels need CUDA tensors; CPU tensors run only under TRITON_INTERPRET=1")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"Triton kernels run on CUDA (or CPU under the interpreter), not {device.type}")


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (tl.arange sizes must be powers of two)."""
    return 1 << max(0, n - 1).bit_length()
