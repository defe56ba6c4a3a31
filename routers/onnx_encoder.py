"""The sentence encoder through ONNX Runtime: a routing decision's one-prompt forward pass, same vectors.

    encoder = OnnxEncoder.load(model_dir, path, tokenizer, reference)       # exported on first use, checked
    vectors = encoder.encode(tokenizer, ["What is 2 + 2?"], max_length=256)      # [N, 384] float32, unit norm

A routing decision embeds one short prompt on one CPU thread (`routers.embedding`), where PyTorch's eager
BERT spends much of its time between operators. ONNX Runtime runs the same graph with its fusions (attention,
GELU, layer norm): measured 25 ms against 54 ms of CPU time per GSM8K question on one thread of the 2-core dev
machine (AMD EPYC, AVX2, float32, another job on the other core), with the same vectors (cosine 1.0, max
difference under 1e-5). The graph is exported once from the local Hugging Face weights with
`torch.onnx.export` and cached beside the embedding cache; what a sentence-transformers model adds on top
(mean pooling over the attention mask, L2 normalisation; Reimers & Gurevych 2019) is done here in numpy.

The export runs the model with eager attention: the SDPA path, traced by the TorchScript exporter, gave
vectors at cosine 0.87-0.96 of the real ones (measured). `load` checks every export against PyTorch on a probe
text and refuses one that differs (`OnnxExportMismatch`).

The export runs in a child process (`python -m routers.onnx_encoder MODEL_DIR OUT`): `torch.onnx.export`
traces with process-wide state, and transformers' model loading patches torch's initialisers for the whole
process, so exporting inside a gateway, beside its engine steps and other loads, is not safe.

int8 (`quantized=True`): the graph's weight matrix products (Q, K, V, attention output, both feed-forward
layers; 97% of the FLOPs of a 55-token prompt) with int8 weights, one scale per output channel, and activations quantized
per tensor at run time (ONNX Runtime's dynamic quantization; Jacob et al. 2018). The two products of
attention scores with activations stay float32. Measured on 1,000 real prompts, one thread of a 2-core AMD
EPYC (Zen 4, AVX512-VNNI; benchmarks/routing_latency.py): p50 6.9 ms against 15.5 ms in float32, vectors at cosine 0.9945 on average (min
0.980) of the float32 ones; a kNN router given them made the same choice for 97.2% of the prompts. The
vectors differ, so an int8 encoder keeps its own embedding cache (`routers.embedding.Embedder`).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
OPSET = 17
PROBE = "Route this: a probe sentence, with punctuation and digits 1234, checks the exported graph."
MAX_PROBE_ERROR = 1e-4      # max |exported - PyTorch| over the probe's unit vector (float32 reorderings: ~1e-6)
MIN_INT8_PROBE_COSINE = 0.97    # the int8 graph's probe vector against PyTorch's (measured: 0.98-1.0 on real prompts)
EXPORT_TIMEOUT_S = 600


class OnnxExportMismatch(RuntimeError):
    """The exported graph's vector for the probe text differs from PyTorch's."""


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """hidden [N, T, D] and mask [N, T] (1 = a real token) -> [N, D] float32 mean of the real tokens, L2-normalised."""
    weights = mask[..., None].astype(np.float32)
    mean = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
    return (mean / np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12)).astype(np.float32)


def export_onnx(model, tokenizer, path: Path) -> Path:
    """Export a loaded Hugging Face encoder (a sentence-transformers model's `auto_model`, float32) to `path`:
    inputs INPUTS [N, T] int64, output "last_hidden_state" [N, T, D] float32, N and T dynamic. The model runs
    with eager attention during the export and gets its own implementation back. Written to a temporary
    name and renamed, so a crash leaves no half file. Returns `path`. Callers outside this module's child
    process use `export_in_subprocess` (module docstring: why)."""
    import torch

    example = tokenizer([PROBE], return_tensors="pt")
    attention = model.config._attn_implementation

    class Hidden(torch.nn.Module):
        def __init__(self, encoder):
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                                token_type_ids=token_type_ids).last_hidden_state

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    dynamic = {name: {0: "batch", 1: "tokens"} for name in (*INPUTS, "last_hidden_state")}
    model.set_attn_implementation("eager")
    try:
        with torch.inference_mode(), warnings.catch_warnings():
            # the tracer's notes on Python-side shape checks and opset details; the probe check in `load` is the test
            warnings.simplefilter("ignore")
            torch.onnx.export(Hidden(model), tuple(example[name] for name in INPUTS), str(partial),
                              input_names=list(INPUTS), output_names=["last_hidden_state"], dynamic_axes=dynamic,
                              opset_version=OPSET, dynamo=False)
    finally:
        model.set_attn_implementation(attention)
    os.replace(partial, path)
    return path


def quantize_int8(source: Path, path: Path) -> Path:
    """Write the int8 form of the float32 graph at `source` to `path` (module docstring: which products, what
    scales), through a temporary name. Returns `path`.

    Raises:
        ModuleNotFoundError: onnxruntime's quantization tools or onnx are not installed."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = onnx.load(str(source))
    weights = {init.name for init in graph.graph.initializer}
    activation_products = [node.name for node in graph.graph.node
                           if node.op_type == "MatMul" and not any(name in weights for name in node.input)]
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_dynamic(str(source), str(partial), weight_type=QuantType.QInt8, per_channel=True,
                         op_types_to_quantize=["MatMul"], nodes_to_exclude=activation_products)
    os.replace(partial, path)
    return path


def float32_path(path: Path) -> Path:
    """The float32 graph an int8 graph at `path` (name ending "-int8.onnx") is quantized from."""
    return path.with_name(path.name.replace("-int8.onnx", ".onnx"))


def export_in_subprocess(model_dir: Path, path: Path, *, quantized: bool = False) -> Path:
    """Export the sentence-transformers model in `model_dir` to `path` in a child process (module docstring:
    why), and quantize it to int8 when `quantized` (the float32 graph is kept beside it). Returns `path`.

    Raises:
        RuntimeError: the child failed or ran past EXPORT_TIMEOUT_S; the message ends with its stderr.
    """
    command = [sys.executable, "-m", "routers.onnx_encoder", str(model_dir), str(path)] + (["--int8"] if quantized else [])
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S,
                              env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"exporting {model_dir} to ONNX took over {EXPORT_TIMEOUT_S} s") from None
    if done.returncode != 0 or not Path(path).is_file():
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"exporting {model_dir} to ONNX failed (exit {done.returncode}):\n{tail}")
    return Path(path)


class OnnxEncoder:
    """An ONNX Runtime session of the encoder, on `num_threads` intra-op threads (1: the caller's own thread).

    Raises:
        ModuleNotFoundError: onnxruntime is not installed.
    """

    def __init__(self, path: Path, num_threads: int = 1):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = num_threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.path = Path(path)
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    @classmethod
    def load(cls, model_dir: Path, path: Path, tokenizer, reference, *, quantized: bool = False,
             num_threads: int = 1) -> OnnxEncoder:
        """The encoder of the graph at `path`, exported from the model in `model_dir` first if missing
        (`export_in_subprocess`; int8 when `quantized`), and checked on a probe text.

        Args:
            model_dir: the sentence-transformers folder the graph is exported from.
            tokenizer: the model's Hugging Face tokenizer.
            reference: `texts -> [N, D]` unit vectors from PyTorch (the sentence-transformers model), for the check.
        Raises:
            OnnxExportMismatch: the probe vector differs from `reference`'s by more than MAX_PROBE_ERROR
                (float32), or is at cosine below MIN_INT8_PROBE_COSINE (int8).
            RuntimeError: the export failed. ModuleNotFoundError: onnxruntime is not installed.
        """
        if not Path(path).is_file():
            export_in_subprocess(Path(model_dir), Path(path), quantized=quantized)
        encoder = cls(path, num_threads)
        got, want = encoder.encode(tokenizer, [PROBE])[0], np.asarray(reference([PROBE]))[0]
        if quantized:
            cosine = float(got @ want)
            if cosine < MIN_INT8_PROBE_COSINE:
                raise OnnxExportMismatch(f"{path}: the int8 encoder's probe vector is at cosine {cosine:.4f} of "
                                         f"PyTorch's (at least {MIN_INT8_PROBE_COSINE} needed); delete the file to "
                                         "quantize it again")
            return encoder
        error = float(np.abs(got - want).max())
        if error > MAX_PROBE_ERROR:
            raise OnnxExportMismatch(f"{path}: the exported encoder's probe vector differs from PyTorch's by {error:.2e} "
                                     f"(allowed {MAX_PROBE_ERROR}); delete the file to export it again")
        return encoder

    def encode(self, tokenizer, texts: list[str], max_length: int = 256) -> np.ndarray:
        """[N, D] float32 L2-normalised mean-pooled embeddings of `texts`, each cut to `max_length` tokens
        (the sentence-transformers model's max_seq_length) and padded to the longest in the batch."""
        batch = tokenizer(list(texts), padding=True, truncation=True, max_length=max_length, return_tensors="np")
        feeds = {name: np.asarray(batch[name], dtype=np.int64) if name in batch
                 else np.zeros_like(batch["input_ids"], dtype=np.int64) for name in INPUTS}
        hidden = self.session.run(["last_hidden_state"], feeds)[0]
        return mean_pool(hidden, feeds["attention_mask"])


def main(argv: list[str] | None = None) -> None:
    """`python -m routers.onnx_encoder MODEL_DIR OUT [--int8]`: what `export_in_subprocess` runs."""
    parser = argparse.ArgumentParser(description="Export a sentence-transformers encoder to ONNX (float32 or int8).")
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--int8", action="store_true", help="quantize (the float32 graph is written beside OUT first)")
    args = parser.parse_args(argv)
    target = float32_path(args.out) if args.int8 else args.out
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # one export at a time per folder: two gateways' routers start together, and the quantizer writes its
    # shape-inferred copy of the source under a fixed name beside it (measured: the second one failed)
    with open(args.out.parent / ".onnx-export.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.is_file():
            from sentence_transformers import SentenceTransformer

            model = SentenceTransformer(str(args.model_dir), device="cpu", local_files_only=True)
            export_onnx(model[0].auto_model, model.tokenizer, target)
        if args.int8 and not args.out.is_file():
            quantize_int8(target, args.out)


if __name__ == "__main__":
    main()
