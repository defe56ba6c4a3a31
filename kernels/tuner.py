"""`Tuner`: picks, per hot shape bucket, the fastest variant that computes the reference's numbers.

For each bucket the `ShapeRecorder` saw most (and the winner table has no verdict on yet):
1. enumerate the candidates: the registered `kernels.variants` of the op that run on this device and
   dtype (Triton kernels, quantized matmuls, `kernels.compiled`);
2. verify each on inputs of the bucket's shapes against the float32 reference (`ref_*`, element by
   element with the variant's tolerance for the dtype; for the decode step, the eager model forward's
   logits, relative to their scale, and every row's greedy token: `kernels.step_check`); a lossless
   matmul variant also on the model's own weight of the bucket's shape, within the tolerance relative to
   the output's largest magnitude (a variant may run a real weight on another path: GGUF blocks in
   `kernels.native_step`); one that fails or raises is logged, stored as "rejected" and never installed;
3. time the default and every verified variant (warm-up, then the median of repeats; a decode-step
   bucket on each of its verification batches, the bucket's largest and its smallest size); a matmul op
   ("linear", "gated_mlp") is timed over copies of its weights (the model's own where it has one of the
   bucket's shape) totalling up to `stream_bytes` (at most MAX_STREAM_COPIES), one call per
   copy in turn, as in a decode step, where every layer's weights stream from memory: on one weight
   the cache holds, a variant can win at 2x and then gain little inside a step (SmolLM2's layer
   linears at 4 rows, `benchmarks/bench_linear_rows.py --layers 1` against the default 30: a [K, N]
   copy about 2x F.linear's speed in cache, 1.10x streamed);
4. store every verdict in the `WinnerTable` and stage the winner, if it beats the default by
   `min_speedup`, warmed up first (`kernels.warmup.install_warm`: compiled now for the bucket's shapes
   and the engine's layouts, never inside a step); the engine applies it between two steps.
A bucket with a verdict is never tuned again in the same environment (device, versions, model): after
a restart `install_known()` puts the stored winners back without timing anything, and a traffic shift
tunes only the buckets that became hot. A serving engine tunes in the background (`kernels.background`): a
Tuner whose `interrupt` returns True stops with `TuningPreempted`, writing nothing for that bucket.

    tuner = Tuner(WinnerTable(), "smollm2-135m-instruct", model=loaded.model)
    tuner.install_known()
    tuner.tune(recorder.snapshot(), budget_s=120)
"""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

from kernels.dispatch import registered
from kernels.ops import REFERENCES
from kernels.recorder import STEP_OPS, Bucket
from kernels.step_check import check_step_logits
from kernels.tuner_inputs import DTYPES, bucket_cases, model_weight_cases, with_cloned_weights
from kernels.variants import Variant, variants
from kernels.warmup import install_warm
from kernels.winners import Environment, Result, WinnerTable

logger = logging.getLogger(__name__)

TUNABLE_OPS = ("linear", "gated_mlp", "rms_norm", "rotary", "paged_attention", "decode_step")
STREAMED_OPS = ("linear", "gated_mlp")  # timed on weights that stream from memory (see the module docstring)
STREAM_BYTES = 192 * 2**20
MAX_STREAM_COPIES = 64


class TuningPreempted(Exception):
    """`Tuner.interrupt` asked to stop: the bucket in progress is dropped unwritten (its timings are not valid)."""


class Tuner:
    """Tunes the hot buckets of one model in one environment.

    Args:
        table: where verdicts persist.
        model_name: the registry name (part of the table key; decode-step buckets carry it too).
        model: the loaded `CausalLM`, needed to verify and time decode-step variants (None: skip them).
        device: torch device type of the candidates.
        min_speedup: a variant is installed only when default time / its time reaches this.
        repeats, warmup: timed and untimed calls per candidate.
        min_share: buckets below this share of all recorded calls of their op are not hot.
        prompts: token id lists the decode-step variants are checked on (`tuner_inputs.step_cases`: each
            prefilled, then its next token decoded); None: random cached K/V and tokens.
        stream_bytes: weight bytes a matmul candidate is timed over (copies of the case's weights, each
            call on the next; 0: the one weight, cache-resident).
        allow_lossy: also try lossy variants (`Variant.lossy`, and op variants whose stated tolerance is
            looser than the registry's default for the dtype: weight-only quantized matmuls and steps);
            off by default, so fp32 results stay equal to the reference within float rounding.
    Attribute `interrupt`: None, or a callable checked between candidates and timed passes; True raises
    `TuningPreempted` (the engine got work: the timing would be disturbed, and would disturb it). The
    measurements already finished are kept, and the next `tune_bucket` of that bucket goes on from them.
    """

    def __init__(self, table: WinnerTable, model_name: str, *, model=None, device: str = "cpu", min_speedup: float = 1.05,
                 repeats: int = 7, warmup: int = 2, min_share: float = 0.02, allow_lossy: bool = False,
                 prompts: list[list[int]] | None = None, stream_bytes: int = STREAM_BYTES):
        self.table, self.model, self.device = table, model, device
        self.env = Environment.current(model_name, device)
        self.min_speedup, self.repeats, self.warmup, self.min_share = min_speedup, repeats, warmup, min_share
        self.allow_lossy, self.prompts, self.stream_bytes = allow_lossy, prompts, stream_bytes
        self.interrupt: Callable[[], bool] | None = None
        self._partial: dict[Bucket, dict] = {}  # bucket -> {None: default ms, variant: Result} of a preempted tune_bucket

    def candidates(self, op: str, dtype: torch.dtype) -> list[Variant]:
        """The registered variants of `op` that run here on `dtype` (lossy ones only with `allow_lossy`)."""
        return [v for v in variants(op) if v.runs_on(self.device, dtype) and (self.allow_lossy or not v.is_lossy(dtype))]

    def install_known(self) -> int:
        """Warm up and stage every stored winner of this environment whose variant is registered (a step
        winner only with the model); returns how many. Compilation happens here, not in a served step."""
        count = 0
        for bucket, result in self.table.winners(self.env).items():
            if result.variant == "default":
                continue
            found = {v.name: v for v in variants(bucket.op)}.get(result.variant)
            if found is None or (bucket.op in STEP_OPS and self.model is None):
                why = "is not registered here" if found is None else "needs the model to warm up"
                logger.warning("stored winner %s of %s %s %s; not installed", result.variant, bucket.op, bucket.label, why)
                continue
            install_warm(bucket, found, self.model)
            count += 1
        return count

    def hot_buckets(self, counts: dict[Bucket, int]) -> list[tuple[Bucket, int]]:
        """The tunable buckets holding at least `min_share` of the calls of their site (op and weight shape:
        a model's LM head is one call per step beside 60 of the layers' projections, and still the largest
        matmul of a decode step): step buckets first (a decode step is worth dozens of op calls), then the
        most work (calls x `_work`)."""
        per_site: dict[tuple, int] = {}
        for bucket, n in counts.items():
            per_site[_site(bucket)] = per_site.get(_site(bucket), 0) + n
        hot = [(b, n) for b, n in counts.items() if b.op in TUNABLE_OPS and n >= self.min_share * per_site[_site(b)]
               and (b.op not in STEP_OPS or b.model == self.env.model)]
        return sorted(hot, key=lambda item: (item[0].op not in STEP_OPS, -item[1] * _work(item[0]), item[0].op, item[0].label))

    def todo(self, counts: dict[Bucket, int]) -> list[tuple[Bucket, int]]:
        """The hot buckets of `counts` with no verdict yet (step buckets only with the model), in tuning order."""
        tuned = self.table.tuned(self.env)
        return [(b, n) for b, n in self.hot_buckets(counts) if b not in tuned and (b.op not in STEP_OPS or self.model is not None)]

    def tune(self, counts: dict[Bucket, int], budget_s: float = 300.0,
             progress: Callable[[Bucket, int, int], None] | None = None) -> list[Result]:
        """Tune the hot buckets of `counts` that have no verdict yet, until `budget_s` seconds are spent.

        Returns the rows written (every variant's verdict). Buckets left when the budget runs out are
        tuned by the next call. `progress(bucket, done, total)` is called before each bucket.
        """
        start = time.monotonic()
        todo = self.todo(counts)
        written: list[Result] = []
        for i, (bucket, calls) in enumerate(todo):
            if time.monotonic() - start > budget_s:
                logger.info("tuning budget of %.0f s spent; %d buckets left for the next round", budget_s, len(todo) - i)
                break
            if progress is not None:
                progress(bucket, i, len(todo))
            written.extend(self.tune_bucket(bucket, calls))
        return written

    def tune_bucket(self, bucket: Bucket, calls: int = 0) -> list[Result]:
        """Verify and time every candidate of one bucket, store the verdicts, stage the winner."""
        dtype = DTYPES[bucket.dtype]
        candidates = self.candidates(bucket.op, dtype)
        cases = bucket_cases(bucket, self.model, self.prompts)  # the first one is timed (a step bucket: all)
        # A matmul of the model's own weight is timed on it and (lossless variants) checked on it too: a
        # variant may run its values differently (GGUF blocks that reproduce it exactly, `kernels.native_step`),
        # which random weights of the same shape never are.
        # The weights are clones, so the packs that losing variants cache for them go with them; the winner
        # packs the model's own weight when it is installed.
        own = with_cloned_weights(model_weight_cases(bucket, self.model)) if self.model is not None and bucket.op in STREAMED_OPS else []
        threads = torch.get_num_threads()

        def time_of(fn: Callable) -> float:
            # A step bucket covers several batch sizes (4: 3 and 4): timed on every case, their mean, so a
            # step compiled for the bucket's largest size cannot win while losing at its smaller ones. A
            # matmul's weight copies live for one timing (and with them the packs a variant caches).
            return self._time(fn, cases if bucket.op in STEP_OPS else self._streamed(bucket.op, (own or cases)[0]))

        # What was measured stays measured across a `TuningPreempted` (each measurement taken whole in an idle
        # gap), so a bucket longer than any gap still completes over several: None -> the default's time.
        done = self._partial.setdefault(bucket, {})
        if None not in done:
            done[None] = time_of(self._default(bucket))
        baseline = done[None]
        results, timed = [], []
        for variant in candidates:
            if variant.name in done:
                results.append(done[variant.name])
                if done[variant.name].status == "passed":
                    timed.append((done[variant.name].median_ms, variant))
                continue
            max_error = None
            self._check_interrupt()
            try:
                error, max_error = self._verify(variant, cases, dtype, bucket)
                if error is None and not variant.is_lossy(dtype):
                    error = self._verify_scaled(variant, own, dtype)
                atol, rtol = variant.tolerance_for(dtype)
                if error is not None:
                    raise AssertionError(error)
                median = time_of(variant.fn)
            except TuningPreempted:
                raise
            except Exception as exc:  # a failing candidate is a verdict, not a crash
                logger.warning("rejected variant %s for %s %s [%s]: %s", variant.name, bucket.op, bucket.label, bucket.dtype, exc)
                done[variant.name] = Result(bucket, variant.name, "rejected", baseline_ms=baseline, max_error=max_error,
                                            calls=calls, message=str(exc)[:500])
                results.append(done[variant.name])
                continue
            finally:
                torch.set_num_threads(threads)
            timed.append((median, variant))
            scale = " x the row's max |logit|" if bucket.op in STEP_OPS else ""
            done[variant.name] = Result(bucket, variant.name, "passed", median, baseline, max_error, calls=calls,
                                        message=f"atol {atol:g} rtol {rtol:g}{scale}")
            results.append(done[variant.name])
        del self._partial[bucket]
        best = min(timed, key=lambda t: t[0], default=None)
        if best is not None and baseline / best[0] >= self.min_speedup:
            results = [Result(r.bucket, r.variant, "winner", r.median_ms, r.baseline_ms, r.max_error, r.calls, r.message)
                       if r.variant == best[1].name else r for r in results]
            install_warm(bucket, best[1], self.model)
            if own:  # pack (or copy) the model's own weight now, not in the first served step
                with torch.inference_mode():
                    for args, kwargs in model_weight_cases(bucket, self.model):
                        best[1].fn(*args, **kwargs)
            logger.info("winner for %s %s [%s]: %s, %.2fx", bucket.op, bucket.label, bucket.dtype, best[1].name, baseline / best[0])
        else:
            results.append(Result(bucket, "default", "winner", baseline, baseline, calls=calls))
        for result in results:
            self.table.put(self.env, result)
        return results

    def _check_interrupt(self) -> None:
        if self.interrupt is not None and self.interrupt():
            raise TuningPreempted("the engine has work")

    def _default(self, bucket: Bucket) -> Callable:
        if bucket.op == "decode_step":
            return lambda model, token_ids, batch, cache: model(token_ids, batch, cache)
        return registered(bucket.op)

    def _reference(self, bucket_op: str) -> Callable:
        if bucket_op == "decode_step":
            return lambda model, token_ids, batch, cache: model(token_ids, batch, cache)
        return REFERENCES[bucket_op]

    @torch.inference_mode()
    def _verify(self, variant: Variant, cases: list[tuple[tuple, dict]], dtype: torch.dtype,
                bucket: Bucket | None = None) -> tuple[str | None, float]:
        """(None, max abs error) when every case is within tolerance, else (what differed, max abs error).

        Kernel ops: element-wise `allclose` against the reference run in float32. Step ops: the logits of
        the step's hidden states (`model.compute_logits`) against the eager forward's, within the bound
        relative to each row's scale and with every greedy token unchanged (`kernels.step_check`).
        A variant with `max_relative_error` (a quantized matmul) is also run on the model's own weights of
        the bucket's shape, when the tuner has the model (`tuner_inputs.model_weight_cases`): its relative
        RMS error there must stay within that bound. Random weights pack alike whatever the model, while a
        model's weights may pack exactly (GGUF Q4_1 into int4) or lose 8-13% (a Q8_0 embedding into int4).
        """
        atol, rtol = variant.tolerance_for(dtype)
        reference = self._reference(variant.op)
        step = variant.op in STEP_OPS
        worst = 0.0
        for args, kwargs in cases:
            expected = reference(*_fresh(args if step else _upcast(args)), **kwargs)
            got = variant.fn(*_fresh(args), **kwargs)
            expected, got = _first_tensor(expected), _first_tensor(got)
            if step:
                expected, got = self.model.compute_logits(expected), self.model.compute_logits(got)
                error, max_error = check_step_logits(expected, got, atol, rtol, near_ties=variant.lossy)
                worst = max(worst, max_error)
                if error is not None:
                    return error, worst
                continue
            expected, got = expected.float(), got.float()
            if expected.shape != got.shape:
                return f"shape {tuple(got.shape)}, expected {tuple(expected.shape)}", float("inf")
            max_error = (got - expected).abs().max().item() if got.numel() else 0.0
            worst = max(worst, max_error)
            if not torch.allclose(got, expected, atol=atol, rtol=rtol):
                return f"max abs error {max_error:.3g} outside atol {atol:g} / rtol {rtol:g}", worst
        if variant.max_relative_error is not None and self.model is not None and bucket is not None:
            for args, kwargs in model_weight_cases(bucket, self.model):
                expected = reference(*_upcast(args), **kwargs).float()
                got = variant.fn(*args, **kwargs).float()
                relative = float((got - expected).norm() / expected.norm().clamp_min(1e-30))
                if relative > variant.max_relative_error:
                    return (f"relative error {relative:.3g} on the model's own weights {tuple(args[1].shape)}, over "
                            f"{variant.max_relative_error:g}"), worst
        return None, worst

    @torch.inference_mode()
    def _verify_scaled(self, variant: Variant, cases: list[tuple[tuple, dict]], dtype: torch.dtype) -> str | None:
        """None when `variant` matches the reference on `cases` (a matmul on the model's own weights) within
        atol + rtol x the largest |reference output|, else what differed. Relative to the output's scale,
        not element by element: on real weights and N(0, 1) inputs a gated MLP's outputs reach 1e3 and the
        rounding of a reordered sum follows that scale, while a wrong weight or block moves it by O(1)."""
        atol, rtol = variant.tolerance_for(dtype)
        reference = self._reference(variant.op)
        for args, kwargs in cases:
            expected = _first_tensor(reference(*_upcast(args), **kwargs)).float()
            got = _first_tensor(variant.fn(*args, **kwargs)).float()
            if expected.shape != got.shape:
                return f"shape {tuple(got.shape)} on the model's own weights, expected {tuple(expected.shape)}"
            error = (got - expected).abs().max().item() if got.numel() else 0.0
            bound = atol + rtol * (expected.abs().max().item() if got.numel() else 0.0)
            if not error <= bound:
                return f"max abs error {error:.3g} on the model's own weights {tuple(args[1].shape)}, over {bound:.3g}"
        return None

    def _streamed(self, op: str, case: tuple[tuple, dict]) -> list[tuple[tuple, dict]]:
        """The cases one timed call cycles through: for a matmul op, the case with its weight matrices
        (the 2-d tensor arguments after the input) replaced by copies, as many as `stream_bytes` holds
        (1 to MAX_STREAM_COPIES); else the case alone."""
        args, kwargs = case
        weights = [i for i, a in enumerate(args) if i > 0 and isinstance(a, torch.Tensor) and a.dim() == 2]
        size = sum(args[i].numel() * args[i].element_size() for i in weights)
        if op not in STREAMED_OPS or not weights or self.stream_bytes <= size:
            return [case]
        copies = min(MAX_STREAM_COPIES, self.stream_bytes // size)
        out = [case]
        for _ in range(copies - 1):
            new = list(args)
            for i in weights:
                new[i] = args[i].clone()
            out.append((tuple(new), kwargs))
        return out

    @torch.inference_mode()
    def _time(self, fn: Callable, cases: list[tuple[tuple, dict]]) -> float:
        """Median wall time in milliseconds of one call, a timed repeat calling fn once on each of `cases`
        in turn (their mean), after `warmup` such passes."""
        for _ in range(self.warmup):
            self._check_interrupt()
            for args, kwargs in cases:
                fn(*args, **kwargs)
        times = []
        for _ in range(self.repeats):
            self._check_interrupt()
            start = time.perf_counter()
            for args, kwargs in cases:
                fn(*args, **kwargs)
            times.append((time.perf_counter() - start) * 1e3 / len(cases))
        return statistics.median(times)


def _site(bucket: Bucket) -> tuple:
    """Where calls of a bucket come from: the op and every shape after the first (a matmul's weight)."""
    return bucket.op, bucket.shapes[1:]


def _work(bucket: Bucket) -> int:
    """Arithmetic of one call, up to a constant per op: a matmul's M x N x K, else the first input's size."""
    size = 1
    for d in bucket.shapes[0]:
        size *= d
    if bucket.op in ("linear", "gated_mlp") and len(bucket.shapes) > 1:
        size *= bucket.shapes[1][0]
    return size


def _upcast(args: tuple) -> tuple:
    return tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)


def _fresh(args: tuple) -> tuple:
    """A copy of the cache argument of a decode step (it is written), the other arguments as they are."""
    return tuple(_clone_cache(a) if hasattr(a, "keys") and hasattr(a, "write") else a for a in args) if args else args


def _clone_cache(cache):
    from copy import copy

    out = copy(cache)
    out.keys, out.values = [k.clone() for k in cache.keys], [v.clone() for v in cache.values]
    return out


def _first_tensor(value) -> torch.Tensor:
    return value[0] if isinstance(value, (tuple, list)) else value


def install_stored(model_name: str, model=None, path=None, providers=None) -> int:
    """Stage the stored winners of `model_name` in this environment (engine start); returns how many.

    Does nothing (returns 0, creates no file) when the table file does not exist. Each winner is warmed
    up on inputs of its bucket first (`kernels.warmup.install_warm`; decode-step winners only with
    `model`, the loaded `CausalLM`), so its compilation happens here and not in the first step that
    serves a request. `providers`: see `kernels.candidates.register_candidates` (default: all, so a
    stored lossy winner, tuned on request, is found again).
    """
    from kernels.candidates import PROVIDERS, register_candidates
    from kernels.winners import default_path

    if not (Path(path) if path else default_path()).is_file():
        return 0
    register_candidates(tuple(PROVIDERS) if providers is None else providers)
    count = Tuner(WinnerTable(path), model_name, model=model).install_known()
    if count:
        logger.info("installed %d stored kernel winners for %s", count, model_name)
    return count
