"""LoRA test fixtures (test_train.py and test_export.py): a tiny random Llama checkpoint folder, tiny examples.

The tiny model (hidden 32, 2 layers, vocabulary 100, tied embeddings like SmolLM2) trains in milliseconds, so
the LoRA properties are checked on it; the real SmolLM2 appears in a few tests only (test_export.py).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

IGNORE = -100


@dataclass(frozen=True)
class Ex:
    """A tokenized example (the fields train_lora reads; posttrain.dataset.Example has the same)."""

    input_ids: list[int]
    labels: list[int]


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=True)
    path = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(str(path))
    return path


def make_examples(n: int, seed: int = 0, min_len: int = 6, max_len: int = 20) -> list[Ex]:
    """`n` examples of a learnable pattern: a random prompt (no loss), then the prompt's tokens + 1 mod 100 (loss)."""
    rng = random.Random(seed)
    examples = []
    for _ in range(n):
        half = rng.randint(min_len // 2, max_len // 2)
        prompt = [rng.randrange(100) for _ in range(half)]
        answer = [(t + 1) % 100 for t in prompt]
        examples.append(Ex(prompt + answer, [IGNORE] * half + answer))
    return examples


@pytest.fixture(scope="session")
def tiny_examples() -> list[Ex]:
    return make_examples(16)
