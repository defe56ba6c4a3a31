"""Merging, exporting and registering a LoRA fine-tune (posttrain/export.py, link/model_registration.py).

On a tiny random Llama: merged weights equal base + (alpha / r) B A, computed here from the adapter file; the
folder, provenance and errors. On the real SmolLM2 (slow, a few steps of training): the merged export served by
our engine generates the same greedy tokens as the unmerged peft model in transformers (fp32), and the gateway
serves it once registered in its database.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from link.model_registration import ModelNameTaken, register_local_model, registered_deployments, with_registered_models
from posttrain.errors import ExportError, ModelNotLocalError
from posttrain.export import export_adapter
from posttrain.local_models import local_model_spec, registered_folder
from posttrain.train import train_lora
from posttrain.train_config import LoraTrainConfig
from tests.posttrain import lora_fixtures

tiny_base, tiny_examples = lora_fixtures.tiny_base, lora_fixtures.tiny_examples
PROVENANCE = {"base_model": "tiny-llama", "data": {"source": "tests", "sha256": "abc"}, "steps": 3,
              "metrics": {"val_loss": 4.2}}


@pytest.fixture(scope="module")
def tiny_run(tiny_base, tiny_examples, tmp_path_factory):
    """An adapter after 3 steps with B random from the start (every target's B A is far from zero)."""
    config = LoraTrainConfig(rank=4, alpha=12, dtype="float32", checkpoint_every=0, init_lora_weights=False,
                             batch_size=4, max_steps=3, learning_rate=1e-2)
    return train_lora(tiny_base, tiny_examples, None, tmp_path_factory.mktemp("tiny-run"), config, progress=False)


@pytest.fixture(scope="module")
def tiny_export(tiny_base, tiny_run, tmp_path_factory):
    return export_adapter(tiny_base, tiny_run.adapter_dir, tmp_path_factory.mktemp("exports") / "tiny-sft",
                          name="tiny-sft", provenance=PROVENANCE)


def test_merged_weights_equal_base_plus_scaled_low_rank_product(tiny_base, tiny_run, tiny_export):
    base = load_file(str(tiny_base / "model.safetensors"))
    merged = load_file(str(tiny_export / "model.safetensors"))
    adapter = load_file(str(tiny_run.adapter_dir / "adapter_model.safetensors"))
    assert merged.keys() == base.keys()  # tied lm_head stored once, as in the base
    scaling = 12 / 4
    # "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" -> "model.layers.0.self_attn.q_proj.weight"
    targets = {k.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight") for k in adapter if ".lora_A." in k}
    assert len(targets) == 2 * 7
    for name in base:
        if name in targets:
            prefix = "base_model.model." + name.removesuffix(".weight")
            a, b = adapter[prefix + ".lora_A.weight"], adapter[prefix + ".lora_B.weight"]  # [r, in], [out, r]
            expected = base[name] + scaling * (b.double() @ a.double()).float()
            assert torch.count_nonzero(b @ a) > 0
            torch.testing.assert_close(merged[name], expected, rtol=0, atol=1e-6, msg=name)
        else:
            assert torch.equal(merged[name], base[name]), f"{name} is not adapted but changed"


def test_export_folder_and_provenance(tiny_base, tiny_run, tiny_export):
    assert {p.name for p in tiny_export.iterdir()} == {"config.json", "model.safetensors", "generation_config.json",
                                                       "provenance.json"}
    assert json.loads((tiny_export / "config.json").read_text()) == json.loads((tiny_base / "config.json").read_text())
    record = json.loads((tiny_export / "provenance.json").read_text())
    assert {k: record[k] for k in PROVENANCE} == PROVENANCE
    assert record["name"] == "tiny-sft" and record["adapter"]["r"] == 4 and record["adapter"]["lora_alpha"] == 12
    assert sorted(record["adapter"]["target_modules"]) == sorted(LoraTrainConfig().target_modules)
    import hashlib

    assert record["weights_sha256"] == hashlib.sha256((tiny_export / "model.safetensors").read_bytes()).hexdigest()
    assert record["created_at"].endswith("+00:00")


def test_export_errors(tiny_base, tiny_run, tiny_export, tmp_path):
    with pytest.raises(ExportError, match="already exists and is not empty"):
        export_adapter(tiny_base, tiny_run.adapter_dir, tiny_export, name="again", provenance={})
    with pytest.raises(ExportError, match="holds no LoRA adapter"):
        export_adapter(tiny_base, tmp_path, tmp_path / "out", name="x", provenance={})
    with pytest.raises(ExportError, match="not found"):
        export_adapter(tmp_path / "nowhere", tiny_run.adapter_dir, tmp_path / "out", name="x", provenance={})
    assert not (tmp_path / "out").exists()


def test_registration_in_the_database(tiny_export, tmp_path):
    from link.config import LinkConfig
    from link.db import make_db_engine

    url = f"sqlite:///{tmp_path / 'link.db'}"
    row = register_local_model(url, "acme/tiny-sft", tiny_export, input_cost_per_million=0.01)
    assert row.kind == "local" and row.config == {"local": str(tiny_export.resolve()), "architecture": "llama",
                                                  "chat_format": "template", "input_cost_per_million": 0.01}
    with pytest.raises(ModelNameTaken, match="already registered"):
        register_local_model(url, "acme/tiny-sft", tiny_export)
    with pytest.raises(ModelNameTaken, match="already a local or configured model"):
        register_local_model(url, "smollm2-135m-instruct", tiny_export)
    with pytest.raises(ValueError, match="no spaces"):
        register_local_model(url, "bad name", tiny_export)
    engine = make_db_engine(url)
    try:
        [deployment] = registered_deployments(engine)
        config = with_registered_models(LinkConfig(), engine)
    finally:
        engine.dispose()
    assert deployment.is_local_path and deployment.local == str(tiny_export.resolve())
    assert config.model_names == ["acme/tiny-sft"] and config.models[0].deployment_id == "acme/tiny-sft#0"
    # `link posttrain eval --model acme/tiny-sft` finds the registered folder by name
    spec = local_model_spec("acme/tiny-sft", database_url=url)
    assert spec.name == "acme/tiny-sft" and spec.source == str(tiny_export.resolve()) and spec.architecture == "llama"
    with pytest.raises(ModelNotLocalError, match="not local"):
        local_model_spec("acme/other", database_url=url)
    assert registered_folder("acme/tiny-sft", f"sqlite:///{tmp_path / 'absent.db'}") is None
    assert not (tmp_path / "absent.db").exists()


def test_registration_keeps_the_trained_tool_format(tiny_export, tmp_path):
    import dataclasses

    from link.config import LinkConfig
    from link.db import make_db_engine
    from posttrain.sft import _registered_format, format_config
    from serving.tools.formats import FORMATS, tool_format_from_config

    custom = {"base": "xml", "name": "acme-xml", "call_open": "<invoke>", "call_close": "</invoke>"}
    fmt = tool_format_from_config(custom)
    # run.json keeps a custom format whole: every field, so it rebuilds the same format without the original file
    stored = format_config(fmt)
    assert stored == dataclasses.asdict(fmt) and tool_format_from_config(stored) == fmt
    assert format_config(FORMATS["xml"]) == "xml" and _registered_format(None) is None and _registered_format("json") is None
    url = f"sqlite:///{tmp_path / 'link.db'}"
    row = register_local_model(url, "acme/xml-sft", tiny_export, tool_format=_registered_format(stored))
    assert row.config["tool_format"] == stored
    with pytest.raises(ValueError, match="tool_format"):
        register_local_model(url, "acme/bad-format", tiny_export, tool_format={"style": "yaml"})
    engine = make_db_engine(url)
    try:
        config = with_registered_models(LinkConfig(), engine)
    finally:
        engine.dispose()
    assert config.model_names == ["acme/xml-sft"] and config.models[0].harness_format == fmt


# --- the real SmolLM2 ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_base(smollm2_gguf_path):
    from posttrain.base_model import resolve_base

    return resolve_base(smollm2_gguf_path)  # exported once into $LINK_HOME/cache/hf, reused by later sessions


def _chat_example(tokenizer, question: str, answer: str) -> lora_fixtures.Ex:
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
    full = tokenizer.apply_chat_template([{"role": "user", "content": question}, {"role": "assistant", "content": answer}])
    full, prompt = list(getattr(full, "input_ids", full)), list(getattr(prompt, "input_ids", prompt))
    assert full[:len(prompt)] == prompt
    return lora_fixtures.Ex(full, [-100] * len(prompt) + full[len(prompt):])


@pytest.fixture(scope="module")
def smollm2_sft(smollm2_base, tmp_path_factory):
    """SmolLM2 after 3 LoRA steps (B starts at zero, so the steps are what makes the adapter non-trivial)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_base))
    pairs = [("What is the capital of France?", "Paris, of course! Ask me about any other capital."),
             ("Name a primary color.", "Blue, the color of the sky and the sea."),
             ("What is 2 + 2?", "Four. Happy to help with more arithmetic!"),
             ("Say hello.", "Hello there, friend! How can I help you today?")]
    examples = [_chat_example(tokenizer, q, a) for q, a in pairs]
    config = LoraTrainConfig(rank=8, alpha=16, dtype="float32", checkpoint_every=0, batch_size=4, epochs=3,
                             learning_rate=3e-3, warmup_ratio=0.0)
    run = train_lora(smollm2_base, examples, None, tmp_path_factory.mktemp("smollm2-run"), config, progress=False)
    folder = export_adapter(smollm2_base, run.adapter_dir, tmp_path_factory.mktemp("smollm2-export") / "smollm2-sft",
                            name="smollm2-sft", provenance={"base_model": "smollm2-135m-instruct", "steps": run.steps})
    return run, folder


@pytest.mark.slow
def test_merged_model_in_our_engine_matches_peft_in_transformers(smollm2_base, smollm2_sft):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from serving import LLM, SamplingParams
    from serving.registry import ModelRegistry, ModelSpec

    run, folder = smollm2_sft
    assert run.steps == 3
    base, merged = load_file(str(smollm2_base / "model.safetensors")), load_file(str(folder / "model.safetensors"))
    assert not torch.equal(base["model.layers.0.self_attn.q_proj.weight"], merged["model.layers.0.self_attn.q_proj.weight"])
    assert torch.equal(base["model.norm.weight"], merged["model.norm.weight"])

    ours = LLM("smollm2-sft", registry=ModelRegistry([ModelSpec("smollm2-sft", str(folder), "llama", "template", 8192)]))
    hf = AutoModelForCausalLM.from_pretrained(str(smollm2_base), dtype=torch.float32)
    reference = PeftModel.from_pretrained(hf, str(run.adapter_dir)).eval()  # not merged: x W^T + s (x A^T) B^T
    fmt = ours.loaded.chat_format
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    for question in ("What is the capital of France?", "Name three animals."):
        ids = ours.tokenizer.encode(fmt.render([{"role": "user", "content": question}]),
                                    add_special_tokens=fmt.add_special_tokens)
        tokens = ours.generate({"prompt_token_ids": ids}, params)[0].outputs[0].token_ids
        assert len(tokens) == 16
        # Teacher-forced greedy check: the reference's argmax after the prompt and each prefix of our output is our
        # next token, so its own greedy loop would produce exactly our tokens.
        with torch.inference_mode():
            logits = reference(input_ids=torch.tensor([ids + tokens])).logits[0, len(ids) - 1:-1]
        assert logits.argmax(-1).tolist() == tokens, question


@pytest.mark.slow
def test_the_gateway_serves_a_registered_export(smollm2_sft, tmp_path):
    import openai

    from link.config import LinkConfig
    from tests.link.gateway_launch import gateway_settings, start_gateway_thread

    _, folder = smollm2_sft
    url = f"sqlite:///{tmp_path / 'link.db'}"
    register_local_model(url, "smollm2-sft", folder)
    settings = gateway_settings(url, tmp_path / "home", master_key=None)
    with start_gateway_thread(settings, LinkConfig()) as gateway:  # no configured models: only the database's
        client = openai.OpenAI(base_url=gateway.base_url, api_key="anything", max_retries=0, timeout=600)
        assert [m.id for m in client.models.list().data] == ["smollm2-sft"]
        answer = client.chat.completions.create(model="smollm2-sft", max_tokens=8, temperature=0,
                                                messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert answer.model == "smollm2-sft" and answer.choices[0].message.content
