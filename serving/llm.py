"""`LLM`: offline generation with vLLM's interface.

    from serving import LLM, SamplingParams
    llm = LLM("smollm2-135m-instruct")
    out = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=16))
    print(out[0].outputs[0].text)
    llm.chat([{"role": "user", "content": "Hi!"}])
"""

from __future__ import annotations

import itertools
import time
from typing import Callable, Sequence, Union

import torch

from serving.engine.llm_engine import EngineConfig, LLMEngine
from serving.engine.outputs import RequestOutput
from serving.errors import ServingError
from serving.model_loader import LoadedModel, load_model
from serving.registry import ModelRegistry, default_registry
from serving.sampling.params import SamplingParams

PromptType = Union[str, dict]  # text, or {"prompt_token_ids": [...]} as in vLLM's TokensPrompt


class LLM:
    """A local model ready to generate.

    Args:
        model: a name in `registry` (default: the embedded default registry).
        dtype: "float32" (default), "bfloat16" or "float16": the weights' and activations' dtype.
        weights: a GGUF file's quantized matrices "packed" (kept as blocks, float32 activations), "float" or
            "auto" (packed where the C++ GGUF module loads); see `serving.model_loader.load_model`.
        registry: where to look `model` up.
        engine_config: KV cache and batching settings of the underlying `LLMEngine`.
        progress: called with (bytes read, total bytes) while the weights load (see `load_model`).
    Raises:
        UnknownModelError, ModelFileError, UnsupportedTensorTypeError: see `load_model`.
    """

    def __init__(self, model: str, *, dtype: str | torch.dtype = "float32", registry: ModelRegistry | None = None,
                 engine_config: EngineConfig = EngineConfig(), progress: Callable[[int, int], None] | None = None,
                 weights: str = "auto"):
        registry = registry or default_registry()
        self.loaded: LoadedModel = load_model(registry.get(model), dtype, progress, weights)
        self.model_name = model
        self.engine = LLMEngine(self.loaded, engine_config)
        self._ids = itertools.count()

    @property
    def tokenizer(self):
        return self.loaded.tokenizer

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Complete each prompt (raw text: no chat formatting).

        Args:
            prompts: one prompt or a list; a prompt is text or {"prompt_token_ids": [int, ...]}.
            sampling_params: one for all prompts, or one per prompt (default `SamplingParams()`).
        Returns:
            One `RequestOutput` per prompt, in order; one the engine stopped (a token over
            `EngineConfig.sample_timeout_s`) has `error` set and finish_reason "abort".
        Raises:
            ContextLengthError: a prompt that leaves no room to generate within the context.
            ServingError: an empty prompt, or a params list of the wrong length.
        """
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        params_list = _broadcast(sampling_params, len(prompts))
        encoded = [self._encode(p) for p in prompts]
        return self._run([(text, ids, params) for (text, ids), params in zip(encoded, params_list)])

    def chat(
        self,
        messages: Sequence[dict] | Sequence[Sequence[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Answer one conversation (a list of {"role", "content"} dicts) or a list of conversations.

        The model's chat format renders the messages and adjusts each request's params
        (`ChatFormat.reply_params`: the in-context format's turn markers as stop strings, and its
        reply's opening space dropped).

        Raises:
            ServingError: no messages, a message with an unknown role or non-text content, or a params
                list of the wrong length; and the errors of `generate`.
        """
        if not messages:
            raise ServingError("messages must contain at least one message")
        conversations = [messages] if isinstance(messages[0], dict) else list(messages)
        params_list = _broadcast(sampling_params, len(conversations))
        fmt = self.loaded.chat_format
        work = []
        for conversation, params in zip(conversations, params_list):
            prompt = fmt.render(conversation)
            ids = self.tokenizer.encode(prompt, add_special_tokens=fmt.add_special_tokens)
            work.append((prompt, ids, fmt.reply_params(params)))
        return self._run(work)

    def _encode(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" not in prompt:
                raise ServingError("a dict prompt must hold 'prompt_token_ids'")
            return None, [int(t) for t in prompt["prompt_token_ids"]]
        if not isinstance(prompt, str):
            raise ServingError(f"a prompt must be a string or a dict with 'prompt_token_ids', got {type(prompt).__name__}")
        return prompt, self.tokenizer.encode(prompt)

    def _run(self, work: list[tuple[str | None, list[int], SamplingParams]]) -> list[RequestOutput]:
        """Submit every prompt to the engine together (continuous batching) and step until all finish."""
        ids = [f"llm-{next(self._ids)}" for _ in work]
        try:
            for request_id, (prompt, prompt_ids, params) in zip(ids, work):
                self.engine.add_request(request_id, prompt_ids, params, prompt=prompt)
            final: dict[str, RequestOutput] = {}
            start = time.perf_counter()
            while self.engine.has_unfinished_requests:
                for output in self.engine.step():
                    if output.finished:
                        output.metrics["generate_seconds"] = time.perf_counter() - start
                        final[output.request_id] = output
        finally:
            for request_id in ids:
                self.engine.abort_request(request_id)  # no-op for finished ones; cleans up after an error
        return [final[request_id] for request_id in ids]


def _broadcast(params: SamplingParams | Sequence[SamplingParams] | None, count: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * count
    if isinstance(params, SamplingParams):
        return [params] * count
    params = list(params)
    if len(params) != count:
        raise ServingError(f"got {len(params)} SamplingParams for {count} prompts; give one, or one per prompt")
    return params
