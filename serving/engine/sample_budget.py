"""The engine's per-token budget: a request whose next token takes too long to choose is stopped, not waited for.

    token = choose_token(state, seq, logits, config.sample_timeout_s)   # SamplingTimeoutError when over

A step samples its sequences one after another, so one slow choice delays every request in the batch. Guided
decoding (`serving.guided.decoding.JsonGuide.sample`: a walk down the vocabulary, feeding each candidate to
the JSON automaton) checks a deadline as it goes, so a schema whose branches multiply costs at most
`sample_timeout_s` of one step; any other sampling work (logits processors, penalties, the sampler) is
measured once it returns. Either way the engine ends the request with `SamplingTimeoutError`
(`LLMEngine._stop`) and the step goes on with the others.
"""

from __future__ import annotations

import time

import torch

from serving.engine.request_state import SeqState
from serving.engine.sequence import Sequence
from serving.errors import SamplingTimeoutError


def choose_token(state: SeqState, seq: Sequence, logits: torch.Tensor, budget_s: float) -> int:
    """The next token of `seq`, chosen by its guide (guided decoding) or its sampler, within `budget_s` seconds.

    Args:
        logits: the sequence's raw logits for the next position, shape [V].
        budget_s: `EngineConfig.sample_timeout_s`.
    Raises:
        SamplingTimeoutError: the choice took longer than `budget_s` (a guide is interrupted at the deadline);
            its message is the client's, its `param` the field behind the work.
    """
    began = time.monotonic()
    token = None
    try:
        if state.guide is not None:
            token = state.guide.sample(logits, seq.prompt_token_ids, seq.output_token_ids, deadline=began + budget_s)
        else:
            token = state.sampler.sample(logits, seq.prompt_token_ids, seq.output_token_ids)
    except SamplingTimeoutError:
        pass
    elapsed = time.monotonic() - began
    if token is not None and elapsed <= budget_s:
        return token
    params = state.sampler.params
    param = "response_format" if params.guided_json is not None else "tools" if params.structural_tag is not None else None
    reason = {"response_format": "its response_format schema has too many overlapping choices to follow (anyOf "
                                 "branches that start alike multiply); simplify the schema",
              "tools": "the parameters of its forced tools have too many overlapping choices to follow; simplify them",
              None: "the server is overloaded or a logits processor is too slow; retry later"}[param]
    raise SamplingTimeoutError(f"the request was stopped after {elapsed:.1f} s choosing output token "
                               f"{seq.num_output_tokens + 1}, over the engine's budget of {budget_s:g} s per token "
                               f"(EngineConfig.sample_timeout_s): {reason}", param)
