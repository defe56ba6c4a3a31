"""Merge a LoRA adapter into its base model and write a servable safetensors checkpoint with its provenance.

    folder = export_adapter(base_dir, run_dir / "adapter", Path("models/acme-tools"), name="acme-tools",
                            provenance={"data": {...}, "steps": 120, "metrics": {...}})
    link.model_registration.register_local_model(database_url, "acme-tools", folder)   # `link serve` serves it

The merged weight of every adapted layer is W + (alpha / r) B A (Hu et al. 2021, arXiv:2106.09685, section 4.1:
merging leaves no inference latency), computed by peft's `merge_and_unload` in fp32. The folder holds
config.json, model.safetensors (fp32, Hugging Face names, as serving.loader.safetensors_loader reads them),
the base's tokenizer files and provenance.json.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from posttrain.checkpoints import replace_dir
from posttrain.errors import ExportError, TrainingError

# Files copied from the base folder when present (export_hf_checkpoint writes the first four).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json",
                   "chat_template.jinja")


def merge_adapter(base_dir: str | Path, adapter_dir: str | Path):
    """The base model (transformers, fp32) with the adapter of `adapter_dir` merged into its weights.

    Raises:
        ExportError: base_dir is not a checkpoint folder, or adapter_dir holds no peft adapter.
    """
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from posttrain.base_model import check_hf_folder

    try:
        base_dir = check_hf_folder(base_dir)
    except TrainingError as exc:
        raise ExportError(str(exc)) from None
    adapter_dir = Path(adapter_dir)
    if not (adapter_dir / "adapter_config.json").is_file():
        raise ExportError(f"{adapter_dir} holds no LoRA adapter (adapter_config.json); pass the adapter/ folder "
                          "that train_lora wrote (out_dir/adapter or out_dir/checkpoints/step-N/adapter)")
    base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    return PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload().eval()


def export_adapter(base_dir: str | Path, adapter_dir: str | Path, out_dir: str | Path, *, name: str,
                   provenance: dict[str, Any]) -> Path:
    """Merge `adapter_dir` into `base_dir` and write the result to `out_dir` (created; must not exist or be empty).

    Args:
        base_dir: the Hugging Face folder the adapter was trained on.
        adapter_dir: a peft adapter folder (train_lora's out_dir/adapter).
        out_dir: the new model folder; written to a temporary folder first and renamed, so it is complete or absent.
        name: the model's name (recorded in provenance.json).
        provenance: what the caller knows: base model name, data description and hash, steps, training config,
            metrics. Stored as given (JSON-serialisable), beside the adapter's settings, the weights' SHA-256 and
            the creation time.
    Returns:
        out_dir as a Path.
    Raises:
        ExportError: out_dir exists and is not empty, or see `merge_adapter`.
    """
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out} already exists and is not empty; choose a new folder for the exported model")
    try:
        json.dumps(provenance)
    except TypeError as exc:
        raise ExportError(f"provenance must be JSON-serialisable: {exc}") from None
    from safetensors.torch import save_file

    model = merge_adapter(base_dir, adapter_dir)
    base_dir, adapter_dir = Path(base_dir), Path(adapter_dir)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    # Tied output embeddings are stored once, as export_hf_checkpoint does (safetensors refuses shared tensors).
    tensors = {k: v.detach().to(torch.float32).contiguous().clone() for k, v in model.state_dict().items()
               if not (tied and k == "lm_head.weight")}

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".tmp-{out.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    shutil.copyfile(base_dir / "config.json", tmp / "config.json")
    for filename in TOKENIZER_FILES:
        if (base_dir / filename).is_file():
            shutil.copyfile(base_dir / filename, tmp / filename)
    adapter = json.loads((adapter_dir / "adapter_config.json").read_text())
    record = {
        "name": name,
        "base_dir": str(base_dir.resolve()),
        "adapter_dir": str(adapter_dir.resolve()),
        "adapter": {k: adapter.get(k) for k in ("r", "lora_alpha", "lora_dropout", "target_modules")},
        "weights_sha256": _sha256(tmp / "model.safetensors"),
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **provenance,
    }
    (tmp / "provenance.json").write_text(json.dumps(record, indent=2, sort_keys=True))
    if out.exists():
        out.rmdir()  # empty, checked above
    replace_dir(tmp, out)
    return out


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
