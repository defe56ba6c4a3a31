"""The evidence rule shared by the learned routers, on a 2-prompt, 3-model table checked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from routers.kinds import apply_evidence_rule, check_unseen_quality, kinds_from_state, kinds_state, labelled_kinds

NAN = np.nan
# prompt 0 plain, prompt 1 with tools; model 0 labelled on the plain one, model 1 on the tool one, model 2 on both
SCORES = np.array([[1.0, NAN, 0.5], [NAN, 0.0, 1.0]])
TOOLS = np.array([False, True])


def test_labelled_kinds_per_model():
    np.testing.assert_array_equal(labelled_kinds(SCORES, TOOLS), [[True, False], [False, True], [True, True]])
    with pytest.raises(ValueError, match="has_tools"):
        labelled_kinds(SCORES, [False])


def test_a_model_without_labels_of_the_query_kind_gets_the_unseen_quality():
    kinds = labelled_kinds(SCORES, TOOLS)
    quality = np.full((3, 3), 0.7)
    out = apply_evidence_rule(quality, [False, True, False], kinds, 0.1)
    np.testing.assert_array_equal(out, [[0.7, 0.1, 0.7], [0.1, 0.7, 0.7], [0.7, 0.1, 0.7]])
    np.testing.assert_array_equal(quality, 0.7)                      # the input is not written to


def test_a_kind_no_model_has_labels_of_leaves_the_predictions():
    plain_only = labelled_kinds(SCORES[:1], TOOLS[:1])              # [[T, F], [F, F], [T, F]]
    out = apply_evidence_rule(np.full((2, 3), 0.7), [False, True], plain_only, 0.1)
    np.testing.assert_array_equal(out, [[0.7, 0.1, 0.7], [0.7, 0.7, 0.7]])
    with pytest.raises(ValueError, match="disagree"):
        apply_evidence_rule(np.zeros((2, 3)), [False], plain_only, 0.1)


def test_state_round_trip_and_files_without_kinds():
    kinds = labelled_kinds(SCORES, TOOLS)
    arrays = kinds_state(kinds)
    assert arrays["model_kinds"].dtype == np.uint8
    np.testing.assert_array_equal(kinds_from_state(arrays, 3), kinds)
    legacy = kinds_from_state({}, 3)                                 # every model on both kinds: the rule never fires
    np.testing.assert_array_equal(legacy, np.ones((3, 2), dtype=bool))
    np.testing.assert_array_equal(apply_evidence_rule(np.full((2, 3), 0.7), TOOLS, legacy, 0.1), 0.7)


def test_unseen_quality_is_a_probability():
    assert check_unseen_quality(0) == 0.0
    with pytest.raises(ValueError, match="unseen_quality"):
        check_unseen_quality(1.5)
