"""Read a GGUF file: metadata -> `ModelConfig`, tensors -> a Hugging Face-named float state dict.

GGUF (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md) stores key/value metadata and
tensors, possibly block-quantized. We read it with the `gguf` package, dequantize with
`serving.loader.dequant` and rename/re-layout tensors to the Hugging Face convention, so one model
implementation serves both GGUF and safetensors checkpoints:

- Llama: llama.cpp's converter permutes the rows of the q/k projections from the half-split RoPE
  layout to the interleaved one; we undo that permutation. Qwen2 files keep the half-split layout
  (llama.cpp runs them with NeoX-style RoPE), so their rows are read as stored.
- Gemma 3: the converter stores RMSNorm scales as (1 + w); Hugging Face keeps w. We subtract 1.

`tensors(packed=True)` keeps the block-quantized matrices as their blocks (`kernels.gguf_weight.GGUFWeight`)
instead of float32: the Llama permutation then moves whole rows of blocks, which is exact.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from kernels.gguf_weight import PACKED_TYPES, GGUFWeight
from serving.config import ModelConfig
from serving.errors import ModelFileError, UnsupportedArchitectureError
from serving.loader.dequant import dequantize, tensor_nbytes

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Norm names whose meaning differs between the two architectures.
_LLAMA_NORMS = {"ffn_norm": "post_attention_layernorm"}
_GEMMA3_NORMS = {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_tensor_name(gguf_name: str, architecture: str) -> str:
    """Map a GGUF tensor name (`blk.3.attn_q.weight`) to its Hugging Face name.

    Raises:
        ModelFileError: a tensor name this architecture does not have.
    """
    stem, _, suffix = gguf_name.rpartition(".")
    if stem in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[stem]}.{suffix}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk":
        names = {**_LAYER_NAMES, **(_GEMMA3_NORMS if architecture == "gemma3" else _LLAMA_NORMS)}
        if parts[2] in names:
            return f"model.layers.{parts[1]}.{names[parts[2]]}.{suffix}"
    raise ModelFileError(f"unexpected tensor {gguf_name!r} in a {architecture} GGUF file")


def unpermute_rope_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation (interleaved RoPE pairs -> half-split halves).

    Args:
        weight: [num_heads * D, E] projection as stored in GGUF.
    Returns:
        [num_heads * D, E] in the Hugging Face layout.
    """
    rows, cols = weight.shape
    head_dim = rows // num_heads
    return weight.reshape(num_heads, head_dim // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def _unpermute(weight: torch.Tensor | GGUFWeight, num_heads: int) -> torch.Tensor | GGUFWeight:
    """`unpermute_rope_rows` of a float weight, or of a packed one by moving whole rows of blocks (exact)."""
    if isinstance(weight, torch.Tensor):
        return unpermute_rope_rows(weight, num_heads)
    order = unpermute_rope_rows(torch.arange(weight.out_features)[:, None], num_heads)[:, 0]
    return weight.take_rows(order)


def _packed(t, shape: tuple[int, int]) -> GGUFWeight:
    """The blocks of a 2-D block-type GGUF tensor `t` of torch shape [N, K], copied out of the file's map.

    Raises:
        ModelFileError: the data does not hold N rows of K weights (a truncated or corrupt file).
    """
    rows, cols = shape
    expected = tensor_nbytes(t.tensor_type, shape)
    if int(t.data.nbytes) != expected:
        raise ModelFileError(f"tensor {t.name!r}: {t.tensor_type.name} data of shape {shape} needs {expected} bytes "
                             f"but {int(t.data.nbytes)} were found (truncated or corrupt model file?)")
    blocks = torch.from_numpy(np.array(t.data, dtype=np.uint8, copy=True).reshape(rows, -1))
    return GGUFWeight.from_blocks(blocks, int(t.tensor_type), cols)


@dataclass
class GGUFCheckpoint:
    """An opened GGUF file. Tensors are read lazily by `state_dict()`.

    Attributes:
        path: the file.
        metadata: every key/value pair, values as Python objects (token lists excluded).
        config: the architecture hyperparameters.
    """

    path: Path
    metadata: dict[str, Any]
    config: ModelConfig
    _reader: Any = field(repr=False)

    @property
    def num_bytes(self) -> int:
        """Bytes of tensor data in the file (quantized blocks as stored)."""
        return sum(int(t.n_bytes) for t in self._reader.tensors)

    def tensors(self, progress: Callable[[int, int], None] | None = None,
                packed: bool = False) -> Iterator[tuple[str, torch.Tensor | GGUFWeight]]:
        """Yield (Hugging Face name, tensor in the Hugging Face layout) for every tensor.

        Args:
            progress: called after each tensor is read with (bytes read so far, `num_bytes`), both in
                bytes of the file's tensor data; the last call has done == total.
            packed: keep each 2-D tensor of a block type (`kernels.gguf_weight.PACKED_TYPES`: Q4_0 to Q8_0,
                Q4_K to Q6_K) as its blocks, a `GGUFWeight` (copied out of the file; llama q/k rows permuted
                with their blocks); every other tensor is float32 as without it.
        """
        cfg = self.config
        total, done = self.num_bytes, 0
        for t in self._reader.tensors:
            name = hf_tensor_name(t.name, cfg.architecture)
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            if packed and len(shape) == 2 and int(t.tensor_type) in PACKED_TYPES:
                w = _packed(t, shape)
            else:
                w = dequantize(t.data, t.tensor_type, shape, name=t.name)
            if cfg.architecture == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
                w = _unpermute(w, cfg.num_heads if name.endswith("q_proj.weight") else cfg.num_kv_heads)
            elif cfg.architecture == "gemma3" and name.endswith("norm.weight"):
                w = w - 1.0
            done += int(t.n_bytes)
            if progress is not None:
                progress(done, total)
            yield name, w

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every tensor by Hugging Face name, float32."""
        return dict(self.tensors())


def _field_value(f) -> Any:
    value = f.contents()
    if isinstance(value, np.generic):
        value = value.item()
    return value


def open_gguf(path: str | os.PathLike) -> GGUFCheckpoint:
    """Open a GGUF file and read its metadata and tensor index.

    Raises:
        ModelFileError: the file is missing, not GGUF, or truncated (tensor data past its end).
        UnsupportedArchitectureError: `general.architecture` is not llama, qwen2 or gemma3.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"model file not found: {path}")
    size = path.stat().st_size
    try:
        reader = _open_reader(path)
    except _PastEndOfFile as exc:
        raise ModelFileError(
            f"{path} is truncated: its header or tensor data needs byte {exc.args[0]} but the file has {size} bytes; "
            "re-download or re-assemble it"
        ) from None
    except Exception as exc:  # the gguf package raises ValueError/IndexError/etc. on corrupt headers
        raise ModelFileError(f"{path} is not a readable GGUF file ({type(exc).__name__}: {exc}); re-download or re-assemble it") from exc
    for t in reader.tensors:
        end = int(t.data_offset) + tensor_nbytes(t.tensor_type, tuple(reversed(t.shape.tolist())))
        if end > size:
            raise ModelFileError(
                f"{path} is truncated: tensor {t.name!r} ends at byte {end} but the file has {size} bytes; "
                "re-download or re-assemble it"
            )
    metadata = {k: _field_value(f) for k, f in reader.fields.items()
                if not k.startswith("GGUF.") and k not in _LARGE_TOKENIZER_KEYS}
    return GGUFCheckpoint(path=path, metadata=metadata, config=config_from_gguf(metadata, reader), _reader=reader)


class _PastEndOfFile(Exception):
    """A read of the GGUF header or of a tensor's data that ends past the end of the file (args: that end)."""


def _open_reader(path: Path):
    """A `gguf.GGUFReader` whose reads past the end of the file raise `_PastEndOfFile`.

    GGUFReader slices a memmap for every header field and tensor; on a truncated file the slice comes back
    short and fails later with an unrelated error ("cannot reshape array ..."), so we check where each read ends.
    """
    from gguf import GGUFReader

    class SizeCheckedReader(GGUFReader):
        def _get(self, offset, dtype, count=1, override_order=None):
            end = int(offset) + int(count) * np.dtype(dtype).itemsize
            if end > len(self.data):
                raise _PastEndOfFile(end)
            return super()._get(offset, dtype, count, override_order)

    return SizeCheckedReader(path)


_LARGE_TOKENIZER_KEYS = {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"}


def config_from_gguf(md: dict[str, Any], reader) -> ModelConfig:
    """Build a `ModelConfig` from GGUF metadata (llama.cpp key names: `{arch}.block_count`, ...).

    Gemma 3 files carry no sliding-window pattern; like llama.cpp we use every 6th layer global.
    """
    arch = md.get("general.architecture")
    if arch not in ("llama", "qwen2", "gemma3"):
        raise UnsupportedArchitectureError(f"GGUF architecture {arch!r} is not supported; supported: llama, qwen2, gemma3")

    def key(name: str, default: Any = None) -> Any:
        return md.get(f"{arch}.{name}", default)

    heads = key("attention.head_count")
    hidden = key("embedding_length")
    tensor_names = {t.name for t in reader.tensors}
    vocab = key("vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    scaling = key("rope.scaling.factor", 1.0) if key("rope.scaling.type", "linear") == "linear" else 1.0
    return ModelConfig(
        architecture=arch,
        vocab_size=int(vocab),
        hidden_size=int(hidden),
        intermediate_size=int(key("feed_forward_length")),
        num_layers=int(key("block_count")),
        num_heads=int(heads),
        num_kv_heads=int(key("attention.head_count_kv", heads)),
        head_dim=int(key("attention.key_length") or key("rope.dimension_count") or hidden // heads),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        context_length=int(key("context_length", 2048)),
        tie_word_embeddings="output.weight" not in tensor_names,
        rope_scaling_factor=float(scaling or 1.0),
        rope_local_theta=10000.0 if arch == "gemma3" else None,
        sliding_window=int(key("attention.sliding_window")) if arch == "gemma3" and key("attention.sliding_window") else None,
        sliding_window_pattern=6 if arch == "gemma3" else None,
        query_pre_attn_scalar=float(key("attention.key_length")) if arch == "gemma3" else None,
        qkv_bias=arch == "qwen2",
    )
