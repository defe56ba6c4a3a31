"""`torch.compile` variants (Inductor's CPU code generation) and thread settings, for the tuner.

Two kinds of candidate are registered by `register_compiled_variants()` (`kernels.variants`):

- op variants (`CompiledOp`): `torch.compile(dynamic=True)` of the references of rms_norm, rotary and
  gated_mlp (Inductor fuses the float32 statistics, the casts and the activation into one loop nest
  per op). Dynamic, not per bucket: a prefill bucket holds every token count from half its size up,
  and static shapes would compile once per count; one symbolic graph per input layout serves them;
- decode-step variants ("decode_step", a step op): the whole decode-only forward of a Llama-family
  model as a chain of compiled per-layer regions, the paged KV cache write and the paged attention
  left eager between them (their lengths change every step, and the cache write is an in-place update
  of a large tensor that Dynamo would otherwise functionalize). Layer l's output projection, residual,
  norm and MLP are fused with layer l+1's norm, QKV projection and rotary embedding into one graph, so
  a 30-layer model runs 31 compiled calls and 30 attention calls per step. Each graph is compiled
  with static shapes (`dynamic=False`) per batch-size bucket: a batch of B sequences is padded to the
  bucket's power of two P (pad rows are token 0 at position 0 and never reach the cache or attention),
  so 6 compilations cover batches 1-32.
  Each is offered at every thread count in `thread_candidates()` (`kernels.step_base`) ("compile-t1", "eager-t2", ...):
  `torch.set_num_threads` is process-wide, so the winner's setting stays in effect after its step.
  On a 2-core machine shared with another busy process, OpenMP's spinning barriers make 2 threads far
  slower than 1 (measured: SmolLM2-135M decode at B=1, 64 ms with 1 thread, 1,300 ms with 2, load 9).

A third kind, the W4A16 decode steps ("compile-w4a16-t1", ...), is lossy and comes with the quantized
provider (`quantized_step_variants`, gathered by `kernels.candidates` beside `kernels.quant_cpu`'s variants): the same
regions with every projection an int4 matmul on weights packed in groups of 32 (`kernels.quant_cpu`),
its input rounded to bfloat16. Decode at batch 1 reads every weight once per token, so its time is the
weights' bytes over memory bandwidth: 4.6 bits per weight instead of 32 (SmolLM2-135M: about 85 MB a
token instead of 430 MB in float32). On a model loaded from GGUF Q4_1 the packed weights are the file's
own (`kernels.quant_cpu` docstring), as llama.cpp computes with them.

Inductor bakes the thread count into the code it generates, so every thread count gets its own copy of
the compiled functions (distinct code objects, hence distinct Dynamo caches).

Compiling happens only when the tuner calls a variant or a winner is warmed up before it is installed
(`kernels.warmup`); what a step calls is the variant's `serving()` form, the same code objects in
run-only mode (`torch._dynamo.run`): compiled code where the guards pass, the eager Python function
where they miss, never a compilation inside a served step.
Correctness: each variant is checked by the tuner against the eager reference on recorded shapes
before it is used (`kernels.step_check` for the decode step: logits and greedy tokens);
`tests/kernels/test_compiled.py` checks greedy SmolLM2 outputs are unchanged.
"""

from __future__ import annotations

import functools
import threading
import types
import weakref

import torch
import torch._dynamo
import torch.nn.functional as F

from kernels import ref
from kernels.dispatch import dispatch
from kernels.quant_cpu import INT4_GROUP_SIZE, INT4_PACKS
from kernels.recorder import bucket_size
from kernels.step_base import is_llama_like, thread_candidates
from kernels.step_check import STEP_TOLERANCE
from kernels.variants import Variant, register_variant

# How functions are compiled and run compile-free; module attributes so tests can count compilations.
_compile = torch.compile
_run_only = torch._dynamo.run


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama RMSNorm as in `ref.ref_rms_norm` (offset 0)."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _w4a16(x: torch.Tensor, weight: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x [P, K] @ an int4 weight (packed [N, K / 2] uint8, scales and zeros [K / G, N, 2] bfloat16), the
    activations rounded to bfloat16 for the kernel, the result in x's dtype (`kernels.quant_cpu`)."""
    packed, scale_and_zero = weight
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16).contiguous(), packed, INT4_GROUP_SIZE, scale_and_zero)
    return out.to(x.dtype)


def _regions(linear):
    """The three compiled regions of a decode step whose projections are `linear(x [P, K], weight) -> [P, N]`
    (`F.linear` on the float weights, or `_w4a16` on packed ones): the first layer's norm, QKV and rotary;
    layer l's output projection, residual, norm and MLP with layer l+1's norm, QKV and rotary; the last
    layer's MLP block and the final norm."""

    def qkv_rotary(x, ln_w, qkv_w, cos, sin, eps: float, num_heads: int, num_kv: int, head_dim: int):
        """x [P, E] -> q [P, H, D], k, v [P, K, D]."""
        n = x.shape[0]
        qkv = linear(_rms(x, ln_w, eps), qkv_w)
        qk_size = (num_heads + num_kv) * head_dim
        qk = qkv[:, :qk_size].reshape(n, num_heads + num_kv, head_dim)
        half = head_dim // 2
        rotated = torch.cat((-qk[..., half:], qk[..., :half]), dim=-1)
        qk = qk * cos[:, None, :] + rotated * sin[:, None, :]
        v = qkv[:, qk_size:].reshape(n, num_kv, head_dim)
        return qk[:, :num_heads], qk[:, num_heads:], v

    def mlp_block(x, attn, o_w, post_w, gate_up, down, eps: float):
        """Residual after attention and after the SwiGLU MLP: x, attn [P, E], [P, H*D] -> [P, E]."""
        x = x + linear(attn, o_w)
        gate, up = linear(_rms(x, post_w, eps), gate_up).chunk(2, dim=-1)
        return x + linear(F.silu(gate) * up, down)

    def first(x, ln_w, qkv_w, cos, sin, eps: float, num_heads: int, num_kv: int, head_dim: int):
        return qkv_rotary(x, ln_w, qkv_w, cos, sin, eps, num_heads, num_kv, head_dim)

    def between(x, attn, o_w, post_w, gate_up, down, ln_w, qkv_w, cos, sin, eps: float, num_heads: int, num_kv: int, head_dim: int):
        x = mlp_block(x, attn, o_w, post_w, gate_up, down, eps)
        return (x, *qkv_rotary(x, ln_w, qkv_w, cos, sin, eps, num_heads, num_kv, head_dim))

    def last(x, attn, o_w, post_w, gate_up, down, norm_w, eps: float):
        return _rms(mlp_block(x, attn, o_w, post_w, gate_up, down, eps), norm_w, eps)

    return first, between, last


# How each weight format feeds its regions: the projection, and a parameter -> the region's weight argument.
WEIGHT_FORMATS = {
    "float": (F.linear, lambda param: param),
    "w4a16": (_w4a16, lambda param: _int4_weight(param)),
}


def _int4_weight(param: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    pack = INT4_PACKS.get(param)  # packed once per weight, shared with the int4 op variants
    return pack.packed, pack.scale_and_zero_as(torch.bfloat16)


def _copy(fn, suffix: str):
    """`fn` with a code object of its own (Dynamo keeps one compile cache per code object)."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{suffix}")
    copied = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
    copied.__kwdefaults__ = fn.__kwdefaults__
    return copied


class CompiledDecodeStep:
    """The decode-only forward of one Llama-family model through compiled per-layer regions.

    Same contract as the model's forward on a decode-only batch: `step(model, token_ids, batch, cache)`
    with token_ids [B] int64 and every query length 1 -> final hidden states [B, E] (the model's dtype).

    Args:
        model: a `serving.models.llama.LlamaForCausalLM` (any model without q/k norms, sliding windows
            or RoPE scaling and with SiLU MLPs).
        num_threads: `torch.set_num_threads` value set before each step and baked into the compiled code.
        pad: pad the batch to its power-of-two bucket (one compilation per bucket) instead of
            compiling per exact batch size.
        weights: "float" (the projections on the model's own weights) or "w4a16" (on the weights packed
            to int4 in groups of 32, `kernels.quant_cpu`, activations rounded to bfloat16 for the matmuls;
            the embedding, norms, attention and residuals stay in the model's dtype).
    Raises:
        ValueError: an unsupported architecture or weight format.
    """

    def __init__(self, model, num_threads: int, pad: bool = True, weights: str = "float"):
        cfg = model.config
        if not supports(model):
            raise ValueError(f"compiled decode step supports Llama-family models, not {cfg.architecture!r}")
        if weights not in WEIGHT_FORMATS:
            raise ValueError(f"unknown weight format {weights!r}; choose from {', '.join(WEIGHT_FORMATS)}")
        self.num_threads, self.pad, self.weights = num_threads, pad, weights
        linear, self._weight = WEIGHT_FORMATS[weights]
        self.num_heads, self.num_kv, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.eps = model.layers[0].input_layernorm.eps
        regions = [_copy(fn, f"{weights}_t{num_threads}") for fn in _regions(linear)]
        # static shapes: every call of a bucket has its padded size P, so one graph per bucket
        self._compiled = tuple(_compile(fn, dynamic=False, fullgraph=True) for fn in regions)
        self._run_only = tuple(_run_only(fn) for fn in regions)

    def __call__(self, model, token_ids: torch.Tensor, batch, cache) -> torch.Tensor:
        """One decode step, compiling the regions for this bucket if they are not yet."""
        return self.run(model, token_ids, batch, cache, compile=True)

    def run(self, model, token_ids: torch.Tensor, batch, cache, compile: bool = False) -> torch.Tensor:
        """One decode step; without `compile`, regions with no compiled code for the bucket run eagerly."""
        first_region, between_region, last_region = self._compiled if compile else self._run_only
        if torch.get_num_threads() != self.num_threads:
            torch.set_num_threads(self.num_threads)
        cfg = model.config
        num_seqs = token_ids.shape[0]
        padded = bucket_size(num_seqs) if self.pad else num_seqs
        positions = batch.positions
        if padded > num_seqs:
            token_ids = F.pad(token_ids, (0, padded - num_seqs))
            positions = F.pad(positions, (0, padded - num_seqs))
        x = model.embed_tokens(token_ids)
        cos, sin = dispatch("rotary_cos_sin", positions, cfg.head_dim, cfg.rope_theta, x.dtype)
        shape = (self.eps, self.num_heads, self.num_kv, self.head_dim)
        layers, w = model.layers, self._weight
        first = layers[0]
        q, k, v = first_region(x, first.input_layernorm.weight, w(first.self_attn.qkv_proj), cos, sin, *shape)
        for i, layer in enumerate(layers):
            attn_mod = layer.self_attn
            cache.write(i, batch.slot_mapping, k[:num_seqs], v[:num_seqs])
            out = dispatch("paged_attention", q[:num_seqs], cache.keys[i], cache.values[i], batch.block_tables,
                           batch.seq_lens, batch.query_lens, scale=attn_mod.scale, sliding_window=None)
            out = out.reshape(num_seqs, -1)
            if padded > num_seqs:
                out = F.pad(out, (0, 0, 0, padded - num_seqs))
            mlp = layer.mlp
            weights = (w(attn_mod.o_proj), layer.post_attention_layernorm.weight, w(mlp.gate_up_proj), w(mlp.down_proj))
            if i + 1 < len(layers):
                nxt = layers[i + 1]
                x, q, k, v = between_region(x, out, *weights, nxt.input_layernorm.weight, w(nxt.self_attn.qkv_proj), cos, sin, *shape)
            else:
                x = last_region(x, out, *weights, model.norm.weight, self.eps)
        return x[:num_seqs]


def supports(model) -> bool:
    """Whether `CompiledDecodeStep` computes this model's forward (`kernels.step_base.is_llama_like`)."""
    return is_llama_like(model)


class _CompiledStepVariant:
    """A decode-step variant: builds its per-model state on first use (weakly keyed by the model)."""

    def __init__(self, num_threads: int, compiled: bool, weights: str = "float"):
        self.num_threads, self.compiled, self.weights = num_threads, compiled, weights
        self._steps: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def __call__(self, model, token_ids, batch, cache, compile: bool = True) -> torch.Tensor:
        if not self.compiled:
            if torch.get_num_threads() != self.num_threads:
                torch.set_num_threads(self.num_threads)
            return model(token_ids, batch, cache)
        step = self._steps.get(model)
        if step is None:
            with self._lock:
                step = self._steps.get(model) or CompiledDecodeStep(model, self.num_threads, weights=self.weights)
                self._steps[model] = step
        return step.run(model, token_ids, batch, cache, compile=compile)

    def serving(self):
        """The step the engine calls: compiled code only (a bucket not warmed up runs eagerly)."""
        return self if not self.compiled else functools.partial(self, compile=False)


class CompiledOp:
    """`torch.compile(dynamic=True)` of an op's reference, in a code object of its own.

    Calling it compiles what its guards miss (the tuner's calls, a warm-up); `serving()` is the same
    code in run-only mode, for steps. Same contract as `fn`.
    """

    def __init__(self, fn):
        self.fn = _copy(fn, "compiled")
        self.__name__ = self.fn.__name__
        self._compiled = None
        self._lock = threading.Lock()

    def __call__(self, *args, **kwargs):
        if self._compiled is None:
            with self._lock:
                self._compiled = self._compiled or _compile(self.fn, dynamic=True)
        return self._compiled(*args, **kwargs)

    def serving(self):
        """`fn` running only the code compiled so far (eager where its guards miss)."""
        return _run_only(self.fn)


_registered: list[Variant] = []


def register_compiled_variants() -> list[Variant]:
    """Register the op and decode-step variants of this module; returns them. Idempotent: the same
    objects each time, so what one registration compiled is not compiled again after the next."""
    if not _registered:
        out = [Variant("rms_norm", "compile", CompiledOp(ref.ref_rms_norm), description="torch.compile (Inductor) of ref_rms_norm"),
               Variant("rotary", "compile", CompiledOp(ref.ref_rotary), description="torch.compile (Inductor) of ref_rotary"),
               Variant("gated_mlp", "compile", CompiledOp(ref.ref_gated_mlp), description="torch.compile (Inductor) of ref_gated_mlp")]
        for n in thread_candidates():
            out.append(Variant("decode_step", f"eager-t{n}", _CompiledStepVariant(n, compiled=False), tolerance=dict(STEP_TOLERANCE),
                               description=f"the eager model forward with torch.set_num_threads({n})"))
            out.append(Variant("decode_step", f"compile-t{n}", _CompiledStepVariant(n, compiled=True), tolerance=dict(STEP_TOLERANCE),
                               description=f"compiled per-layer regions, batch padded to its bucket, {n} thread(s)"))
        _registered.extend(out)
    return [register_variant(v) for v in _registered]


# (atol, rtol) of a W4A16 step's logits against the eager float step (`kernels.step_check`): on a model
# loaded from GGUF Q4_1 the int4 weights are the file's own, so the error is the activations' bfloat16
# rounding at every projection (7.8e-3 per rounding; bfloat16's own whole-step bound); on other weights
# int4 rounding adds to it. The greedy-token check applies as for every step variant.
W4A16_STEP_TOLERANCE: dict[torch.dtype, tuple[float, float]] = {torch.float32: (0.0, 5e-2), torch.bfloat16: (0.0, 5e-2)}
_quantized: list[Variant] = []


def quantized_step_variants() -> list[Variant]:
    """The decode steps with W4A16 projections ("compile-w4a16-t1", ...), one per thread count: lossy
    (`Variant.lossy`), so the tuner tries them only when allowed. The same objects on every call."""
    if not _quantized:
        _quantized.extend(
            Variant("decode_step", f"compile-w4a16-t{n}", _CompiledStepVariant(n, compiled=True, weights="w4a16"),
                    tolerance=dict(W4A16_STEP_TOLERANCE), lossy=True,
                    description=f"compiled per-layer regions, int4 weights (groups of {INT4_GROUP_SIZE}) and bfloat16 "
                                f"activations in the projections, {n} thread(s)")
            for n in thread_candidates())
    return list(_quantized)
