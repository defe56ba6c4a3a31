"""Our Qwen2 against Hugging Face `transformers` loading the same Qwen2.5-Coder GGUF files (fp32).

For each model, three real prompts (an MT-Bench writing and coding question, a GSM8K question) in the file's
ChatML template: 32 greedy tokens are the reference's greedy tokens, and at every step the top-5 next-token
log-probabilities agree within 1e-3. The reference runs teacher-forced, as in `test_parity_transformers.py`.

Memory: fp32 1.5B is about 7 GB per copy, and transformers' GGUF reader peaks at several times that while it
dequantizes. So each model's comparison runs in a child process of its own (its memory goes back whole when it
ends, whatever the test process already holds), and inside it ours runs first and is freed before the reference
loads.
"""

from __future__ import annotations

import gc
import multiprocessing

import pytest

NUM_NEW_TOKENS = 32

pytestmark = pytest.mark.slow


def _compare(name: str, prompts: list[str]) -> list[str]:
    """In a child process: the differences between our model `name` and the reference on `prompts` (none: parity)."""
    from serving import LLM, SamplingParams
    from tests.serving.models.test_parity_transformers import LOGPROB_TOL, _hf_logprobs, _hf_model

    llm = LLM(name, dtype="float32")
    fmt = llm.loaded.chat_format
    params = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True, logprobs=5)
    runs = []
    for prompt in prompts:
        ids = llm.tokenizer.encode(fmt.render([{"role": "user", "content": prompt}]), add_special_tokens=fmt.add_special_tokens)
        out = llm.generate({"prompt_token_ids": ids}, params)[0].outputs[0]
        top5 = [sorted((lp.logprob for lp in entry.values() if lp.rank <= 5), reverse=True) for entry in out.logprobs]
        runs.append((prompt, ids, list(out.token_ids), top5))
    path = llm.loaded.spec.resolve_path()
    del llm, out
    gc.collect()

    hf_model = _hf_model(path)
    problems = []
    for prompt, ids, token_ids, top5 in runs:
        if len(token_ids) != NUM_NEW_TOKENS:
            problems.append(f"{len(token_ids)} tokens, not {NUM_NEW_TOKENS}, for {prompt[:60]!r}")
            continue
        ref_logprobs = _hf_logprobs(hf_model, ids, token_ids)
        if token_ids != ref_logprobs.argmax(dim=-1).tolist():
            problems.append(f"greedy tokens differ for {prompt[:60]!r}")
        for step, ours in enumerate(top5):
            ref = ref_logprobs[step].topk(5).values.tolist()
            diff = max(abs(a - b) for a, b in zip(ours, ref))
            if len(ours) != 5 or diff >= LOGPROB_TOL:
                problems.append(f"step {step}: top-5 logprobs differ by {diff:.2e} for {prompt[:60]!r}")
    return problems


@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"])
def test_qwen_matches_transformers(name, real_prompts):
    prompts = [real_prompts[0], real_prompts[2], real_prompts[3]]
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        problems = pool.apply(_compare, (name, prompts))
    assert not problems, "\n".join(problems)
