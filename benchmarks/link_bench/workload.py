"""The serving benchmark's prompts: AlpacaEval instructions and MT-Bench first turns, rendered as chat prompts.

    texts = load_workload(default_data_dir(), seed=0)            # 885 strings, shuffled
    gguf_path, ids = render_prompts("smollm2-135m-instruct", texts[:8])   # token ids per prompt
    gguf_path, render = prompt_renderer("smollm2-135m-instruct")          # render(text) -> token ids
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Callable, Sequence

ROOT = Path(__file__).resolve().parents[2]
ALPACA_EVAL_MODEL = "gpt4_1106_preview"  # every model_outputs.json holds the same 805 instructions
WARMUP_MESSAGE = "Say hello."


def default_data_dir() -> Path:
    """$LINK_DATASETS_DIR, else ../shared/data next to the repository."""
    return Path(os.environ.get("LINK_DATASETS_DIR") or ROOT.parent / "shared" / "data")


def load_workload(data_dir: str | Path, seed: int = 0) -> list[str]:
    """AlpacaEval instructions and MT-Bench first turns, shuffled with `seed`.

    Raises:
        FileNotFoundError: either data set is missing under `data_dir`.
    """
    data_dir = Path(data_dir)
    alpaca = data_dir / "alpaca_eval" / "results" / ALPACA_EVAL_MODEL / "model_outputs.json"
    if not alpaca.is_file():
        alpaca = next(iter(sorted((data_dir / "alpaca_eval" / "results").glob("*/model_outputs.json"))), alpaca)
    mt_bench = data_dir / "mt-bench" / "mt_bench" / "question.jsonl"
    for path in (alpaca, mt_bench):
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found; point --data-dir or LINK_DATASETS_DIR at the shared data folder")
    texts = [row["instruction"] for row in json.loads(alpaca.read_text())]
    texts += [json.loads(line)["turns"][0] for line in mt_bench.read_text().splitlines() if line.strip()]
    random.Random(seed).shuffle(texts)
    return texts


def render_prompts(model: str, texts: Sequence[str]) -> tuple[Path, list[list[int]]]:
    """(GGUF path, prompt token ids): each text as one user message in the model's chat format,
    tokenized as `serving.model_loader.load_model` sets the tokenizer and chat format up.

    Raises:
        UnknownModelError: `model` is not registered; ServingError: the model is not a GGUF file.
    """
    path, render = prompt_renderer(model)
    return path, [render(t) for t in texts]


def prompt_renderer(model: str) -> tuple[Path, Callable[[str], list[int]]]:
    """(GGUF path, text -> prompt token ids), the tokenizer read once; errors as `render_prompts`."""
    from serving.errors import ServingError
    from serving.loader.gguf_loader import open_gguf
    from serving.registry import default_registry
    from serving.text.chat_format import InContextChatFormat, TemplateChatFormat
    from serving.text.tokenizer import Tokenizer

    spec = default_registry().get(model)
    path = spec.resolve_path()
    if path.is_dir() or spec.tokenizer != "model":
        raise ServingError(f"the serving benchmark needs a GGUF model with its own tokenizer; {model!r} is not one")
    tok = Tokenizer.from_gguf(path, open_gguf(path).metadata)
    fmt = TemplateChatFormat(tok.chat_template, tok.bos_token, tok.eos_token) if spec.chat_format == "template" else InContextChatFormat()

    def render(text: str) -> list[int]:
        return tok.encode(fmt.render([{"role": "user", "content": text}]), add_special_tokens=fmt.add_special_tokens)

    return path, render
