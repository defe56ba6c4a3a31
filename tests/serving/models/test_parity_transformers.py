"""Our PyTorch Llama and Gemma 3 against Hugging Face `transformers` loading the same GGUF file.

For each model, fp32, six real prompts (MT-Bench and GSM8K) rendered in the model's chat format:
greedy generation of 64 new tokens gives the same token ids, and at every step the top-5 next-token
log-probabilities agree within 1e-3. Our six prompts run as one batch, as the engine serves them. The
reference runs teacher-forced (one forward pass over prompt + our output), which checks the same property
as its own greedy loop at a fraction of the time.
"""

from __future__ import annotations

import functools

import pytest
import torch

from serving import SamplingParams
from tests.serving.gguf_reader import ArrayReader

pytestmark = pytest.mark.slow  # loads a real model (tests/test_markers.py)

NUM_NEW_TOKENS = 64
LOGPROB_TOL = 1e-3


def _hf_model(path):
    """transformers' own model for the GGUF file at `path`, fp32, in eval mode.

    transformers reads the file twice (config, then tensors), each time parsing the whole header with its
    vocabulary, and builds gguf's tensor-name map anew for every submodule: tens of seconds of pure Python.
    Here one `ArrayReader` (the same bytes, parsed about 3x faster) serves both reads and the name map is built
    once per (architecture, layers): the same values, so the weights and config are what transformers' loader makes.
    """
    import gguf
    from transformers import AutoModelForCausalLM

    readers = {}

    def reader(file, *args, **kwargs):
        key = (str(file), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = ArrayReader(file, *args, **kwargs)
        return readers[key]

    with pytest.MonkeyPatch.context() as patch:  # only while transformers loads: our own loader keeps the plain reader
        patch.setattr(gguf, "GGUFReader", reader)
        patch.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return model.eval()


def _hf_logprobs(model, prompt_ids: list[int], output_ids: list[int]) -> torch.Tensor:
    """Reference next-token log-probabilities [steps, V] after the prompt and each output prefix.

    One teacher-forced forward pass over prompt + output: if the reference's argmax at every step is
    our token, greedy generation with the reference yields exactly our tokens (by induction over steps).
    """
    ids = torch.tensor([prompt_ids + output_ids])
    with torch.inference_mode():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1]
    return torch.log_softmax(logits.float(), dim=-1)


def _check_parity(llm, hf_model, prompts: list[str]) -> None:
    fmt = llm.loaded.chat_format
    params = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True, logprobs=5)
    prompt_ids = [llm.tokenizer.encode(fmt.render([{"role": "user", "content": p}]), add_special_tokens=fmt.add_special_tokens)
                  for p in prompts]
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params)
    for prompt, ids, result in zip(prompts, prompt_ids, outputs, strict=True):
        ours = result.outputs[0]
        assert result.prompt_token_ids == ids and len(ours.token_ids) == NUM_NEW_TOKENS
        ref_logprobs = _hf_logprobs(hf_model, ids, ours.token_ids)
        ref_greedy = ref_logprobs.argmax(dim=-1).tolist()
        assert ours.token_ids == ref_greedy, f"greedy tokens differ for prompt {prompt[:60]!r}"
        for step, entry in enumerate(ours.logprobs):
            ours_top5 = sorted((lp.logprob for lp in entry.values() if lp.rank <= 5), reverse=True)
            ref_top5 = ref_logprobs[step].topk(5).values.tolist()
            assert len(ours_top5) == 5
            diff = max(abs(a - b) for a, b in zip(ours_top5, ref_top5))
            assert diff < LOGPROB_TOL, f"step {step}: top-5 logprobs differ by {diff:.2e} for {prompt[:60]!r}"


def test_smollm2_matches_transformers(smollm2, smollm2_gguf_path, real_prompts):
    _check_parity(smollm2, _hf_model(smollm2_gguf_path), real_prompts)


def test_gemma3_matches_transformers(gemma3, gemma3_gguf_path, real_prompts):
    _check_parity(gemma3, _hf_model(gemma3_gguf_path), real_prompts)
