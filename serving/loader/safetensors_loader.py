"""Read a Hugging Face checkpoint folder: `config.json` plus one or more `*.safetensors` files.

Fine-tuned models (the post-training module's merged LoRA exports) arrive in this form. Tensor names
and layouts are already the Hugging Face ones our models load.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from serving.config import ModelConfig
from serving.errors import ModelFileError


@dataclass
class SafetensorsCheckpoint:
    """An opened checkpoint folder; `tensors()` reads the weights lazily, file by file."""

    path: Path
    config: ModelConfig
    files: list[Path]

    @property
    def num_bytes(self) -> int:
        """Bytes of the safetensors files (headers included)."""
        return sum(file.stat().st_size for file in self.files)

    def tensors(self, progress: Callable[[int, int], None] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (Hugging Face name, float32 tensor) for every tensor of every shard.

        Args:
            progress: called after each tensor with (bytes read so far, `num_bytes`): the stored size of the
                tensors read, and at the end of each shard the files' sizes so far (their headers counted), so
                the last call has done == total.
        """
        from safetensors import safe_open

        total, done_files = self.num_bytes, 0
        for file in self.files:
            try:
                with safe_open(str(file), framework="pt") as f:
                    done = done_files
                    for name in f.keys():
                        tensor = f.get_tensor(name)
                        done += tensor.numel() * tensor.element_size()
                        if progress is not None:
                            progress(min(done, done_files + file.stat().st_size), total)
                        yield name, tensor.float()
            except (OSError, ValueError, RuntimeError) as exc:
                raise ModelFileError(f"cannot read {file}: {exc}; the file may be truncated") from exc
            done_files += file.stat().st_size
            if progress is not None:
                progress(done_files, total)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.tensors())


def open_safetensors(path: str | os.PathLike) -> SafetensorsCheckpoint:
    """Open a folder holding `config.json` and `*.safetensors` (sharded or not).

    Raises:
        ModelFileError: the folder, its config.json or its safetensors files are missing or unreadable.
        UnsupportedArchitectureError: config.json names an architecture we do not implement.
    """
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelFileError(f"no config.json in {path}; a safetensors checkpoint is a folder with config.json and *.safetensors")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelFileError(f"no *.safetensors files in {path}")
    try:
        cfg = json.loads(config_file.read_text())
    except json.JSONDecodeError as exc:
        raise ModelFileError(f"{config_file} is not valid JSON: {exc}") from exc
    return SafetensorsCheckpoint(path=path, config=ModelConfig.from_hf_config(cfg), files=files)
