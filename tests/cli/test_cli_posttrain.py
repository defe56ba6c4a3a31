"""`link posttrain sft|eval|export` (cli/posttrain.py) through typer's CliRunner.

The runs use a tiny random Llama (hidden 32, 2 layers) with SmolLM2's tokenizer and chat template, so the whole
pipeline (BFCL traces as OpenAI JSONL -> split -> LoRA steps -> scoring in our engine -> merged export registered
in a database) takes seconds. Bad input (traces without tools, tools the format cannot express, an empty dataset,
a base model that is not local) must give one line and exit code 2 before any model is loaded or trained: the
loaders are replaced by tripwires there.

    LINK_DATASETS_DIR=../shared/data .venv/bin/python -m pytest -q tests/cli/test_cli_posttrain.py
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.app import app
from posttrain.dataset import split_traces
from posttrain.traces import read_openai_jsonl
from posttrain.traces_bfcl import read_bfcl

runner = CliRunner()
TINY = ["--rank", "4", "--alpha", "8", "--dtype", "float32", "--batch-size", "2", "--checkpoint-every", "0",
        "--no-progress", "--lr", "1e-2"]


@pytest.fixture(scope="module")
def tiny_chat_base(tmp_path_factory, smollm2_gguf_path) -> Path:
    """A tiny random Llama with SmolLM2's vocabulary, tokenizer files and chat template (a local HF folder)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from posttrain.base_model import resolve_base

    smollm2 = resolve_base(smollm2_gguf_path)  # cached in $LINK_HOME/cache/hf
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    path = tmp_path_factory.mktemp("tiny-chat-llama")
    LlamaForCausalLM(config).save_pretrained(str(path))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(smollm2 / name, path / name)
    return path


def _write_jsonl(path: Path, traces) -> Path:
    path.write_text("".join(json.dumps({"id": t.id, "category": t.category, "messages": t.messages, "tools": t.tools}) + "\n"
                            for t in traces))
    return path


@pytest.fixture(scope="module")
def bfcl_jsonl(data_dir, tmp_path_factory) -> Path:
    """Eight BFCL items (four simple, four irrelevance) as OpenAI fine-tuning JSONL."""
    traces = read_bfcl(data_dir, ["simple", "irrelevance"])
    picked = [t for t in traces if t.category == "simple"][:4] + [t for t in traces if t.category == "irrelevance"][:4]
    return _write_jsonl(tmp_path_factory.mktemp("data") / "bfcl8.jsonl", picked)


@pytest.fixture
def tripwires(monkeypatch):
    """Loading a model or training fails the test: bad input must be refused before either."""
    import posttrain.base_model
    import posttrain.train
    import serving.llm

    def tripped(*args, **kwargs):
        raise AssertionError("a model was loaded or trained on bad input")

    monkeypatch.setattr(posttrain.base_model, "resolve_base", tripped)
    monkeypatch.setattr(posttrain.train, "train_lora", tripped)
    monkeypatch.setattr(serving.llm, "load_model", tripped)


def _one_line_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def test_help_texts():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0 and "posttrain" in result.output
    result = runner.invoke(app, ["posttrain", "--help"])
    assert result.exit_code == 0 and all(cmd in result.output for cmd in ("sft", "eval", "export"))
    for cmd, options in (("sft", ("--base", "--data", "--out", "--val-fraction", "--tool-format", "--pii", "--no-resume")),
                         ("eval", ("--model", "--split-file", "--part", "--limit", "--out")),
                         ("export", ("--run", "--name", "--register", "--database-url"))):
        result = runner.invoke(app, ["posttrain", cmd, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0 and all(o in result.output for o in options), (cmd, result.output)


# --- bad input -----------------------------------------------------------------------------------------------


def test_traces_without_tools(tmp_path, tripwires):
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}) + "\n")
    result = runner.invoke(app, ["posttrain", "sft", "--data", str(data), "--out", str(tmp_path / "run")])
    _one_line_error(result, "offers tools")
    assert not (tmp_path / "run").exists()


def test_a_schema_the_format_cannot_express(tmp_path, bfcl_jsonl, data_dir, tripwires):
    fmt = tmp_path / "plain-xml.json"
    fmt.write_text(json.dumps({"base": "xml", "name": "plain-xml", "nested_values": "refuse"}))
    parallel = _write_jsonl(tmp_path / "arrays.jsonl", [t for t in read_bfcl(data_dir, ["simple"])
                                                         if '"array"' in json.dumps(t.tools)][:2])
    result = runner.invoke(app, ["posttrain", "sft", "--data", str(parallel), "--tool-format", str(fmt),
                                 "--out", str(tmp_path / "run")])
    _one_line_error(result, "cannot express", "plain-xml")
    result = runner.invoke(app, ["posttrain", "sft", "--data", str(bfcl_jsonl), "--tool-format", "no-such-format",
                                 "--out", str(tmp_path / "run")])
    _one_line_error(result, "unknown tool format")
    assert not (tmp_path / "run").exists()          # a refused run leaves no output folder behind


def test_an_empty_dataset(tmp_path, bfcl_jsonl, tripwires):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    _one_line_error(runner.invoke(app, ["posttrain", "sft", "--data", str(empty), "--out", str(tmp_path / "run")]),
                    "holds no conversations")
    # a length filter that leaves nothing
    _one_line_error(runner.invoke(app, ["posttrain", "sft", "--data", str(bfcl_jsonl), "--max-seq-length", "32",
                                        "--out", str(tmp_path / "run")]), "longer than max_seq_length=32")
    assert not (tmp_path / "run").exists()


def test_an_empty_dataset_after_the_personal_data_filter(tmp_path, tripwires):
    from sqlmodel import Session

    from link.db import make_db_engine, upgrade
    from link.db.models import ToolTrace

    url = f"sqlite:///{tmp_path / 'link.db'}"
    upgrade(url)
    tools = [{"type": "function", "function": {"name": "lookup_order", "parameters": {
        "type": "object", "properties": {"order_id": {"type": "string"}}}}}]
    engine = make_db_engine(url)
    with Session(engine) as session:
        for i in range(3):
            session.add(ToolTrace(id=f"req-{i}", policy="harness", messages=[
                {"role": "user", "content": f"I am jane{i}@example.com, where is order A{i}?"}], tools=tools,
                response={"role": "assistant", "tool_calls": [{"id": "c0", "type": "function", "function": {
                    "name": "lookup_order", "arguments": json.dumps({"order_id": f"A{i}"})}}]}, finish_reason="tool_calls"))
        session.commit()
    engine.dispose()
    result = runner.invoke(app, ["posttrain", "sft", "--data", f"log:{url}?policy=harness", "--pii", "drop",
                                 "--out", str(tmp_path / "run")])
    _one_line_error(result, "no traces are left", "3 dropped")
    result = runner.invoke(app, ["posttrain", "sft", "--data", f"log:{url}?policy=other", "--out", str(tmp_path / "run")])
    _one_line_error(result, "holds no tool-call traces", "policies=['other']")
    assert not (tmp_path / "run").exists()


def test_a_base_model_that_is_not_local(tmp_path, bfcl_jsonl, tripwires):
    for base in ("openai/gpt-4o", "smollm9-1b"):
        result = runner.invoke(app, ["posttrain", "sft", "--base", base, "--data", str(bfcl_jsonl), "--out", str(tmp_path / "run")])
        _one_line_error(result, f"model {base!r} is not local")
    _one_line_error(runner.invoke(app, ["posttrain", "eval", "--model", "openai/gpt-4o", "--data", str(bfcl_jsonl)]),
                    "is not local")
    assert not (tmp_path / "run").exists()


# --- the pipeline on a tiny model ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sft_run(tiny_chat_base, bfcl_jsonl, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "tiny"
    result = runner.invoke(app, ["posttrain", "sft", "--base", str(tiny_chat_base), "--data", str(bfcl_jsonl),
                                 "--out", str(out), "--val-fraction", "0.25", "--max-steps", "2", *TINY],
                           env={"COLUMNS": "200"})
    return out, result


@pytest.mark.slow
def test_sft_trains_and_writes_the_split(sft_run, bfcl_jsonl):
    out, result = sft_run
    assert result.exit_code == 0, result.output
    assert "steps" in result.output and "2 (" in result.output and "tokens/s" in result.output and "val loss" in result.output
    split = json.loads((out / "split.json").read_text())
    train, val = split_traces(read_openai_jsonl(bfcl_jsonl), 0.25, 0)
    assert split["train"] == [t.id for t in train] and split["val"] == [t.id for t in val]
    assert len(split["val"]) == 2 and {t.category for t in val} == {"simple", "irrelevance"}  # one per category
    assert split["data"] == [str(bfcl_jsonl)] and split["seed"] == 0
    run = json.loads((out / "run.json").read_text())
    assert run["train"]["steps"] == 2 and run["num_train_traces"] == 6 and run["train"]["val_loss"] > 0
    assert (out / "adapter" / "adapter_config.json").is_file()


@pytest.mark.slow
def test_eval_scores_exactly_the_held_out_part(sft_run, tiny_chat_base, tmp_path):
    out, _ = sft_run
    items = tmp_path / "items.jsonl"
    result = runner.invoke(app, ["posttrain", "eval", "--model", str(tiny_chat_base), "--split-file", str(out / "split.json"),
                                 "--max-tokens", "4", "--out", str(items)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in items.read_text().splitlines()]
    assert [r["id"] for r in rows] == json.loads((out / "split.json").read_text())["val"]
    assert all(r["output_tokens"] <= 4 for r in rows)
    metrics = json.loads((tmp_path / "items.metrics.json").read_text())
    assert metrics["num_items"] == 2 and metrics["accuracy"] == sum(r["correct"] for r in rows) / 2
    assert f"accuracy {100 * metrics['accuracy']:.1f}% (items with calls" in result.output and "irrelevance" in result.output


@pytest.mark.slow
def test_export_merges_and_registers(sft_run, tmp_path):
    from link.db import make_db_engine
    from link.model_registration import registered_deployments

    out, _ = sft_run
    url = f"sqlite:///{tmp_path / 'link.db'}"
    folder = tmp_path / "models" / "tiny-sft"
    result = runner.invoke(app, ["posttrain", "export", "--run", str(out), "--name", "acme/tiny-sft", "--out", str(folder),
                                 "--database-url", url], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    provenance = json.loads((folder / "provenance.json").read_text())
    run = json.loads((out / "run.json").read_text())
    assert provenance["base_model"] == run["base"] and provenance["steps"] == 2
    assert provenance["data"]["specs"] == run["data"] and provenance["data"]["num_train"] == 6
    assert provenance["metrics"]["val_loss"] == run["train"]["val_loss"]
    engine = make_db_engine(url)
    try:
        [deployment] = registered_deployments(engine)
    finally:
        engine.dispose()
    assert deployment.name == "acme/tiny-sft" and deployment.local == str(folder.resolve())
    # The base is a folder, not a configured model: no price to inherit.
    assert (deployment.input_cost_per_million, deployment.output_cost_per_million) == (0.0, 0.0)
    priced = runner.invoke(app, ["posttrain", "export", "--run", str(out), "--name", "acme/tiny-priced", "--out",
                                 str(tmp_path / "priced"), "--database-url", url, "--input-cost-per-million", "0.5"])
    assert priced.exit_code == 0, priced.output
    engine = make_db_engine(url)
    try:
        by_name = {d.name: d for d in registered_deployments(engine)}
    finally:
        engine.dispose()
    assert (by_name["acme/tiny-priced"].input_cost_per_million, by_name["acme/tiny-priced"].output_cost_per_million) == (0.5, 0.0)
    again = runner.invoke(app, ["posttrain", "export", "--run", str(out), "--name", "acme/tiny-sft",
                                "--out", str(tmp_path / "other"), "--database-url", url])
    _one_line_error(again, "already registered")
    assert not (tmp_path / "other").exists()  # refused before merging
    taken = runner.invoke(app, ["posttrain", "export", "--run", str(out), "--name", "smollm2-135m-instruct",
                                "--out", str(tmp_path / "third"), "--database-url", url])
    _one_line_error(taken, "already a local model")
    assert not (tmp_path / "third").exists()


def test_a_fine_tuned_model_inherits_its_configured_base_price(monkeypatch):
    from posttrain.sft import base_prices

    monkeypatch.delenv("LINK_CONFIG", raising=False)
    # The embedded default prices SmolLM2 at $0.02 and Qwen2.5-Coder-0.5B at $0.08 per 1e6 tokens each way.
    assert base_prices("smollm2-135m-instruct") == (0.02, 0.02)
    assert base_prices("qwen2.5-coder-0.5b-instruct") == (0.08, 0.08)
    assert base_prices("/some/folder") == (0.0, 0.0)
