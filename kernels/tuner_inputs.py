"""Inputs of a bucket's shapes for the tuner: the cases a variant is verified on, the first one timed.

Random values from a fixed seed (the recorder keeps shapes, not data). Each case covers the contract,
not only the common path: rms_norm with Llama's and Gemma's offsets, gated_mlp with SwiGLU and GeGLU,
rotary contiguous and as the engine's strided view of the fused QKV output, paged attention as a decode
batch and as a prefill chunk over a shuffled block table. A decode step runs the real model on a batch
of sequences with 150-odd tokens of random cached K/V, at the bucket's top batch size and at its
smallest (the padded path); given real prompts (the recorded workload's), on those instead: each prompt
prefilled by the eager model into the cache, then one step decoding its greedy next token. Random K/V
is far outside what the model meets, and there a step whose matmuls round to bfloat16 moves the logits
by 20-60% of their scale where real prompts move them by under 1.2% (SmolLM2-135M, 16 serving prompts).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels import ref
from kernels.recorder import STEP_OPS, Bucket

_SEED = 0
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def bucket_cases(bucket: Bucket, model=None, prompts: list[list[int]] | None = None) -> list[tuple[tuple, dict]]:
    """The cases of any bucket: `step_cases` for a step op (needs `model`, the loaded `CausalLM`; on
    `prompts`, token id lists, when given), else `op_cases`.

    Raises:
        ValueError: a step bucket without a model, or an op the tuner has no inputs for.
    """
    if bucket.op in STEP_OPS:
        if model is None:
            raise ValueError(f"{bucket.op} {bucket.label}: a step bucket needs the model to build its inputs")
        return step_cases(model, bucket.leading, prompts=prompts)
    return op_cases(bucket, DTYPES[bucket.dtype])


def warmup_cases(bucket: Bucket, model=None) -> list[tuple[tuple, dict]]:
    """The inputs a winner is compiled on before it serves (`kernels.warmup`): `bucket_cases`, and for a
    kernel op the same cases at the bucket's smallest leading size too. A dynamic-shape graph traced at
    a power of two alone can be specialized to it (Dynamo gives equal sizes one symbol: rotary at 64
    tokens with head dim 64), and the other sizes of the bucket would miss its guards."""
    cases = bucket_cases(bucket, model)
    if bucket.op in STEP_OPS or bucket.leading <= 2:
        return cases
    first, *rest = bucket.shapes
    smallest = Bucket(bucket.op, ((bucket.leading // 2 + 1, *first[1:]), *rest), bucket.dtype, bucket.model)
    return cases + op_cases(smallest, DTYPES[bucket.dtype])


def model_weight_cases(bucket: Bucket, model) -> list[tuple[tuple, dict]]:
    """A "linear" or "gated_mlp" bucket's call on `model`'s own weights of the bucket's shapes (the first
    parameters that fit: a tied LM head is the embedding), x ~ N(0, 1) in the bucket's dtype; [] when the
    model has none (or for another op). The weights are the parameters themselves, so a pack cached while
    checking is the one the model's calls use."""
    dtype = DTYPES[bucket.dtype]
    gen = torch.Generator().manual_seed(_SEED)
    (rows, *_), weight_shape = bucket.shapes[0], tuple(bucket.shapes[1])
    if bucket.op == "linear":
        found = next((p for p in model.parameters() if tuple(p.shape) == weight_shape and p.dtype == dtype), None)
        if found is None:
            return []
        return [((torch.randn(rows, weight_shape[1], generator=gen).to(dtype), found), {})]
    if bucket.op == "gated_mlp":
        for module in model.modules():
            gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
            if isinstance(gate_up, torch.Tensor) and tuple(gate_up.shape) == weight_shape and gate_up.dtype == dtype:
                x = torch.randn(rows, weight_shape[1], generator=gen).to(dtype)
                return [((x, gate_up, down, module.activation), {})]
    return []


def with_cloned_weights(cases: list[tuple[tuple, dict]]) -> list[tuple[tuple, dict]]:
    """Matmul cases with their weight tensors (the 2-d arguments after the input) cloned: what a variant
    packs or copies for them is freed with them."""
    return [(tuple(a.clone() if i > 0 and isinstance(a, torch.Tensor) and a.dim() == 2 else a for i, a in enumerate(args)), kwargs)
            for args, kwargs in cases]


def op_cases(bucket: Bucket, dtype: torch.dtype) -> list[tuple[tuple, dict]]:
    """(args, kwargs) cases of one op bucket. Raises ValueError for an op the tuner does not tune."""
    gen = torch.Generator().manual_seed(_SEED)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype)

    shapes, op = bucket.shapes, bucket.op
    if op == "linear":
        (n, *rest), (out, inp) = shapes[0], shapes[1]
        return [((randn(n, *rest), randn(out, inp, scale=inp**-0.5)), {})]
    if op == "gated_mlp":
        (n, e), (f2, _) = shapes[0], shapes[1]
        x, gate_up, down = randn(n, e), randn(f2, e, scale=e**-0.5), randn(e, f2 // 2, scale=(f2 // 2) ** -0.5)
        return [((x, gate_up, down, "silu"), {}), ((x, gate_up, down, "gelu_tanh"), {})]
    if op == "rms_norm":
        x, e = randn(*shapes[0]), shapes[0][-1]
        weight = randn(e, scale=0.1) + 1
        return [((x, weight, 1e-6), {}), ((x, weight - 1, 1e-6), {"offset": 1.0})]
    if op == "rotary":
        # Contiguous (q or k after a q/k norm, Gemma) and the Llama layout: q and k rotated together
        # as a view of the fused QKV output, rows strided by the v columns that follow them
        # (`serving.models.layers.Attention`). A compiled variant guards on contiguity: warmed on one
        # layout only, it compiled again for the other inside a served step (`kernels.warmup`). The
        # row stride's value does not matter: one dynamic graph served rows of 14, 15 and 16 heads.
        n, heads, d = shapes[0]
        cos, sin = ref.ref_rotary_cos_sin(torch.randint(0, 4096, (n,), generator=gen), d, 10000.0, dtype)
        qkv = randn(n, (heads + max(1, heads // 4)) * d)
        return [((randn(n, heads, d), cos, sin), {}), ((qkv[:, : heads * d].view(n, heads, d), cos, sin), {})]
    if op == "paged_attention":
        (n, heads, d), (block_size, kv_heads, _) = shapes[0], shapes[1]
        decode = [int(x) for x in torch.randint(1, 200, (n,), generator=gen)]
        return [_paged(gen, randn, decode, [1] * n, heads, kv_heads, d, block_size),
                _paged(gen, randn, [n + 37], [n], heads, kv_heads, d, block_size)]
    raise ValueError(f"the tuner has no inputs for op {op!r}")


def _paged(gen, randn, seq_lens, query_lens, heads, kv_heads, d, block_size):
    per_seq = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(per_seq) + 2
    physical = torch.randperm(num_blocks, generator=gen)
    tables = torch.zeros(len(seq_lens), max(per_seq), dtype=torch.int64)
    used = 0
    for b, count in enumerate(per_seq):
        tables[b, :count] = physical[used : used + count]
        used += count
    k_cache, v_cache = randn(num_blocks, block_size, kv_heads, d), randn(num_blocks, block_size, kv_heads, d)
    q = randn(sum(query_lens), heads, d)
    return (q, k_cache, v_cache, tables, seq_lens, query_lens), {"scale": d**-0.5, "sliding_window": None}


def step_cases(model, batch_size: int, context: int = 150, block_size: int = 16,
               prompts: list[list[int]] | None = None, max_prompt_tokens: int = 512) -> list[tuple[tuple, dict]]:
    """Decode batches for `model` (a `CausalLM`): `batch_size` sequences, then the bucket's smallest size.

    Without `prompts`, sequence b has context + 3b tokens; the K/V of all but its newest token are random
    (std 0.5) in blocks of a shuffled table, and the step decodes a random token. With `prompts` (token id
    lists, used in turn, each cut to its last `max_prompt_tokens`), sequence b's cache holds the eager
    model's K/V of its prompt and the step decodes the prompt's greedy next token.
    """
    gen = torch.Generator().manual_seed(_SEED)
    sizes = [batch_size] + ([batch_size // 2 + 1] if batch_size > 2 else [])
    cases = []
    for size in sizes:
        texts = [prompts[b % len(prompts)][-max_prompt_tokens:] for b in range(size)] if prompts else None
        seq_lens = [len(t) + 1 for t in texts] if texts else [context + 3 * b for b in range(size)]
        per_seq = [-(-s // block_size) for s in seq_lens]
        cache = model.allocate_cache(sum(per_seq) + 1, block_size)
        if texts is None:
            for keys in (*cache.keys, *cache.values):
                keys.copy_(torch.randn(keys.shape, generator=gen) * 0.5)
        physical = torch.randperm(sum(per_seq) + 1, generator=gen)
        tables = torch.zeros(size, max(per_seq), dtype=torch.int64)
        used = 0
        for b, count in enumerate(per_seq):
            tables[b, :count] = physical[used : used + count]
            used += count
        positions = torch.tensor([s - 1 for s in seq_lens])
        slots = torch.tensor([int(tables[b, p // block_size]) * block_size + p % block_size for b, p in enumerate(positions.tolist())])
        batch = _batch(positions, slots, tables, seq_lens)
        if texts is None:
            token_ids = torch.randint(0, model.config.vocab_size, (size,), generator=gen)
        else:
            token_ids = torch.tensor([_prefill(model, t, tables[b], cache, block_size) for b, t in enumerate(texts)])
        cases.append(((model, token_ids, batch, cache), {}))
    return cases


@torch.inference_mode()
def _prefill(model, tokens: list[int], table: torch.Tensor, cache, block_size: int) -> int:
    """Run `tokens` through the eager model into `cache` (blocks `table`); returns the greedy next token."""
    n = len(tokens)
    pos = torch.arange(n)
    slots = table[pos // block_size] * block_size + pos % block_size
    batch = DecodeBatch(pos, slots, table[None, :], [n], [n])
    hidden = model(torch.tensor(tokens), batch, cache)
    return int(model.compute_logits(hidden[-1:]).argmax())


@dataclass
class DecodeBatch:
    """The fields of `serving.engine.paged_cache.BatchMetadata` a decode step reads (`kernels` does not import
    `serving`): positions, slot_mapping [B] int64, block_tables [B, max_blocks], seq_lens, query_lens."""

    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: list[int]
    query_lens: list[int]
    sliding_slot_mapping: None = None
    sliding_block_tables: None = None


def _batch(positions, slots, tables, seq_lens) -> DecodeBatch:
    return DecodeBatch(positions, slots, tables, seq_lens, [1] * len(seq_lens))
