"""The base model of a fine-tune as a Hugging Face checkpoint folder (what `transformers` and `peft` load).

    base_dir = resolve_base("smollm2-135m-instruct")   # a registry name, a .gguf file or a HF folder

A GGUF model is converted once with our converter (`serving.loader.hf_export.export_hf_checkpoint`: the
dequantized GGUF tensors, fp32) into `$LINK_HOME/cache/hf/<name>-<key>/`, keyed by the file's path, size and
modification time, and reused afterwards.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from posttrain.checkpoints import replace_dir
from posttrain.errors import TrainingError


def check_hf_folder(path: str | Path) -> Path:
    """`path` if it is a Hugging Face checkpoint folder (config.json and *.safetensors).

    Raises:
        TrainingError: the folder is missing or lacks config.json or safetensors weights.
    """
    path = Path(path).expanduser()
    hint = ("pass a local model name (see `link models`), a .gguf file, or a folder written by "
            "serving.loader.hf_export.export_hf_checkpoint")
    if not path.is_dir():
        raise TrainingError(f"base model folder {path} not found; {hint}")
    if not (path / "config.json").is_file() or not any(path.glob("*.safetensors")):
        raise TrainingError(f"{path} is not a Hugging Face checkpoint folder (config.json and *.safetensors); {hint}")
    return path


def resolve_base(base: str | Path) -> Path:
    """The Hugging Face folder of a local base model.

    Args:
        base: a registry name (serving.registry.default_registry), a .gguf file or a Hugging Face folder.
    Returns:
        a folder with config.json, model.safetensors and the tokenizer files.
    Raises:
        TrainingError: `base` is not a local model (not a registry name, .gguf file or checkpoint folder).
    """
    from serving.errors import ServingError
    from serving.registry import default_registry

    path = Path(base).expanduser()
    if path.is_dir():
        return check_hf_folder(path)
    if not path.is_file():
        registry = default_registry()
        try:
            path = registry.get(str(base)).resolve_path()
        except ServingError as exc:
            names = ", ".join(spec.name for spec in registry)
            raise TrainingError(f"base model {str(base)!r} is not local: not a local model name ({names}), "
                                f"not a .gguf file and not a Hugging Face checkpoint folder ({exc})") from None
        if path.is_dir():
            return check_hf_folder(path)
    if path.suffix != ".gguf":
        raise TrainingError(f"base model file {path} is not a .gguf file; pass a .gguf file or a checkpoint folder")
    return _exported(path)


def _exported(gguf: Path) -> Path:
    from serving.loader.hf_export import export_hf_checkpoint
    from serving.paths import cache_dir

    stat = gguf.resolve().stat()
    key = hashlib.sha256(f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    final = cache_dir("hf") / f"{gguf.stem}-{key}"
    if (final / "config.json").is_file():
        return final
    tmp = final.with_name(f".tmp-{final.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    export_hf_checkpoint(gguf, tmp)
    replace_dir(tmp, final)
    return final
