"""Our C++ decode step (`kernels/native/decode_step.cpp`) and GGUF-block projections, as tuner variants.

    step = NativeDecodeStep(model, weights="gguf")     # a Llama-family model in float32
    hidden = step(model, token_ids, batch, cache)      # the "decode_step" contract: [B] ids -> [B, E]

Why: the eager float32 decode step of SmolLM2-135M at batch 1 is about 27 ms of matmuls on 430 MB of
weights and as much again in small ops (SDPA's setup for one query row, the cache write, ~80 dispatched
ops per layer). The C++ step runs each layer as a handful of loops with no per-op dispatch (see the
source). With `weights="gguf"` a projection whose float weight is exactly GGUF blocks (the model was
dequantized from a Q4_1 or Q8_0 file) is kept in those blocks, 6 or 9 bits a weight with the blocks'
scales (float32 here): the step then reads 5.3x (Q4_1) less weight memory per token than in float32 and
computes with the same weights as the float step.

Packing is exact or not at all. `pack_q4` / `pack_q8` recover each block of 32 consecutive input features
(GGUF's QK4_1 / QK8_0) the way ggml's quantizers chose it: Q4_1 maps a block's smallest value to code 0
and its largest to 15 (d = (max - min) / 15, w = d * q + min); Q8_0 maps its largest magnitude to 127
(d = max |w| / 127, w = d * q). A weight is packed only if every element is reproduced within
`EXACT_RTOL` (2^-20, a few float32 roundings) of its block's largest magnitude, else it stays float32:
on weights that are not such blocks (a safetensors checkpoint) both variants are the float step. So the
variants are lossless: their results differ from the eager step by float32 rounding (the order of sums,
the packing's 2^-20 bound, a vector exp with ~1e-7 relative error), checked by the tuner against it (`kernels.step_check`: logits within `STEP_TOLERANCE`, greedy tokens
equal) like every step variant.

Variants ("cpu" provider): "native-t{n}" (float32 projections) and "native-gguf-t{n}" (GGUF blocks where
exact) of "decode_step" for each thread count of `kernels.step_base.thread_candidates`, and "native-gguf"
of "linear" (the LM head and any other linear: a tied Q8_0 embedding of 49152 x 576 is 32 MB instead of
113 MB a token). Parity: `tests/kernels/test_native_step.py`.
"""

from __future__ import annotations

import functools
import math
import threading
import weakref

import torch
import torch.nn.functional as F

from kernels.dispatch import dispatch
from kernels.native import load_decode_step, unavailable_reason
from kernels.packs import PackCache
from kernels.step_base import is_llama_like, thread_candidates
from kernels.step_check import STEP_TOLERANCE
from kernels.variants import Variant

BLOCK = 32          # GGUF's QK4_1 and QK8_0
EXACT_RTOL = 2.0 ** -20  # a packed block must reproduce every element within this x its largest |w|
WEIGHT_FORMATS = ("float", "gguf")


def _blocks(weight: torch.Tensor) -> torch.Tensor | None:
    """weight [N, K] float -> [N, K / 32, 32] float32, or None when it is not 2-D with K a multiple of 32."""
    if weight.dim() != 2 or weight.shape[1] % BLOCK or not weight.dtype.is_floating_point:
        return None
    return weight.detach().float().reshape(weight.shape[0], -1, BLOCK)


def _exact(blocks: torch.Tensor, rebuilt: torch.Tensor) -> bool:
    bound = EXACT_RTOL * blocks.abs().amax(dim=-1, keepdim=True)
    return bool(((rebuilt - blocks).abs() <= bound).all())


def pack_q4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The Q4_1-style blocks of `weight` [N, K], or None when they do not reproduce it exactly.

    Returns:
        (codes [N, K / 2] uint8, d [N, K / 32] float32, m [N, K / 32] float32): w = d * q + m with q in
        [0, 15]; byte i of a block holds element i (low nibble) and element i + 16 (high nibble).
    """
    blocks = _blocks(weight)
    if blocks is None:
        return None
    low, high = blocks.amin(dim=-1), blocks.amax(dim=-1)
    d = (high - low) / 15
    q = torch.round((blocks - low[..., None]) / torch.where(d > 0, d, 1.0)[..., None]).clamp_(0, 15)
    if not _exact(blocks, d[..., None] * q + low[..., None]):
        return None
    q = q.to(torch.uint8)
    codes = (q[..., :16] | (q[..., 16:] << 4)).reshape(weight.shape[0], weight.shape[1] // 2)
    return codes.contiguous(), d.contiguous(), low.contiguous()


def pack_q8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The Q8_0-style blocks of `weight` [N, K], or None when they do not reproduce it exactly.

    Returns:
        (codes [N, K] int8 in [-127, 127], d [N, K / 32] float32): w = d * q.
    """
    blocks = _blocks(weight)
    if blocks is None:
        return None
    d = blocks.abs().amax(dim=-1) / 127
    q = torch.round(blocks / torch.where(d > 0, d, 1.0)[..., None]).clamp_(-127, 127)
    if not _exact(blocks, d[..., None] * q):
        return None
    return q.to(torch.int8).reshape(weight.shape).contiguous(), d.contiguous()


def projection(weight: torch.Tensor, weights: str = "gguf"):
    """The C++ `Projection` of a weight [N, K]: Q4_1- or Q8_0-style blocks where they reproduce it exactly
    and `weights` is "gguf" (the smaller first), else the float32 weight itself (not copied).

    Raises:
        RuntimeError: the C++ module cannot be built here.
        ValueError: the weight stays float and is not float32 [N, K].
    """
    module = _module()
    if weights == "gguf":
        q4 = pack_q4(weight)
        if q4 is not None:
            return module.Projection.q4(*q4)
        q8 = pack_q8(weight)
        if q8 is not None:
            return module.Projection.q8(*q8)
    if weight.dtype != torch.float32 or weight.dim() != 2:
        raise ValueError(f"a float projection is float32 [N, K], got {weight.dtype} {tuple(weight.shape)}")
    return module.Projection.float32(weight.detach())


def _module():
    module = load_decode_step()
    if module is None:
        raise RuntimeError(f"the C++ decode step is unavailable here: {unavailable_reason('decode_step')}")
    return module


def supports(model) -> bool:
    """Whether the C++ step computes this model's decode forward: a float32 Llama-family model without
    q/k norms, sliding windows or RoPE scaling, with SiLU MLPs (`kernels.step_base.is_llama_like`)."""
    return is_llama_like(model) and model.embed_tokens.weight.dtype == torch.float32


class NativeDecodeStep:
    """A Llama-family model's decode-only forward through the C++ step.

    Same contract as the model's forward on a decode-only batch: `step(model, token_ids, batch, cache)`
    with token_ids [B] int64 and every query length 1 -> final hidden states [B, E] float32. The K/V of
    the new tokens are written into `cache` at `batch.slot_mapping`, as the eager step writes them.

    Args:
        model: a float32 model that `supports()` accepts.
        weights: "float" (every projection on the model's float32 weights) or "gguf" (GGUF blocks where
            they reproduce a weight exactly, `projection`).
    Raises:
        ValueError: an unsupported model or weight format.
        RuntimeError: the C++ module cannot be built here.
    """

    def __init__(self, model, weights: str = "gguf"):
        if weights not in WEIGHT_FORMATS:
            raise ValueError(f"unknown weight format {weights!r}; choose from {', '.join(WEIGHT_FORMATS)}")
        if not supports(model):
            raise ValueError("the C++ decode step supports float32 Llama-family models without q/k norms, sliding "
                             f"windows or RoPE scaling, not this {model.config.architecture!r} model")
        cfg = model.config
        norms, projections = [], []
        for layer in model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            norms += [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
            projections += [projection(w, weights) for w in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)]
        norms.append(model.norm.weight)
        self.weights = weights
        self.formats = [p.kind for p in projections]
        self._step = _module().LlamaDecodeStep(norms, projections, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                                               float(model.layers[0].input_layernorm.eps), float(model.layers[0].self_attn.scale))

    def __call__(self, model, token_ids: torch.Tensor, batch, cache) -> torch.Tensor:
        cfg = model.config
        x = model.embed_tokens(token_ids)
        cos, sin = dispatch("rotary_cos_sin", batch.positions, cfg.head_dim, cfg.rope_theta, x.dtype)
        return self._step.run(x, cos, sin, cache.keys, cache.values, batch.slot_mapping, batch.block_tables,
                              torch.tensor(batch.seq_lens, dtype=torch.int64))


# model -> {weights: NativeDecodeStep}, shared by every thread count's variant (the step does not depend on
# it): one packed copy per model and format. Packed when first built; a model whose weights change in
# place afterwards needs a new model object (the engine loads weights once).
_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_STEPS_LOCK = threading.Lock()


def step_for(model, weights: str) -> NativeDecodeStep:
    """The `NativeDecodeStep` of `model` in `weights`, built on first use (thread-safe)."""
    steps = _STEPS.get(model, {})
    if weights not in steps:
        with _STEPS_LOCK:
            steps = _STEPS.setdefault(model, {})
            if weights not in steps:
                steps[weights] = NativeDecodeStep(model, weights)
    return steps[weights]


class _NativeStepVariant:
    """A decode-step variant: the model's shared `NativeDecodeStep` (`step_for`), `num_threads` set first
    (process-wide, as for the compiled steps: the winner's setting stays after its step)."""

    def __init__(self, num_threads: int, weights: str):
        self.num_threads, self.weights = num_threads, weights

    def __call__(self, model, token_ids, batch, cache) -> torch.Tensor:
        step = step_for(model, self.weights)
        if torch.get_num_threads() != self.num_threads:
            torch.set_num_threads(self.num_threads)
        return step(model, token_ids, batch, cache)


_LINEAR_PACKS = PackCache(projection)  # weight -> its Projection, "gguf" (packed once per weight)


def gguf_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The "linear" contract (x [..., K], weight [N, K] -> [..., N]) on the weight's GGUF blocks where they
    reproduce it exactly (`projection`, packed once per weight), float32; F.linear for other dtypes."""
    if x.dtype != torch.float32 or weight.dtype != torch.float32:
        return F.linear(x, weight, bias)
    proj = _LINEAR_PACKS.get(weight)
    out = proj(x.reshape(math.prod(x.shape[:-1]), x.shape[-1])).reshape(*x.shape[:-1], weight.shape[0])
    return out if bias is None else out + bias


@functools.cache
def _available() -> bool:
    return load_decode_step() is not None


_variants: list[Variant] = []


def native_variants() -> list[Variant]:
    """The C++ step's variants (lossless; see the module docstring). The same objects on every call."""
    if not _variants:
        for n in thread_candidates():
            for weights, label in (("float", "float32 projections"), ("gguf", "GGUF Q4_1/Q8_0 blocks where exact")):
                name = f"native-t{n}" if weights == "float" else f"native-gguf-t{n}"
                _variants.append(Variant("decode_step", name, _NativeStepVariant(n, weights), dtypes=(torch.float32,),
                                         tolerance=dict(STEP_TOLERANCE), available=_available,
                                         description=f"our C++ decode step, {label}, {n} thread(s)"))
        _variants.append(Variant("linear", "native-gguf", gguf_linear, dtypes=(torch.float32,), available=_available,
                                 description="our AVX-512 kernel on the weight's GGUF Q4_1/Q8_0 blocks where exact, else float32"))
    return list(_variants)
