"""End to end through `LLM.generate` / `LLM.chat` on the real SmolLM2-135M (and Gemma 3 270M).

Each `SamplingParams` field is checked at this level by a test that fails if the generation loop ignored
it; the sampler's maths is unit-tested in test_sampler.py, so here the expected values come from another
code path: the model's own logits (a prefill, or one teacher-forced forward pass over prompt + greedy
output), the penalties written out by hand, or a greedy run of the same prompt.

Run: LINK_HOME=.link python -m pytest tests/serving/test_llm.py (about a minute on a 2-core CPU).
"""

from __future__ import annotations

import pytest
import torch

from serving import SamplingParams

pytestmark = pytest.mark.slow  # loads a real model (tests/test_markers.py)

STORY = "Once upon a time"
# The greedy continuation repeats the prompt (" happy. I am happy. I am happy."), so every penalty bites.
REPEAT = "I am happy. I am happy. I am"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
NUM_TOKENS = 24
SEED = 1
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_TOKENS)
SMOLLM2_CHATML_HI = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nHi<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def _complete(llm, prompt, **params):
    return llm.generate(prompt, SamplingParams(**params))[0].outputs[0]


def _prefill_logits(llm, prompt_ids: list[int]) -> torch.Tensor:
    """The model's next-token logits [V] after `prompt_ids`: one forward pass, no sampler, no engine."""
    return llm.loaded.model.prefill_logits(prompt_ids)[-1]


def _teacher_forced_logits(llm, prompt_ids: list[int], output_ids: list[int]) -> torch.Tensor:
    """Next-token logits [len(output_ids), V] at every output step, from one forward pass over prompt + output."""
    return llm.loaded.model.prefill_logits(prompt_ids + output_ids)[len(prompt_ids) - 1 : -1]


@pytest.fixture(scope="module")
def story(smollm2):
    """Greedy RequestOutput of STORY, NUM_TOKENS tokens."""
    return smollm2.generate(STORY, GREEDY)[0]


@pytest.fixture(scope="module")
def story_logits(smollm2, story) -> torch.Tensor:
    return _teacher_forced_logits(smollm2, story.prompt_token_ids, story.outputs[0].token_ids)


@pytest.fixture(scope="module")
def story_sampled(smollm2):
    """STORY sampled at temperature 1 with SEED."""
    return _complete(smollm2, STORY, temperature=1.0, seed=SEED, max_tokens=NUM_TOKENS)


@pytest.fixture(scope="module")
def france(smollm2):
    """SmolLM2's greedy chat answer to FRANCE (ends with <|im_end|> well before 64 tokens)."""
    return smollm2.chat(FRANCE, SamplingParams(temperature=0, max_tokens=64))[0].outputs[0]


# --------------------------------------------------------------------------- greedy, seed, n, top_k


def test_greedy_first_token_is_the_argmax_of_a_direct_forward(smollm2, story):
    ids = smollm2.tokenizer.encode(STORY)
    assert story.prompt_token_ids == ids and story.prompt == STORY
    assert story.outputs[0].token_ids[0] == int(_prefill_logits(smollm2, ids).argmax())


def test_greedy_is_the_argmax_at_every_step_and_reproducible(smollm2, story, story_logits):
    out = story.outputs[0]
    assert len(out.token_ids) == NUM_TOKENS and out.finish_reason == "length"
    assert out.token_ids == story_logits.argmax(dim=-1).tolist()
    again = smollm2.generate(STORY, GREEDY)[0].outputs[0]
    assert (again.token_ids, again.text) == (out.token_ids, out.text)
    assert out.text == smollm2.tokenizer.decode(out.token_ids)


def test_seed_makes_sampling_reproducible(smollm2, story, story_sampled):
    assert len(story_sampled.token_ids) == NUM_TOKENS
    assert story_sampled.token_ids != story.outputs[0].token_ids  # temperature 1 really samples
    same = _complete(smollm2, STORY, temperature=1.0, seed=SEED, max_tokens=NUM_TOKENS)
    assert same.token_ids == story_sampled.token_ids
    other = _complete(smollm2, STORY, temperature=1.0, seed=SEED + 1, max_tokens=NUM_TOKENS)
    assert other.token_ids != story_sampled.token_ids


def test_n_gives_indexed_different_samples(smollm2):
    outputs = smollm2.generate(STORY, SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8))[0].outputs
    assert [o.index for o in outputs] == [0, 1, 2]
    assert all(len(o.token_ids) == 8 for o in outputs)
    assert len({tuple(o.token_ids) for o in outputs}) > 1


def test_top_k_1_is_greedy(smollm2, story, story_sampled):
    # Same temperature and seed as `story_sampled`, which differs from greedy: only top_k makes this greedy.
    out = _complete(smollm2, STORY, temperature=1.0, top_k=1, seed=SEED, max_tokens=NUM_TOKENS)
    assert out.token_ids == story.outputs[0].token_ids


@pytest.mark.parametrize("field,value,check", [
    # top_p: the nucleus is the top token alone when its probability p1 >= top_p.
    ("top_p", 0.005, lambda probs, value: bool((probs[:, 0] > value).all())),
    # min_p: the top token alone survives when p2 < min_p * p1.
    ("min_p", 0.95, lambda probs, value: bool((probs[:, 1] < value * probs[:, 0]).all())),
])
def test_truncation_to_one_token_is_greedy(smollm2, story, story_logits, field, value, check):
    num = 16
    top2 = torch.softmax(story_logits[:num] / 1.5, dim=-1).topk(2, dim=-1).values  # [num, 2] at temperature 1.5
    assert check(top2, value), f"precondition: {field}={value} should keep one token at every step"
    out = _complete(smollm2, STORY, temperature=1.5, seed=SEED, max_tokens=num, **{field: value})
    assert out.token_ids == story.outputs[0].token_ids[:num]
    untruncated = _complete(smollm2, STORY, temperature=1.5, seed=SEED, max_tokens=num, top_p=1.0)
    assert untruncated.token_ids != out.token_ids


# --------------------------------------------------------------------------- length and stopping


def test_max_tokens(smollm2, story):
    out = _complete(smollm2, STORY, temperature=0, max_tokens=5)
    assert out.token_ids == story.outputs[0].token_ids[:5]
    assert out.finish_reason == "length" and out.stop_reason is None


def _split_stop_string(tokenizer, token_ids: list[int]) -> tuple[int, str, int]:
    """(i, stop, start): a 4-character stop string made of the last 2 characters of token i's text and the
    first 2 of token i+1's, found first at `start` in the decoded text."""
    ends = [len(tokenizer.decode(token_ids[:k])) for k in range(len(token_ids) + 1)]
    text = tokenizer.decode(token_ids)
    for i in range(len(token_ids) - 1):
        boundary = ends[i + 1]
        if boundary - ends[i] >= 2 and ends[i + 2] - boundary >= 2:
            stop = text[boundary - 2 : boundary + 2]
            if text.find(stop) == boundary - 2:
                return i, stop, boundary - 2
    raise AssertionError(f"no token boundary to split a stop string over in {text!r}")


def test_stop_string_split_across_two_tokens(smollm2, story):
    greedy = story.outputs[0]
    i, stop, start = _split_stop_string(smollm2.tokenizer, greedy.token_ids)
    out = _complete(smollm2, STORY, temperature=0, max_tokens=NUM_TOKENS, stop=[stop])
    assert out.text == greedy.text[:start]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    assert out.token_ids == greedy.token_ids[: i + 2]  # stopped on the token that completed the string
    kept = _complete(smollm2, STORY, temperature=0, max_tokens=NUM_TOKENS, stop=[stop], include_stop_str_in_output=True)
    assert kept.text == greedy.text[: start + len(stop)] and kept.text.endswith(stop)
    assert (kept.finish_reason, kept.stop_reason) == ("stop", stop)


def test_stop_token_ids(smollm2, story):
    greedy = story.outputs[0].token_ids
    stop_id = greedy[2]
    assert stop_id not in greedy[:2]
    out = _complete(smollm2, STORY, temperature=0, max_tokens=NUM_TOKENS, stop_token_ids=[stop_id])
    assert out.token_ids == greedy[:3]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop_id)
    # As in vLLM, the stop token's text is left out unless include_stop_str_in_output.
    assert out.text == smollm2.tokenizer.decode(greedy[:2])
    kept = _complete(smollm2, STORY, temperature=0, max_tokens=NUM_TOKENS, stop_token_ids=[stop_id],
                     include_stop_str_in_output=True)
    assert kept.token_ids == greedy[:3] and kept.text == smollm2.tokenizer.decode(greedy[:3])


def test_chat_stops_at_eos(smollm2, france):
    assert (france.finish_reason, france.stop_reason) == ("stop", None)
    assert len(france.token_ids) < 64
    assert france.token_ids[-1] in smollm2.tokenizer.eos_token_ids
    assert all(t not in smollm2.tokenizer.eos_token_ids for t in france.token_ids[:-1])
    assert "Paris" in france.text and "<|im_end|>" not in france.text


def test_ignore_eos_and_skip_special_tokens(smollm2, france):
    # 16 tokens: enough to run well past the EOS (token 8 of SmolLM2's answer) without the cost of 64.
    eos_at = len(france.token_ids) - 1
    past = smollm2.chat(FRANCE, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0].outputs[0]
    assert len(past.token_ids) == 16 and (past.finish_reason, past.stop_reason) == ("length", None)
    assert past.token_ids[: eos_at + 1] == france.token_ids  # greedy continues through the EOS
    assert "<|im_end|>" not in past.text  # skip_special_tokens=True (the default) hides it
    assert past.text == smollm2.tokenizer.decode(past.token_ids, skip_special_tokens=True)

    shown = smollm2.chat(FRANCE, SamplingParams(temperature=0, max_tokens=eos_at + 3, ignore_eos=True,
                                                skip_special_tokens=False))[0].outputs[0]
    assert shown.token_ids == past.token_ids[: eos_at + 3]
    assert "<|im_end|>" in shown.text
    assert shown.text == smollm2.tokenizer.decode(shown.token_ids, skip_special_tokens=False)


# --------------------------------------------------------------------------- logprobs


def test_logprobs_are_the_model_distribution(smollm2, story, story_logits):
    num = 8
    out = _complete(smollm2, STORY, temperature=0, max_tokens=num, logprobs=3)
    assert out.token_ids == story.outputs[0].token_ids[:num]  # asking for logprobs changes no token
    assert len(out.logprobs) == num
    for token, entry in zip(out.token_ids, out.logprobs):
        assert token in entry and entry[token].rank == 1  # greedy picks the most likely token
        assert sorted(lp.rank for lp in entry.values()) == [1, 2, 3]

    first = torch.log_softmax(_prefill_logits(smollm2, story.prompt_token_ids), dim=-1).topk(3)
    got = sorted(out.logprobs[0].items(), key=lambda item: item[1].rank)
    assert [tid for tid, _ in got] == first.indices.tolist()
    assert [lp.logprob for _, lp in got] == pytest.approx(first.values.tolist(), abs=1e-4)

    # Later steps against the teacher-forced pass (a different matmul shape than one-token decoding).
    ref = torch.log_softmax(story_logits[:num], dim=-1).topk(3)
    for step, entry in enumerate(out.logprobs):
        got = sorted(entry.items(), key=lambda item: item[1].rank)
        assert [tid for tid, _ in got] == ref.indices[step].tolist()
        assert [lp.logprob for _, lp in got] == pytest.approx(ref.values[step].tolist(), abs=1e-3)

    chosen = [entry[token].logprob for token, entry in zip(out.token_ids, out.logprobs)]
    assert out.cumulative_logprob == pytest.approx(sum(chosen), abs=1e-5)
    assert out.cumulative_logprob < 0


def test_no_logprobs_by_default(story):
    assert story.outputs[0].logprobs is None and story.outputs[0].cumulative_logprob is None


# --------------------------------------------------------------------------- penalties


def _repetition(logits, prompt_ids, output_ids, p=1.3):
    """CTRL (Keskar et al. 2019), HF/vLLM sign convention, on every token of prompt + output."""
    out = logits.clone()
    for t in set(prompt_ids) | set(output_ids):
        out[t] = out[t] / p if out[t] > 0 else out[t] * p
    return out


def _presence(logits, prompt_ids, output_ids, p=1.5):
    out = logits.clone()
    for t in set(output_ids):
        out[t] -= p
    return out


def _frequency(logits, prompt_ids, output_ids, p=1.5):
    out = logits.clone()
    for t in output_ids:
        out[t] -= p
    return out


@pytest.fixture(scope="module")
def repeat(smollm2):
    """Greedy output of REPEAT (12 tokens) and its teacher-forced logits."""
    out = smollm2.generate(REPEAT, SamplingParams(temperature=0, max_tokens=12))[0]
    ids = out.prompt_token_ids
    return ids, out.outputs[0], _teacher_forced_logits(smollm2, ids, out.outputs[0].token_ids)


@pytest.mark.parametrize("field,value,by_hand", [
    ("repetition_penalty", 1.3, _repetition),
    ("presence_penalty", 1.5, _presence),
    ("frequency_penalty", 1.5, _frequency),
])
def test_penalty_changes_a_repetitive_output(smollm2, repeat, field, value, by_hand):
    prompt_ids, greedy, logits = repeat
    assert greedy.text.startswith(" happy. I am happy")  # the model repeats itself without a penalty
    g = greedy.token_ids
    # The first step where the hand-penalized argmax leaves the greedy path; up to it the outputs agree.
    step = next((s for s in range(len(g)) if int(by_hand(logits[s], prompt_ids, g[:s]).argmax()) != g[s]), None)
    assert step is not None, f"{field}={value} never changes the argmax on this prompt"
    out = _complete(smollm2, REPEAT, temperature=0, max_tokens=len(g), **{field: value})
    assert out.token_ids[:step] == g[:step]
    assert out.token_ids[step] == int(by_hand(logits[step], prompt_ids, g[:step]).argmax())
    if field == "repetition_penalty":  # the prompt's tokens are penalized from the first step on
        assert step == 0
        penalized = by_hand(_prefill_logits(smollm2, prompt_ids), prompt_ids, [])
        assert out.token_ids[0] == int(penalized.argmax())


# --------------------------------------------------------------------------- prompts, chat, tokenizer


def test_token_id_prompt_equals_text_prompt(smollm2, story):
    ids = smollm2.tokenizer.encode(STORY)
    result = smollm2.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=8))[0]
    assert result.prompt is None and result.prompt_token_ids == ids
    assert result.outputs[0].token_ids == story.outputs[0].token_ids[:8]
    assert result.outputs[0].text == smollm2.tokenizer.decode(story.outputs[0].token_ids[:8])


def test_smollm2_chat_template_is_chatml(smollm2):
    # The GGUF's template adds SmolLM2's default system prompt when the conversation has none.
    assert "You are a helpful AI assistant named SmolLM, trained by Hugging Face" in smollm2.tokenizer.chat_template
    assert smollm2.loaded.chat_format.render([{"role": "user", "content": "Hi"}]) == SMOLLM2_CHATML_HI


def test_gemma3_in_context_chat(gemma3):
    prompt = gemma3.loaded.chat_format.render(FRANCE)
    assert prompt.endswith("\nUser: What is the capital of France?\nAssistant:")
    out = gemma3.chat(FRANCE, SamplingParams(temperature=0, max_tokens=16))[0].outputs[0]
    assert "Paris" in out.text
    assert "User" not in out.text  # the format's stop strings end the turn
    assert out.finish_reason == "stop" and out.stop_reason in gemma3.loaded.chat_format.stop


def test_tokenizer_round_trip_smollm2(smollm2, real_prompts):
    for prompt in real_prompts:
        assert smollm2.tokenizer.decode(smollm2.tokenizer.encode(prompt)) == prompt


def test_tokenizer_round_trip_gemma3(gemma3, real_prompts):
    tok = gemma3.tokenizer
    bos = tok.backend.token_to_id(tok.bos_token)
    for prompt in real_prompts:
        ids = tok.encode(prompt)
        assert ids[0] == bos and bos not in ids[1:]
        assert tok.decode(ids, skip_special_tokens=True) == prompt
