"""CPU threads of per-request routing work: one OpenMP thread for the encoder's own thread, one BLAS thread.

    executor = ThreadPoolExecutor(1, initializer=pin_intraop_threads, initargs=(1,))   # routers.embedding.Embedder
    limit_blas_threads()        # once, in a process that serves routing decisions (link/policies/router.py)

A routing decision is a few small products (one prompt's forward pass, one query against a few thousand
training embeddings) on a machine that may have two cores, busy with other work (the gateway's local engine).
Split across threads, such small work waits at every barrier for a thread whose core is taken, and idle
pool threads spin on the cores the others need. Measured on the 2-core dev machine under load
(benchmarks/routing_latency.py): one prompt's MiniLM forward pass p50 138 ms with torch's 2 OpenMP threads,
29 ms with one; a [1, 384] x [384, 2225] product 12 ms with numpy's 2 OpenBLAS threads, 0.05 ms with one, and
those threads' spinning doubled the encoder's time beside them (p50 75 ms against 35 ms).

Why not `torch.set_num_threads`: it sets the calling thread's OpenMP count and also the process default,
which every thread that first uses torch while it is lowered keeps for good (a gateway worker thread that
later runs local engine steps); restoring it afterwards does not reach those threads.
`pin_intraop_threads` calls `omp_set_num_threads` of the loaded OpenMP runtime, a per-thread setting, in a
thread the embedder owns. numpy's OpenBLAS has only a process-wide count: `limit_blas_threads` sets it to
one, which costs nothing where numpy's BLAS work is per-request routing (the gateway runs its models with
torch, whose BLAS and OpenMP pools are separate).
"""

from __future__ import annotations

import ctypes
import logging
import re

logger = logging.getLogger(__name__)


def omp_set_num_threads_function(prefer: str | None = None):
    """`omp_set_num_threads` of an OpenMP runtime already loaded in this process (libgomp, libiomp or libomp;
    those under the folder `prefer` first, e.g. torch's own), or None when there is none (a torch built
    without OpenMP). It sets the calling thread's OpenMP thread count only."""
    for handle in _loaded_openmp_libraries(prefer):
        function = getattr(handle, "omp_set_num_threads", None)
        if function is not None:
            function.argtypes, function.restype = [ctypes.c_int], None
            return function
    return None


def _loaded_openmp_libraries(prefer: str | None):
    """Handles of the OpenMP runtimes mapped in this process (Linux: /proc/self/maps), `prefer`'s first, then
    the process's global symbols (where other platforms find one)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if re.search(r"/lib(g|i)?omp[^/]*\.so", line)})
    except OSError:
        paths = []
    paths.sort(key=lambda path: not (prefer and path.startswith(prefer)))
    for path in paths:
        try:
            yield ctypes.CDLL(path)
        except OSError:
            continue
    yield ctypes.CDLL(None)


def pin_intraop_threads(num_threads: int) -> None:
    """Thread initializer: this thread's torch intra-op (OpenMP) thread count becomes `num_threads`, leaving
    every other thread's and the process default alone (see the module docstring). Logs a warning when it
    cannot (no OpenMP runtime found, or not torch's)."""
    import os

    import torch

    torch.get_num_threads()          # torch sets up this thread's OpenMP count on first use: do it first
    function = omp_set_num_threads_function(prefer=os.path.dirname(torch.__file__))
    if function is not None:
        function(num_threads)
    if torch.get_num_threads() != num_threads:
        logger.warning("could not set the embedding thread's OpenMP threads to %d: torch uses %d there", num_threads,
                       torch.get_num_threads())


def limit_blas_threads(num_threads: int = 1) -> int:
    """Limit numpy's OpenBLAS pool to `num_threads` for the whole process (see the module docstring); an MKL
    (which torch may share) is left alone. Returns how many OpenBLAS libraries were limited (0 when none is
    loaded or threadpoolctl is missing)."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        logger.warning("threadpoolctl is not installed: numpy's BLAS keeps its threads")
        return 0
    openblas = ThreadpoolController().select(internal_api="openblas")
    if openblas.lib_controllers:
        openblas.limit(limits=num_threads)
    return len(openblas.lib_controllers)
