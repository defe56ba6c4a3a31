"""`LLMEngine`: requests in, tokens out, one scheduler step at a time.

    engine = LLMEngine(load_model(spec), EngineConfig())
    engine.add_request("r1", prompt_ids, SamplingParams(max_tokens=32))
    while engine.has_unfinished_requests:
        for output in engine.step():      # RequestOutput snapshots of the requests that advanced
            ...
    engine.abort_request("r1")            # frees the request's KV blocks at once

Each step: the `Scheduler` picks the batch (continuous batching, chunked prefill, preemption), the
`ModelRunner` runs it over the paged KV cache, and every sequence whose logits came back samples one
token, detokenizes and checks its stop conditions. With `EngineConfig.speculative`, decoding sequences
first get draft tokens that the same forward pass verifies (`serving.spec_decode`); a sequence then
emits its accepted drafts and one more token per step. A request with n > 1 prefills its prompt once and
forks n sequences that share the prompt's KV blocks (copy-on-write on the partial last block). A request
whose next token takes longer than `EngineConfig.sample_timeout_s` to choose is stopped within that step
(`serving.engine.sample_budget`): its last output carries the `SamplingTimeoutError`, the others go on.
"""

from __future__ import annotations

import dataclasses
import itertools
import time

import torch

from serving.engine.block_manager import BlockManager
from serving.engine.engine_config import EngineConfig, pool_sizes  # EngineConfig is imported from here too
from serving.engine.model_runner import ModelRunner
from serving.engine.outputs import Logprob, RequestOutput
from serving.engine.request_state import RequestState, SeqState
from serving.engine.sample_budget import choose_token
from serving.engine.scheduler import Scheduler, SchedulerConfig
from serving.engine.sequence import Sequence
from serving.engine.sliding_block_manager import SlidingBlockManager
from serving.engine.stop import StopResult, check_stop, refuses_eos
from serving.errors import ContextLengthError, SamplingTimeoutError, ServingError
from serving.model_loader import LoadedModel
from serving.sampling.params import SEED_MIN, SamplingParams
from serving.sampling.sampler import Sampler, batched_argmax, compute_logprobs
from serving.text.detokenizer import IncrementalDetokenizer


class LLMEngine:
    """The batching engine for one loaded model (see the module docstring)."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig = EngineConfig()):
        self.loaded, self.config = loaded, config
        num_blocks, num_sliding = pool_sizes(loaded, config)
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching and not num_sliding)
        self.sliding_block_manager = (SlidingBlockManager(num_sliding, config.block_size, loaded.config.sliding_window)
                                      if num_sliding else None)
        self.scheduler = Scheduler(SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens), self.block_manager,
                                   self.sliding_block_manager)
        self.runner = ModelRunner(loaded.model, loaded.model.allocate_cache(num_blocks, config.block_size, num_sliding),
                                  loaded.spec.name)
        # The longest sequence the engine can hold: the model's context, or less when the KV cache is smaller.
        self.max_model_len = min(loaded.context_length, num_blocks * config.block_size)
        self._requests: dict[str, RequestState] = {}
        self._seq_to_request: dict[int, RequestState] = {}
        self._seq_ids = itertools.count()
        self._token_table = None  # serving.guided.decoding.TokenTable, built by the first guided_json request
        self.speculator = None
        if config.speculative is not None:
            from serving.spec_decode.speculator import Speculator

            self.speculator = Speculator(config.speculative, loaded)
        if config.tuned_kernels:
            from kernels.cpu_defaults import install_cpu_defaults
            from kernels.tuner import install_stored

            install_cpu_defaults()  # only where our C++ kernel is already built: no minute-long build here
            install_stored(loaded.spec.name, loaded.model)  # applied before the first step; compiled now

    @property
    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def check_request(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Validate a request without queueing it.

        Raises:
            ServingError: empty prompt or ids outside the vocabulary.
            ContextLengthError: a prompt that leaves no room to generate within the context.
        """
        ctx = self.max_model_len
        if not prompt_token_ids:
            raise ServingError("the prompt is empty: give at least one token")
        if len(prompt_token_ids) >= ctx:
            raise ContextLengthError(
                f"the prompt has {len(prompt_token_ids)} tokens but {self.loaded.spec.name!r} accepts at most {ctx} "
                "tokens of prompt and output together here (the model's context, or the KV cache size if smaller); "
                "shorten the prompt"
            )
        if params.guided_json is not None or params.structural_tag is not None:
            from serving.guided.automaton import automaton_for

            automaton_for(params.guided_json, params.structural_tag)  # UnsupportedSchemaError now, not mid-step
        vocab = self.loaded.config.vocab_size
        bad = [t for t in prompt_token_ids if not 0 <= t < vocab]
        if bad:
            raise ServingError(f"prompt token ids out of the vocabulary [0, {vocab}): {bad[:5]}")

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, prompt: str | None = None, priority: int = 0) -> None:
        """Queue a request (lower `priority` runs first; FCFS among equals).

        Raises:
            ServingError, ContextLengthError: see `check_request`; ServingError for a duplicate id.
        """
        if request_id in self._requests:
            raise ServingError(f"request id {request_id!r} is already in use")
        self.check_request(prompt_token_ids, params)
        request = RequestState(request_id, prompt, list(prompt_token_ids), params, time.monotonic())
        seq = Sequence(next(self._seq_ids), list(prompt_token_ids), priority=priority, arrival_time=request.arrival_time)
        self._attach(request, seq, 0)
        self.scheduler.add(seq)
        self._requests[request_id] = request

    def abort_request(self, request_id: str) -> None:
        """Drop a request and free its KV blocks now. Unknown or finished ids are ignored."""
        request = self._requests.pop(request_id, None)
        if request is None:
            return
        for seq in request.seqs:
            self._finish_seq(seq)

    def step(self) -> list[RequestOutput]:
        """Run one scheduler step; return snapshots of the requests that produced tokens."""
        start = time.perf_counter()
        if self.speculator is not None:
            self._propose_drafts()
        plan = self.scheduler.schedule()
        if plan.is_empty:
            if self.scheduler.waiting and not self.scheduler.running:
                raise RuntimeError("no request fits in the KV cache; raise kv_cache_bytes")
            return []
        if self.speculator is not None:
            self.speculator.begin_step(plan.scheduled)
        logits = self.runner.execute(plan.scheduled, plan.block_copies, plan.sliding_block_copies)
        now = time.monotonic()
        greedy: list[Sequence] = []  # rows whose next token is the plain argmax (see `_plain_greedy_tokens`)
        for seq, num_new in plan.scheduled:
            request = self._seq_to_request[seq.seq_id]
            if request.first_scheduled_time is None:
                request.first_scheduled_time = now
            if seq.draft_token_ids:
                continue  # advanced once its drafts are verified (`_verify`)
            self._advance(seq, num_new)
            if seq.seq_id in logits and len(request.seqs) == request.params.n:  # not a first token that forks
                state = request.states[seq.seq_id]
                if state.guide is None and state.logprobs is None and state.sampler.is_plain_greedy(seq.num_output_tokens):
                    greedy.append(seq)
        decided = self._plain_greedy_tokens(greedy, logits)
        touched: dict[str, RequestState] = {}
        for seq, _ in plan.scheduled:
            if seq.seq_id not in logits:
                continue
            request = self._seq_to_request.get(seq.seq_id)
            if request is None:
                continue  # its request was stopped earlier in this step (`_stop`)
            row = logits[seq.seq_id]
            touched[request.request_id] = request
            if seq.draft_token_ids:
                self._verify(request, seq, row)
                continue
            if len(request.seqs) < request.params.n:  # first token: fork the other samples
                for index in range(len(request.seqs), request.params.n):
                    if request.error is not None:
                        break  # a sample ran over its budget: the request is stopped, no more forks
                    child = seq.fork(next(self._seq_ids))
                    self.block_manager.fork(seq, child)
                    if self.sliding_block_manager is not None:
                        self.sliding_block_manager.fork(seq, child)
                    self._attach(request, child, index)
                    self.scheduler.add_running(child)
                    self._sample(request, child, row)
            self._sample(request, seq, row, decided.get(seq.seq_id))
        outputs = []
        for request in touched.values():
            outputs.append(request.snapshot(self.speculator is not None))
            if request.finished:
                del self._requests[request.request_id]
        if self.speculator is not None:
            self.speculator.end_step(time.perf_counter() - start)  # the step's cost, drafting and sampling included
        return outputs

    def _advance(self, seq: Sequence, num_new: int) -> None:
        """Count `num_new` more tokens as computed: register full blocks with the prefix cache, and
        release the sliding-window blocks no future query reads (after dropping a rejected draft's)."""
        block_size = self.block_manager.block_size
        crossed = (seq.num_computed_tokens + num_new) // block_size > seq.num_computed_tokens // block_size
        seq.num_computed_tokens += num_new
        if crossed:  # a block's KV is now complete: make it findable by the prefix cache
            self.block_manager.mark_computed(seq)
        if self.sliding_block_manager is not None:
            self.sliding_block_manager.truncate(seq)
            self.sliding_block_manager.release_out_of_window(seq)

    def _propose_drafts(self) -> None:
        """Give the decoding sequences draft tokens (`Speculator.propose`). Guided requests never draft."""
        running = self.scheduler.running
        candidates = []
        for seq in running:
            request = self._seq_to_request[seq.seq_id]
            spec = request.states[seq.seq_id].spec
            if spec is not None and len(request.seqs) == request.params.n:
                candidates.append((seq, spec, request.params.max_tokens))
        self.speculator.propose(candidates, len(running), self.max_model_len)

    def _verify(self, request: RequestState, seq: Sequence, rows: torch.Tensor) -> None:
        """Emit a drafted sequence's accepted tokens and the target's next one, then roll its KV back to the
        last accepted token (blocks past it return to the pool; their KV is never hashed)."""
        state = request.states[seq.seq_id]
        tokens = self.speculator.verify(state.sampler, seq, rows, state.spec)
        num_computed = seq.num_computed_tokens + len(tokens)  # the last verified token and the accepted drafts
        for row, token in zip(rows, tokens):
            self._sample(request, seq, row, token)
            if state.finish_reason:
                return  # finished: its blocks are already freed
        self.block_manager.truncate(seq, num_computed)
        self._advance(seq, len(tokens))

    def _stop(self, request: RequestState, error: ServingError) -> None:
        """End `request` now with `error`: its unfinished sequences get finish_reason "abort" and free their blocks;
        `step` returns its last snapshot, which carries the error."""
        request.error = error
        for seq in request.seqs:
            state = request.states[seq.seq_id]
            if state.finish_reason is None:
                state.finish_reason = "abort"
                self._finish_seq(seq)

    def _finish_seq(self, seq: Sequence) -> None:
        self.scheduler.finish(seq)
        self._seq_to_request.pop(seq.seq_id, None)
        if self.speculator is not None:
            self.speculator.release(seq.seq_id)

    def _attach(self, request: RequestState, seq: Sequence, index: int) -> None:
        params = request.params
        # Sample `index` of a seeded request draws from seed + index, wrapped into the signed 64-bit range of a
        # seed: from 2**63 - 1 the next sample's seed is -2**63, not an invalid seed raised inside a step (which
        # would stop the engine loop for every request).
        seed = None if params.seed is None else (params.seed + index - SEED_MIN) % 2**64 + SEED_MIN
        sampler = Sampler(params if seed == params.seed else dataclasses.replace(params, seed=seed),
                          eos_token_ids=self.loaded.tokenizer.eos_token_ids)
        detokenizer = IncrementalDetokenizer(self.loaded.tokenizer, params.skip_special_tokens)
        request.seqs.append(seq)
        guide = self._guide(params, sampler)
        # no drafts where a token may be chosen again (`refuses_eos`): a replaced token would void the ones after it
        spec = (self.speculator.policy.new_state() if self.speculator is not None and guide is None
                and not params.echo_markers else None)
        request.states[seq.seq_id] = SeqState(index, sampler, detokenizer, logprobs=[] if params.logprobs is not None else None,
                                              guide=guide, spec=spec)
        self._seq_to_request[seq.seq_id] = request

    def _plain_greedy_tokens(self, seqs: list[Sequence], logits: dict[int, torch.Tensor]) -> dict[int, int]:
        """{seq_id: token} for `seqs`, whose next token is the plain argmax (`Sampler.is_plain_greedy`),
        decided in one batched call when there are two or more; the others are sampled one by one."""
        if len(seqs) < 2:
            return {}
        tokens = batched_argmax([logits[seq.seq_id] for seq in seqs])
        return {} if tokens is None else {seq.seq_id: token for seq, token in zip(seqs, tokens)}

    def _sample(self, request: RequestState, seq: Sequence, logits: torch.Tensor, token: int | None = None) -> None:
        """Choose (unless `token` was decided in the batch), record, detokenize and check the stop rules; a
        choice over `config.sample_timeout_s` stops the request instead."""
        if request.error is not None:
            return  # stopped by another of its samples in this step
        state, params, tokenizer = request.states[seq.seq_id], request.params, self.loaded.tokenizer
        for _ in range(2):
            if token is None:
                try:
                    token = choose_token(state, seq, logits, self.config.sample_timeout_s)
                except SamplingTimeoutError as exc:
                    self._stop(request, exc)
                    return
            if token not in tokenizer.eos_token_ids or not refuses_eos(params, state.detokenizer.text):
                break
            # only an echoed tool result block so far (serving/engine/stop.py): chosen again without EOS, the model answers
            logits, token = logits.clone(), None
            logits[list(tokenizer.eos_token_ids)] = float("-inf")
        request.last_token_time = time.monotonic()
        if state.first_token_time is None:
            state.first_token_time = request.last_token_time
        seq.append_token(token)
        if state.logprobs is not None:
            chosen, top = compute_logprobs(logits, token, params.logprobs)
            state.cumulative_logprob += chosen
            entry = {tid: Logprob(lp, rank + 1, tokenizer.id_to_token(tid)) for rank, (tid, lp) in enumerate(top)}
            if token not in entry:
                entry[token] = Logprob(chosen, int((logits > logits[token]).sum()) + 1, tokenizer.id_to_token(token))
            state.logprobs.append(entry)
        detok = state.detokenizer
        previous_len = len(detok.text)
        detok.step(seq.output_token_ids)  # decodes a few recent tokens, not the whole output
        state.text = _visible(detok.text, params)
        result = check_stop(params, token, seq.num_output_tokens, detok.text, previous_len, tokenizer.eos_token_ids)
        if result is None and seq.num_tokens >= self.max_model_len:
            result = StopResult("length", None)
        if result is None:
            return
        state.finish_reason, state.stop_reason = result.finish_reason, result.stop_reason
        state.text = _visible(result.text if result.text is not None else self._final_text(detok, seq.output_token_ids, result), params)
        self._finish_seq(seq)

    def _final_text(self, detok: IncrementalDetokenizer, token_ids: list[int], result: StopResult) -> str:
        """The full decode of the kept tokens, partial characters (U+FFFD) included."""
        kept = token_ids if result.keeps_last_token_text else token_ids[:-1]
        if len(kept) >= detok.read_offset:
            return detok.text + detok.pending_text(kept)
        # A non-special stop token completed a character and was committed with it: decode once.
        return self.loaded.tokenizer.decode(kept, skip_special_tokens=detok.skip_special_tokens)

    def _guide(self, params: SamplingParams, sampler: Sampler):
        """A fresh `JsonGuide` for one sequence of a `guided_json` or `structural_tag` request (the token
        table is built once)."""
        if params.guided_json is None and params.structural_tag is None:
            return None
        from serving.guided.automaton import automaton_for
        from serving.guided.decoding import JsonGuide, TokenTable

        if self._token_table is None:
            self._token_table = TokenTable(self.loaded.tokenizer)
        return JsonGuide(automaton_for(params.guided_json, params.structural_tag), self._token_table, sampler)


def _visible(text: str, params: SamplingParams) -> str:
    """The output text the client sees: less its opening space under `strip_leading_space`."""
    return text[1:] if params.strip_leading_space and text.startswith(" ") else text
