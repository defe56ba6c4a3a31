"""Strict policy options (link/policies/options.py): every type refuses unknown keys (naming the key and listing
its options), non-finite numbers anywhere, values of the wrong type or out of their documented range; the same
checks run for link.yaml policies and API ones.

    .venv/bin/python -m pytest -q tests/link/test_policy_options.py
"""

from __future__ import annotations

import pytest

from link.config import PolicyConfig, parse_config
from link.policies.base import POLICIES, PolicyError, make_policy, policy_class
from link.policies.options import check_name, int_option, number_value
from link.policies.store import PolicyStore
from routers.base import ROUTERS
from tests.link.gateway_launch import mock_deployment
from tests.link.router_fakes import TableRouter, save_table_router

NAMES = ("m1", "m2", "small", "big")


@pytest.fixture(scope="module")
def router_file(tmp_path_factory):
    path = save_table_router(tmp_path_factory.mktemp("router") / "r.safetensors", ["small", "big"])
    yield str(path)
    ROUTERS.pop(TableRouter.type, None)


def check(type_: str, models: list[str], options: dict, name: str = "p") -> None:
    """The checks the API and the config loader run (`Policy.check`), without building a router's loader."""
    policy_class(type_).check(PolicyConfig.model_construct(name=name, type=type_, models=models, options=options), NAMES)


def refused(type_: str, models: list[str], options: dict, name: str = "p") -> PolicyError:
    with pytest.raises(PolicyError) as info:
        check(type_, models, options, name)
    return info.value


@pytest.mark.parametrize("type_,models", [("fixed", ["m1"]), ("fallback", ["m1", "m2"]), ("moa", ["m1", "m2"]),
                                          ("cascade", ["m1", "m2"])])
def test_unknown_options_are_named_with_the_allowed_ones(type_, models):
    error = refused(type_, models, {"capture_traces": True, "colour": "red"})
    assert error.param == "options.colour"
    assert error.message.startswith(f"unknown option 'colour' of a '{type_}' policy; its options: ")
    # the common options: a plan of several calls (moa, cascade) cannot continue a dying stream
    common = "capture_traces, cache" if type_ in ("moa", "cascade") else "capture_traces, continue_on_failure, cache"
    assert error.message.endswith(common)
    check(type_, models, {"capture_traces": True})


def test_router_and_hybrid_options(router_file):
    assert refused("router", ["small"], {"path": router_file, "k": 3}).param == "options.k"
    for key, value in (("cost_penalty", -1), ("cost_penalty", 1e10), ("cost_penalty", "50"), ("max_cost_usd", 2e6),
                       ("max_cost_usd", float("inf"))):
        assert refused("router", ["small"], {"path": router_file, key: value}).param == f"options.{key}", (key, value)
    check("router", ["small", "big"], {"path": router_file, "cost_penalty": 200, "max_cost_usd": 0.01})
    nested = refused("hybrid", ["small", "big"], {"path": router_file, "moa": {"layers": 9}})
    assert nested.param == "options.moa.layers" and "[1, 4]" in nested.message
    assert refused("hybrid", ["small", "big"], {"path": router_file, "moa": [1]}).param == "options.moa"
    assert refused("hybrid", ["small", "big"], {"path": router_file, "moa_gain": 1.5}).param == "options.moa_gain"


def test_the_encoder_option_of_policies_that_read_a_router(router_file):
    for type_, models, extra in (("router", ["small"], {}), ("hybrid", ["small", "big"], {}),
                                 ("cascade", ["small", "big"], {"scorer": "router", "threshold": 0.5})):
        error = refused(type_, models, {"path": router_file, "encoder": "tensorrt", **extra})
        assert error.param == "options.encoder" and "('auto', 'onnx', 'onnx-int8', 'torch')" in error.message
        assert refused(type_, models, {"path": router_file, "encoder": 8, **extra}).param == "options.encoder"
        for encoder in ("auto", "onnx", "onnx-int8", "torch"):
            check(type_, models, {"path": router_file, "encoder": encoder, **extra})


@pytest.mark.parametrize("options,param", [
    ({"layers": 1e308}, "options.layers"), ({"layers": 10**30}, "options.layers"), ({"layers": 0}, "options.layers"),
    ({"layers": 2.0}, "options.layers"), ({"deadline_s": float("nan")}, "options.deadline_s"),
    ({"deadline_s": 3601}, "options.deadline_s"), ({"proposer_max_tokens": 0}, "options.proposer_max_tokens"),
    ({"temperatures": [float("inf")]}, "options.temperatures[0]"), ({"temperatures": [-0.1]}, "options.temperatures[0]"),
    ({"temperatures": [0.5] * 9}, "options.temperatures"), ({"aggregator": ""}, "options.aggregator"),
    ({"proposers": [{"model": "m1", "temperature": 2.5}]}, "options.proposers[0].temperature"),
    ({"capture_traces": "yes"}, "options.capture_traces")])
def test_moa_values_out_of_range(options, param):
    assert refused("moa", ["m1", "m2"], options).param == param


def test_moa_accepts_its_documented_ranges():
    check("moa", ["m1", "m2"], {"aggregator": "m2", "temperatures": [0, 2], "layers": 4, "deadline_s": 0.5,
                                "proposer_max_tokens": None, "min_proposals": 4})
    policy = make_policy(PolicyConfig(name="moa-ok", type="moa", models=["m1", "m2"], options={"layers": 3}), NAMES)
    assert policy.moa.layers == 3 and policy.describe()["cost_bound"]["calls"] == 3 * 2 + 1


@pytest.mark.parametrize("options,param", [({"threshold": 1.5}, "options.threshold"),
                                           ({"threshold": [0.5, float("nan")]}, "options.threshold[1]"),
                                           ({"threshold": True}, "options.threshold"),
                                           ({"judge_logprobs": "no"}, "options.judge_logprobs"),
                                           ({"judge": 3}, "options.judge")])
def test_cascade_values(options, param):
    assert refused("cascade", ["m1", "m2", "small"], options).param == param


@pytest.mark.parametrize("name", ["a\nb", "tab\tname", " lead", "trail ", "zero\u200bwidth", "bell\x07"])
def test_policy_names_without_control_characters_or_edge_spaces(name):
    with pytest.raises(PolicyError) as info:
        check_name(name)
    assert info.value.param == "name"
    assert refused("fallback", ["m1", "m2"], {}, name=name).param == "name"
    check_name("team a/cheap-first v2")  # inner spaces and slashes are fine


def test_config_file_policies_get_the_same_checks():
    config = parse_config({"models": [mock_deployment(n, "http://127.0.0.1:9/v1") for n in ("m1", "m2")],
                           "policies": [{"name": "yaml-moa", "type": "moa", "models": ["m1", "m2"],
                                         "options": {"layers": 1e308}}]})
    with pytest.raises(PolicyError) as info:
        PolicyStore(None, config)
    assert info.value.param == "options.layers"


def test_option_helpers():
    assert number_value(0, "x", 0, 1) == 0.0 and isinstance(number_value(1, "x", 0, 1), float)
    with pytest.raises(PolicyError, match=r"x must be a number in \(0, 1\], got 0"):
        number_value(0, "x", 0, 1, low_open=True)
    assert int_option({}, "n", 7, 1, 9) == 7 and int_option({"n": None}, "n", 7, 1, 9, nullable=True) is None
    with pytest.raises(PolicyError):
        int_option({"n": None}, "n", 7, 1, 9)
    assert set(POLICIES) >= {"fixed", "fallback", "router", "cascade", "moa", "hybrid"}
