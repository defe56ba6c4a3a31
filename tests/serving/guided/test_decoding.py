"""Constrained sampling through the JSON automaton: the lazy-masking guide on a toy vocabulary (random
logits, forced end, forced text, the in-context format's opening space), then the real models: SmolLM2
documents that parse and Gemma's free-form json_object reply closing well before max_tokens.

    LINK_HOME=.link LINK_DATASETS_DIR=../shared/data .venv/bin/python -m pytest -q tests/serving/guided/test_decoding.py
"""

from __future__ import annotations

import json

import pytest
import torch

from serving.guided.automaton import JsonAutomaton
from serving.guided.decoding import JsonGuide, TokenTable
from serving.sampling.params import SamplingParams
from serving.sampling.sampler import Sampler
from serving.tools.harness import parse_tool_calls
from tests.serving.guided_cases import PERSON, TREE, CharTokenizer, valid


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("schema", [{"type": "object"}, PERSON, TREE])
def test_guide_on_random_logits_produces_a_valid_document(temperature, schema):
    tok = CharTokenizer()
    table = TokenTable(tok)
    for seed in range(4):
        params = SamplingParams(temperature=temperature, seed=seed)
        guide = JsonGuide(JsonAutomaton(schema), table, Sampler(params, eos_token_ids=tok.eos_token_ids))
        gen = torch.Generator().manual_seed(seed)
        # A bias towards closing characters, as a model has, so documents end within the budget.
        bias = torch.zeros(tok.vocab_size)
        bias[[0, tok.vocab.index("}"), tok.vocab.index("]"), tok.vocab.index('"')]] = 4.0
        out = []
        for _ in range(2000):
            token = guide.sample(torch.randn(tok.vocab_size, generator=gen) + bias, [], out)
            out.append(token)
            if token == 0:
                break
        assert out[-1] == 0, tok.decode(out)
        assert valid(schema, tok.decode(out)) and isinstance(json.loads(tok.decode(out)), dict)


def test_end_of_output_is_forced_once_the_document_is_closed():
    tok = CharTokenizer()
    table = TokenTable(tok)
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    guide = JsonGuide(JsonAutomaton(schema), table, Sampler(SamplingParams(temperature=0), eos_token_ids=tok.eos_token_ids))
    out = []
    for ch in '{"name": "Ada", "age": 36}':
        logits = torch.full((tok.vocab_size,), -10.0)
        logits[tok.vocab.index(ch)] = 10.0
        out.append(guide.sample(logits, [], out))
    assert tok.decode(out) == '{"name": "Ada", "age": 36}' and guide.is_closed
    # The model now prefers a newline, then a space: neither may follow a closed document.
    logits = torch.full((tok.vocab_size,), -10.0)
    logits[tok.vocab.index("\n")], logits[tok.vocab.index(" ")] = 10.0, 9.0
    assert guide.sample(logits, [], out) == 0


def _guide(tok, automaton, **params) -> JsonGuide:
    return JsonGuide(automaton, TokenTable(tok), Sampler(SamplingParams(**params), eos_token_ids=tok.eos_token_ids))


def test_token_table_indexes_tokens_by_their_first_character():
    tok = CharTokenizer()
    table = TokenTable(tok)
    for c in "<{ ":
        expected = sorted(i for i, t in enumerate(tok.vocab) if i != 0 and t.startswith(c))
        assert sorted(table.starting_with(c).tolist()) == expected and expected
    assert table.starting_with("\u2603").numel() == 0


def test_forced_text_is_written_whatever_the_model_prefers():
    """A tagged block on random logits: the tag and name come out exactly, the document is valid, and the
    harness parser reads the call back."""
    tok = CharTokenizer()
    block = {"begin": '<tool_call>\n{"name": "get_weather", "arguments": ', "end": "}\n</tool_call>",
             "schema": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
                        "additionalProperties": False}}
    for seed in range(3):
        guide = _guide(tok, JsonAutomaton.tagged([block]), temperature=0.8, seed=seed)
        gen, out = torch.Generator().manual_seed(seed), []
        while not out or out[-1] != 0:
            out.append(guide.sample(torch.randn(tok.vocab_size, generator=gen), [], out))
            assert len(out) < 200
        text = tok.decode(out)
        assert text.startswith(block["begin"]) and text.endswith(block["end"])
        calls = parse_tool_calls(text, [{"type": "function", "function": {"name": "get_weather"}}]).tool_calls
        assert [c["function"]["name"] for c in calls] == ["get_weather"]
        assert json.loads(calls[0]["function"]["arguments"])["city"] in ("Paris", "Rome")


def test_the_opening_space_of_an_in_context_reply_is_not_part_of_the_document():
    """With strip_leading_space the first token's space is dropped before the automaton sees it (the engine
    drops it from the text): " {" may open the document, a bare " " may not, and no later space is dropped."""
    tok = CharTokenizer()
    auto = JsonAutomaton({"type": "object"})
    favour = torch.full((tok.vocab_size,), -10.0)
    favour[tok.vocab.index(" ")], favour[tok.vocab.index(" {")], favour[tok.vocab.index("{")] = 9.0, 8.0, 7.0
    assert _guide(tok, auto, temperature=0, strip_leading_space=True).sample(favour) == tok.vocab.index(" {")
    assert _guide(tok, auto, temperature=0).sample(favour) == tok.vocab.index("{")
    guide = _guide(tok, auto, temperature=0, strip_leading_space=True)
    first = guide.sample(favour)
    assert guide.sample(favour, [], [first]) == tok.vocab.index(" ")  # inside the object a space is whitespace


# ---------------------------------------------------------------------------------------------
# The real models
# ---------------------------------------------------------------------------------------------

ANSWER = {"type": "object", "properties": {"answer": {"type": "number"}, "unit": {"type": "string"},
                                           "confident": {"type": "boolean"}},
          "required": ["answer", "unit", "confident"], "additionalProperties": False}


def _check(schema: dict, text: str) -> None:
    value = json.loads(text)
    assert isinstance(value, dict) and valid(schema, text), text
    try:
        import jsonschema
    except ImportError:
        return
    jsonschema.validate(value, schema)


@pytest.mark.slow
def test_real_model_outputs_parse_greedy_and_sampled(smollm2, real_prompts):
    prompts = real_prompts[3:5]  # two GSM8K questions (8 requests)
    work, params = [], []
    for schema in ({"type": "object"}, ANSWER):
        hint = "Reply with one JSON object." + ("" if schema == {"type": "object"} else f" Schema: {json.dumps(schema)}")
        for prompt in prompts:
            for temperature in (0.0, 0.8):
                work.append([{"role": "system", "content": hint}, {"role": "user", "content": prompt}])
                params.append(SamplingParams(temperature=temperature, seed=7, max_tokens=160, guided_json=json.dumps(schema)))
    outputs = smollm2.chat(work, params)
    for out, p in zip(outputs, params):
        c = out.outputs[0]
        if c.finish_reason == "length":  # honest: cut by max_tokens, and still a valid prefix
            auto = JsonAutomaton(json.loads(p.guided_json))
            assert auto.feed(auto.start(), c.text) is not None
            continue
        assert c.finish_reason == "stop"
        _check(json.loads(p.guided_json), c.text)
    # A 135M model sometimes writes a long string value; most documents still close within the budget.
    assert sum(o.outputs[0].finish_reason == "stop" for o in outputs) >= len(outputs) // 2


@pytest.mark.slow
def test_real_gemma_json_object_closes_well_before_max_tokens(gemma3):
    """Gemma 270M, greedy, on a prompt where it repeats ever longer keys: unbounded, it ran to max_tokens
    (digits, keys); MAX_MEMBERS and MAX_KEY_CHARS make it close the object with a valid document."""
    messages = [{"role": "system", "content": "Reply with one JSON object and nothing else."},
                {"role": "user", "content": "Give me a JSON object describing a cat."}]
    out = gemma3.chat(messages, SamplingParams(temperature=0, max_tokens=512, guided_json='{"type": "object"}'))[0].outputs[0]
    assert out.finish_reason == "stop" and len(out.token_ids) < 320, (len(out.token_ids), out.text[-200:])
    value = json.loads(out.text)
    assert isinstance(value, dict) and 1 <= len(value) <= 16 and out.text == out.text.strip()
