"""Estimated USD cost of a recorded answer whose token counts were not recorded.

Some recorded sets (RouteLLM, AlpacaEval) give the prompt and sometimes the response text, never the
tokens billed. Their cost is estimated here, explicitly:

    tokens  = ceil(characters / 4)              (OpenAI's rule of thumb for English text)
    cost    = prompt_tokens * input_price + completion_tokens * output_price   (prices in USD per token)

Prices (USD per million tokens) come from `routerarena/model_cost/cost.json` under the data directory
when the model is listed there (by its own name, or by the name in `PRICE_ALIASES`), else from
`FALLBACK_PRICES`; a model in neither has no known price (`model_price` returns None) and callers
charge it 0.

    price = model_price("gpt-4-1106-preview", data_dir)     # (10.0, 30.0)
    estimate_cost_usd("What is 2+2?", "4", price)            # 3 + 1 tokens -> 6.0e-05 USD
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

COST_FILE = Path("routerarena") / "model_cost" / "cost.json"
CHARS_PER_TOKEN = 4

# Recorded model name -> its name in cost.json (same model, different spelling).
PRICE_ALIASES: dict[str, str] = {
    "mistralai/Mixtral-8x7B-Instruct-v0.1": "mistralai/mixtral-8x7b-instruct",
    "gpt4_1106_preview": "gpt-4-1106-preview",
}

# Used when cost.json is missing: (input, output) USD per million tokens, the providers' list prices
# when the recordings were made (OpenAI for gpt-4-1106-preview, Together AI for Mixtral-8x7B).
FALLBACK_PRICES: dict[str, tuple[float, float]] = {
    "gpt-4-1106-preview": (10.0, 30.0),
    "mistralai/Mixtral-8x7B-Instruct-v0.1": (0.6, 0.6),
}


def tokens_for_chars(num_chars: int) -> int:
    """ceil(num_chars / 4): the estimated tokens of a text of `num_chars` characters."""
    return math.ceil(num_chars / CHARS_PER_TOKEN)


def estimate_tokens(text: str | None) -> int:
    """`tokens_for_chars(len(text))`; 0 for None or ""."""
    return tokens_for_chars(len(text)) if text else 0


@lru_cache(maxsize=8)
def _cost_table(path: Path) -> dict[str, tuple[float, float]]:
    if not path.is_file():
        return {}
    raw = json.loads(path.read_text(encoding="utf-8"))
    return {name: (float(p["input_token_price_per_million"]), float(p["output_token_price_per_million"]))
            for name, p in raw.items()}


def model_price(model: str, data_dir: Path | None) -> tuple[float, float] | None:
    """(input, output) USD per million tokens for `model`, or None when no price is known.

    Looks up cost.json under `data_dir` by the exact name, then by `PRICE_ALIASES[model]`, then
    `FALLBACK_PRICES[model]`.
    """
    table = _cost_table(Path(data_dir) / COST_FILE) if data_dir is not None else {}
    for name in (model, PRICE_ALIASES.get(model)):
        if name is not None and name in table:
            return table[name]
    return FALLBACK_PRICES.get(model)


def estimate_cost_usd(prompt: str, response: str | None, price: tuple[float, float] | None, *,
                      completion_tokens: int | None = None) -> float:
    """Estimated USD for one answer: tokens by `estimate_tokens` times `price` (per million tokens).

    Args:
        prompt: the prompt text (its characters / 4 are the prompt tokens).
        response: the answer text, or None when it was not recorded.
        price: (input, output) USD per million tokens; None charges 0.
        completion_tokens: overrides the response estimate (e.g. 1 for a one-letter answer).
    """
    if price is None:
        return 0.0
    completion = estimate_tokens(response) if completion_tokens is None else completion_tokens
    return (estimate_tokens(prompt) * price[0] + completion * price[1]) / 1e6
