"""A toy chat model for tests of the engine's request path on CPU in milliseconds: a tiny random Llama over the
character tokenizer of guided_cases.py (EOS id 0), with a plain chat template. Its text is noise, but every
guided output is valid JSON and every request runs the real engine, server and gateway code.

    loaded = toy_chat_model()                                # a serving.model_loader.LoadedModel
    app = create_engine_app(loaded.spec.name, loaded=loaded, engine_config=TOY_ENGINE)
"""

from __future__ import annotations

import types

import torch

from serving.config import ModelConfig
from serving.engine.llm_engine import EngineConfig
from serving.model_loader import LoadedModel
from serving.models import build_model
from serving.text.chat_format import TemplateChatFormat
from tests.serving.guided_cases import CharTokenizer

TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
TOY_ENGINE = EngineConfig(num_blocks=256, block_size=16, tuned_kernels=False)


def toy_chat_model(name: str = "toy-chat", context_length: int = 1024) -> LoadedModel:
    tokenizer = CharTokenizer()
    cfg = ModelConfig(architecture="llama", vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64,
                      num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0,
                      context_length=context_length)
    torch.manual_seed(0)
    model = build_model(cfg, torch.float32)
    for p in model.parameters():
        p.normal_(0, 0.05)
    return LoadedModel(types.SimpleNamespace(name=name), cfg, model, tokenizer, TemplateChatFormat(TEMPLATE),
                       torch.float32, context_length, 0.0)
