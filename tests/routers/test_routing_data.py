"""RoutingData: pivoting outcome rows, views, splits; and the real RouterBench and RouteLLM tables."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from routers.offline.data import RoutingData, kfold_indices, train_test_split


def row(prompt_id, model, score, cost=0.0, suite="s", prompt=None, completion_tokens=None):
    return SimpleNamespace(prompt_id=prompt_id, suite=suite, prompt=prompt or f"text of {prompt_id}", model=model,
                           score=score, cost_usd=cost, completion_tokens=completion_tokens)


def toy() -> RoutingData:
    return RoutingData.from_outcomes([
        row("p1", "a", 1.0, 0.1, "x"), row("p1", "b", 0.0, 0.2, "x"),
        row("p2", "b", 1.0, 0.3, "y", completion_tokens=7),            # p2 lacks model a
        row("p3", "a", 0.5, 0.4, "y"), row("p3", "b", 0.25, 0.5, "y"),
    ])


def test_from_outcomes_pivots_in_order_of_first_appearance_with_nan_holes():
    d = toy()
    assert d.prompt_ids == ["p1", "p2", "p3"] and d.models == ["a", "b"] and d.suites == ["x", "y", "y"]
    assert d.num_prompts == 3 and d.num_models == 2
    np.testing.assert_array_equal(d.scores, [[1.0, 0.0], [np.nan, 1.0], [0.5, 0.25]])
    np.testing.assert_array_equal(d.costs, [[0.1, 0.2], [np.nan, 0.3], [0.4, 0.5]])
    np.testing.assert_array_equal(d.completion_tokens, [[np.nan, np.nan], [np.nan, 7], [np.nan, np.nan]])
    assert RoutingData.from_outcomes([row("p", "a", 1.0)]).completion_tokens is None


def test_from_outcomes_rejects_duplicates_and_nothing():
    with pytest.raises(ValueError, match="duplicate"):
        RoutingData.from_outcomes([row("p", "a", 1.0), row("p", "a", 0.0)])
    with pytest.raises(ValueError, match="no outcome"):
        RoutingData.from_outcomes([])


def test_invariants_are_checked():
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        RoutingData(["p"], ["t"], ["s"], ["a"], np.array([[1.5]]), np.array([[0.0]]))
    with pytest.raises(ValueError, match=">= 0"):
        RoutingData(["p"], ["t"], ["s"], ["a"], np.array([[1.0]]), np.array([[-1.0]]))
    with pytest.raises(ValueError, match="length"):
        RoutingData(["p", "q"], ["t"], ["s"], ["a"], np.zeros((2, 1)), np.zeros((2, 1)))


def test_views_subset_select_complete_and_concat():
    d = toy()
    assert d.subset(np.array([True, False, True])).prompt_ids == ["p1", "p3"]
    assert d.subset([2, 0]).prompt_ids == ["p3", "p1"]
    only_b = d.select_models(["b"])
    np.testing.assert_array_equal(only_b.scores[:, 0], [0.0, 1.0, 0.25])
    assert d.complete_rows().prompt_ids == ["p1", "p3"]
    with pytest.raises(KeyError, match="unknown models"):
        d.select_models(["zzz"])
    np.testing.assert_allclose(d.mean_scores(), [0.75, 1.25 / 3])
    other = RoutingData(["q"], ["t"], ["z"], ["c", "a"], np.array([[1.0, 0.0]]), np.array([[0.0, 0.0]]))
    both = RoutingData.concat([d, other])
    assert both.models == ["a", "b", "c"] and both.num_prompts == 4
    np.testing.assert_array_equal(both.scores[3], [0.0, np.nan, 1.0])
    assert np.isnan(both.scores[:3, 2]).all()


def test_a_prompt_offers_tools_when_any_of_its_rows_says_so_and_views_keep_it():
    rows = [row("t1", "a", 1.0), row("t1", "b", 0.0), row("t2", "a", 1.0), row("t2", "b", 1.0)]
    rows[1].has_tools = True                                   # rows without the attribute count as False
    d = RoutingData.from_outcomes(rows)
    np.testing.assert_array_equal(d.has_tools, [True, False])
    np.testing.assert_array_equal(d.subset([1, 0]).has_tools, [False, True])
    np.testing.assert_array_equal(d.select_models(["b"]).has_tools, [True, False])
    np.testing.assert_array_equal(d.with_suites(["u", "v"]).has_tools, [True, False])
    np.testing.assert_array_equal(RoutingData.concat([toy(), d]).has_tools, [False] * 3 + [True, False])
    assert toy().has_tools.dtype == bool and not toy().has_tools.any()


def test_recorded_answers_follow_every_view():
    rows = [row("r1", "a", 1.0), row("r1", "b", 0.0), row("r2", "a", 0.0)]
    rows[0].response, rows[1].response = "42", None               # rows without the attribute have no answer
    d = RoutingData.from_outcomes(rows)
    assert d.responses.tolist() == [["42", None], [None, None]]
    assert d.subset([1, 0]).responses.tolist() == [[None, None], ["42", None]]
    assert d.select_models(["a"]).responses.tolist() == [["42"], [None]]
    assert d.with_suites(["u", "v"]).responses.tolist() == d.responses.tolist()
    assert RoutingData.concat([toy(), d]).responses.tolist() == [[None, None]] * 3 + [["42", None], [None, None]]
    assert toy().responses is None and RoutingData.concat([toy(), toy().subset([])]).responses is None


def test_groups_by_subject_reads_routellm_prompt_ids():
    d = RoutingData(["routellm-mmlu/anatomy/0", "routellm-mmlu/virology/3", "routellm-gsm8k/4"], ["a", "b", "c"],
                    ["mmlu", "mmlu", "gsm8k"], ["m"], np.zeros((3, 1)), np.zeros((3, 1)))
    assert d.groups("subject") == ["anatomy", "virology", "gsm8k"]
    assert d.groups("suite") == ["mmlu", "mmlu", "gsm8k"]
    assert d.with_suites(d.groups("subject")).suites[0] == "anatomy"
    with pytest.raises(ValueError, match="group key"):
        d.groups("colour")


def test_train_test_split_sizes_disjointness_and_strata():
    labels = ["a"] * 60 + ["b"] * 30 + ["c"] * 10
    train, test = train_test_split(100, 20, seed=1, stratify=labels)
    assert len(test) == 20 and len(train) == 80 and not set(train) & set(test)
    counts = {k: sum(labels[i] == k for i in test) for k in "abc"}
    assert counts == {"a": 12, "b": 6, "c": 2}
    again = train_test_split(100, 20, seed=1, stratify=labels)
    np.testing.assert_array_equal(test, again[1])
    assert len(train_test_split(10, 0.3, seed=0)[1]) == 3
    with pytest.raises(ValueError):
        train_test_split(10, 10)


def test_kfold_partitions_and_holds_whole_groups_out():
    folds = list(kfold_indices(23, 5, seed=0))
    tests = np.concatenate([t for _, t in folds])
    assert sorted(tests.tolist()) == list(range(23))
    assert all(len(set(tr) & set(te)) == 0 and len(tr) + len(te) == 23 for tr, te in folds)
    groups = [f"g{i % 7}" for i in range(70)]
    for train, test in kfold_indices(70, 3, seed=2, groups=groups):
        assert not {groups[i] for i in train} & {groups[i] for i in test}
    with pytest.raises(ValueError):
        list(kfold_indices(10, 4, groups=["a", "b", "a", "b", "a", "b", "a", "b", "a", "b"]))


def test_real_routerbench_and_routellm_tables(data_dir):
    from evals.recorded import load_source

    test = RoutingData.from_outcomes(load_source("routerbench:test", data_dir))
    assert test.num_models == 11
    complete = test.complete_rows()
    # 953 rows: the twin rows of arc-challenge.val.172 merge into one complete prompt; 6 ARC prompts lack models
    assert test.num_prompts == 952 and complete.num_prompts == 946
    gpt4 = complete.models.index("gpt-4-1106-preview")
    assert complete.mean_scores()[gpt4] == pytest.approx(0.879, abs=0.001)
    gsm = RoutingData.from_outcomes(load_source("routellm-gsm8k", data_dir))
    assert gsm.num_prompts == 1319 and gsm.num_models == 2 and not np.isnan(gsm.scores).any()


def test_signals_follow_their_answers_through_every_view():
    from evals.outcomes import Outcome

    rows = [Outcome("p0", "s", "q0", "a", 1.0, signals={"key": "1", "logprob_mean": -0.1}),
            Outcome("p0", "s", "q0", "b", 0.0),
            Outcome("p1", "s", "q1", "a", 0.0, signals={"key": "2", "sample_keys": ["2", "3"]})]
    data = RoutingData.from_outcomes(rows)
    assert data.signals.shape == (2, 2) and data.signals[0, 0]["logprob_mean"] == -0.1 and data.signals[0, 1] is None
    assert data.signals[1, 0]["sample_keys"] == ["2", "3"]                    # a list inside stays a list
    assert data.subset([1]).signals[0, 0]["key"] == "2"
    assert data.select_models(["b", "a"]).signals[0, 1]["key"] == "1"
    both = RoutingData.concat([data.subset([0]), RoutingData.from_outcomes([Outcome("p2", "s", "q2", "c", 1.0)])])
    assert both.models == ["a", "b", "c"] and both.signals[0, 0]["key"] == "1" and both.signals[1, 2] is None
    assert RoutingData.from_outcomes([Outcome("p", "s", "q", "a", 1.0)]).signals is None
