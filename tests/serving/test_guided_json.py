"""`response_format` by constrained decoding: the JSON automaton against `json.loads`, the schema subset,
the lazy-masking guide on a toy vocabulary, and the real model (offline and over HTTP).

    LINK_HOME=.link LINK_DATASETS_DIR=../shared/data .venv/bin/python -m pytest -q tests/serving/test_guided_json.py
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from serving.guided_decoding import JsonGuide, TokenTable
from serving.guided_json import MAX_WHITESPACE, JsonAutomaton, UnsupportedSchemaError, response_format_schema
from serving.sampler import Sampler
from serving.sampling_params import SamplingParams

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}, "score": {"type": ["number", "null"]},
        "role": {"enum": ["admin", "user"]}, "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "address": {"$ref": "#/$defs/Address"}, "ok": {"type": "boolean"},
        "id": {"anyOf": [{"type": "integer"}, {"type": "string"}]}, "kind": {"const": "person"},
    },
    "required": ["name", "age", "kind"], "additionalProperties": False,
    "$defs": {"Address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                          "additionalProperties": False}},
}


def _valid(schema: dict, text: str) -> bool:
    auto = JsonAutomaton(schema)
    state = auto.feed(auto.start(), text)
    return state is not None and auto.is_complete(state)


def _reject_index(auto: JsonAutomaton, text: str) -> int | None:
    """The index of the first character the automaton refuses, or None."""
    state = auto.start()
    for i, c in enumerate(text):
        state = auto.feed(state, c)
        if state is None:
            return i
    return None


KEY_CHARS = 'aé"\\'


def _random_value(rng: random.Random, depth: int = 0):
    kinds = ["str", "int", "float", "bool", "null"] + (["obj", "arr"] if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "obj":
        return {f"k{i}{rng.choice(KEY_CHARS)}": _random_value(rng, depth + 1) for i in range(rng.randint(0, 3))}
    if kind == "arr":
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {"str": lambda: "".join(rng.choice('ab "\\\n\té☃') for _ in range(rng.randint(0, 5))),
            "int": lambda: rng.randint(-1000, 1000), "float": lambda: rng.uniform(-1e6, 1e6) * rng.choice([1, 1e-9, 1e12]),
            "bool": lambda: rng.random() < 0.5, "null": lambda: None}[kind]()


def _documents(count: int) -> list[str]:
    rng = random.Random(0)
    docs = []
    for i in range(count):
        value = {"root": _random_value(rng), "n": i}
        style = [dict(), dict(indent=2), dict(separators=(",", ":")), dict(ensure_ascii=False)][i % 4]
        docs.append(json.dumps(value, **style))
    return docs


def _strict_loads(text: str):
    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        if len(keys) != len(set(keys)):
            raise ValueError("duplicate key")
        return dict(pairs)

    return json.loads(text, object_pairs_hook=no_duplicates, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))


def test_every_prefix_of_a_valid_document_is_accepted_and_only_the_whole_is_complete():
    auto = JsonAutomaton({"type": "object"})
    for doc in _documents(60):
        state = auto.start()
        for i, c in enumerate(doc):
            assert not auto.is_complete(state) or i == len(doc), doc[:i]
            state = auto.feed(state, c)
            assert state is not None, f"refused {doc[:i + 1]!r}"
        assert auto.is_complete(state)


def test_corruptions_are_rejected_no_earlier_than_the_corruption_and_agree_with_json_loads():
    auto, rng = JsonAutomaton({}), random.Random(1)  # any JSON value, as json.loads takes
    num_rejected = 0
    for doc in _documents(40):
        for _ in range(10):
            pos = rng.randrange(len(doc))
            bad = doc[:pos] + rng.choice('{}[]",:0-e. atfn\\x') + doc[pos + 1:]
            try:
                _strict_loads(bad)
                loads_ok, error_pos = True, None
            except json.JSONDecodeError as exc:
                loads_ok, error_pos = False, exc.pos
            except ValueError:
                loads_ok, error_pos = False, None
            index = _reject_index(auto, bad)
            complete = index is None and auto.is_complete(auto.feed(auto.start(), bad))
            assert complete == loads_ok, bad
            if index is not None:
                num_rejected += 1
                assert index >= min(pos, len(doc)), (bad, index, pos)  # the text before the change was a valid prefix
                if error_pos is not None:
                    assert index >= error_pos, (bad, index, error_pos)  # json.loads sees the problem there or earlier
    assert num_rejected > 100


@pytest.mark.parametrize("text", [
    '{"name": "Ann", "age": 31, "kind": "person"}',
    '{"kind":"person","age":-2,"name":"B","score":null,"role":"user","tags":["x","y"],"ok":true,"id":"a7"}',
    '{\n  "name": "C",\n  "age": 0,\n  "kind": "person",\n  "address": {"city": "Rome"},\n  "id": 12,\n  "score": 1.5e3\n}',
])
def test_schema_accepts_valid_instances(text):
    assert _valid(PERSON, text) and json.loads(text)


@pytest.mark.parametrize("text", [
    '{"name": "Ann", "age": 31}',                                   # required "kind" missing
    '{"name": "Ann", "age": 31, "kind": "person", "extra": 1}',     # additionalProperties false
    '{"name": "Ann", "age": 3.5, "kind": "person"}',                # integer
    '{"name": "Ann", "age": 31, "kind": "robot"}',                  # const
    '{"name": "Ann", "age": 31, "kind": "person", "role": "root"}', # enum
    '{"name": 1, "age": 31, "kind": "person"}',                     # string
    '{"name": "A", "age": 1, "kind": "person", "tags": ["a", "b", "c", "d"]}',  # maxItems
    '{"name": "A", "age": 1, "kind": "person", "address": {}}',     # nested required
    '{"name": "A", "name": "B", "age": 1, "kind": "person"}',       # duplicate key
    '{"name": "A", "age": 1, "kind": "person"} x',                  # nothing but blanks after the document
])
def test_schema_rejects_invalid_instances(text):
    assert not _valid(PERSON, text)


def test_whitespace_is_bounded_and_numbers_cannot_dead_end():
    auto = JsonAutomaton({"type": "object"})
    assert auto.feed(auto.start(), " " * MAX_WHITESPACE) is not None
    assert auto.feed(auto.start(), " " * (MAX_WHITESPACE + 1)) is None
    state = auto.feed(auto.start(), '{"a": 1' + "1" * 40)
    assert state is None or auto.feed(state, "}") is not None


@pytest.mark.parametrize("schema, keyword", [
    ({"type": "string", "pattern": "^a"}, "pattern"),
    ({"type": "object", "properties": {"d": {"type": "string", "format": "date"}}}, "format"),
    ({"oneOf": [{"type": "string"}]}, "oneOf"),
    ({"type": "number", "minimum": 0}, "minimum"),
])
def test_unsupported_keywords_are_refused_by_name(schema, keyword):
    with pytest.raises(UnsupportedSchemaError, match=f"'{keyword}'"):
        response_format_schema({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})


def test_response_format_types():
    assert response_format_schema({"type": "text"}) is None
    assert response_format_schema({"type": "json_object"}) == {"type": "object"}
    with pytest.raises(UnsupportedSchemaError, match="not supported"):
        response_format_schema({"type": "yaml"})


class _CharTokenizer:
    """A toy tokenizer: printable ASCII characters, a few multi-character tokens and an EOS (id 0)."""

    def __init__(self):
        self.vocab = ["</s>"] + [chr(c) for c in range(32, 127)] + ["\n", '{"', '": ', '", "', "true", "12", "name", "}\n"]
        self.eos_token_ids = (0,)
        self.vocab_size = len(self.vocab)

    def encode(self, text, add_special_tokens=True):
        return [self.vocab.index(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.vocab[i] for i in ids if not (skip_special_tokens and i == 0))


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("schema", [{"type": "object"}, PERSON])
def test_guide_on_random_logits_produces_a_valid_document(temperature, schema):
    tok = _CharTokenizer()
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
        assert _valid(schema, tok.decode(out)) and isinstance(json.loads(tok.decode(out)), dict)


# ---------------------------------------------------------------------------------------------
# The real model
# ---------------------------------------------------------------------------------------------

ANSWER = {"type": "object", "properties": {"answer": {"type": "number"}, "unit": {"type": "string"},
                                           "confident": {"type": "boolean"}},
          "required": ["answer", "unit", "confident"], "additionalProperties": False}


def _check(schema: dict, text: str) -> None:
    value = json.loads(text)
    assert isinstance(value, dict) and _valid(schema, text), text
    try:
        import jsonschema
    except ImportError:
        return
    jsonschema.validate(value, schema)


def test_real_model_outputs_parse_greedy_and_sampled(smollm2, real_prompts):
    prompts = real_prompts[3:6]  # three GSM8K questions
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


def test_end_of_output_is_forced_once_the_document_is_closed():
    tok = _CharTokenizer()
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
