"""The settings of one LoRA fine-tuning run (posttrain.train.train_lora), checked where they are built, and the
learning-rate schedule they define.

    config = LoraTrainConfig(rank=16, alpha=32, batch_size=4, max_seq_length=1024)
    config.scaling            # alpha / rank = 2.0
    config.lr_at(0, 100)      # the first warmup step's learning rate
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraTrainConfig:
    """Settings of one LoRA run (CPU-friendly defaults for a ~100M-parameter model).

    Attributes:
        rank, alpha, dropout: LoRA r, alpha (the update is scaled by alpha / r) and dropout on the adapter input.
        target_modules: names of the linear layers that get an adapter.
        init_lora_weights: True = B zero (the adapter starts as a no-op); False = B random too (tests only).
        num_adapted_layers: adapt only the last N decoder layers (None = all). Fewer is faster: no gradient flows
            below the lowest adapted layer, so the backward pass stops there.
        learning_rate: peak AdamW learning rate; weight_decay: AdamW decoupled weight decay.
        epochs: passes over the training set; max_steps: stop earlier (None = all steps of all epochs).
        batch_size: sequences per optimizer step; micro_batch_tokens: padded tokens per forward pass at most
            (rows x longest row; the step's sequences are accumulated over as many passes as that takes). Peak
            memory grows with it: SmolLM2-135M in fp32 peaked at 12.7 GB with 4096, so the default is 2048.
        max_seq_length: tokens per example at most; longer ones are handled by `overlong`: "error" (refuse before
            training), "drop" (leave them out) or "truncate" (keep the first max_seq_length tokens).
        warmup_ratio: share of the steps with a linear warmup from 0; schedule: "cosine", "linear" or "constant"
            decay afterwards, down to min_lr_ratio x learning_rate.
        max_grad_norm: clip the global L2 norm of the adapter gradients to this (0 = no clipping).
        seed: LoRA initialisation, dropout and data order.
        dtype: "auto" (bfloat16 where the CPU multiplies bf16 natively, see serving.model_loader.cpu_has_bf16, or
            on a GPU; else float32), "float32" or "bfloat16"; the base weights' dtype (adapters stay fp32).
        checkpoint_every: steps between checkpoints (0 = none but the end); keep_checkpoints: how many to keep.
        eval_every: steps between validation passes besides each epoch's end (0 = only at epoch ends).
    """

    rank: int = 16
    alpha: float = 32
    dropout: float = 0.0
    target_modules: tuple[str, ...] = DEFAULT_TARGETS
    init_lora_weights: bool = True
    num_adapted_layers: int | None = None
    # 5e-4 with 4 sequences per step: on BFCL with SmolLM2-135M, 2e-4 with 8 left the first reply token (call or
    # no call) near 50/50 after one epoch (+9.9 AST points); 5e-4 with 4 learned it (+26.8).
    learning_rate: float = 5e-4
    weight_decay: float = 0.0
    epochs: int = 1
    max_steps: int | None = None
    batch_size: int = 4
    micro_batch_tokens: int = 2048
    max_seq_length: int = 1024
    overlong: str = "error"
    warmup_ratio: float = 0.03
    schedule: str = "cosine"
    min_lr_ratio: float = 0.1
    max_grad_norm: float = 1.0
    seed: int = 0
    dtype: str = "auto"
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    eval_every: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_modules", tuple(self.target_modules))
        positive = {"rank": self.rank, "alpha": self.alpha, "learning_rate": self.learning_rate, "epochs": self.epochs,
                    "batch_size": self.batch_size, "micro_batch_tokens": self.micro_batch_tokens,
                    "max_seq_length": self.max_seq_length}
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"LoraTrainConfig.{name} must be positive, got {value}")
        if self.num_adapted_layers is not None and self.num_adapted_layers < 1:
            raise ValueError(f"LoraTrainConfig.num_adapted_layers must be at least 1 (or None for all), got {self.num_adapted_layers}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"LoraTrainConfig.max_steps must be at least 1 (or None for all epochs), got {self.max_steps}")
        for name in ("checkpoint_every", "eval_every", "weight_decay", "max_grad_norm"):
            if getattr(self, name) < 0:
                raise ValueError(f"LoraTrainConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.keep_checkpoints < 1:
            raise ValueError(f"LoraTrainConfig.keep_checkpoints must be at least 1, got {self.keep_checkpoints}")
        if not 0 <= self.dropout < 1 or not 0 <= self.warmup_ratio < 1 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError("LoraTrainConfig: dropout and warmup_ratio must lie in [0, 1), min_lr_ratio in [0, 1]")
        if not self.target_modules:
            raise ValueError("LoraTrainConfig.target_modules is empty; name the linear layers to adapt, e.g. q_proj")
        choices = {"overlong": ("error", "drop", "truncate"), "schedule": ("cosine", "linear", "constant"),
                   "dtype": ("auto", "float32", "bfloat16")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"LoraTrainConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")

    @property
    def scaling(self) -> float:
        """alpha / rank: the factor of the low-rank update B A."""
        return self.alpha / self.rank

    def torch_dtype(self) -> torch.dtype:
        """The base weights' dtype `dtype` resolves to here."""
        if self.dtype == "auto":
            from serving.model_loader import auto_dtype

            return auto_dtype()
        return {"float32": torch.float32, "bfloat16": torch.bfloat16}[self.dtype]

    def lr_at(self, step: int, total_steps: int) -> float:
        """Learning rate of optimizer step `step` (0-based) of `total_steps`."""
        warmup = math.ceil(self.warmup_ratio * total_steps)
        if step < warmup:
            return self.learning_rate * (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        if self.schedule == "cosine":
            decay = 0.5 * (1 + math.cos(math.pi * progress))
        elif self.schedule == "linear":
            decay = 1 - progress
        else:
            decay = 1.0
        return self.learning_rate * (self.min_lr_ratio + (1 - self.min_lr_ratio) * decay)
