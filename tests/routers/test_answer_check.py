"""The answer checker: arithmetic re-checked by hand, final numbers, a checker that learns a planted rule,
its file, the cascade scorer, the replay entry, and RouteLLM's real GSM8K answers."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from routers.answer_check import (ANSWER_FEATURE_NAMES, AnswerChecker, AnswerScorer, answer_features, answer_row,
                                  load_answer_checker, save_answer_checker)
from routers.arithmetic import check_arithmetic, evaluate_expression, final_number
from routers.calls import response_text
from routers.cascade import Cascade, CascadeTrace
from routers.features import TEXT_FEATURE_NAMES, text_features
from routers.offline.cascade_eval import cascade_answer_scores
from routers.offline.data import RoutingData
from routers.offline.evaluate import evaluate_split
from routers.offline.metrics import apgr, threshold_curve
from routers.offline.settings import EvalSettings


def test_expressions_as_written_in_worked_answers():
    assert evaluate_expression("9 * $2") == 18
    assert evaluate_expression("2 + 1/2") == 2.5
    assert evaluate_expression("20% * 50") == pytest.approx(10)
    assert evaluate_expression("(3 + 4) x 2") == 14
    assert evaluate_expression("1,000 × 3") == 3000
    assert evaluate_expression("12 ÷ 4 - 1") == 2
    # never anything but arithmetic
    for text in ("__import__('os')", "2 ** 3", "x", "1 / 0", "(2 + 3"):
        assert evaluate_expression(text) is None


def test_arithmetic_steps_counted_and_checked_by_hand():
    assert check_arithmetic("16 - 3 = 13 eggs, then 13 - 4 = 8") == (2, 1)
    # the calculator note is checked once, not again as the "= $18" around it
    assert check_arithmetic("for 9 * $2 = $<<9*2=18>>18.\n#### 18") == (2, 0)
    assert check_arithmetic("<<9*2=19>>") == (1, 1)
    # a chain checks each "=": 2 + 1/2 = 5/2 holds, 5/2 = 3.5 does not; 10/3 = 3 rounds to the integer stated
    assert check_arithmetic("2 + 1/2 = 5/2 = 3.5") == (2, 1)
    assert check_arithmetic("10/3 = 3, 85 + 86 = 172, 1/2 = 50%, 1/3 = 34%") == (4, 2)
    # rounding to two decimals is not an error; a side without an operator on both ends is no claim
    assert check_arithmetic("10/3 = 3.33 and 10/3 = 3.5") == (2, 1)
    assert check_arithmetic("20% of 50 = 10, so 5 = 5") == (0, 0)
    assert check_arithmetic("no numbers here") == (0, 0)
    # a chain after "=" is whole; one cut off by an operator outside it is not checked; "x" ending a word is no operator
    assert check_arithmetic("Total = 5 * 3 = 16") == (1, 1)
    assert check_arithmetic("lilies / 5 = 200 / 5 = 40") == (1, 0) and check_arithmetic("3 * 45 = 1 * x") == (0, 0)
    assert check_arithmetic("Alex 5 * 2 = 11") == (1, 1) and check_arithmetic("3 + 4 = 8 xylophones") == (1, 1)
    # a value too large for a float is no claim; a long sum with no "=" after it is matched in linear time
    assert check_arithmetic("9" * 300 + " * " + "9" * 300 + " = 1") == (0, 0)
    assert check_arithmetic("The total is " + " + ".join(["1"] * 60) + " = total apples") == (0, 0)
    assert check_arithmetic(" + ".join(["1"] * 60) + " = 60") == (1, 0)


def test_final_number():
    assert final_number("so 5 and 6\n#### 1,234") == 1234
    assert final_number("The answer is 7.") == 7
    assert final_number("first 3 then 4.5 left") == 4.5
    assert final_number("none") is None
    assert final_number("#### " + "9" * 400) is None  # not finite as a float


def test_answer_row_reads_the_final_answer_against_prompt_and_working():
    row = dict(zip(ANSWER_FEATURE_NAMES, answer_row("Tom has 3 apples and buys 4.", "3 + 4 = 7\n#### 7")))
    assert row["num_checked_steps"] == 1 and row["num_wrong_steps"] == 0 and row["has_final_marker"] == 1
    assert row["final_in_working"] == 1 and row["final_in_prompt"] == 0 and row["final_is_integer"] == 1
    assert row["log10_final"] == pytest.approx(np.log10(8))
    # the working ends at the last final-answer marker, whose number is the final answer
    row = dict(zip(ANSWER_FEATURE_NAMES, answer_row("p", "Answer: 16 - 3 - 4 = 9. 9 * 2 = 18. #### 18")))
    assert row["final_in_working"] == 1 and row["log10_final"] == pytest.approx(np.log10(19))
    x = answer_features(["p one", "p two"], ["1", None])
    assert x.shape == (2, len(ANSWER_FEATURE_NAMES) + len(TEXT_FEATURE_NAMES))
    np.testing.assert_allclose(x[:, len(ANSWER_FEATURE_NAMES):], text_features(["p one", "p two"]))
    with pytest.raises(ValueError):
        answer_features(["a"], [])


def planted(n: int, seed: int) -> tuple[list[str], list[str], np.ndarray]:
    """Word problems answered by adding two numbers; an answer is correct exactly when its sum is right,
    and a fifth of the answers get the sum wrong."""
    rng = np.random.default_rng(seed)
    prompts, answers, correct = [], [], []
    for _ in range(n):
        a, b = (int(v) for v in rng.integers(2, 90, size=2))
        ok = rng.random() > 0.2
        total = a + b if ok else a + b + int(rng.integers(1, 9))
        prompts.append(f"Ann has {a} pens and gets {b} more. How many pens does she have?")
        answers.append(f"She has {a} + {b} = {total} pens.\n#### {total}")
        correct.append(float(ok))
    return prompts, answers, np.array(correct)


def letter_embed(texts: list[str]) -> np.ndarray:
    """A deterministic stand-in encoder: letter frequencies (so the PCA path runs without MiniLM)."""
    out = np.zeros((len(texts), 26), dtype=np.float32)
    for i, t in enumerate(texts):
        for ch in t.lower():
            if "a" <= ch <= "z":
                out[i, ord(ch) - 97] += 1
    return out


def test_the_checker_learns_a_planted_rule_and_its_file_round_trips(tmp_path):
    prompts, answers, correct = planted(400, seed=0)
    checker = AnswerChecker(num_components=2, num_rounds=60, embed=letter_embed).fit(prompts, answers, correct)
    test_p, test_a, test_y = planted(200, seed=1)
    p = checker.predict(test_p, test_a)
    assert p.shape == (200,) and ((p >= 0) & (p <= 1)).all()
    # every wrong answer ranks below every right one
    assert p[test_y == 0].max() < p[test_y == 1].min()
    path = save_answer_checker(checker, tmp_path / "checker.safetensors", info={"model": "toy"})
    loaded = load_answer_checker(path, embed=letter_embed)
    np.testing.assert_allclose(loaded.predict(test_p, test_a), p)
    # a loaded checker saved again keeps what its file said of it
    assert load_answer_checker(save_answer_checker(loaded, tmp_path / "again.safetensors")).info == {"model": "toy"}
    assert loaded.feature_names == checker.feature_names and len(loaded.feature_names) == 14 + len(TEXT_FEATURE_NAMES) + 4


def test_checker_errors(tmp_path):
    with pytest.raises(RuntimeError, match="not fitted"):
        AnswerChecker(num_components=0).predict(["p"], ["a"])
    with pytest.raises(ValueError, match="both"):
        AnswerChecker(num_components=0).fit(["p", "q"], ["a", "b"], [1.0, 1.0])
    with pytest.raises(ValueError, match="labels"):
        AnswerChecker(num_components=0).fit(["p", "q"], ["a", "b"], [1.0])
    with pytest.raises(FileNotFoundError):
        load_answer_checker(tmp_path / "missing.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a file")
    with pytest.raises(ValueError, match="not an answer-checker"):
        load_answer_checker(tmp_path / "junk.safetensors")
    with pytest.raises(ValueError, match="missing"):
        AnswerChecker(num_components=0).fit(["p", "q", "r"], ["a", "b", "c"], [1.0, 0.0, np.nan])
    with pytest.raises(ValueError, match="num_components 4 exceeds the 3 answers"):
        AnswerChecker(num_components=4, embed=letter_embed).fit(["p", "q", "r"], ["a", "b", "c"], [1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="embedding's 26 dimensions"):
        AnswerChecker(num_components=30, embed=letter_embed).fit(*planted(40, seed=2))
    from safetensors.numpy import save_file
    save_file({"empty": np.zeros(1, dtype=np.float32)}, str(tmp_path / "damaged.safetensors"),
              metadata={"answer_checker": '{"format": "togetherlink-answer-checker", "version": 1, "booster": "x"}'})
    with pytest.raises(ValueError, match="damaged"):
        load_answer_checker(tmp_path / "damaged.safetensors")


class Caller:
    """Fixed answers per model."""

    def __init__(self, answers: dict[str, str]):
        self.answers, self.calls = answers, []

    async def complete(self, model, body):
        self.calls.append(model)
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": self.answers[model]},
                             "finish_reason": "stop"}]}

    async def stream(self, model, body):  # pragma: no cover - the strong step is only called whole here
        yield {}


def test_the_scorer_accepts_a_checked_answer_and_escalates_a_wrong_one():
    prompts, answers, correct = planted(400, seed=0)
    scorer = AnswerScorer(AnswerChecker(num_components=0, num_rounds=60).fit(prompts, answers, correct))
    body = {"messages": [{"role": "user", "content": "Ann has 12 pens and gets 30 more. How many pens does she have?"}]}
    cascade = Cascade(["cheap", "strong"], scorer, 0.5)
    good = Caller({"cheap": "She has 12 + 30 = 42 pens.\n#### 42", "strong": "42"})
    trace = CascadeTrace()
    assert response_text(asyncio.run(cascade.complete(good, body, trace))).endswith("42") and good.calls == ["cheap"]
    assert trace.to_dict()["scorer"] == "answer" and trace.steps[0].score > 0.5
    bad = Caller({"cheap": "She has 12 + 30 = 45 pens.\n#### 45", "strong": "42"})
    trace = CascadeTrace()
    assert response_text(asyncio.run(cascade.complete(bad, body, trace))) == "42" and bad.calls == ["cheap", "strong"]
    assert trace.steps[0].score < 0.5 and trace.answered_by == "strong"


def toy_pair(n: int, seed: int, prefix: str) -> RoutingData:
    """"weak" answers the planted problems (USD 1 each), "strong" is always right (USD 10)."""
    prompts, answers, correct = planted(n, seed)
    responses = np.array([[a, "right"] for a in answers], dtype=object)
    return RoutingData([f"{prefix}{i}" for i in range(n)], prompts, ["toy"] * n, ["weak", "strong"],
                       np.stack([correct, np.ones(n)], axis=1), np.tile([1.0, 10.0], (n, 1)), responses=responses)


def test_the_replay_measures_the_answer_cascade_paying_every_called_step():
    train, test = toy_pair(300, 0, "a"), toy_pair(100, 1, "b")
    settings = EvalSettings(types=(), baselines=(), options={"answer": {"num_components": 0, "num_rounds": 60}},
                            answer_check=True)
    routers = evaluate_split(train, test, settings, features=(None, None))["routers"]
    entry = routers["cascade:answer"]
    assert entry["steps"] == ["weak", "strong"] and entry["pays_rejected"]
    cost, quality = np.array(entry["curve"]["cost_usd"]), np.array(entry["curve"]["quality"])
    wrong = 1 - test.scores[:, 0].mean()
    # lowest threshold: the weak model answers all (USD 1); highest: everything escalates (USD 11, quality 1)
    assert cost[0] == pytest.approx(1.0) and quality[0] == pytest.approx(1 - wrong)
    assert cost[-1] == pytest.approx(11.0) and quality[-1] == pytest.approx(1.0)
    # the checker finds every wrong answer: escalating exactly those reaches quality 1 at USD 1 + 10 * wrong
    assert np.min(cost[quality == 1.0]) == pytest.approx(1 + 10 * wrong)
    # RouteLLM's 10-quantile APGR equals that of any ranking with every wrong answer first (ties broken)
    perfect = (1 - test.scores[:, 0]) + np.random.default_rng(0).random(test.num_prompts) * 1e-3
    share, q = threshold_curve(perfect, test.scores, 1, 0)
    assert entry["apgr"] == pytest.approx(apgr(share, q, test.scores[:, 0].mean(), 1.0)) and entry["apgr"] > 0.9
    # no recorded answers: no entry
    plain = RoutingData(test.prompt_ids, test.prompts, test.suites, test.models, test.scores, test.costs)
    assert cascade_answer_scores(train, plain, [0, 1]) is None


def test_real_gsm8k_answers_of_mixtral(data_dir):
    """RouteLLM's recorded GSM8K answers: Mixtral's arithmetic slips predict its wrong answers."""
    from evals.recorded import load_source

    data = RoutingData.from_outcomes(load_source("routellm-gsm8k", data_dir))
    weak = data.models.index("mistralai/Mixtral-8x7B-Instruct-v0.1")
    answers = data.responses[:, weak]
    assert data.responses.shape == (1319, 2) and all(isinstance(a, str) for a in answers)
    wrong_step = np.array([check_arithmetic(a)[1] > 0 for a in answers])
    correct = data.scores[:, weak] == 1
    # measured: 8.9% of the answers (117) have a wrong step; 89% of those are wrong against 31% of the rest
    assert 0.07 < wrong_step.mean() < 0.11
    assert (1 - correct[wrong_step].mean()) > 0.8 and (1 - correct[~wrong_step].mean()) < 0.4
    half = np.arange(data.num_prompts) % 2 == 0
    checker = AnswerChecker(num_components=0).fit([data.prompts[i] for i in np.flatnonzero(half)], answers[half],
                                                  data.scores[half, weak])
    p = checker.predict([data.prompts[i] for i in np.flatnonzero(~half)], answers[~half])
    y = correct[~half]
    auc = (p[y][:, None] > p[~y][None, :]).mean()  # the probability a right answer outranks a wrong one
    assert auc > 0.7


def confident(n: int, seed: int):
    """Identical answer texts; right exactly when the answer's mean token log-probability is above -1 (the planted
    rule only the confidence signal can read)."""
    from routers.signals import answer_signals

    rng = np.random.default_rng(seed)
    means = rng.uniform(-2.0, 0.0, n)
    text = "It is 42.\n#### 42"
    signals = [answer_signals(text, [float(m)] * 8, [{"It": float(m)}] * 8) for m in means]   # as a served answer's
    return ["What is 6 x 7?"] * n, [text] * n, (means > -1.0).astype(float), signals


def test_a_checker_reading_the_confidence_signal_learns_what_the_text_cannot_show(tmp_path):
    prompts, answers, correct, signals = confident(400, seed=0)
    checker = AnswerChecker(num_components=0, num_rounds=60, signal_families=("confidence",))
    checker.fit(prompts, answers, correct, signals)
    assert checker.feature_names[-4:] == ["signal_logprob_mean", "signal_logprob_min", "signal_entropy_mean",
                                          "signal_log_tokens"]
    test_p, test_a, test_y, test_s = confident(200, seed=1)
    margin = np.abs(np.array([s["logprob_mean"] for s in test_s]) + 1.0) > 0.1   # away from the boundary
    assert test_s[0]["tokens"] == 8 and test_s[0]["has_final_answer"] == 1.0
    p = checker.predict(test_p, test_a, test_s)
    assert p[(test_y == 0) & margin].max() < p[(test_y == 1) & margin].min()
    # without the signal (a provider's answer) the checker still answers, from the text alone: one value
    blind = checker.predict(test_p, test_a)
    assert np.ptp(blind) == 0.0 and 0.0 < blind[0] < 1.0
    loaded = load_answer_checker(save_answer_checker(checker, tmp_path / "c.safetensors"))
    assert loaded.signal_families == ("confidence",)
    np.testing.assert_allclose(loaded.predict(test_p, test_a, test_s), p)
    with pytest.raises(ValueError, match="unknown signal families"):
        AnswerChecker(signal_families=("vibes",))
    with pytest.raises(ValueError, match="2 answers but 1 signal"):
        checker.predict(["a", "b"], ["x", "y"], [None])


class LogprobCaller:
    """The cheap step answers with token log-probabilities when asked (mean `level`); the strong one plainly."""

    def __init__(self, level: float):
        self.level, self.bodies = level, []

    async def complete(self, model, body):
        self.bodies.append((model, body))
        choice = {"index": 0, "message": {"role": "assistant", "content": "It is 42.\n#### 42"}, "finish_reason": "stop"}
        if model == "cheap" and body.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": "It", "logprob": self.level, "top_logprobs":
                                               [{"token": "It", "logprob": self.level}]}] * 8}
        return {"choices": [choice]}

    async def stream(self, model, body):  # pragma: no cover - whole answers only here
        yield {}


def test_the_cascade_asks_the_step_for_logprobs_reads_them_and_hides_them_from_the_client():
    prompts, answers, correct, signals = confident(400, seed=0)
    checker = AnswerChecker(num_components=0, num_rounds=60, signal_families=("confidence", "checks"))
    cascade = Cascade(["cheap", "strong"], AnswerScorer(checker.fit(prompts, answers, correct, signals)), 0.5)
    body = {"messages": [{"role": "user", "content": "What is 6 x 7?"}]}
    sure, trace = LogprobCaller(-0.2), CascadeTrace()
    response = asyncio.run(cascade.complete(sure, body, trace))
    assert [m for m, _ in sure.bodies] == ["cheap"] and sure.bodies[0][1]["top_logprobs"] == 5
    assert response["choices"][0]["logprobs"] is None                    # the client did not ask for them
    step = trace.to_dict()["steps"][0]
    assert step["accepted"] and step["signals"]["logprob_mean"] == -0.2 and step["signals"]["tokens"] == 8
    unsure, trace = LogprobCaller(-1.8), CascadeTrace()
    asyncio.run(cascade.complete(unsure, body, trace))
    assert [m for m, _ in unsure.bodies] == ["cheap", "strong"] and trace.answered_by == "strong"
    asked = LogprobCaller(-0.2)
    response = asyncio.run(cascade.complete(asked, {**body, "logprobs": True, "top_logprobs": 2}, CascadeTrace()))
    assert asked.bodies[0][1]["top_logprobs"] == 2 and response["choices"][0]["logprobs"] is not None
