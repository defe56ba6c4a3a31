"""`link router ...` tried as a new user would on another outcome file (issue 37 item 5): each defect found then,
reproduced on small outcome files written here, with a fake embedder."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.app import app
from evals.outcomes import Outcome, OutcomeTable
from routers.base import load_router
from tests.cli.test_cli_router import fake_embed, write_outcomes

runner = CliRunner()


@pytest.fixture(autouse=True)
def fakes(monkeypatch):
    monkeypatch.setattr("routers.embedding.Embedder.embed", fake_embed)


def said(result) -> str:
    """The command's output with rich's line wrapping undone."""
    return " ".join(result.output.split())


def write_jsonl(path, records: list[dict]):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_the_same_models_in_another_order_are_the_same_models(tmp_path):
    train = write_outcomes(tmp_path / "train.jsonl", 60, 0, "a")
    test = OutcomeTable.read(write_outcomes(tmp_path / "b.jsonl", 30, 1, "b"))
    # the test file lists weak first: the same two models
    flipped = OutcomeTable(sorted(test, key=lambda o: o.model != "weak")).write(tmp_path / "test.jsonl")
    assert OutcomeTable.read(flipped).models == ("weak", "strong")
    out_json = tmp_path / "r.json"
    result = runner.invoke(app, ["router", "eval", "--type", "knn", "--train", str(train), "--test", str(flipped),
                                 "--baselines", "oracle", "--lambdas", "16", "--json", str(out_json)])
    assert result.exit_code == 0, result.output
    split = json.loads(out_json.read_text())["split"]
    assert split["models"] == ["strong", "weak"]          # the training order, the test columns moved to it
    # the oracle reaches every prompt's best score: the test file's own per-prompt max
    best = {}
    for o in test:
        best[o.prompt_id] = max(best.get(o.prompt_id, 0.0), o.score)
    assert split["routers"]["oracle"]["max_quality"] == pytest.approx(np.mean(list(best.values())))
    assert split["single_models"]["weak"]["accuracy"] == pytest.approx(
        np.mean([o.score for o in test if o.model == "weak"]))
    # other models are still refused, and the message names the difference
    other = OutcomeTable([Outcome(o.prompt_id, o.suite, o.prompt, "other" if o.model == "weak" else o.model, o.score,
                                  o.cost_usd) for o in test]).write(tmp_path / "other.jsonl")
    result = runner.invoke(app, ["router", "eval", "--type", "knn", "--train", str(train), "--test", str(other),
                                 "--baselines", "oracle", "--lambdas", "16"])
    assert result.exit_code == 2
    assert "only in the training data: weak" in said(result) and "only in the test data: other" in said(result)


def test_an_empty_answer_is_a_recorded_answer_and_a_skipped_cascade_is_said(tmp_path):
    rng = np.random.default_rng(0)
    records = []
    for i in range(80):
        right = bool(rng.uniform() < 0.6)
        prompt = f"{'easy' if right else 'hard'} sum {i}"
        # the weak model's wrong answers are empty strings: answers all the same, recorded
        records.append({"prompt_id": f"p{i}", "suite": "toy", "prompt": prompt, "model": "weak",
                        "score": float(right), "cost_usd": 1e-5, "response": f"#### {i}" if right else ""})
        records.append({"prompt_id": f"p{i}", "suite": "toy", "prompt": prompt, "model": "strong",
                        "score": 1.0, "cost_usd": 1e-3, "response": f"#### {i}"})
    path = write_jsonl(tmp_path / "answers.jsonl", records)
    weak = [o for o in OutcomeTable.read(path) if o.model == "weak"]
    assert sum(o.response == "" for o in weak) == sum(r["response"] == "" for r in records) > 0
    out_json = tmp_path / "r.json"
    args = ["router", "eval", "--type", "knn", "--train", str(path), "--folds", "2", "--baselines", "oracle",
            "--lambdas", "16", "--answer-check", "--json", str(out_json)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    folds = json.loads(out_json.read_text())["kfold"]["folds"]
    assert all("cascade:answer" in fold["routers"] for fold in folds), said(result)
    assert "not measured" not in said(result)
    # an unrecorded (null) answer of the weak model on 7 prompts: the cascade is skipped, and the warning names
    # the model and how many answers it lacks
    for r in records[:14:2]:
        r["response"] = None
    write_jsonl(path, records)
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    text = said(result)
    assert "warning: cascade:answer not measured" in text and "weak has no recorded answer on 7 of 80 prompts" in text


def test_a_model_with_one_row_is_an_error_naming_it(tmp_path):
    train = OutcomeTable.read(write_outcomes(tmp_path / "a.jsonl", 60, 0, "a"))
    lonely = [*train, Outcome("a/0", "toy", train.rows[0].prompt, "tiny", 1.0, 1e-6)]
    path = OutcomeTable(lonely).write(tmp_path / "lonely.jsonl")
    result = runner.invoke(app, ["router", "train", "--type", "knn", "--data", str(path), "--out",
                                 str(tmp_path / "r.safetensors")])
    assert result.exit_code == 2, result.output
    assert "tiny" in said(result) and "1 of 60 prompts" in said(result)
    assert not (tmp_path / "r.safetensors").exists()
    result = runner.invoke(app, ["router", "eval", "--type", "knn", "--train", str(path), "--folds", "5"])
    assert result.exit_code == 2, result.output
    assert "tiny" in said(result) and "1 of 60 prompts" in said(result) and "k must be in" not in said(result)


def test_train_says_how_many_prompts_it_uses_and_why_it_drops_any(tmp_path):
    train = OutcomeTable.read(write_outcomes(tmp_path / "a.jsonl", 60, 0, "a"))
    # the weak model lacks 15 prompts
    gaps = {f"a/{i}" for i in range(15)}
    path = OutcomeTable([o for o in train if not (o.model == "weak" and o.prompt_id in gaps)]).write(tmp_path / "g.jsonl")
    out = tmp_path / "r.safetensors"
    result = runner.invoke(app, ["router", "train", "--type", "knn", "--data", str(path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = said(result)
    assert "trained knn on 45 of 60 prompts x 2 models" in text
    assert "15 prompts left out: they lack a score of weak (45 of 60 prompts)" in text
    assert load_router(out).info["num_prompts"] == 45


# LightGBM's added booster: two leaves of min_data_in_leaf 30, within a bag of 80% of the rows: ceil(60 / 0.8)
@pytest.mark.parametrize("type_, options, needed", [("knn", ["--option", "k=20"], 21), ("lgbm", [], 75)])
def test_add_model_with_too_few_labels_warns_naming_the_minimum(tmp_path, type_, options, needed):
    train = write_outcomes(tmp_path / "a.jsonl", 90, 0, "a")
    out = tmp_path / "r.safetensors"
    result = runner.invoke(app, ["router", "train", "--type", type_, "--data", str(train), "--out", str(out), *options])
    assert result.exit_code == 0, result.output
    rows = [Outcome(f"c/{i}", "toy", f"{'hard' if i % 2 else 'easy'} question c{i}", "sft", float(i % 2), 1e-5)
            for i in range(12)]
    labelled = OutcomeTable(rows).write(tmp_path / "sft.jsonl")
    result = runner.invoke(app, ["router", "add-model", str(out), "--model", "sft", "--data", str(labelled)])
    assert result.exit_code == 0, result.output
    assert f"warning: sft has 12 labelled prompts; a {type_} router needs at least {needed}" in said(result)
    hard, easy = ({"messages": [{"role": "user", "content": f"{kind} one"}]} for kind in ("hard", "easy"))
    # what the warning says: right on every hard prompt, wrong on every easy one, yet one prediction for both
    assert load_router(out).router.score(hard)["sft"] == pytest.approx(load_router(out).router.score(easy)["sft"])
    # enough labels: no warning
    rows = [Outcome(f"c/{i}", "toy", f"{'hard' if i % 2 else 'easy'} question c{i}", "sft2", float(i % 2), 1e-5)
            for i in range(needed)]
    labelled = OutcomeTable(rows).write(tmp_path / "sft2.jsonl")
    result = runner.invoke(app, ["router", "add-model", str(out), "--model", "sft2", "--data", str(labelled)])
    assert result.exit_code == 0, result.output
    assert "warning" not in said(result)
    scored = {kind: load_router(out).router.score(body)["sft2"] for kind, body in (("hard", hard), ("easy", easy))}
    assert scored["hard"] > scored["easy"]


def test_rows_without_prompt_text_or_cost_and_null_scores(tmp_path):
    good = [{"prompt_id": f"p{i}", "suite": "toy", "prompt": f"question {i}", "model": m, "score": float(i % 2),
             "cost_usd": c} for i in range(20) for m, c in (("a", 1e-3), ("b", 1e-5))]
    out = tmp_path / "r.safetensors"

    def train(path):
        return runner.invoke(app, ["router", "train", "--type", "knn", "--data", str(path), "--out", str(out)])

    # a row without prompt text: routing cannot embed it (line 4 of the file)
    rows = [dict(r) for r in good]
    del rows[3]["prompt"]
    result = train(write_jsonl(tmp_path / "noprompt.jsonl", rows))
    assert result.exit_code == 2
    assert f"{tmp_path / 'noprompt.jsonl'}:4" in said(result) and "'prompt'" in said(result)
    # a text-free file (written with text=False, as shipped) still reads, for replay by prompt id
    table = OutcomeTable.read(write_jsonl(tmp_path / "good.jsonl", good))
    shipped = table.write(tmp_path / "shipped.jsonl.gz", text=False)
    assert len(OutcomeTable.read(shipped)) == 40
    result = train(shipped)
    assert result.exit_code == 2 and "no prompt text" in said(result) and str(shipped) in said(result)
    # rows without cost_usd: read as 0 USD, with a warning that counts them
    rows = [dict(r) for r in good]
    for r in rows[:5]:
        del r["cost_usd"]
    result = train(write_jsonl(tmp_path / "nocost.jsonl", rows))
    assert result.exit_code == 0, result.output
    assert "warning: 5 rows of" in said(result) and "have no cost_usd; read as 0 USD" in said(result)
    # a null score: the error names the field, the file and the line
    rows = [dict(r) for r in good]
    rows[6]["score"] = None
    result = train(write_jsonl(tmp_path / "null.jsonl", rows))
    assert result.exit_code == 2
    assert f"{tmp_path / 'null.jsonl'}:7" in said(result) and "'score'" in said(result)


@pytest.mark.parametrize("name, text", [("empty.jsonl", ""), ("empty.csv", ",".join(["prompt_id", "model", "score"]) + "\n")])
def test_an_empty_file_is_named(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    for args in (["train", "--type", "knn", "--data", str(path), "--out", str(tmp_path / "r.safetensors")],
                 ["eval", "--type", "knn", "--train", str(path)]):
        result = runner.invoke(app, ["router", *args])
        assert result.exit_code == 2
        assert str(path) in said(result) and "no outcome rows" in said(result)


def test_the_cross_validation_png_draws_the_folds_mean_with_the_tables_numbers(tmp_path):
    from routers.offline.plot import report_figure

    train = write_outcomes(tmp_path / "a.jsonl", 90, 0, "a")
    out_json, out_png = tmp_path / "cv.json", tmp_path / "cv.png"
    result = runner.invoke(app, ["router", "eval", "--type", "knn", "--train", str(train), "--folds", "3",
                                 "--baselines", "random,oracle", "--lambdas", "16", "--json", str(out_json),
                                 "--plot", str(out_png)])
    assert result.exit_code == 0, result.output
    report = json.loads(out_json.read_text())
    summary, folds = report["kfold"]["summary"], report["kfold"]["folds"]
    fig = report_figure(report, title="3-fold CV")
    labels = fig.axes[0].get_legend_handles_labels()[1]
    for name in ("knn", "random", "oracle", "cascade:knn"):
        aiq = summary[name]["aiq"]
        number = f"{aiq['mean']:.3f}±{aiq['std']:.3f}"
        assert f"{name} (AIQ {number})" in labels            # the legend reads the table's mean±std ...
        assert number in said(result)                         # ... which the command printed
        # ... the mean of the folds' AIQs, not the first fold's
        assert aiq["mean"] == pytest.approx(np.mean([f["routers"][name]["aiq"] for f in folds]))
    assert out_png.read_bytes()[:4] == b"\x89PNG"
