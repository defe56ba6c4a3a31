"""Our C++ CPU kernels, compiled on first use for the machine they run on.

    rows = load_rows_linear()          # the compiled module, or None where it cannot be built here
    y = rows.rows_linear(x, weight)    # x [M, K], weight [N, K], float32 -> [M, N]

`rows_linear.cpp`: a float32 linear layer for a few rows (a decode batch, a speculative verify step)
that reads every weight row once per call; see the source for the layout.
`decode_step.cpp`: a whole Llama-family decode step in one call, its projections float32 or GGUF-style
4-/8-bit blocks (`kernels.native_step` builds and checks it). Both share `tiles.h`.

    step = load_decode_step()          # or None

`gguf_matmul.cpp`: linear layers on GGUF quantized blocks (Q4_0/1, Q5_0/1, Q8_0, Q4_K, Q5_K, Q6_K) as the file
stores them; built for the widest instruction set of this CPU (`cpu_isa()`: avx512, avx2 or portable), from
one source with each set's flags (`simd.h`). `LINK_KERNEL_ISA=avx2` (or portable) picks a narrower one, to
run the AVX2 path on an AVX-512 machine.

    gguf = load_gguf_matmul()          # or None; gguf.isa() says which build it is

Each is built with `torch.utils.cpp_extension.load` (g++ and ninja, flags -O3 -mavx512f -mfma -fopenmp) into torch's
extension cache (`TORCH_EXTENSIONS_DIR`, default ~/.cache/torch_extensions), one compiler process on one core
the first time and a file check after that. The sources include only the ATen and pybind11 headers they use,
not <torch/extension.h> (the whole C++ frontend, which was most of a build: cold builds on the 2-core dev machine
took 35 s of CPU time with it and 15 s without for rows_linear, 36 s and 21 s for decode_step, 39-42 s and 20-24 s
for each gguf_matmul build). rows_linear and decode_step need a CPU with AVX-512F (`torch.backends.cpu
.get_cpu_capability()` reports "AVX512" or better); gguf_matmul also builds for AVX2 and without SIMD. Where a module
cannot run, or its build fails, the loader returns None once, logs why, and callers keep PyTorch's kernels.

    modules = load_all([("gguf_matmul", "portable"), ("gguf_matmul", "avx2")])   # both builds at once

Different modules build at the same time (`load_all`, or `load_native` from several threads); one module
builds once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Sequence

import torch

logger = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).resolve().parent
FLAGS = ["-O3", "-mavx512f", "-mfma", "-fopenmp"]
# gguf_matmul's builds: the same source with each instruction set's flags. -ffp-contract=off keeps the block
# decoders' multiply-then-add as two roundings, as ggml's dequantizer computes them.
ISA_FLAGS = {
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mf16c"],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
    "portable": [],
}
ISA_ORDER = ("portable", "avx2", "avx512")

_locks_lock = threading.Lock()  # guards `_locks`
_locks: dict[str, threading.Lock] = {}  # one per module key: a module builds once, different modules at once
_loaded: dict[str, ModuleType | None] = {}
_why_not: dict[str, str] = {}


def has_avx512() -> bool:
    """Whether PyTorch sees AVX-512 on this CPU (its own dispatch level, "AVX512" or "AMX")."""
    return torch.backends.cpu.get_cpu_capability() in ("AVX512", "AVX512_BF16", "AMX")


def cpu_isa() -> str:
    """The widest of `ISA_ORDER` this CPU runs (PyTorch's own dispatch level), or `LINK_KERNEL_ISA` when set to
    a narrower one.

    Raises:
        ValueError: `LINK_KERNEL_ISA` names an unknown set or one wider than the CPU has.
    """
    level = torch.backends.cpu.get_cpu_capability()
    widest = "avx512" if level in ("AVX512", "AVX512_BF16", "AMX") else "avx2" if level == "AVX2" else "portable"
    wanted = os.environ.get("LINK_KERNEL_ISA", "").strip().lower()
    if not wanted:
        return widest
    if wanted not in ISA_ORDER:
        raise ValueError(f"LINK_KERNEL_ISA={wanted!r} is not one of {', '.join(ISA_ORDER)}")
    if ISA_ORDER.index(wanted) > ISA_ORDER.index(widest):
        raise ValueError(f"LINK_KERNEL_ISA={wanted} needs a CPU this one is not (PyTorch reports {level}); use {widest} or narrower")
    return wanted


def load_gguf_matmul(isa: str | None = None) -> ModuleType | None:
    """The compiled `gguf_matmul` module for `isa` (default `cpu_isa()`), or None where it cannot be built here."""
    isa = isa or cpu_isa()
    return load_native("gguf_matmul", isa)


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
    """Whether `name`.cpp (an AVX-512-only source, `load_native(name)`) is already compiled for this source on this
    machine (loading it is then a file check, not a build of about a minute)."""
    if _loaded.get(name) is not None:
        return True
    from torch.utils.cpp_extension import _get_build_directory

    module_name = f"link_{name}_{source_digest(name)}"
    return (Path(_get_build_directory(module_name, verbose=False)) / f"{module_name}.so").is_file()


def load_native(name: str, isa: str | None = None) -> ModuleType | None:
    """The compiled module of `name`.cpp (built on the first call, thread-safe), or None where this machine
    cannot run or build it (no compiler or ninja, a failed build, or, for the AVX-512-only sources
    (`isa` None), no AVX-512: the reason is logged once and kept in `unavailable_reason(name)`).

    Args:
        isa: None for a source written for AVX-512 only (`FLAGS`); else a key of `ISA_FLAGS`, built with
            those flags into its own module (`unavailable_reason(f"{name}_{isa}")`).
    """
    key = name if isa is None else f"{name}_{isa}"
    if key in _loaded:
        return _loaded[key]
    with _locks_lock:
        lock = _locks.setdefault(key, threading.Lock())
    with lock:
        if key in _loaded:
            return _loaded[key]
        module, reason = None, None
        if isa is None and not has_avx512():
            reason = f"the CPU lacks AVX-512 (PyTorch reports {torch.backends.cpu.get_cpu_capability()})"
        elif shutil.which("c++") is None and shutil.which("g++") is None:
            reason = "no C++ compiler (c++ or g++) on PATH"
        else:
            flags = FLAGS if isa is None else ["-O3", "-ffp-contract=off", "-fopenmp", *ISA_FLAGS[isa]]
            try:
                from torch.utils.cpp_extension import load

                module_name = f"link_{key}_{source_digest(name)}"
                _clear_stale_lock(module_name)
                module = load(module_name, [str(SOURCE_DIR / f"{name}.cpp")], extra_cflags=flags,
                              extra_ldflags=["-fopenmp"], verbose=False)
            except Exception as exc:  # a missing ninja or a compiler error: the PyTorch kernels stay
                reason = f"building {name}.cpp failed: {type(exc).__name__}: {str(exc).strip()[-400:]}"
        if reason is not None:
            logger.warning("native kernel %s unavailable: %s", key, reason)
            _why_not[key] = reason
        _loaded[key] = module
        return module


def load_all(requests: Sequence[tuple[str, str | None]]) -> list[ModuleType | None]:
    """`load_native(name, isa)` for each (name, isa) pair, the missing builds running at once (a build is one
    compiler process on one core), up to one per CPU core. Returns the modules in `requests`' order, None
    where one cannot be built here (the reason in `unavailable_reason`, as `load_native`)."""
    workers = max(1, min(len(requests), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="native-build") as pool:
        return list(pool.map(lambda request: load_native(*request), requests))


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
