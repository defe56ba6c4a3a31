"""Sequential generation: one sequence at a time over a contiguous KV cache.

The simplest correct decoding loop (prefill the prompt, then one token per forward pass). It is the
reference the batching engine is tested against.
"""

from __future__ import annotations

import torch

from serving.model_loader import LoadedModel
from serving.outputs import CompletionOutput, Logprob
from serving.sampler import Sampler, compute_logprobs
from serving.sampling_params import SamplingParams
from serving.stop import check_stop


@torch.inference_mode()
def generate_sequence(lm: LoadedModel, prompt_ids: list[int], params: SamplingParams, sampler: Sampler, index: int = 0) -> CompletionOutput:
    """Generate one completion of `prompt_ids` (non-empty, shorter than the context).

    Returns:
        The completion; finish_reason "length" when max_tokens or the context length is reached.
    """
    model, tokenizer = lm.model, lm.tokenizer
    room = lm.context_length - len(prompt_ids)
    max_new = room if params.max_tokens is None else min(params.max_tokens, room)
    cache = model.allocate_cache(len(prompt_ids) + max_new)
    hidden = model(torch.tensor(prompt_ids), 0, cache)
    logits = model.compute_logits(hidden[-1:])[0]
    output_ids: list[int] = []
    logprobs: list[dict[int, Logprob]] | None = [] if params.logprobs is not None else None
    cumulative = 0.0
    text, finish, stop_reason = "", "length", None
    while True:
        token = sampler.sample(logits, prompt_ids, output_ids)
        output_ids.append(token)
        if logprobs is not None:
            chosen, top = compute_logprobs(logits, token, params.logprobs)
            cumulative += chosen
            entry = {tid: Logprob(lp, rank + 1, tokenizer.id_to_token(tid)) for rank, (tid, lp) in enumerate(top)}
            if token not in entry:
                rank = int((logits > logits[token]).sum()) + 1
                entry[token] = Logprob(chosen, rank, tokenizer.id_to_token(token))
            logprobs.append(entry)
        previous_len = len(text)
        text = tokenizer.decode(output_ids, skip_special_tokens=params.skip_special_tokens)
        result = check_stop(params, token, len(output_ids), text, previous_len, tokenizer.eos_token_ids)
        if result is not None:
            text, finish, stop_reason = result.text, result.finish_reason, result.stop_reason
            break
        if len(output_ids) >= max_new:
            break
        position = len(prompt_ids) + len(output_ids) - 1
        logits = model.compute_logits(model(torch.tensor([token]), position, cache))[0]
    return CompletionOutput(
        index=index, text=text, token_ids=output_ids, finish_reason=finish, stop_reason=stop_reason,
        logprobs=logprobs, cumulative_logprob=cumulative if logprobs is not None else None,
    )
