"""Training checkpoints of `train_lora`: written atomically, found again for a bit-exact resume.

    out_dir/checkpoints/step-N/
        adapter/           peft `save_pretrained` (adapter_config.json, adapter_model.safetensors)
        optimizer.pt       AdamW state (torch.save)
        rng.pt             the torch CPU random state after step N (LoRA dropout draws from it)
        state.json         step, tokens, smoothed loss, the run's identity (config, data hash) and the epoch's order

A checkpoint is built in a temporary folder and renamed into place, so a crash mid-write leaves no
`step-N` folder; `latest_checkpoint` only sees complete ones.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

_STEP_DIR = re.compile(r"^step-(\d+)$")


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint folder; `state` is its state.json."""

    path: Path
    state: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.state["step"])

    @property
    def adapter_dir(self) -> Path:
        return self.path / "adapter"

    def load_optimizer(self) -> dict:
        return torch.load(self.path / "optimizer.pt", weights_only=False)

    def load_rng(self) -> torch.Tensor:
        return torch.load(self.path / "rng.pt", weights_only=False)


def replace_dir(tmp: Path, final: Path) -> None:
    """Move the finished folder `tmp` to `final`, replacing an older `final` (the swap is two renames)."""
    if final.exists():
        old = final.with_name(final.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


def save_checkpoint(root: Path, model, optimizer: torch.optim.Optimizer, state: dict[str, Any], *, keep: int) -> Path:
    """Write root/step-{state['step']} atomically and delete all but the newest `keep` checkpoints."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{state['step']}"
    tmp = root / f".tmp-step-{state['step']}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    model.save_pretrained(str(tmp / "adapter"))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(torch.get_rng_state(), tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps(state))
    replace_dir(tmp, final)
    for old in list_checkpoints(root)[:-keep] if keep > 0 else []:
        shutil.rmtree(old.path, ignore_errors=True)
    return final


def list_checkpoints(root: Path) -> list[Checkpoint]:
    """The complete checkpoints under `root`, oldest first."""
    found = []
    if root.is_dir():
        for path in root.iterdir():
            match = _STEP_DIR.match(path.name)
            state_file = path / "state.json"
            if match and state_file.is_file() and (path / "adapter").is_dir():
                found.append(Checkpoint(path, json.loads(state_file.read_text())))
    return sorted(found, key=lambda c: c.step)


def latest_checkpoint(root: Path) -> Checkpoint | None:
    checkpoints = list_checkpoints(root)
    return checkpoints[-1] if checkpoints else None
