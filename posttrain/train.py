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

Here: the run (resume, the step loop, validation, the log, the adapter export). Its settings and schedule are
posttrain/train_config.py, the model and one step on it posttrain/lora.py, the data checks posttrain/batching.py.
"""

from __future__ import annotations

import dataclasses
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

from posttrain.base_model import check_hf_folder
from posttrain.batching import TokenizedExample, data_hash, epoch_batches, prepare_examples
from posttrain.checkpoints import latest_checkpoint, replace_dir, save_checkpoint
from posttrain.errors import TrainingError
from posttrain.lora import evaluate_loss, lora_model, train_step
from posttrain.train_config import LoraTrainConfig

logger = logging.getLogger(__name__)
# Fields that change how often things are written, not what is computed: a resumed run may change them.
_BOOKKEEPING = ("checkpoint_every", "keep_checkpoints", "eval_every")


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
    train_set, num_dropped = prepare_examples(train, config.max_seq_length, config.overlong, "training")
    if not train_set:
        raise TrainingError("the training set is empty" + (f" ({num_dropped} examples dropped: over max_seq_length or "
                            "without assistant tokens)" if num_dropped else "") + "; nothing to train on")
    val_set, _ = prepare_examples(val, config.max_seq_length, "truncate", "validation")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt_root, log_path = out_dir / "checkpoints", out_dir / "train_log.jsonl"
    identity = json.loads(json.dumps({"config": {k: v for k, v in dataclasses.asdict(config).items() if k not in _BOOKKEEPING},
                                      "data": data_hash(train_set), "base": str(base_dir.resolve())}))
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
