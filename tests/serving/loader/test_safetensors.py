"""Hugging Face safetensors checkpoints: our GGUF -> HF converter, and loading the folder back."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from serving import LLM, SamplingParams
from serving.config import ModelConfig
from serving.loader.gguf_loader import open_gguf
from serving.loader.hf_export import export_hf_checkpoint, hf_config
from serving.registry import ModelRegistry, ModelSpec

pytestmark = pytest.mark.slow  # loads a real model (tests/test_markers.py)


@pytest.fixture(scope="module")
def smollm2_hf_dir(smollm2_gguf_path, tmp_path_factory):
    return export_hf_checkpoint(smollm2_gguf_path, tmp_path_factory.mktemp("smollm2-hf"))


def test_converted_weights_equal_dequantized_gguf(smollm2_hf_dir, smollm2_gguf_path):
    expected = open_gguf(smollm2_gguf_path).state_dict()
    with safe_open(str(smollm2_hf_dir / "model.safetensors"), framework="pt") as f:
        assert set(f.keys()) == set(expected)
        for name in f.keys():
            assert torch.equal(f.get_tensor(name), expected[name]), name


def test_safetensors_model_generates_like_gguf(smollm2_hf_dir, smollm2):
    registry = ModelRegistry([ModelSpec("smollm2-hf", str(smollm2_hf_dir), "llama", "template", 8192)])
    llm = LLM("smollm2-hf", registry=registry)
    params = SamplingParams(temperature=0, max_tokens=24)
    messages = [{"role": "user", "content": "Name three primary colors."}]
    ours = llm.chat(messages, params)[0].outputs[0]
    reference = smollm2.chat(messages, params)[0].outputs[0]
    assert ours.token_ids == reference.token_ids
    assert ours.text == reference.text


def test_transformers_reads_our_checkpoint_with_the_same_logits(smollm2_hf_dir, smollm2):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(smollm2_hf_dir), dtype=torch.float32).eval()
    ids = smollm2.tokenizer.encode("The quick brown fox jumps over the lazy dog.")
    ours = smollm2.loaded.model.prefill_logits(ids)
    with torch.inference_mode():
        theirs = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(ours, theirs, atol=1e-3, rtol=1e-4)


def test_hf_config_round_trips(smollm2, gemma3):
    for llm in (smollm2, gemma3):
        cfg = llm.loaded.config
        assert ModelConfig.from_hf_config(hf_config(cfg, 1, 2)) == cfg
