"""`link router train --type lgbm --option lexical=true` end to end: a word the fake embedding cannot see."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cli.app import app
from evals.outcomes import Outcome, OutcomeTable
from routers.base import load_router
from tests.cli.test_cli_router import fake_embed

runner = CliRunner()


@pytest.fixture(autouse=True)
def fakes(monkeypatch):
    monkeypatch.setattr("routers.embedding.Embedder.embed", fake_embed)


def test_train_a_lightgbm_router_that_reads_the_words(tmp_path):
    """The word "tricky" (mid-prompt, invisible to the fake embedding and the text features) marks where the
    weak model fails; `--option lexical=true` stacks word models that read it, in training and in a request,
    and the router without them cannot tell."""
    rows = []
    for i in range(240):
        tricky = i % 3 == 0
        prompt = f"question {i} about a {'tricky' if tricky else 'simple'} sum"     # the same length either way
        rows.append(Outcome(f"w/{i}", "toy", prompt, "strong", 1.0, 1e-3))
        rows.append(Outcome(f"w/{i}", "toy", prompt, "weak", 0.0 if tricky else 1.0, 1e-5))
    data = OutcomeTable(rows).write(tmp_path / "words.jsonl")
    out = tmp_path / "words.safetensors"
    result = runner.invoke(app, ["router", "train", "--type", "lgbm", "--data", str(data), "--out", str(out),
                                 "--option", "lexical=true", "--option", "num_bags=1"])
    assert result.exit_code == 0, result.output
    router = load_router(out).router
    assert router.lexical and router.lexical_model is not None
    tricky = router.score({"messages": [{"role": "user", "content": "question 999 about a tricky sum"}]})
    plain = router.score({"messages": [{"role": "user", "content": "question 999 about a simple sum"}]})
    assert tricky["weak"] < 0.2 < 0.8 < plain["weak"]
    blind = tmp_path / "blind.safetensors"
    assert runner.invoke(app, ["router", "train", "--type", "lgbm", "--data", str(data), "--out", str(blind),
                               "--option", "num_bags=1"]).exit_code == 0
    router = load_router(blind).router
    tricky = router.score({"messages": [{"role": "user", "content": "question 999 about a tricky sum"}]})
    plain = router.score({"messages": [{"role": "user", "content": "question 999 about a simple sum"}]})
    assert abs(tricky["weak"] - plain["weak"]) < 0.05
