"""LoRA supervised fine-tuning on tokenized examples, loss on the assistant's tokens only.

    config = LoraTrainConfig(rank=16, alpha=32, batch_size=4, max_seq_length=1024)
    result = train_lora(resolve_base("smollm2-135m-instruct"), train, val, Path("runs/sft"), config)
    result.adapter_dir        # out_dir/adapter (peft save_pretrained); merge it with posttrain.export

LoRA (Hu et al. 2021, arXiv:2106.09685): each target linear layer computes W x + (alpha / r) B A x with the base
W frozen, A [r, in] random and B [out, r] zero at the start (so the untrained model is the base model); only A
and B are trained, here with AdamW (Loshchilov & Hutter 2019) under a linear warmup and cosine (or linear) decay,
gradient-norm clipping, and gradient accumulation of micro-batches up to `batch_size` sequences per step. The
loss of a step is the mean cross-entropy over all its target tokens (labels != -100), whatever the micro-batching.

Files in out_dir: train_log.jsonl (one line per step: step, epoch, loss, lr, tokens, tokens_per_s; and one per
validation: step, val_loss), checkpoints/step-N/ (posttrain/checkpoints.py; the run resumes from the newest
one bit-exactly), adapter/ and result.json at the end.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import resource
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from posttrain.base_model import check_hf_folder
from posttrain.batching import IGNORE_INDEX, TokenizedExample, collate, epoch_batches, micro_batches
from posttrain.checkpoints import latest_checkpoint, replace_dir, save_checkpoint
from posttrain.errors import TrainingError

logger = logging.getLogger(__name__)
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Fields that change how often things are written, not what is computed: a resumed run may change them.
_BOOKKEEPING = ("checkpoint_every", "keep_checkpoints", "eval_every")


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


@dataclass(frozen=True)
class TrainResult:
    """What a run did. Losses are mean cross-entropy per target token (nats); tokens count non-padding inputs."""

    steps: int
    epochs: float
    final_loss: float | None  # smoothed training loss at the last step (exponential moving average, 0.9)
    val_loss: float | None  # the last validation pass (None without a validation set)
    tokens: int
    tokens_per_s: float  # over the optimizer steps of this call (validation and checkpoints not counted)
    wall_s: float
    peak_rss_mb: float  # the process's peak resident memory (getrusage ru_maxrss)
    dtype: str
    adapter_dir: Path
    num_train: int
    num_dropped: int  # examples left out by overlong="drop" or without any target token
    resumed_from: int | None  # the checkpoint step this call continued from

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "adapter_dir": str(self.adapter_dir)}


def _prepare(examples: Sequence[TokenizedExample] | None, config: LoraTrainConfig, what: str) -> tuple[list, int]:
    """Check and cut examples: a list of (input_ids, labels) lists and the number dropped.

    Raises:
        TrainingError: mismatched lengths, or examples over max_seq_length with overlong="error".
    """
    kept, dropped, too_long = [], 0, []
    for i, e in enumerate(examples or ()):
        ids, labels = list(e.input_ids), list(e.labels)
        if len(ids) != len(labels):
            raise TrainingError(f"{what} example {i}: {len(ids)} input_ids but {len(labels)} labels; they must match")
        if len(ids) > config.max_seq_length:
            if config.overlong == "error":
                too_long.append(len(ids))
                continue
            if config.overlong == "drop":
                dropped += 1
                continue
            ids, labels = ids[:config.max_seq_length], labels[:config.max_seq_length]
        if all(label == IGNORE_INDEX for label in labels[1:]):  # nothing to predict (label 0 has no context)
            dropped += 1
            continue
        kept.append(_Example(ids, labels))
    if too_long:
        raise TrainingError(f"{len(too_long)} {what} examples are longer than max_seq_length={config.max_seq_length} "
                            f"(longest {max(too_long)} tokens); raise max_seq_length or set overlong='drop' or 'truncate'")
    return kept, dropped


@dataclass(frozen=True)
class _Example:
    input_ids: list[int]
    labels: list[int]


def _data_hash(examples: list[_Example]) -> str:
    digest = hashlib.sha256()
    for e in examples:
        digest.update(json.dumps([e.input_ids, e.labels]).encode())
    return digest.hexdigest()


def lora_model(base_dir: str | Path, config: LoraTrainConfig, dtype: torch.dtype = torch.float32):
    """The base model of `base_dir` (transformers, `dtype`) wrapped by peft with `config`'s fresh LoRA adapters.

    Only the adapters require gradients. The initialisation draws from torch's global RNG (seed it first).
    Raises:
        TrainingError: transformers cannot load the folder, or no layer matches `config.target_modules`.
    """
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    try:
        base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=dtype)
    except (OSError, ValueError) as exc:
        raise TrainingError(f"transformers cannot load the base model in {base_dir}: {exc}") from exc
    num_layers = base.config.num_hidden_layers
    if config.num_adapted_layers is not None and config.num_adapted_layers > num_layers:
        raise TrainingError(f"num_adapted_layers={config.num_adapted_layers} but {base_dir} has {num_layers} layers")
    layers = None if config.num_adapted_layers is None else list(range(num_layers - config.num_adapted_layers, num_layers))
    lora = LoraConfig(r=config.rank, lora_alpha=config.alpha, lora_dropout=config.dropout, bias="none",
                      target_modules=list(config.target_modules), init_lora_weights=config.init_lora_weights,
                      layers_to_transform=layers, task_type="CAUSAL_LM")
    try:
        model = get_peft_model(base, lora)
    except ValueError as exc:
        raise TrainingError(f"target_modules {list(config.target_modules)} do not fit {base_dir}: {exc}") from exc
    return model


def _token_losses(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(sum of the cross-entropy of every target token (fp32 scalar), number of target tokens).

    Position t predicts token t+1; the output projection runs only on positions with a target, which saves the
    [B, T, vocab] logits of prompt and padding positions (most of them in tool-call traces).
    """
    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    targets = labels[:, 1:]
    keep = targets != IGNORE_INDEX
    logits = model.get_output_embeddings()(hidden[:, :-1][keep]).float()
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return F.cross_entropy(logits, targets[keep], reduction="sum"), int(keep.sum())


def train_step(model, optimizer: torch.optim.Optimizer, batch: Sequence[TokenizedExample], lr: float, *,
               micro_batch_tokens: int, max_grad_norm: float) -> tuple[float, int]:
    """One optimizer step on `batch`, accumulating gradients over micro-batches of at most `micro_batch_tokens`
    padded tokens; the loss is the mean over all the batch's target tokens, as one pass over the batch would give.

    Returns:
        (the step's loss in nats per target token, the number of non-padding input tokens).
    """
    device = next(model.parameters()).device
    lengths = [len(e.input_ids) for e in batch]
    order = sorted(range(len(batch)), key=lambda i: -lengths[i])
    num_targets = sum(sum(1 for x in e.labels[1:] if x != IGNORE_INDEX) for e in batch)
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss_total, num_tokens = 0.0, 0
    for part in micro_batches(order, lengths, micro_batch_tokens):
        ids, mask, labels = (t.to(device) for t in collate([batch[i] for i in part]))
        loss_sum, _ = _token_losses(model, ids, mask, labels)
        (loss_sum / num_targets).backward()
        loss_total += loss_sum.detach().item()
        num_tokens += int(mask.sum())
    if max_grad_norm > 0:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_total / num_targets, num_tokens


def evaluate_loss(model, examples: Sequence[TokenizedExample], micro_batch_tokens: int) -> float:
    """Mean cross-entropy per target token of `examples` (nats), dropout off."""
    lengths = [len(e.input_ids) for e in examples]
    order = sorted(range(len(examples)), key=lambda i: -lengths[i])
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    device = next(model.parameters()).device
    with torch.no_grad():
        for part in micro_batches(order, lengths, micro_batch_tokens):
            ids, mask, labels = (t.to(device) for t in collate([examples[i] for i in part]))
            loss_sum, n = _token_losses(model, ids, mask, labels)
            total, count = total + float(loss_sum), count + n
    model.train(was_training)
    return total / max(count, 1)


def _progress(enabled: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]}"),
                    TextColumn("{task.fields[tps]} tok/s"), TimeElapsedColumn(), TextColumn("ETA"),
                    TimeRemainingColumn(), disable=not enabled)


def _rewrite_log(path: Path, upto_step: int) -> None:
    """Keep only the log lines of steps <= upto_step (a resumed run rewrites what came after its checkpoint)."""
    if not path.exists():
        return
    lines = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= upto_step]
    path.write_text("".join(line + "\n" for line in lines))


def train_lora(base_dir: str | Path, train: Sequence[TokenizedExample], val: Sequence[TokenizedExample] | None,
               out_dir: str | Path, config: LoraTrainConfig, *, resume: bool = True, progress: bool = True) -> TrainResult:
    """Train a LoRA adapter on `train`; see the module docstring for the method and the files written.

    Args:
        base_dir: a Hugging Face checkpoint folder (posttrain.base_model.resolve_base gives one for a GGUF model).
        train, val: examples with `input_ids` and `labels` (same length, -100 = no loss), e.g.
            posttrain.dataset.Example; `val` may be None or empty (no validation loss).
        out_dir: created if needed; holds the log, checkpoints, adapter/ and result.json.
        config: the run's settings.
        resume: continue from the newest checkpoint in out_dir (which must come from the same config and data);
            False starts over, deleting out_dir's checkpoints and log.
        progress: show a Rich progress bar (step/total, smoothed loss, tokens/s, elapsed, ETA).
    Returns:
        TrainResult (also written to out_dir/result.json).
    Raises:
        TrainingError, before any training step: no usable training example, examples over max_seq_length,
        a base_dir that is missing or not a checkpoint folder, target modules the model lacks, or checkpoints in
        out_dir from another config or data set.
    """
    started = time.perf_counter()
    base_dir = check_hf_folder(base_dir)
    train_set, num_dropped = _prepare(train, config, "training")
    if not train_set:
        raise TrainingError("the training set is empty" + (f" ({num_dropped} examples dropped: over max_seq_length or "
                            "without assistant tokens)" if num_dropped else "") + "; nothing to train on")
    val_set, _ = _prepare(val, dataclasses.replace(config, overlong="truncate"), "validation")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt_root, log_path = out_dir / "checkpoints", out_dir / "train_log.jsonl"
    identity = json.loads(json.dumps({"config": {k: v for k, v in dataclasses.asdict(config).items() if k not in _BOOKKEEPING},
                                      "data": _data_hash(train_set), "base": str(base_dir.resolve())}))
    checkpoint = latest_checkpoint(ckpt_root) if resume else None
    if checkpoint is not None and checkpoint.state["identity"] != identity:
        raise TrainingError(f"{checkpoint.path} belongs to another run (different config, data or base model); "
                            "use a new out_dir, or resume=False to start over there")
    if not resume:
        shutil.rmtree(ckpt_root, ignore_errors=True)
        log_path.unlink(missing_ok=True)

    dtype = config.torch_dtype()
    torch.manual_seed(config.seed)
    model = lora_model(base_dir, config, dtype)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay)
    lengths = [len(e.input_ids) for e in train_set]
    steps_per_epoch = math.ceil(len(train_set) / config.batch_size)
    total_steps = config.epochs * steps_per_epoch
    if config.max_steps is not None:
        total_steps = min(total_steps, config.max_steps)

    step, tokens, loss_ema, val_loss = 0, 0, None, None
    if checkpoint is not None:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(model, load_file(str(checkpoint.adapter_dir / "adapter_model.safetensors")))
        optimizer.load_state_dict(checkpoint.load_optimizer())
        torch.set_rng_state(checkpoint.load_rng())
        step, tokens = checkpoint.step, checkpoint.state["tokens"]
        loss_ema, val_loss = checkpoint.state["loss_ema"], checkpoint.state["val_loss"]
        logger.info("resuming %s from step %d", out_dir, step)
    _rewrite_log(log_path, step)
    resumed_from = checkpoint.step if checkpoint is not None else None

    def state(epoch: int, order: list[list[int]]) -> dict:
        return {"step": step, "tokens": tokens, "loss_ema": loss_ema, "val_loss": val_loss, "epoch": epoch,
                "order": order, "identity": identity}

    train_s, session_tokens = 0.0, 0
    with _progress(progress) as bar, log_path.open("a") as log:
        task = bar.add_task("train", total=total_steps, completed=step, loss="-", tps="-")
        while step < total_steps:
            epoch, index = divmod(step, steps_per_epoch)
            order = epoch_batches(lengths, config.batch_size, config.seed, epoch)
            if checkpoint is not None and checkpoint.state["epoch"] == epoch and checkpoint.state["order"] != order:
                raise TrainingError(f"{checkpoint.path}: the data order differs from this run's; use a new out_dir")
            t0 = time.perf_counter()
            lr = config.lr_at(step, total_steps)
            loss, step_tokens = train_step(model, optimizer, [train_set[i] for i in order[index]], lr,
                                           micro_batch_tokens=config.micro_batch_tokens, max_grad_norm=config.max_grad_norm)
            step += 1
            tokens += step_tokens
            dt = time.perf_counter() - t0
            train_s, session_tokens = train_s + dt, session_tokens + step_tokens
            loss_ema = loss if loss_ema is None else 0.9 * loss_ema + 0.1 * loss
            tps = session_tokens / train_s
            log.write(json.dumps({"step": step, "epoch": epoch, "loss": loss, "lr": lr, "tokens": tokens,
                                  "tokens_per_s": step_tokens / dt}) + "\n")
            bar.update(task, completed=step, loss=f"{loss_ema:.4f}", tps=f"{tps:,.0f}")
            is_epoch_end = step % steps_per_epoch == 0 or step == total_steps
            if val_set and (is_epoch_end or (config.eval_every and step % config.eval_every == 0)):
                val_loss = evaluate_loss(model, val_set, config.micro_batch_tokens)
                log.write(json.dumps({"step": step, "val_loss": val_loss}) + "\n")
            log.flush()
            if (config.checkpoint_every and step % config.checkpoint_every == 0) or step == total_steps:
                save_checkpoint(ckpt_root, model, optimizer, state(epoch, order), keep=config.keep_checkpoints)
    if val_set and val_loss is None:
        val_loss = evaluate_loss(model, val_set, config.micro_batch_tokens)

    adapter_dir = out_dir / "adapter"
    tmp = out_dir / ".tmp-adapter"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    replace_dir(tmp, adapter_dir)
    result = TrainResult(
        steps=step, epochs=step / steps_per_epoch, final_loss=loss_ema, val_loss=val_loss, tokens=tokens,
        tokens_per_s=session_tokens / train_s if train_s else 0.0, wall_s=time.perf_counter() - started,
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, dtype=str(dtype).removeprefix("torch."),
        adapter_dir=adapter_dir, num_train=len(train_set), num_dropped=num_dropped, resumed_from=resumed_from)
    (out_dir / "result.json").write_text(json.dumps(result.to_json(), indent=2))
    return result
