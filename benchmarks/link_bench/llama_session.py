"""llama.cpp (llama-cpp-python) in a process of its own that stays up between phases, so that its phases can
interleave with our server's on the same model file: load once, then decode and prefill on demand.

    with LlamaCppSession(gguf_path, seed=0) as llama:           # spawns the worker; it loads the model
        records, wall_s = llama.decode(warmup_ids, prompts, max_tokens=64)   # one request at a time
        prefill_records = llama.prefill(warmup_ids, long_prompts)            # max_tokens=1, own timer
        rss_mib = llama.peak_rss_mb()                           # VmHWM of the worker process

llama.cpp serves one request at a time here (llama-cpp-python has no batching of independent requests), with
`N_CTX` tokens of context, greedy, one thread per core this process may run on. Decode timing: each token's
instant as `Llama.generate` yields it (prompt and decode in one loop). Prefill timing: TTFT to the first yielded token and llama.cpp's own
prompt-evaluation time (`llama_perf_context(...).t_p_eval_ms`, reset before each prompt; None where the
installed llama-cpp-python lacks the perf API). Decode requests reuse the prompt prefix shared with the previous
request, as our engine's prefix cache does; prefill requests evaluate their whole prompt.
"""

from __future__ import annotations

import multiprocessing
import os
import time

from benchmarks.link_bench.prefill import PrefillRecord
from benchmarks.link_bench.processes import peak_rss_mb_of
from benchmarks.link_bench.timing import TimedRequest, record_from_times

N_CTX = 4096  # tokens of context: the KV cache llama.cpp allocates, part of its peak RSS


def _perf_api():
    """(read, reset) of llama.cpp's context perf counters for this llama_cpp version, or None."""
    import llama_cpp

    if hasattr(llama_cpp, "llama_perf_context"):
        return llama_cpp.llama_perf_context, llama_cpp.llama_perf_context_reset
    if hasattr(llama_cpp, "llama_get_timings"):  # before llama.cpp's perf API rename
        return llama_cpp.llama_get_timings, llama_cpp.llama_reset_timings
    return None


def _num_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one, else the CPU count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class _Worker:
    """The model in the worker process and the two timed loops."""

    def __init__(self, path: str, seed: int):
        from llama_cpp import Llama

        self.llm = Llama(model_path=path, n_ctx=N_CTX, n_threads=_num_cores(), seed=seed, verbose=False)
        self.perf = _perf_api()

    def _tokens(self, ids: list[int], num_tokens: int, whole_prompt: bool = False) -> tuple[float, list[float]]:
        """(start instant, instant of each of `num_tokens` tokens), greedy (top_k=1, temp 0). `generate` reuses
        the prompt prefix it shares with the previous request (the chat template's header), as our engine's
        prefix cache does; `whole_prompt` forgets the previous request first, so every prompt token is evaluated."""
        if whole_prompt:
            self.llm.reset()
        start, times = time.perf_counter(), []
        for _ in self.llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            times.append(time.perf_counter())
            if len(times) == num_tokens:
                break
        return start, times

    def decode(self, warmup: list[int], prompts: list[list[int]], max_tokens: int) -> tuple[list[TimedRequest], float]:
        self._tokens(warmup, min(4, max_tokens))
        start, records = time.perf_counter(), []
        for ids in prompts:
            t0, times = self._tokens(ids, max_tokens)
            records.append(record_from_times(len(ids), len(times), t0, times[0], times[-1]))
        return records, time.perf_counter() - start

    def _eval_s(self) -> float | None:
        if self.perf is None or getattr(self.llm, "_ctx", None) is None:
            return None
        data = self.perf[0](self.llm._ctx.ctx)
        return data.t_p_eval_ms / 1e3 if data.t_p_eval_ms > 0 else None

    def prefill(self, warmup: list[int], prompts: list[list[int]]) -> list[PrefillRecord]:
        self._tokens(warmup, 1)
        records = []
        for ids in prompts:
            if self.perf is not None and getattr(self.llm, "_ctx", None) is not None:
                self.perf[1](self.llm._ctx.ctx)
            t0, times = self._tokens(ids, 1, whole_prompt=True)
            records.append(PrefillRecord(len(ids), times[0] - t0, self._eval_s()))
        return records


def _serve(conn, path: str, seed: int) -> None:
    """The worker's loop: load, answer ("ready", None), then each (method, args) with ("ok", result) or ("error", text)."""
    try:
        worker = _Worker(path, seed)
        conn.send(("ready", None))
    except Exception as exc:  # reported to the parent, which raises it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    while (message := conn.recv()) is not None:
        method, args = message
        try:
            conn.send(("ok", getattr(worker, method)(*args)))
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class LlamaCppSession:
    """llama-cpp-python on the GGUF at `path` in a spawned worker (see the module docstring).

    Raises (from `start` and each method): RuntimeError with the worker's error text.
    """

    def __init__(self, path: str, seed: int = 0):
        self.path, self.seed = path, seed
        self._process = self._conn = None

    def start(self) -> "LlamaCppSession":
        """Spawn the worker; it loads the model, which `wait_ready` (and every call) waits for."""
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, self.path, self.seed), daemon=True)
        self._process.start()
        child.close()
        self._loaded = False
        return self

    def wait_ready(self) -> None:
        """Block until the worker has loaded the model (so loading never overlaps a measured phase)."""
        if not self._loaded:
            self._expect(self._conn.recv())
            self._loaded = True

    def _call(self, method: str, *args):
        self.wait_ready()
        self._conn.send((method, args))
        return self._expect(self._conn.recv())

    @staticmethod
    def _expect(reply: tuple):
        status, value = reply
        if status == "error":
            raise RuntimeError(value)
        return value

    def decode(self, warmup: list[int], prompts: list[list[int]], max_tokens: int) -> tuple[list[TimedRequest], float]:
        """Each prompt in turn, `max_tokens` tokens each, after one short warm-up request: (records, wall s)."""
        return self._call("decode", warmup, prompts, max_tokens)

    def prefill(self, warmup: list[int], prompts: list[list[int]]) -> list[PrefillRecord]:
        """Each prompt in turn with one output token, after one warm-up prompt (not recorded)."""
        return self._call("prefill", warmup, prompts)

    def peak_rss_mb(self) -> float:
        """The worker's peak resident memory (MiB) so far: VmHWM of its /proc status (model load included)."""
        return peak_rss_mb_of(self._process.pid)

    def stop(self) -> None:
        """Ask the worker to exit; kill it after 10 s (idempotent)."""
        if self._process is None:
            return
        try:
            self._conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._process = None

    def __enter__(self) -> "LlamaCppSession":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
