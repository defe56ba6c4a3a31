"""The Triton kernels on a CUDA device: their parity tests, then each kernel timed against its reference.

1. Runs the GPU cases of the parity tests (`pytest -m gpu tests/kernels/test_triton_*.py`).
2. For the shapes of SmolLM2-135M (hidden 576, 9 heads, 3 KV heads, head size 64, FFN 1536) and Gemma-3-270M
   (hidden 640, 4 heads, 1 KV head, head size 256, FFN 2048, sliding window 512) at decode batch sizes and
   a 512-token prefill, checks each kernel against its reference at that shape (the tolerance of its
   `kernels.triton.triton_variants()` entry, reference in float32) and times both: warm-up calls, then the
   median over repeats of `--inner` back-to-back calls between two CUDA events. Printed per row: reference
   and Triton time (microseconds per call), speedup (reference / Triton), the bandwidth the Triton kernel
   achieves (bytes it must move / time, GB/s) and the largest absolute error.

References timed: the `kernels.ref` function, except paged decode attention, whose reference builds its
masks on the CPU and so cannot run on CUDA tensors: there the baseline is the same gather + masked softmax
written with device tensors (`_torch_paged_decode`); parity is still checked against `ref_paged_attention`
on CPU copies. The quantized matmul is timed against `ref_ggml_linear` (dequantize, then matmul) and, in
the `dense` column, against F.linear on the unquantized weight in the activation dtype.

Run from the repository root on a machine with a CUDA GPU (about 2 minutes on an H200, most of it Triton
compiling each shape once):

    python benchmarks/gpu_kernels.py [--dtype bfloat16] [--models smollm2-135m gemma-3-270m] [--json out.json]

Without a CUDA device it prints why and exits with status 2; the CPU suite checks the same kernels under
TRITON_INTERPRET=1. The exit status is 1 when a parity test or check fails.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernels import ref  # noqa: E402


@dataclass(frozen=True)
class ModelShapes:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    activation: str
    rms_offset: float
    sliding_window: int | None


MODELS = {
    "smollm2-135m": ModelShapes(576, 9, 3, 64, 1536, 49152, "silu", 0.0, None),
    "gemma-3-270m": ModelShapes(640, 4, 1, 256, 2048, 262144, "gelu_tanh", 1.0, 512),
}
BLOCK_SIZE = 16
TOKENS = (1, 16, 512)  # decode batches and a prefill, for the elementwise kernels
MLP_TOKENS = (1, 16)
DECODE = ((1, 512), (1, 4096), (16, 512), (16, 2048))  # (batch, context) of paged decode attention


@dataclass
class Row:
    kernel: str
    model: str
    shape: str
    dtype: str
    ref_us: float
    triton_us: float
    speedup: float
    triton_gbps: float
    max_abs_error: float
    ok: bool
    dense_us: float | None = None


@dataclass
class Case:
    kernel: str
    shape: str
    run: Callable[[], torch.Tensor]  # the Triton kernel
    reference: Callable[[], torch.Tensor]  # the timed baseline
    expected: Callable[[], torch.Tensor]  # the float32 reference output for the parity check
    tolerance: tuple[float, float]
    num_bytes: int
    dense: Callable[[], torch.Tensor] | None = None


def time_us(fn: Callable, warmup: int, repeats: int, inner: int) -> float:
    """Median over `repeats` of the CUDA-event time of `inner` back-to-back calls, per call, in microseconds."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / inner)
    return statistics.median(times)


def _torch_paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale, window):
    """ref._paged_decode's gather + masked softmax with every tensor on q's device. q [B, H, D] -> [B, H, D]."""
    num_blocks = -(-int(seq_lens.max()) // k_cache.shape[1])
    k = k_cache[block_tables[:, :num_blocks]].flatten(1, 2)  # [B, L, K, D]
    v = v_cache[block_tables[:, :num_blocks]].flatten(1, 2)
    group = q.shape[1] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bhd,blhd->bhl", q, k).float() * scale
    k_pos = torch.arange(k.shape[1], device=q.device)[None, :]
    mask = k_pos < seq_lens[:, None]
    if window is not None:
        mask &= seq_lens[:, None] - 1 - k_pos < window
    probs = torch.softmax(scores.masked_fill(~mask[:, None, :], float("-inf")), dim=-1).to(q.dtype)
    return torch.einsum("bhl,blhd->bhd", probs, v)


def model_cases(m: ModelShapes, dtype: torch.dtype, dev: str = "cuda") -> list[Case]:
    """The benchmark cases of one model's shapes, inputs on device `dev` in `dtype`."""
    from kernels import triton as kt
    from kernels.triton import activation, paged_attention, quant_matmul, rms_norm, rotary

    es = torch.tensor([], dtype=dtype).element_size()
    gen = torch.Generator(device=dev).manual_seed(0)

    def randn(*shape, std=1.0):
        return (torch.randn(*shape, generator=gen, device=dev) * std).to(dtype)

    tol = lambda table: table[dtype]  # noqa: E731
    cases: list[Case] = []
    weight = randn(m.hidden, std=0.1) + (0.0 if m.rms_offset else 1.0)
    for tokens in TOKENS:
        x, residual = randn(tokens, m.hidden), randn(tokens, m.hidden)
        cases.append(Case("rms_norm", f"[{tokens}, {m.hidden}]",
                          lambda x=x: rms_norm.rms_norm(x, weight, 1e-6, offset=m.rms_offset),
                          lambda x=x: ref.ref_rms_norm(x, weight, 1e-6, offset=m.rms_offset),
                          lambda x=x: ref.ref_rms_norm(x.float(), weight.float(), 1e-6, offset=m.rms_offset),
                          tol(kt.EXACT_ISH), 2 * x.nbytes + weight.nbytes))
        cases.append(Case("add_rms_norm", f"[{tokens}, {m.hidden}]",
                          lambda x=x, r=residual: rms_norm.add_rms_norm(x, r, weight, 1e-6, offset=m.rms_offset)[0],
                          lambda x=x, r=residual: ref.ref_add_rms_norm(x, r, weight, 1e-6, offset=m.rms_offset)[0],
                          lambda x=x, r=residual: ref.ref_add_rms_norm(x.float(), r.float(), weight.float(), 1e-6,
                                                                       offset=m.rms_offset)[0],
                          tol(kt.EXACT_ISH), 4 * x.nbytes + weight.nbytes))
        num_qk = m.heads + m.kv_heads
        qkv = randn(tokens, (num_qk + m.kv_heads) * m.head_dim)
        qk = qkv[:, : num_qk * m.head_dim].view(tokens, num_qk, m.head_dim)
        # (the reference builds its frequencies on the CPU)
        cos, sin = (t.to(dev, dtype) for t in ref.ref_rotary_cos_sin(torch.arange(tokens) + 100, m.head_dim, 10000.0, torch.float32))
        cases.append(Case("rotary", f"[{tokens}, {num_qk}, {m.head_dim}]",
                          lambda qk=qk, c=cos, s=sin: rotary.rotary(qk, c, s),
                          lambda qk=qk, c=cos, s=sin: ref.ref_rotary(qk, c, s),
                          lambda qk=qk, c=cos, s=sin: ref.ref_rotary(qk.float(), c.float(), s.float()),
                          tol(kt.EXACT_ISH), 2 * qk.numel() * es + cos.nbytes + sin.nbytes))
        gate_up = randn(tokens, 2 * m.ffn)
        cases.append(Case(f"gated_activation ({m.activation})", f"[{tokens}, {2 * m.ffn}]",
                          lambda g=gate_up: activation.gated_activation(g, m.activation),
                          lambda g=gate_up: ref.ref_gated_activation(g, m.activation),
                          lambda g=gate_up: ref.ref_gated_activation(g.float(), m.activation),
                          tol(kt.EXACT_ISH), gate_up.nbytes * 3 // 2))
    gate_up_proj, down_proj = randn(2 * m.ffn, m.hidden, std=m.hidden**-0.5), randn(m.hidden, m.ffn, std=m.ffn**-0.5)
    for tokens in MLP_TOKENS:
        x = randn(tokens, m.hidden)
        cases.append(Case(f"gated_mlp ({m.activation})", f"[{tokens}, {m.hidden}] x F {m.ffn}",
                          lambda x=x: activation.gated_mlp(x, gate_up_proj, down_proj, m.activation),
                          lambda x=x: ref.ref_gated_mlp(x, gate_up_proj, down_proj, m.activation),
                          lambda x=x: ref.ref_gated_mlp(x.float(), gate_up_proj.float(), down_proj.float(), m.activation),
                          tol(kt.MATMUL), gate_up_proj.nbytes + down_proj.nbytes + 2 * x.nbytes))

    windows = [None] + ([m.sliding_window] if m.sliding_window else [])
    for batch, context in DECODE:
        for window in windows:
            lens = [context - 7 * b for b in range(batch)]  # unequal lengths
            blocks_per_seq = -(-context // BLOCK_SIZE)
            tables = torch.randperm(batch * blocks_per_seq, device=dev).view(batch, blocks_per_seq)
            cache_shape = (batch * blocks_per_seq, BLOCK_SIZE, m.kv_heads, m.head_dim)
            k_cache, v_cache = randn(*cache_shape), randn(*cache_shape)
            q, lens_t, scale = randn(batch, m.heads, m.head_dim), torch.tensor(lens, device=dev), m.head_dim**-0.5
            visible = sum(n if window is None else min(n, window) for n in lens)
            cases.append(Case("paged_decode" + (f" (window {window})" if window else ""), f"B {batch}, context {context}",
                              lambda q=q, k=k_cache, v=v_cache, t=tables, n=lens, w=window:
                                  paged_attention.paged_decode_attention(q, k, v, t, n, scale=scale, sliding_window=w),
                              lambda q=q, k=k_cache, v=v_cache, t=tables, n=lens_t, w=window: _torch_paged_decode(q, k, v, t, n, scale, w),
                              lambda q=q, k=k_cache, v=v_cache, t=tables, n=lens, w=window: ref.ref_paged_attention(
                                  q.float().cpu(), k.float().cpu(), v.float().cpu(), t.cpu(), n, [1] * len(n), scale=scale, sliding_window=w),
                              tol(kt.ATTENTION), 2 * visible * m.kv_heads * m.head_dim * es + 2 * q.nbytes))

    layers = {"qkv": ((m.heads + 2 * m.kv_heads) * m.head_dim, m.hidden), "o": (m.hidden, m.heads * m.head_dim),
              "gate_up": (2 * m.ffn, m.hidden), "down": (m.hidden, m.ffn), "lm_head": (m.vocab, m.hidden)}
    for layer, (num_out, num_in) in layers.items():
        dense_weight = randn(num_out, num_in, std=num_in**-0.5)
        for qtype in ("q8_0", "q4_0"):
            qw = quant_matmul.quantize(dense_weight, qtype)
            for tokens in MLP_TOKENS:
                x = randn(tokens, num_in)
                cases.append(Case(f"quant_matmul {qtype}", f"{layer} [{tokens}, {num_in}] x [{num_out}, {num_in}]",
                                  lambda x=x, qw=qw: quant_matmul.quant_matmul(x, qw),
                                  lambda x=x, qw=qw: ref.ref_ggml_linear(x, qw.scales, qw.quants, qw.qtype),
                                  lambda x=x, qw=qw: ref.ref_ggml_linear(x.float(), qw.scales, qw.quants, qw.qtype),
                                  tol(kt.MATMUL), qw.nbytes + x.nbytes + tokens * num_out * es,
                                  dense=lambda x=x, w=dense_weight: F.linear(x, w)))
    return cases


def run_tests() -> dict:
    """The GPU cases of the Triton parity tests, in a subprocess: {"returncode", "summary"}."""
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests/kernels").glob("test_triton_*.py"))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *files],
                          cwd=ROOT, capture_output=True, text=True)
    lines = (done.stdout + done.stderr).strip().splitlines()
    print("\n".join(lines[-15:]))
    return {"returncode": done.returncode, "summary": lines[-1] if lines else ""}


def check(case: Case) -> tuple[bool, float]:
    """(within tolerance and finite, largest absolute error) of the Triton output against the float32 reference."""
    out = case.run().float().cpu()
    expected = case.expected().float().cpu()
    error = (out - expected).abs()
    atol, rtol = case.tolerance
    return bool(torch.isfinite(out).all() and (error <= atol + rtol * expected.abs()).all()), float(error.max())


def run_benchmarks(models: list[str], dtype: torch.dtype, warmup: int, repeats: int, inner: int) -> list[Row]:
    rows = []
    header = f"{'kernel':<28} {'model':<13} {'shape':<36} {'ref us':>9} {'triton us':>9} {'speedup':>7} {'GB/s':>7} {'max err':>9}  ok"
    print(header)
    for name in models:
        for case in model_cases(MODELS[name], dtype):
            ok, max_error = check(case)
            ref_us = time_us(case.reference, warmup, repeats, inner)
            triton_us = time_us(case.run, warmup, repeats, inner)
            dense_us = time_us(case.dense, warmup, repeats, inner) if case.dense else None
            row = Row(case.kernel, name, case.shape, str(dtype).removeprefix("torch."), ref_us, triton_us, ref_us / triton_us,
                      case.num_bytes / (triton_us * 1e-6) / 1e9, max_error, ok, dense_us)
            rows.append(row)
            dense = f"  dense {dense_us:.1f} us" if dense_us is not None else ""
            print(f"{row.kernel:<28} {name:<13} {row.shape:<36} {ref_us:>9.1f} {triton_us:>9.1f} {row.speedup:>6.2f}x "
                  f"{row.triton_gbps:>7.0f} {row.max_abs_error:>9.2e}  {'ok' if ok else 'FAIL'}{dense}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--inner", type=int, default=10, help="calls per timed repeat")
    parser.add_argument("--skip-tests", action="store_true", help="do not run the pytest parity cases first")
    parser.add_argument("--json", type=Path, help="write the rows and the environment to this file")
    args = parser.parse_args(argv)

    if not torch.cuda.is_available():
        print("benchmarks/gpu_kernels.py needs a CUDA device, and torch.cuda.is_available() is False here. "
              "On a CPU the kernels are checked under the Triton interpreter instead: "
              "python -m pytest tests/kernels/test_triton_*.py", file=sys.stderr)
        return 2
    import triton

    from kernels.triton.common import is_interpreting

    if is_interpreting():
        print("TRITON_INTERPRET is set: unset it to compile the kernels for the GPU", file=sys.stderr)
        return 2
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    print(", ".join(f"{k} {v}" for k, v in env.items()))
    tests = {"skipped": True} if args.skip_tests else run_tests()
    rows = run_benchmarks(args.models, getattr(torch, args.dtype), args.warmup, args.repeats, args.inner)
    failed = [r for r in rows if not r.ok]
    if args.json:
        args.json.write_text(json.dumps({**env, "dtype": args.dtype, "tests": tests, "rows": [asdict(r) for r in rows]}, indent=1))
    if failed or tests.get("returncode", 0) != 0:
        print(f"FAILED: {len(failed)} parity checks; tests: {tests.get('summary', 'skipped')}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
