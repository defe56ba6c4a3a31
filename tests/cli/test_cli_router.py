"""`link router train|calibrate|eval` end to end on small outcome files, with a fake embedder."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.app import app
from evals.outcomes import Outcome, OutcomeTable
from routers.base import ROUTERS, Router, load_router, register_router

runner = CliRunner()


def fake_embed(self, texts):
    """Coordinate 0: the prompt says it is hard; 1: a constant."""
    out = np.zeros((len(texts), 384), dtype=np.float32)
    out[:, 0] = [1.0 if t.startswith("hard") else 0.0 for t in texts]
    out[:, 1] = 1.0
    return out


class LinearRouter(Router):
    """Least squares of each model's score on the first two embedding coordinates."""

    type = "linear"

    def __init__(self, models, ridge: float = 0.0):
        super().__init__(models)
        self.ridge = ridge
        self.weights = np.zeros((2, len(self.models)))

    def fit(self, data, features):
        data = self.aligned(data)
        x = features.embeddings[:, :2].astype(np.float64)
        self.weights = np.linalg.solve(x.T @ x + self.ridge * np.eye(2), x.T @ data.scores)
        return self

    def predict(self, features, suites=None):
        return features.embeddings[:, :2].astype(np.float64) @ self.weights

    def state(self):
        return {"weights": self.weights}, {"ridge": self.ridge}

    @classmethod
    def from_state(cls, arrays, meta):
        router = cls(meta["models"], ridge=meta["ridge"])
        router.weights = arrays["weights"]
        return router


@pytest.fixture(autouse=True)
def fakes(monkeypatch):
    monkeypatch.setattr("routers.embedding.Embedder.embed", fake_embed)
    register_router("linear", f"{__name__}:LinearRouter")
    yield
    ROUTERS.pop("linear", None)


def write_outcomes(path, n: int, seed: int, prefix: str):
    """Strong (1e-3 USD) right 90% of the time; weak (1e-5 USD) right on easy prompts, wrong on hard ones."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        hard = i % 3 == 0
        prompt = f"{'hard' if hard else 'easy'} question {prefix}{i} " + "x" * int(rng.integers(0, 40))
        rows.append(Outcome(f"{prefix}/{i}", "toy", prompt, "strong", float(rng.uniform() < 0.9), 1e-3))
        rows.append(Outcome(f"{prefix}/{i}", "toy", prompt, "weak", 0.0 if hard else float(rng.uniform() < 0.95), 1e-5))
    return OutcomeTable(rows).write(path)


@pytest.fixture()
def files(tmp_path):
    return write_outcomes(tmp_path / "train.jsonl", 90, 0, "a"), write_outcomes(tmp_path / "test.csv", 60, 1, "b")


def test_train_then_calibrate_a_lambda_and_a_threshold(tmp_path, files):
    train, test = files
    out = tmp_path / "r.safetensors"
    result = runner.invoke(app, ["router", "train", "--type", "linear", "--data", str(train), "--out", str(out),
                                 "--option", "ridge=0.5"])
    assert result.exit_code == 0, result.output
    loaded = load_router(out)
    assert loaded.router.ridge == 0.5 and loaded.models == ["strong", "weak"]
    assert loaded.info["data"] == [str(train)] and loaded.info["num_prompts"] == 90
    assert loaded.decision["cost_penalty"] == 0.0

    result = runner.invoke(app, ["router", "calibrate", str(out), "--data", str(test), "--target", "cost=0.0005"])
    assert result.exit_code == 0, result.output
    decision = load_router(out).decision
    assert decision["rule"] == "lambda" and decision["cost_penalty"] >= 0
    assert decision["target"] == {"kind": "cost", "value": 0.0005, "model": None}
    # the hard third goes to the strong model: 1/3 * 1e-3 + 2/3 * 1e-5 <= 5e-4
    hard, easy = ({"messages": [{"role": "user", "content": f"{kind} one"}]} for kind in ("hard", "easy"))
    assert load_router(out).decide(hard).chosen == "strong"
    assert load_router(out).decide(easy).chosen == "weak"
    # a budget below that sends everything to the weak model: a positive penalty
    result = runner.invoke(app, ["router", "calibrate", str(out), "--data", str(test), "--target", "cost=0.0002"])
    assert result.exit_code == 0, result.output
    assert load_router(out).decision["cost_penalty"] > 0 and load_router(out).decide(hard).chosen == "weak"
    assert "warning" not in result.output
    # under the weak model's 1e-5 USD no setting reaches it: the cheapest is kept, with a warning
    result = runner.invoke(app, ["router", "calibrate", str(out), "--data", str(test), "--target", "cost=0.000001"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "warning: no setting keeps the mean cost at or under 1e-06 USD" in said and "(1e-05 USD)" in said
    # at lambda 0 the weak model already takes the easy two thirds, and a cost penalty only adds to them: 5% is
    # out of reach and the nearest share is said
    result = runner.invoke(app, ["router", "calibrate", str(out), "--data", str(test), "--target", "share:weak=0.05"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "warning: no setting sends 5.0% of these prompts to weak; the nearest sends 66.7%" in said, said

    other = tmp_path / "t.safetensors"
    result = runner.invoke(app, ["router", "calibrate", str(out), "--data", str(test), "--rule", "threshold",
                                 "--strong", "strong", "--weak", "weak", "--target", "share:strong=0.34",
                                 "--out", str(other)])
    assert result.exit_code == 0, result.output
    assert load_router(other).decision["rule"] == "threshold"
    assert "share of calls" in result.output


def test_eval_a_split_with_resplits_writes_json_and_png(tmp_path, files):
    train, test = files
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    result = runner.invoke(app, ["router", "eval", "--type", "linear", "--train", str(train), "--test", str(test),
                                 "--splits", "2", "--json", str(out_json), "--plot", str(out_png), "--lambdas", "32"])
    assert result.exit_code == 0, result.output
    report = json.loads(out_json.read_text())
    split = report["split"]
    assert split["num_test"] == 60 and split["pair"] == {"strong": "strong", "weak": "weak"}
    assert set(split["routers"]) == {"linear", "random", "best-per-task", "length", "oracle", "cascade:linear",
                                     "cascade:oracle"}
    assert split["routers"]["linear"]["apgr"] > split["routers"]["random"]["apgr"]
    # the within-suite AUC: the oracle ranks perfectly, best-per-task knows only each suite's mean
    assert split["routers"]["oracle"]["auc_within_suite"] == 1.0
    assert split["routers"]["best-per-task"]["auc_within_suite"] == 0.5
    assert split["routers"]["linear"]["auc_within_suite"] > 0.5 and "AUC in suite" in result.output
    cascade = split["routers"]["cascade:linear"]
    assert cascade["steps"] == ["weak", "strong"] and cascade["apgr"] > split["routers"]["random"]["apgr"]
    assert "cascade:<router> escalates weak -> strong" in result.output
    assert len(report["resplits"]["splits"]) == 2 and "linear" in report["resplits"]["summary"]
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "APGR" in result.output or "apgr" in result.output


def test_eval_cross_validation_and_errors(tmp_path, files):
    train, _ = files
    out_json = tmp_path / "cv.json"
    result = runner.invoke(app, ["router", "eval", "--type", "linear", "--train", str(train), "--folds", "3",
                                 "--seeds", "2", "--baselines", "random,oracle", "--json", str(out_json)])
    assert result.exit_code == 0, result.output
    report = json.loads(out_json.read_text())
    assert len(report["kfold"]["folds"]) == 6 and report["kfold"]["seeds"] == [0, 1]
    bad = runner.invoke(app, ["router", "calibrate", str(tmp_path / "none.safetensors"), "--data", str(train),
                              "--target", "speed=1"])
    assert bad.exit_code == 2 and "error:" in bad.output
    bad = runner.invoke(app, ["router", "eval", "--type", "linear", "--train", str(train), "--option", "lgbm.x=1"])
    assert bad.exit_code == 2 and "lgbm" in bad.output
    bad = runner.invoke(app, ["router", "train", "--type", "nope", "--data", str(train), "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "unknown router type" in bad.output
    backwards = runner.invoke(app, ["router", "eval", "--type", "linear", "--train", str(train), "--folds", "3",
                                    "--cascade-models", "strong,weak"])
    assert backwards.exit_code == 2 and "cheapest first" in backwards.output


def test_eval_reports_its_progress_per_fold_and_router_on_stderr(tmp_path, files):
    train, _ = files
    out_json = tmp_path / "cv.json"
    result = runner.invoke(app, ["router", "eval", "--type", "linear", "--train", str(train), "--folds", "3",
                                 "--seeds", "2", "--baselines", "random", "--no-cascade", "--json", str(out_json)])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("evaluating routers")]
    # 3 folds x 2 seeds x 1 learned router = 6 steps, counted up one by one to the total
    assert lines == ["evaluating routers ...", "evaluating routers: 0/6 encoding 90 prompts",
                     *(f"evaluating routers: {3 * s + f + 1}/6 fold {f + 1}/3 of seed {s}, linear"
                       for s in range(2) for f in range(3))]
    assert "evaluating routers" not in result.stdout and "wrote" in result.stdout  # stdout: the report only
    assert len(json.loads(out_json.read_text())["kfold"]["folds"]) == 6


def test_routing_commands_refuse_outcomes_of_one_model(tmp_path, files):
    train, _ = files
    one = OutcomeTable.read(train).select(models=["strong"]).write(tmp_path / "strong.jsonl")
    for args in (["train", "--type", "linear", "--data", str(one), "--out", str(tmp_path / "r.safetensors")],
                 ["eval", "--type", "linear", "--train", str(one), "--folds", "3"]):
        result = runner.invoke(app, ["router", *args])
        assert result.exit_code == 2, result.output
        assert "at least 2 models" in result.output and "only strong" in result.output


def test_calibrate_a_cascade_threshold_keeps_the_router_rule(tmp_path, files):
    train, test = files
    out = tmp_path / "r.safetensors"
    assert runner.invoke(app, ["router", "train", "--type", "linear", "--data", str(train), "--out", str(out)]).exit_code == 0
    result = runner.invoke(app, ["router", "calibrate", str(out), "--data", str(test), "--rule", "cascade",
                                 "--cascade-models", "weak,strong", "--target", "cost=0.0005"])
    assert result.exit_code == 0, result.output
    loaded = load_router(out)
    assert loaded.decision["rule"] == "lambda" and loaded.decision["cost_penalty"] == 0.0
    cascade = loaded.decision["cascade"]
    assert cascade["models"] == ["weak", "strong"]
    # the weak model's predicted quality takes two values (hard, easy prompts); within 5e-4 USD the best
    # threshold escalates exactly the hard third: 20 x 1e-3 + 40 x 1e-5 over 60 prompts
    weak_q = {kind: loaded.router.score({"messages": [{"role": "user", "content": f"{kind} one"}]})["weak"]
              for kind in ("hard", "easy")}
    assert weak_q["hard"] < cascade["threshold"] <= weak_q["easy"]
    assert "share of calls: weak 66.7%, strong 33.3%" in result.output
    assert "threshold:" in result.output and "scorer: router" in result.output
    # calibrating the router's lambda afterwards keeps the cascade's threshold
    assert runner.invoke(app, ["router", "calibrate", str(out), "--data", str(test), "--target", "cost=0.0005"]).exit_code == 0
    assert load_router(out).decision["cascade"] == cascade
    bad = runner.invoke(app, ["router", "calibrate", str(out), "--data", str(test), "--rule", "cascade",
                              "--cascade-models", "weak,nobody", "--target", "cost=0.0005"])
    assert bad.exit_code == 2 and "nobody" in bad.output
    backwards = runner.invoke(app, ["router", "calibrate", str(out), "--data", str(test), "--rule", "cascade",
                                    "--cascade-models", "strong,weak", "--target", "cost=0.0005"])
    assert backwards.exit_code == 2 and "cheapest first" in backwards.output and "weak,strong" in backwards.output


def test_eval_with_a_hybrid_column(tmp_path):
    def with_moa(path, n, seed, prefix):
        """The strong/weak table plus link/moa: right on every prompt, at 2e-3 USD."""
        write_outcomes(path, n, seed, prefix)
        table = OutcomeTable.read(path)
        rows = list(table) + [Outcome(o.prompt_id, o.suite, o.prompt, "link/moa", 1.0, 2e-3)
                              for o in table if o.model == "strong"]
        return OutcomeTable(rows).write(path)

    train, test = with_moa(tmp_path / "a.jsonl", 90, 0, "a"), with_moa(tmp_path / "b.jsonl", 60, 1, "b")
    out_json = tmp_path / "h.json"
    result = runner.invoke(app, ["router", "eval", "--type", "linear", "--train", str(train), "--test", str(test),
                                 "--hybrid", "link/moa", "--baselines", "oracle", "--lambdas", "32",
                                 "--json", str(out_json), "--plot", str(tmp_path / "h.png")])
    assert result.exit_code == 0, result.output
    split = json.loads(out_json.read_text())["split"]
    assert split["ensembles"] == ["link/moa"] and split["pair"] == {"strong": "strong", "weak": "weak"}
    assert set(split["routers"]) == {"linear", "oracle", "cascade:linear", "cascade:oracle", "hybrid:linear",
                                     "hybrid:oracle"}
    moa = split["models"].index("link/moa")
    assert max(s[moa] for s in split["routers"]["linear"]["curve"]["share"]) == 0.0
    assert split["routers"]["hybrid:oracle"]["max_quality"] == 1.0
    assert "hybrid:<router> also among link/moa" in result.output


def test_add_model_keeps_the_others_and_routes_to_the_new_one(tmp_path, files):
    train, _ = files
    out = tmp_path / "knn.safetensors"
    assert runner.invoke(app, ["router", "train", "--type", "knn", "--data", str(train), "--out", str(out),
                               "--option", "k=10"]).exit_code == 0
    hard, easy = ({"messages": [{"role": "user", "content": f"{kind} one"}]} for kind in ("hard", "easy"))
    before = {kind: load_router(out).decide(body) for kind, body in (("hard", hard), ("easy", easy))}
    # The new model: right on every hard prompt, wrong on the easy ones, at the weak model's price (1e-5 USD).
    rows = []
    for i in range(40):
        kind = "hard" if i % 2 else "easy"
        rows.append(Outcome(f"c/{i}", "toy", f"{kind} question c{i}", "sft", float(kind == "hard"), 1e-5))
    labelled = OutcomeTable(rows).write(tmp_path / "sft.jsonl")
    result = runner.invoke(app, ["router", "add-model", str(out), "--model", "sft", "--data", str(labelled)])
    assert result.exit_code == 0, result.output
    assert "added sft from 40 labelled prompts" in result.output
    loaded = load_router(out)
    assert loaded.models == ["strong", "weak", "sft"] and loaded.info["added_models"] == [{"model": "sft", "num_prompts": 40}]
    after = {kind: loaded.decide(body) for kind, body in (("hard", hard), ("easy", easy))}
    for kind in ("hard", "easy"):  # the old models' predictions and costs are unchanged
        for model in ("strong", "weak"):
            assert after[kind].quality[model] == pytest.approx(before[kind].quality[model])
            assert after[kind].expected_cost[model] == pytest.approx(before[kind].expected_cost[model])
    # k = 10 identical neighbours, shrunk toward the model's mean (0.5) with prior 10:
    # hard (10 * 1 + 10 * 0.5) / 20, easy (10 * 0 + 10 * 0.5) / 20.
    assert after["hard"].quality["sft"] == pytest.approx(0.75) and after["easy"].quality["sft"] == pytest.approx(0.25)
    assert after["hard"].expected_cost["sft"] == pytest.approx(1e-5)
    with_penalty = loaded.decide(hard, cost_penalty=1000.0)  # 0.75 - 0.01 beats strong's ~0.9 - 1.0
    assert with_penalty.chosen == "sft" and after["easy"].chosen == before["easy"].chosen != "sft"

    # the model added from plain prompts competes for tool-calling requests too (no model has tool labels)
    assert loaded.decide({**hard, "tools": TOOLS}, cost_penalty=1000.0).chosen == "sft"

    again = runner.invoke(app, ["router", "add-model", str(out), "--model", "sft", "--data", str(labelled)])
    assert again.exit_code == 2 and "already one of the router's models" in again.output
    absent = runner.invoke(app, ["router", "add-model", str(out), "--model", "nope", "--data", str(labelled)])
    assert absent.exit_code == 2 and "no outcomes of 'nope'" in absent.output
    linear = tmp_path / "linear.safetensors"
    assert runner.invoke(app, ["router", "train", "--type", "linear", "--data", str(train), "--out", str(linear)]).exit_code == 0
    refused = runner.invoke(app, ["router", "add-model", str(linear), "--model", "sft", "--data", str(labelled)])
    assert refused.exit_code == 2 and "cannot add a model" in refused.output


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def test_a_model_added_from_tool_calls_takes_tool_traffic_only(tmp_path, files):
    """Issue 8: a fine-tune added from BFCL outcomes (rows of a tool suite) must not draw plain requests."""
    train, _ = files
    out = tmp_path / "knn.safetensors"
    assert runner.invoke(app, ["router", "train", "--type", "knn", "--data", str(train), "--out", str(out),
                               "--option", "k=10"]).exit_code == 0
    plain = [{"messages": [{"role": "user", "content": f"{kind} one"}]} for kind in ("hard", "easy")]
    before = [load_router(out).decide(body, cost_penalty=100.0) for body in plain]
    # right on 30 of 40 tool prompts, at the weak model's price
    rows = [Outcome(f"bfcl/test/{i}", "bfcl", f"{'hard' if i % 2 else 'easy'} question t{i}", "sft", float(i % 4 != 0),
                    1e-5, has_tools=True) for i in range(40)]
    labelled = OutcomeTable(rows).write(tmp_path / "sft.jsonl")
    assert runner.invoke(app, ["router", "add-model", str(out), "--model", "sft", "--data", str(labelled)]).exit_code == 0
    loaded = load_router(out)
    for body, old in zip(plain, before):
        new = loaded.decide(body, cost_penalty=100.0)
        assert new.chosen == old.chosen != "sft"
        assert new.quality == pytest.approx({**old.quality, "sft": 0.0})      # no plain evidence: predicted to fail
    # a request offering tools, "hard one": sft's k = 10 nearest are hard tool prompts (all right: odd i), shrunk
    # with prior 10 toward its tool mean 0.75: (10 + 7.5) / 20; strong and weak have no tool evidence: 0
    tool = loaded.decide({**plain[0], "tools": TOOLS}, cost_penalty=100.0)
    assert tool.chosen == "sft"
    assert tool.quality == pytest.approx({"strong": 0.0, "weak": 0.0, "sft": 0.875})


def test_train_checker_on_real_gsm8k_answers_and_its_errors(tmp_path, data_dir):
    out = tmp_path / "checker.safetensors"
    model = "mistralai/Mixtral-8x7B-Instruct-v0.1"
    args = ["router", "train-checker", "--data", "routellm-gsm8k", "--data-dir", str(data_dir), "--components", "0"]
    result = runner.invoke(app, [*args, "--model", model, "--out", str(out)])
    assert result.exit_code == 0, result.output
    # Mixtral's recorded GSM8K accuracy: 63.8% of 1319 (RouteLLM's table)
    assert "on 1319 answers" in result.output and "(63.8% correct)" in result.output
    from routers.answer_check import load_answer_checker

    checker = load_answer_checker(out)
    p = checker.predict(["Ann has 3 pens and buys 4. How many?"] * 2, ["3 + 4 = 7\n#### 7", "3 + 4 = 9\n#### 9"])
    assert p[0] > p[1]  # a wrong sum lowers P(correct)
    mmlu = ["router", "train-checker", "--data", "routellm-mmlu", "--data-dir", str(data_dir)]
    result = runner.invoke(app, [*mmlu, "--model", "gpt-4-1106-preview", "--out", str(out)])
    assert result.exit_code == 2 and "records no answers of 'gpt-4-1106-preview'" in result.output
    result = runner.invoke(app, [*args, "--model", "nope", "--out", str(out)])
    assert result.exit_code == 2 and "model 'nope' is not in the data" in result.output


def test_train_checker_calibrates_the_cascade_threshold_on_out_of_fold_scores(tmp_path, data_dir):
    from link.config import PolicyConfig
    from link.policies.cascade import build_cascade
    from routers.answer_check import load_answer_checker
    from routers.offline.cascade_eval import cascade_sweep
    from routers.offline.data import RoutingData
    from evals.recorded import load_source

    out = tmp_path / "checker.safetensors"
    weak, strong = "mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"
    result = runner.invoke(app, ["router", "train-checker", "--data", "routellm-gsm8k", "--data-dir", str(data_dir),
                                 "--components", "0", "--model", weak, "--strong", strong, "--target", "share:" + strong + "=0.3",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    info = load_answer_checker(out).info
    assert info["steps"] == [weak, strong] and 0.6 < info["auc"] < 0.9
    assert f"escalation threshold {info['threshold']:.4f}" in " ".join(result.output.split())
    # the stored threshold escalates at most 30% of the prompts (the checker refitted on all answers
    # escalates a similar share: within 10 points of the target on its own training answers)
    data = RoutingData.from_outcomes(load_source("routellm-gsm8k", data_dir))
    checker = load_answer_checker(out)
    p = checker.predict(data.prompts, list(data.responses[:, 0]))
    assert abs(np.mean(p < info["threshold"]) - 0.3) < 0.1
    sweep = cascade_sweep(np.stack([p, np.zeros_like(p)], 1), data.scores, data.costs, [0, 1],
                          thresholds=np.array([info["threshold"]]), pays_rejected=True)
    assert sweep.share[0, 1] == pytest.approx(np.mean(p < info["threshold"]))
    # a cascade policy over the same steps takes it as its default threshold; other steps keep 0.5
    cascade, _ = build_cascade(PolicyConfig(name="c", type="cascade", models=[weak, strong],
                                            options={"scorer": "answer", "checker": str(out)}))
    assert cascade.thresholds == [pytest.approx(info["threshold"])]
    cascade, _ = build_cascade(PolicyConfig(name="c", type="cascade", models=[weak, "other"],
                                            options={"scorer": "answer", "checker": str(out)}))
    assert cascade.thresholds == [0.5]
    result = runner.invoke(app, ["router", "train-checker", "--data", "routellm-gsm8k", "--data-dir", str(data_dir),
                                 "--model", weak, "--target", "cost=0.001", "--out", str(out)])
    assert result.exit_code == 2 and "needs both a strong model and a target" in result.output


def test_train_checker_says_what_to_fix(tmp_path, data_dir):
    from link.config import PolicyConfig
    from link.policies.base import PolicyError
    from link.policies.cascade import build_cascade

    weak, strong = "mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"
    base = ["router", "train-checker", "--data", "routellm-gsm8k", "--data-dir", str(data_dir), "--components", "0",
            "--model", weak]
    result = runner.invoke(app, [*base, "--out", str(tmp_path)])          # a folder
    assert result.exit_code == 2 and "is not a regular file" in result.output
    (tmp_path / "file").write_text("x")
    result = runner.invoke(app, [*base, "--out", str(tmp_path / "file" / "c.safetensors")])   # under a file
    assert result.exit_code == 2 and "File exists" in result.output and str(tmp_path / "file") in result.output
    result = runner.invoke(app, [*base, "--out", str(tmp_path / "c.safetensors"), "--strong", weak, "--target", "cost=1"])
    assert result.exit_code == 2 and "--strong must be another model" in result.output
    # Mixtral alone costs more than nothing: no threshold meets cost=0, and the command says so
    result = runner.invoke(app, [*base, "--out", str(tmp_path / "c.safetensors"), "--strong", strong, "--target", "cost=0"])
    assert result.exit_code == 0 and "warning: no threshold meets --target cost=0" in " ".join(result.output.split())
    assert "0.0% escalated" in result.output
    with pytest.raises(PolicyError, match="fitted on answers of 'mistralai/Mixtral-8x7B-Instruct-v0.1'"):
        build_cascade(PolicyConfig(name="c", type="cascade", models=[strong, weak],
                                   options={"scorer": "answer", "checker": str(tmp_path / "c.safetensors")}))
