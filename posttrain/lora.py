"""The LoRA-wrapped model and what one optimizer step does to it: the loss on target tokens only, a step with
gradient accumulation over micro-batches, and the validation loss.

    model = lora_model(base_dir, LoraTrainConfig(rank=16), torch.float32)    # only the adapters train
    loss, num_tokens = train_step(model, optimizer, batch, lr, micro_batch_tokens=2048, max_grad_norm=1.0)
    val_loss = evaluate_loss(model, val_examples, micro_batch_tokens=2048)   # nats per target token

The run around them (resume, checkpoints, log, adapter export) is posttrain/train.py; the schedule is
posttrain/train_config.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from posttrain.batching import IGNORE_INDEX, TokenizedExample, collate, micro_batches
from posttrain.errors import TrainingError
from posttrain.train_config import LoraTrainConfig


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


def token_losses(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
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
        loss_sum, _ = token_losses(model, ids, mask, labels)
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
            loss_sum, n = token_losses(model, ids, mask, labels)
            total, count = total + float(loss_sum), count + n
    model.train(was_training)
    return total / max(count, 1)
