"""Load a registered model: checkpoint -> `CausalLM` in the requested dtype, tokenizer, chat format.

A first load takes tens of seconds on a small CPU (reading and dequantizing every tensor), so it logs a line
when it starts (the file and its size) and one when the model is ready (the time taken and the resident size
of its weights) on the `serving.model_loader` logger, and reports its progress to an optional callback
(`progress(bytes read, total bytes)`), which `link chat` draws as a progress bar on stderr.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

import torch

from kernels.gguf_weight import has_native
from serving.config import ModelConfig
from serving.errors import ModelFileError, ServingError
from serving.loader.gguf_loader import open_gguf
from serving.loader.safetensors_loader import open_safetensors
from serving.models import build_model
from serving.models.base import CausalLM
from serving.registry import ModelSpec
from serving.text.chat_format import ChatFormat, InContextChatFormat, TemplateChatFormat
from serving.text.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

WEIGHT_FORMATS = ("auto", "packed", "float")
"""How `load_model` keeps a GGUF file's block-quantized matrices: "packed" as their blocks (`GGUFWeight`, computed
on in float32), "float" dequantized to the requested dtype, "auto" packed where the C++ GGUF matmul module loads."""

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def cpu_has_bf16() -> bool:
    """True when the CPU multiplies bf16 natively (AVX512_BF16 or AMX-BF16; Linux /proc/cpuinfo flags).

    Without it PyTorch emulates bf16 matmuls through fp32 conversions, which is slower than fp32.
    """
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def auto_dtype() -> torch.dtype:
    """The fastest safe dtype here: bf16 on a CUDA GPU or a CPU with native bf16, else fp32."""
    return torch.bfloat16 if torch.cuda.is_available() or cpu_has_bf16() else torch.float32


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """"float32"/"bfloat16"/"float16"/"auto" (see `auto_dtype`) or a torch dtype -> torch dtype.

    Raises:
        ServingError: any other name.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return auto_dtype()
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ServingError(f"unsupported dtype {dtype!r}; use one of auto, {', '.join(DTYPES)}") from None


@dataclass
class LoadedModel:
    """Everything needed to run one model.

    Attributes:
        context_length: tokens of prompt + output accepted (the registry's value, capped by the file's).
        load_seconds: wall time of `load_model`.
        weights: "packed" (the GGUF blocks kept, `kernels.gguf_weight.GGUFWeight`) or "float".
    """

    spec: ModelSpec
    config: ModelConfig
    model: CausalLM
    tokenizer: Tokenizer
    chat_format: ChatFormat
    dtype: torch.dtype
    context_length: int
    load_seconds: float
    weights: str = "float"

    @property
    def resident_bytes(self) -> int:
        """Bytes of the model's weights and buffers in memory, GGUF blocks included (tied weights counted once)."""
        tensors = {t.data_ptr(): t for t in (*self.model.parameters(), *self.model.buffers())}
        return sum(t.numel() * t.element_size() for t in tensors.values()) + sum(w.nbytes for w in self.model.packed_weights())


def is_packed(weights: str, is_gguf: bool) -> bool:
    """Whether `load_model` keeps a checkpoint's block-quantized matrices packed (see `WEIGHT_FORMATS`).

    Raises:
        ServingError: an unknown format, or "packed" for a checkpoint that is not GGUF.
    """
    if weights not in WEIGHT_FORMATS:
        raise ServingError(f"unsupported weights {weights!r}; use one of {', '.join(WEIGHT_FORMATS)}")
    if weights == "packed" and not is_gguf:
        raise ServingError("packed weights need a GGUF file; this checkpoint is safetensors")
    if weights == "auto":
        return is_gguf and has_native()
    return weights == "packed"


def load_model(spec: ModelSpec, dtype: str | torch.dtype = "float32",
               progress: Callable[[int, int], None] | None = None, weights: str = "auto") -> LoadedModel:
    """Read the checkpoint of `spec` (GGUF file or safetensors folder) and build the model.

    Args:
        dtype: the weights' and activations' dtype of a float model. A packed model computes in float32 whatever
            is asked (its `dtype` is float32, and so is its KV cache).
        weights: "auto", "packed" or "float" (`WEIGHT_FORMATS`, `is_packed`). "packed" without the C++ module
            computes on the PyTorch reference (exact, but it decodes every weight on every call: tests only).
        progress: called after each tensor is read with (bytes done, total bytes) of the checkpoint's tensor
            data (`GGUFCheckpoint.tensors`, `SafetensorsCheckpoint.tensors`): non-decreasing, ending at the total.
            A model joined from chunk packages on its first use reports that first, the same way (bytes written,
            file size), before the tensors' count starts again from 0.
    Raises:
        ModelFileError: missing/truncated/corrupt file, or an architecture different from `spec`'s.
        UnsupportedTensorTypeError, UnsupportedArchitectureError: the file cannot be run.
        ServingError: an unknown dtype or weights format ("packed" for a safetensors checkpoint included).
    """
    start = time.perf_counter()
    torch_dtype = parse_dtype(dtype)
    path = spec.resolve_path(progress)
    packed = is_packed(weights, not path.is_dir())
    if path.is_dir():
        ckpt = open_safetensors(path)
        tokenizer_dir = path if spec.tokenizer == "model" else spec.tokenizer
        tokenizer = Tokenizer.from_folder(tokenizer_dir)
    else:
        ckpt = open_gguf(path)
        tokenizer = Tokenizer.from_gguf(path, ckpt.metadata) if spec.tokenizer == "model" else Tokenizer.from_folder(spec.tokenizer)
    cfg = ckpt.config
    if cfg.architecture != spec.architecture:
        raise ModelFileError(f"{path} holds a {cfg.architecture} model but {spec.name!r} is registered as {spec.architecture}")
    if packed:
        asked, torch_dtype = torch_dtype, torch.float32
        logger.info("loading model %s from %s (%.1f MB of weights, packed GGUF blocks on %s, float32 activations%s)",
                    spec.name, path, ckpt.num_bytes / 1e6, "the C++ module" if has_native() else "the slow PyTorch reference",
                    "" if asked == torch.float32 else f"; {str(asked).removeprefix('torch.')} asked, float32 used")
        model = build_model(cfg, torch_dtype)
        model.load_weights(ckpt.tensors(progress, packed=True))
    else:
        logger.info("loading model %s from %s (%.1f MB of weights, %s)", spec.name, path, ckpt.num_bytes / 1e6,
                    str(torch_dtype).removeprefix("torch."))
        model = build_model(cfg, torch_dtype)
        model.load_weights(ckpt.tensors(progress))
    if spec.chat_format == "template":
        if not tokenizer.chat_template:
            raise ModelFileError(f"{spec.name!r} is registered with chat_format='template' but {path} has no chat template")
        chat_format: ChatFormat = TemplateChatFormat(tokenizer.chat_template, tokenizer.bos_token, tokenizer.eos_token)
    else:
        chat_format = InContextChatFormat()
    loaded = LoadedModel(
        spec=spec, config=cfg, model=model, tokenizer=tokenizer, chat_format=chat_format, dtype=torch_dtype,
        context_length=min(spec.context_length, cfg.context_length), load_seconds=time.perf_counter() - start,
        weights="packed" if packed else "float",
    )
    logger.info("model %s is ready: loaded in %.1f s, %.1f MB resident", spec.name, loaded.load_seconds,
                loaded.resident_bytes / 1e6)
    return loaded
