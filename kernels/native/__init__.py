"""Our C++ CPU kernels, compiled on first use for the machine they run on.

    rows = load_rows_linear()          # the compiled module, or None where it cannot be built here
    y = rows.rows_linear(x, weight)    # x [M, K], weight [N, K], float32 -> [M, N]

`rows_linear.cpp`: a float32 linear layer for a few rows (a decode batch, a speculative verify step)
that reads every weight row once per call; see the source for the layout.
`decode_step.cpp`: a whole Llama-family decode step in one call, its projections float32 or GGUF-style
4-/8-bit blocks (`kernels.native_step` builds and checks it). Both share `tiles.h`.

    step = load_decode_step()          # or None

Each is built with `torch.utils.cpp_extension.load` (g++ and ninja, flags -O3 -mavx512f -mfma -fopenmp) into torch's
extension cache (`TORCH_EXTENSIONS_DIR`, default ~/.cache/torch_extensions), about 30 s the first time
on a 2-core CPU and a file check after that. Needs a CPU with AVX-512F (`torch.backends.cpu
.get_cpu_capability()` reports "AVX512" or better); elsewhere, or when the build fails, the loader
returns None once, logs why, and callers keep PyTorch's kernels.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import threading
import time
from pathlib import Path
from types import ModuleType

import torch

logger = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).resolve().parent
FLAGS = ["-O3", "-mavx512f", "-mfma", "-fopenmp"]

_lock = threading.Lock()
_loaded: dict[str, ModuleType | None] = {}
_why_not: dict[str, str] = {}


def has_avx512() -> bool:
    """Whether PyTorch sees AVX-512 on this CPU (its own dispatch level, "AVX512" or "AMX")."""
    return torch.backends.cpu.get_cpu_capability() in ("AVX512", "AVX512_BF16", "AMX")


def unavailable_reason(name: str = "rows_linear") -> str | None:
    """Why `load_native(name)` returned None (after a call), else None."""
    return _why_not.get(name)


def load_rows_linear() -> ModuleType | None:
    """The compiled `rows_linear` module, or None where it cannot be built here (`load_native`)."""
    return load_native("rows_linear")


def load_decode_step() -> ModuleType | None:
    """The compiled `decode_step` module (`Projection`, `LlamaDecodeStep`), or None (`load_native`)."""
    return load_native("decode_step")


def source_digest(name: str) -> str:
    """A short hash of `name`.cpp and the headers here: part of the built module's name, so an edited
    source or header builds afresh (torch's extension cache tracks only the .cpp files it is given)."""
    digest = hashlib.sha256()
    for path in [SOURCE_DIR / f"{name}.cpp", *sorted(SOURCE_DIR.glob("*.h"))]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:10]


def is_built(name: str) -> bool:
    """Whether `name`.cpp is already compiled for this source on this machine (loading it is then a file check,
    not a build of about a minute)."""
    if _loaded.get(name) is not None:
        return True
    from torch.utils.cpp_extension import _get_build_directory

    module_name = f"link_{name}_{source_digest(name)}"
    return (Path(_get_build_directory(module_name, verbose=False)) / f"{module_name}.so").is_file()


def load_native(name: str) -> ModuleType | None:
    """The compiled module of `name`.cpp (built on the first call, thread-safe), or None where this machine
    cannot run or build it (no AVX-512, no compiler or ninja, a failed build: the reason is logged once
    and kept in `unavailable_reason(name)`)."""
    if name in _loaded:
        return _loaded[name]
    with _lock:
        if name in _loaded:
            return _loaded[name]
        module, reason = None, None
        if not has_avx512():
            reason = f"the CPU lacks AVX-512 (PyTorch reports {torch.backends.cpu.get_cpu_capability()})"
        elif shutil.which("c++") is None and shutil.which("g++") is None:
            reason = "no C++ compiler (c++ or g++) on PATH"
        else:
            try:
                from torch.utils.cpp_extension import load

                module_name = f"link_{name}_{source_digest(name)}"
                _clear_stale_lock(module_name)
                module = load(module_name, [str(SOURCE_DIR / f"{name}.cpp")], extra_cflags=FLAGS,
                              extra_ldflags=["-fopenmp"], verbose=False)
            except Exception as exc:  # a missing ninja or a compiler error: the PyTorch kernels stay
                reason = f"building {name}.cpp failed: {type(exc).__name__}: {str(exc).strip()[-400:]}"
        if reason is not None:
            logger.warning("native kernel %s unavailable: %s", name, reason)
            _why_not[name] = reason
        _loaded[name] = module
        return module


STALE_LOCK_S = 600  # a build takes about a minute on 2 cores; a lock older than this is a killed build's


def _clear_stale_lock(module_name: str) -> None:
    """Remove the build lock a killed build left (torch's loader would wait on it forever)."""
    from torch.utils.cpp_extension import _get_build_directory

    lock = Path(_get_build_directory(module_name, verbose=False)) / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return
    if age > STALE_LOCK_S:
        logger.warning("removing the build lock %s left %.0f s ago by a build that did not finish", lock, age)
        lock.unlink(missing_ok=True)
