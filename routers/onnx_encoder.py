"""The sentence encoder through ONNX Runtime: a routing decision's one-prompt forward pass, same vectors.

    encoder = OnnxEncoder.load(hf_model, path, tokenizer, reference)        # exported on first use, checked
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
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
OPSET = 17
PROBE = "Route this: a probe sentence, with punctuation and digits 1234, checks the exported graph."
MAX_PROBE_ERROR = 1e-4      # max |exported - PyTorch| over the probe's unit vector (float32 reorderings: ~1e-6)


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
    name and renamed, so a crash leaves no half file. Returns `path`.

    The loaded model is reused rather than loaded again: transformers' loading is not thread-safe (two
    threads loading at once left another test's models with meta or uninitialised weights)."""
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
    def load(cls, model, path: Path, tokenizer, reference, *, num_threads: int = 1) -> OnnxEncoder:
        """The encoder of the graph at `path`, exported from `model` (`export_onnx`) first if missing, and checked.

        Args:
            model: the loaded Hugging Face encoder (float32).
            tokenizer: the model's Hugging Face tokenizer.
            reference: `texts -> [N, D]` unit vectors from PyTorch (the sentence-transformers model), for the check.
        Raises:
            OnnxExportMismatch: the graph's probe vector differs from `reference`'s by more than MAX_PROBE_ERROR.
            ModuleNotFoundError: onnxruntime (or, to export, onnx) is not installed.
        """
        if not Path(path).is_file():
            export_onnx(model, tokenizer, Path(path))
        encoder = cls(path, num_threads)
        error = float(np.abs(encoder.encode(tokenizer, [PROBE]) - np.asarray(reference([PROBE]))).max())
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
