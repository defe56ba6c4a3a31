"""`link posttrain sft` on the real qwen2.5-coder-0.5b-instruct (a registry name: its GGUF exported to a Hugging Face
Qwen2ForCausalLM folder) with BFCL traces, then `link posttrain export` registers the merged result. A short run:
two LoRA steps of rank 2 on short traces.

    LINK_HOME=.link LINK_DATASETS_DIR=../shared/data .venv/bin/python -m pytest -q tests/cli/test_cli_posttrain_qwen.py
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.app import app
from posttrain.traces_bfcl import read_bfcl

pytestmark = pytest.mark.slow

runner = CliRunner()
BASE = "qwen2.5-coder-0.5b-instruct"
MAX_LEN = 768


def test_sft_and_export_on_qwen(data_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("LINK_CONFIG", raising=False)  # the embedded default config prices the base
    from link.db import make_db_engine
    from link.model_registration import registered_deployments

    traces = read_bfcl(data_dir, ["simple", "irrelevance"])
    picked = [t for t in traces if t.category == "simple"][:3] + [t for t in traces if t.category == "irrelevance"][:3]
    data = tmp_path / "bfcl6.jsonl"
    data.write_text("".join(json.dumps({"id": t.id, "category": t.category, "messages": t.messages, "tools": t.tools}) + "\n"
                            for t in picked))
    out = tmp_path / "run"
    result = runner.invoke(app, ["posttrain", "sft", "--base", BASE, "--data", str(data), "--out", str(out),
                                 "--val-fraction", "0.34", "--max-steps", "2", "--rank", "2", "--alpha", "4",
                                 "--dtype", "float32", "--batch-size", "1", "--checkpoint-every", "0", "--no-progress",
                                 "--max-seq-length", str(MAX_LEN)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    run = json.loads((out / "run.json").read_text())
    print(f"\n{result.output}\nrun.json train: {run['train']}")
    assert run["train"]["steps"] == 2 and run["num_train_traces"] == 4 and run["train"]["val_loss"] > 0
    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 2
    url = f"sqlite:///{tmp_path / 'link.db'}"
    folder = tmp_path / "models" / "qwen-sft"
    result = runner.invoke(app, ["posttrain", "export", "--run", str(out), "--name", "acme/qwen-sft", "--out", str(folder),
                                 "--database-url", url], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    assert json.loads((folder / "provenance.json").read_text())["steps"] == 2
    engine = make_db_engine(url)
    try:
        [deployment] = registered_deployments(engine)
    finally:
        engine.dispose()
    assert deployment.name == "acme/qwen-sft" and deployment.local == str(folder.resolve())
    # The base is a model of the embedded default, priced 0.08 USD per million tokens each way: inherited.
    assert (deployment.input_cost_per_million, deployment.output_cost_per_million) == (0.08, 0.08)
