"""Tests for `serving.sampling.params`: defaults, normalization, properties and validation (the
messages name the field, the value and the valid range).
"""

from __future__ import annotations

import dataclasses

import pytest

from serving.errors import InvalidSamplingParamsError, ServingError
from serving.sampling.params import SamplingParams, SamplingType


# ---------------------------------------------------------------------------------------------
# SamplingParams: defaults, normalization, properties
# ---------------------------------------------------------------------------------------------


def test_defaults():
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p, p.seed) == (1, 1.0, 1.0, 0, 0.0, None)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert (p.stop, p.stop_token_ids, p.ignore_eos, p.max_tokens) == ((), (), False, 16)
    assert (p.logprobs, p.include_stop_str_in_output, p.skip_special_tokens) == (None, False, True)
    assert not p.is_greedy
    assert p.sampling_type is SamplingType.RANDOM


def test_frozen_and_hashable():
    p = SamplingParams(stop=["a"], stop_token_ids=[1])
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.temperature = 0.5  # type: ignore[misc]
    assert hash(p) == hash(SamplingParams(stop=("a",), stop_token_ids=(1,)))


@pytest.mark.parametrize(
    "given, expected",
    [("###", ("###",)), (["a", "bc"], ("a", "bc")), (("x",), ("x",)), ([], ()), (None, ())],
)
def test_stop_normalized_to_tuple(given, expected):
    p = SamplingParams(stop=given)
    assert p.stop == expected and isinstance(p.stop, tuple)


@pytest.mark.parametrize(
    "given, expected", [([2, 7], (2, 7)), ((5,), (5,)), (3, (3,)), ([], ()), (None, ())]
)
def test_stop_token_ids_normalized_to_tuple(given, expected):
    p = SamplingParams(stop_token_ids=given)
    assert p.stop_token_ids == expected and isinstance(p.stop_token_ids, tuple)


def test_fields_are_stored():
    # Fields consumed by the engine / detokenizer: the sampler ignores them, so the contract here
    # is that they are stored as given (and validated, below).
    p = SamplingParams(
        n=3,
        max_tokens=None,
        ignore_eos=True,
        include_stop_str_in_output=True,
        skip_special_tokens=False,
        logprobs=5,
        seed=-7,
    )
    assert (p.n, p.max_tokens, p.ignore_eos) == (3, None, True)
    assert (p.include_stop_str_in_output, p.skip_special_tokens, p.logprobs, p.seed) == (
        True,
        False,
        5,
        -7,
    )
    assert SamplingParams(max_tokens=1).max_tokens == 1
    assert SamplingParams(logprobs=0).logprobs == 0 and SamplingParams(logprobs=20).logprobs == 20


@pytest.mark.parametrize(
    "kwargs, greedy, kind",
    [
        ({"temperature": 0.0}, True, SamplingType.GREEDY),
        ({"temperature": 0.0, "seed": 1}, True, SamplingType.GREEDY),
        ({"top_k": 1}, True, SamplingType.GREEDY),
        ({"top_k": 2}, False, SamplingType.RANDOM),
        ({"temperature": 0.01}, False, SamplingType.RANDOM),
        ({"seed": 0}, False, SamplingType.RANDOM_SEED),
    ],
)
def test_is_greedy_and_sampling_type(kwargs, greedy, kind):
    p = SamplingParams(**kwargs)
    assert p.is_greedy is greedy
    assert p.sampling_type is kind


# ---------------------------------------------------------------------------------------------
# SamplingParams: validation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value, fragments",
    [
        ("n", 0, ["n must be", ">= 1", "got 0"]),
        ("n", 1.5, ["n must be", "got 1.5"]),
        ("temperature", -0.1, ["temperature must be", ">= 0", "got -0.1"]),
        ("temperature", float("nan"), ["temperature", "got nan"]),
        ("top_p", 0.0, ["top_p must be in (0, 1]", "got 0.0"]),
        ("top_p", 1.01, ["top_p must be in (0, 1]", "got 1.01"]),
        ("top_k", -2, ["top_k must be", ">= -1", "got -2"]),
        ("top_k", 2.0, ["top_k", "got 2.0"]),
        ("min_p", -0.01, ["min_p must be in [0, 1]", "got -0.01"]),
        ("min_p", 1.5, ["min_p must be in [0, 1]", "got 1.5"]),
        ("seed", 2**63, ["seed must be", str(2**63)]),
        ("seed", "42", ["seed must be", "'42'"]),
        ("presence_penalty", 2.5, ["presence_penalty must be in [-2, 2]", "got 2.5"]),
        ("presence_penalty", -2.01, ["presence_penalty must be in [-2, 2]", "got -2.01"]),
        ("frequency_penalty", -3, ["frequency_penalty must be in [-2, 2]", "got -3"]),
        ("frequency_penalty", 2.01, ["frequency_penalty must be in [-2, 2]", "got 2.01"]),
        ("repetition_penalty", 0.0, ["repetition_penalty must be", "> 0", "got 0.0"]),
        ("repetition_penalty", -1.0, ["repetition_penalty must be", "> 0", "got -1.0"]),
        ("max_tokens", 0, ["max_tokens must be at least 1, got 0"]),
        ("max_tokens", -5, ["max_tokens must be at least 1, got -5"]),
        ("max_tokens", 2.0, ["max_tokens must be", "got 2.0"]),
        ("logprobs", -1, ["logprobs must be", "[0, 20]", "got -1"]),
        ("logprobs", 21, ["logprobs must be", "[0, 20]", "got 21"]),
        ("stop", "", ["stop must be", "non-empty", "''"]),
        ("stop", ["ok", ""], ["stop must be", "non-empty"]),
        ("stop", [1], ["stop must be"]),
        ("stop_token_ids", [-1], ["stop_token_ids must be", ">= 0", "-1"]),
        ("stop_token_ids", ["a"], ["stop_token_ids must be"]),
        ("ignore_eos", "yes", ["ignore_eos must be a bool"]),
    ],
)
def test_validation_errors(field, value, fragments):
    with pytest.raises(InvalidSamplingParamsError) as info:
        SamplingParams(**{field: value})
    message = str(info.value)
    assert message.startswith(field)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    # The gateway maps ServingError (a ValueError) to a 400.
    assert isinstance(info.value, ServingError) and isinstance(info.value, ValueError)


def test_max_tokens_message_exact():
    with pytest.raises(InvalidSamplingParamsError, match=r"^max_tokens must be at least 1, got 0$"):
        SamplingParams(max_tokens=0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"top_p": 1e-9},
        {"top_k": -1},
        {"min_p": 1.0},
        {"presence_penalty": -2, "frequency_penalty": 2},
        {"repetition_penalty": 1e-3},
        {"temperature": 5.0},
        {"seed": -(2**63)},
        {"seed": 2**63 - 1},
    ],
)
def test_boundary_values_accepted(kwargs):
    params = SamplingParams(**kwargs)
    for name, value in kwargs.items():
        assert getattr(params, name) == value, name  # stored as given, not clamped


def test_guided_fields_and_strip_leading_space():
    tag = '{"structures": [{"begin": "<b>", "schema": {}, "end": "</b>"}]}'
    params = SamplingParams(structural_tag=tag, strip_leading_space=True)
    assert params.structural_tag == tag and params.strip_leading_space and params.guided_json is None
    assert SamplingParams().structural_tag is None and SamplingParams().strip_leading_space is False
    with pytest.raises(InvalidSamplingParamsError, match="structural_tag"):
        SamplingParams(guided_json='{"type": "object"}', structural_tag=tag)
    with pytest.raises(InvalidSamplingParamsError, match="structural_tag"):
        SamplingParams(structural_tag={"structures": []})
    with pytest.raises(InvalidSamplingParamsError, match="strip_leading_space must be a bool"):
        SamplingParams(strip_leading_space=1)
