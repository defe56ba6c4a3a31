"""Batches for LoRA training: a seeded, length-grouped order of examples per epoch, micro-batches under a token
budget, and right-padded tensors.

    order = epoch_batches(lengths, batch_size=8, seed=0, epoch=0)     # [[example index, ...] per optimizer step]
    for step_indices in order:
        for micro in micro_batches(step_indices, lengths, max_tokens=4096):
            input_ids, attention_mask, labels = collate([examples[i] for i in micro])

`prepare_examples` checks and cuts a data set to `max_seq_length` first; `data_hash` fingerprints it.

Length grouping (as in Hugging Face's `LengthGroupedSampler`): shuffle, cut into mega-batches of
`group * batch_size` examples, sort each by length, cut into batches, shuffle the batches. Examples of similar
length share a batch, so little compute goes to padding, while the order stays random and seeded.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

from posttrain.errors import TrainingError

IGNORE_INDEX = -100  # labels value that takes no loss (torch.nn.functional.cross_entropy's ignore_index)


class TokenizedExample(Protocol):
    """What training needs of an example (posttrain.dataset.Example has these fields)."""

    input_ids: Sequence[int]
    labels: Sequence[int]  # same length; IGNORE_INDEX where no loss


def epoch_batches(lengths: Sequence[int], batch_size: int, seed: int, epoch: int, *, group: int = 16) -> list[list[int]]:
    """The example indices of every optimizer step of one epoch, a pure function of (lengths, seed, epoch).

    Args:
        lengths: token count of each example.
        batch_size: examples per step; only the epoch's last batch may be smaller.
        seed, epoch: seed the permutation (the same pair always gives the same order).
        group: batches per mega-batch sorted by length.
    Returns:
        ceil(len(lengths) / batch_size) lists of indices, each sorted by decreasing length; every index once.
    """
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(len(lengths), generator=generator).tolist()
    mega = batch_size * group
    batches: list[list[int]] = []
    for start in range(0, len(order), mega):
        chunk = sorted(order[start:start + mega], key=lambda i: -lengths[i])
        batches.extend(chunk[j:j + batch_size] for j in range(0, len(chunk), batch_size))
    # The one short batch (if any) is the last of the last mega-batch; the shuffle may move it anywhere.
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


def micro_batches(indices: Sequence[int], lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Split one step's indices (sorted by decreasing length) so that rows x longest row <= max_tokens per part.

    A single example longer than `max_tokens` forms a part of its own (the budget bounds padding, not length).
    """
    parts: list[list[int]] = []
    for i in indices:
        if parts and (len(parts[-1]) + 1) * max(lengths[j] for j in (*parts[-1], i)) <= max_tokens:
            parts[-1].append(i)
        else:
            parts.append([i])
    return parts


def collate(examples: Sequence[TokenizedExample], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad examples to one length.

    Returns:
        input_ids [B, T] (int64, pad_id in padding), attention_mask [B, T] (1 = token, 0 = padding),
        labels [B, T] (IGNORE_INDEX in padding); T = the longest example.
    """
    width = max(len(e.input_ids) for e in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, e in enumerate(examples):
        n = len(e.input_ids)
        input_ids[row, :n] = torch.tensor(list(e.input_ids), dtype=torch.long)
        labels[row, :n] = torch.tensor(list(e.labels), dtype=torch.long)
        attention_mask[row, :n] = 1
    return input_ids, attention_mask, labels


@dataclass(frozen=True)
class CutExample:
    """A training example as checked and cut by `prepare_examples` (plain lists, hashable content)."""

    input_ids: list[int]
    labels: list[int]


def data_hash(examples: list[CutExample]) -> str:
    """SHA-256 (hex) of the examples' token ids and labels, in order: the data part of a run's identity."""
    digest = hashlib.sha256()
    for e in examples:
        digest.update(json.dumps([e.input_ids, e.labels]).encode())
    return digest.hexdigest()


def prepare_examples(examples: Sequence[TokenizedExample] | None, max_seq_length: int, overlong: str,
                     what: str) -> tuple[list[CutExample], int]:
    """Check and cut examples to at most `max_seq_length` tokens, handling longer ones by `overlong` ("error",
    "drop" or "truncate"; posttrain.train_config.LoraTrainConfig); examples with no target token are dropped.
    `what` names the set in errors ("training").

    Returns:
        (the kept examples as lists, the number dropped).

    Raises:
        TrainingError: mismatched lengths, or examples over max_seq_length with overlong="error".
    """
    kept, dropped, too_long = [], 0, []
    for i, e in enumerate(examples or ()):
        ids, labels = list(e.input_ids), list(e.labels)
        if len(ids) != len(labels):
            raise TrainingError(f"{what} example {i}: {len(ids)} input_ids but {len(labels)} labels; they must match")
        if len(ids) > max_seq_length:
            if overlong == "error":
                too_long.append(len(ids))
                continue
            if overlong == "drop":
                dropped += 1
                continue
            ids, labels = ids[:max_seq_length], labels[:max_seq_length]
        if all(label == IGNORE_INDEX for label in labels[1:]):  # nothing to predict (label 0 has no context)
            dropped += 1
            continue
        kept.append(CutExample(ids, labels))
    if too_long:
        raise TrainingError(f"{len(too_long)} {what} examples are longer than max_seq_length={max_seq_length} "
                            f"(longest {max(too_long)} tokens); raise max_seq_length or set overlong='drop' or 'truncate'")
    return kept, dropped
