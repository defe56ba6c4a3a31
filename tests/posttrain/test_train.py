"""LoRA training (posttrain/train.py, train_config.py, lora.py, batching.py, checkpoints.py) on a tiny random Llama.

What moved and what did not: an untrained adapter is a no-op, a training step moves only the adapters and lowers
the loss, a resumed run equals a straight one, and bad input fails before any step.
"""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from posttrain.batching import IGNORE_INDEX, collate, epoch_batches, micro_batches
from posttrain.errors import TrainingError
from posttrain.lora import evaluate_loss, lora_model, train_step
from posttrain.train import train_lora
from posttrain.train_config import LoraTrainConfig
from tests.posttrain import lora_fixtures
from tests.posttrain.lora_fixtures import Ex, make_examples

tiny_base, tiny_examples = lora_fixtures.tiny_base, lora_fixtures.tiny_examples
FAST = dict(rank=4, alpha=8, dtype="float32", checkpoint_every=0)


def _adapter_tensors(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters() if "lora_" in k}


def _base_tensors(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters() if "lora_" not in k}


def test_untrained_adapter_changes_no_output(tiny_base, tiny_examples):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(tiny_base), dtype=torch.float32).eval()
    torch.manual_seed(0)
    model = lora_model(tiny_base, LoraTrainConfig(**FAST)).eval()
    lora_b = [v for k, v in model.named_parameters() if "lora_B" in k]
    assert len(lora_b) == 2 * 7 and all(torch.count_nonzero(b) == 0 for b in lora_b)  # 2 layers x 7 targets
    assert all(torch.count_nonzero(v) > 0 for k, v in model.named_parameters() if "lora_A" in k)
    ids, mask, _ = collate(tiny_examples[:4])
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids, attention_mask=mask).logits, base(input_ids=ids, attention_mask=mask).logits)


def test_a_step_moves_only_the_adapter_and_lowers_the_loss(tiny_base, tiny_examples):
    config = LoraTrainConfig(**FAST, learning_rate=1e-2)
    torch.manual_seed(0)
    model = lora_model(tiny_base, config)
    trainable = {k for k, v in model.named_parameters() if v.requires_grad}
    assert trainable and all("lora_A" in k or "lora_B" in k for k in trainable)
    base_before, adapter_before = _base_tensors(model), _adapter_tensors(model)
    loss_before = evaluate_loss(model, tiny_examples, 4096)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.learning_rate)
    losses = [train_step(model, optimizer, tiny_examples, config.learning_rate, micro_batch_tokens=64,
                         max_grad_norm=1.0)[0] for _ in range(8)]
    assert losses[0] == pytest.approx(loss_before, rel=1e-5)  # step 1 sees the untrained model (dropout 0)
    assert evaluate_loss(model, tiny_examples, 4096) < loss_before - 0.1  # nats per target token
    base_after, adapter_after = _base_tensors(model), _adapter_tensors(model)
    assert base_after.keys() == base_before.keys()
    assert all(torch.equal(base_after[k], base_before[k]) for k in base_before), "a base weight changed"
    assert all(not torch.equal(adapter_after[k], adapter_before[k]) for k in adapter_before), "an adapter did not move"


def test_only_the_last_layers_can_be_adapted(tiny_base, tiny_examples):
    config = LoraTrainConfig(**FAST, num_adapted_layers=1, learning_rate=1e-2)
    torch.manual_seed(0)
    model = lora_model(tiny_base, config)
    adapted = {k.split(".layers.")[1].split(".")[0] for k, v in model.named_parameters() if v.requires_grad}
    assert adapted == {"1"}  # layer 1 of 0..1
    before = evaluate_loss(model, tiny_examples, 4096)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.learning_rate)
    for _ in range(8):
        train_step(model, optimizer, tiny_examples, config.learning_rate, micro_batch_tokens=4096, max_grad_norm=1.0)
    assert evaluate_loss(model, tiny_examples, 4096) < before
    with pytest.raises(TrainingError, match="has 2 layers"):
        lora_model(tiny_base, LoraTrainConfig(**FAST, num_adapted_layers=3))


def test_accumulated_micro_batches_give_the_full_batch_gradient(tiny_base, tiny_examples):
    """The step's loss is the mean over all target tokens however the batch is split into micro-batches."""
    config = LoraTrainConfig(**FAST, init_lora_weights=False)
    grads = []
    for budget in (4096, 20):  # one pass vs. about one example per pass
        torch.manual_seed(0)
        model = lora_model(tiny_base, config)
        optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
        optimizer.zero_grad = lambda set_to_none=True: None  # keep .grad for the comparison
        loss, tokens = train_step(model, optimizer, tiny_examples[:8], 0.0, micro_batch_tokens=budget, max_grad_norm=0)
        grads.append((loss, tokens, {k: v.grad.clone() for k, v in model.named_parameters() if v.requires_grad}))
    (loss_a, tokens_a, grad_a), (loss_b, tokens_b, grad_b) = grads
    assert tokens_a == tokens_b == sum(len(e.input_ids) for e in tiny_examples[:8])
    assert loss_a == pytest.approx(loss_b, rel=1e-6)
    for k in grad_a:  # equal up to float32 summation order: errors scale with the gradient's largest element
        torch.testing.assert_close(grad_a[k], grad_b[k], rtol=1e-5, atol=1e-5 * grad_a[k].abs().max().item())


def test_train_lora_writes_log_adapter_and_result(tiny_base, tiny_examples, tmp_path):
    config = LoraTrainConfig(**{**FAST, "checkpoint_every": 2}, learning_rate=1e-2, batch_size=4, epochs=2, eval_every=3)
    result = train_lora(tiny_base, tiny_examples, tiny_examples[:4], tmp_path, config, progress=False)
    assert result.steps == 8 and result.epochs == 2.0 and result.dtype == "float32"
    assert result.tokens == 2 * sum(len(e.input_ids) for e in tiny_examples)
    assert result.tokens_per_s > 0 and result.peak_rss_mb > 0 and result.resumed_from is None
    lines = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "loss" in line]
    assert [line["step"] for line in steps] == list(range(1, 9))
    assert [line["step"] for line in lines if "val_loss" in line] == [3, 4, 6, 8]  # every 3 steps and each epoch's end
    assert steps[-1]["tokens"] == result.tokens
    assert [line["lr"] for line in steps] == pytest.approx([config.lr_at(s, 8) for s in range(8)])
    assert result.val_loss == lines[-1]["val_loss"] and result.val_loss < steps[0]["loss"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-6", "step-8"]  # keep 2
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    assert json.loads((tmp_path / "result.json").read_text())["steps"] == 8


def test_resume_equals_a_straight_run(tiny_base, tiny_examples, tmp_path):
    from safetensors.torch import load_file

    config = LoraTrainConfig(**{**FAST, "checkpoint_every": 2, "keep_checkpoints": 3}, learning_rate=1e-2,
                             batch_size=4, dropout=0.1)  # dropout: the RNG state must resume too
    straight = train_lora(tiny_base, tiny_examples, None, tmp_path / "straight", config, progress=False)
    assert straight.steps == 4
    # An interrupted run: only the step-2 checkpoint survived.
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(tmp_path / "straight" / "checkpoints" / "step-2", resumed_dir / "checkpoints" / "step-2")
    resumed = train_lora(tiny_base, tiny_examples, None, resumed_dir, config, progress=False)
    assert resumed.resumed_from == 2 and resumed.steps == 4 and resumed.tokens == straight.tokens
    a = load_file(str(straight.adapter_dir / "adapter_model.safetensors"))
    b = load_file(str(resumed.adapter_dir / "adapter_model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6)
    # A different config must not resume from these checkpoints.
    with pytest.raises(TrainingError, match="another run"):
        train_lora(tiny_base, tiny_examples, None, resumed_dir, LoraTrainConfig(**FAST, learning_rate=1e-3), progress=False)


@pytest.mark.parametrize("case, message", [
    ("empty", "training set is empty"),
    ("missing base", "not found"),
    ("not a checkpoint", "not a Hugging Face checkpoint"),
    ("too long", "longer than max_seq_length=16"),
    ("length mismatch", "labels; they must match"),
    ("no targets", "training set is empty"),
])
def test_bad_input_fails_before_training(case, message, tiny_base, tiny_examples, tmp_path):
    base, train, config = tiny_base, tiny_examples, LoraTrainConfig(**FAST)
    if case == "empty":
        train = []
    elif case == "missing base":
        base = tmp_path / "nowhere"
    elif case == "not a checkpoint":
        base = tmp_path
        (tmp_path / "config.json").write_text("{}")
    elif case == "too long":
        config = LoraTrainConfig(**FAST, max_seq_length=16)
    elif case == "length mismatch":
        train = [Ex([1, 2, 3], [IGNORE_INDEX, 2])]
    elif case == "no targets":
        train = [Ex([1, 2, 3], [IGNORE_INDEX] * 3)]
    with pytest.raises(TrainingError, match=message):
        train_lora(base, train, None, tmp_path / "out", config, progress=False)
    assert not (tmp_path / "out" / "train_log.jsonl").exists()


def test_overlong_examples_can_be_dropped_or_truncated(tiny_base, tmp_path):
    examples = make_examples(4, min_len=10, max_len=12) + [Ex(list(range(30)), list(range(30)))]
    dropped = train_lora(tiny_base, examples, None, tmp_path / "d", LoraTrainConfig(**FAST, max_seq_length=16,
                         overlong="drop"), progress=False)
    assert dropped.num_train == 4 and dropped.num_dropped == 1
    cut = train_lora(tiny_base, examples, None, tmp_path / "t", LoraTrainConfig(**FAST, max_seq_length=16,
                     overlong="truncate", batch_size=5), progress=False)
    assert cut.num_train == 5 and cut.tokens == sum(len(e.input_ids) for e in examples[:4]) + 16


@pytest.mark.parametrize("field, value", [("rank", 0), ("batch_size", 0), ("schedule", "step"), ("dtype", "fp8"),
                                          ("dropout", 1.0), ("target_modules", ()), ("overlong", "skip"),
                                          ("max_steps", 0), ("num_adapted_layers", 0)])
def test_config_is_validated(field, value):
    with pytest.raises(ValueError, match=field):
        LoraTrainConfig(**{field: value})


def test_learning_rate_schedule():
    config = LoraTrainConfig(learning_rate=1.0, warmup_ratio=0.1, min_lr_ratio=0.0)  # 10 of 100 steps warm up
    assert [config.lr_at(s, 100) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    assert config.lr_at(10, 100) == pytest.approx(1.0)
    assert config.lr_at(55, 100) == pytest.approx(0.5)  # halfway through the cosine
    assert config.lr_at(99, 100) == pytest.approx(0.5 * (1 + math.cos(math.pi * 89 / 90)))
    linear = LoraTrainConfig(learning_rate=1.0, warmup_ratio=0.0, schedule="linear", min_lr_ratio=0.1)
    # progress = step / steps (as Hugging Face's schedules: the last step keeps a little more than the floor)
    assert [linear.lr_at(s, 10) for s in (0, 5, 9)] == pytest.approx([1.0, 0.55, 0.19])


def test_epoch_batches_are_seeded_length_grouped_permutations():
    lengths = [(i * 37) % 101 + 1 for i in range(70)]
    batches = epoch_batches(lengths, batch_size=8, seed=3, epoch=1, group=2)
    assert sorted(i for b in batches for i in b) == list(range(70))
    assert sorted(len(b) for b in batches) == [6] + [8] * 8
    assert all([lengths[i] for i in b] == sorted((lengths[i] for i in b), reverse=True) for b in batches)
    assert batches == epoch_batches(lengths, batch_size=8, seed=3, epoch=1, group=2)
    assert batches != epoch_batches(lengths, batch_size=8, seed=3, epoch=2, group=2)
    # Grouping pays: less padding than batches of a plain shuffle.
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    order = torch.randperm(70, generator=torch.Generator().manual_seed(0)).tolist()
    plain = sum(len(order[j:j + 8]) * max(lengths[i] for i in order[j:j + 8]) for j in range(0, 70, 8))
    assert padded < plain


def test_micro_batches_and_collate():
    lengths = [10, 8, 8, 5, 3]
    assert micro_batches([0, 1, 2, 3, 4], lengths, max_tokens=20) == [[0, 1], [2, 3], [4]]
    assert micro_batches([0, 1], lengths, max_tokens=4) == [[0], [1]]
    ids, mask, labels = collate([Ex([5, 6, 7], [IGNORE_INDEX, 6, 7]), Ex([9], [9])], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [9, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert labels.tolist() == [[IGNORE_INDEX, 6, 7], [9, IGNORE_INDEX, IGNORE_INDEX]]
