"""Engine-configuration tuning for a recorded traffic mix: `link compile tune-config`.

    link compile tune-config --model smollm2-135m-instruct --mix mix.jsonl --speedup 4 --budget 10
    tune_config("smollm2-135m-instruct", load_mix("mix.jsonl"))       # -> ConfigTuneOutcome

`tune_config` loads the model once, replays the mix (`serving.tuning.replay`) under the default
`EngineConfig` and the candidates of `serving.tuning.config_search` (coordinate descent, measurements
budgeted), and stores the winner with both configurations' throughput and p99 TTFT in the
`config_winners` table of $LINK_HOME/compile/winners.sqlite, keyed by model, device, library versions
and the mix's fingerprint (`serving.tuning.traffic.mix_fingerprint`). `apply_winner` puts a stored winner
into a running engine between two steps (`serving.tuning.reconfigure`), its requests kept.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from kernels.config_winners import ConfigWinner, ConfigWinnerTable
from kernels.winners import Environment
from serving.tuning.traffic import RequestShape, mix_fingerprint, mix_signature

logger = logging.getLogger(__name__)


@dataclass
class ConfigTuneOutcome:
    """What one `tune_config` run did: the search's outcome, the stored row, seconds spent."""

    model: str
    outcome: object  # serving.tuning.config_search.SearchOutcome
    stored: ConfigWinner
    tune_s: float


def measure_replay(loaded, base, mix: list[RequestShape], speedup: float, seed: int = 0, prompt_pool=None):
    """A `measure` function for `serving.tuning.config_search.search`: one replay of `mix` per call. A candidate
    whose replay raises (e.g. a KV cache too small for the mix) measures 0 tok/s at infinite TTFT, so it
    never wins; the error is logged and kept in the summary."""
    from serving.tuning.config_search import Measurement, apply
    from serving.tuning.replay import replay

    def measure(candidate: dict) -> Measurement:
        try:
            result = replay(loaded, apply(base, candidate), mix, speedup=speedup, seed=seed, prompt_pool=prompt_pool)
        except Exception as exc:  # a failing candidate is a verdict, not a crash of the search
            logger.warning("replay under %s failed: %s", candidate, exc)
            return Measurement(0.0, float("inf"), {"error": f"{type(exc).__name__}: {exc}"})
        return Measurement(result.output_tokens_per_s, result.ttft_p99_s, result.summary())

    return measure


def tune_config(model: str, mix: list[RequestShape], *, loaded=None, dtype: str = "float32", speedup: float = 1.0,
                budget: int = 10, confirm: int = 1, ttft_slack: float = 0.0, repeats: int = 1, space: dict | None = None,
                base=None, table: ConfigWinnerTable | None = None, prompt_pool: list[list[int]] | None = None,
                progress: Callable[[str], None] = lambda message: None) -> ConfigTuneOutcome:
    """Search the engine configuration that serves `mix` best (see `serving.tuning.config_search`) and store it.

    Args:
        model: registry name (the table key); `loaded`: the model already loaded (else loaded here in `dtype`).
        mix: the recorded request shapes; `speedup`: arrival times are divided by it.
        budget, confirm, ttft_slack, repeats, space: see `serving.tuning.config_search.search`; `space` defaults to
            `default_space()` (speculation included).
        base: the `EngineConfig` the candidates override (default: `EngineConfig()`).
        prompt_pool: real prompt token ids to fill the replayed prompts with (default: random ids).

    Raises:
        ValueError: an empty mix, bad search arguments, or a request longer than the engine holds.
        UnknownModelError, ServingError: the model cannot be loaded.
    """
    from serving.engine.llm_engine import EngineConfig
    from serving.tuning.config_search import describe, search, to_json

    if not mix:
        raise ValueError("the mix is empty")
    fingerprint, signature = mix_fingerprint(mix), mix_signature(mix)
    if loaded is None:
        from serving.model_loader import load_model
        from serving.registry import default_registry

        progress(f"loading {model}")
        loaded = load_model(default_registry().get(model), dtype)
    base = base or EngineConfig()
    table = table or ConfigWinnerTable()
    start = time.monotonic()
    progress(f"replaying {len(mix)} requests (mix {signature}) per candidate, budget {budget}")

    def report(candidate: dict, m) -> None:
        progress(f"{describe(candidate)}: {m.output_tokens_per_s:.1f} tok/s, p99 TTFT {m.ttft_p99_s:.3f} s")

    outcome = search(measure_replay(loaded, base, mix, speedup, prompt_pool=prompt_pool), base=base, space=space, budget=budget, confirm=confirm,
                     ttft_slack=ttft_slack, repeats=repeats, progress=report)
    d, w = outcome.default_measurement, outcome.winner_measurement
    stored = ConfigWinner(fingerprint, signature, len(mix), to_json(outcome.winner), d.output_tokens_per_s, d.ttft_p99_s,
                          w.output_tokens_per_s, w.ttft_p99_s, len(outcome.trials), time.time())
    table.put(Environment.current(model), stored)
    return ConfigTuneOutcome(model, outcome, stored, time.monotonic() - start)


def stored_config(model: str, mix: list[RequestShape], base=None, table: ConfigWinnerTable | None = None):
    """The `EngineConfig` tuned for `mix`'s fingerprint in this environment (`base` with its overrides),
    or None when that mix was never tuned here."""
    from serving.engine.llm_engine import EngineConfig
    from serving.tuning.config_search import apply, from_json

    row = (table or ConfigWinnerTable()).get(Environment.current(model), mix_fingerprint(mix))
    return None if row is None else apply(base or EngineConfig(), from_json(row.config))


def apply_winner(engine, model: str, mix: list[RequestShape], table: ConfigWinnerTable | None = None) -> bool:
    """Reconfigure a running engine (`AsyncLLMEngine`: before its next step; `LLMEngine`: now, call it
    between steps) with the stored winner of `mix`; its running requests continue. Returns False
    (nothing done) when no winner is stored or the engine already runs it.

    Raises:
        ValueError: (an `LLMEngine`) the live requests do not fit the winner's KV cache.
    """
    from serving.tuning.reconfigure import reconfigure, reconfigure_between_steps

    inner = getattr(engine, "engine", engine)
    config = stored_config(model, mix, base=inner.config, table=table)
    if config is None or config == inner.config:
        return False
    if inner is engine:
        reconfigure(engine, config)
    else:
        reconfigure_between_steps(engine, config)
    return True


def config_rows(table: ConfigWinnerTable | None = None, model: str | None = None) -> list[dict]:
    """The stored configuration winners as dicts (newest first); `current`: tuned in this environment."""
    from serving.tuning.config_search import describe, from_json

    rows = []
    for w in (table or ConfigWinnerTable()).rows():
        if model and w.env.model != model:
            continue
        rows.append({"model": w.env.model, "device": w.env.device, "current": Environment.current(w.env.model) == w.env,
                     "fingerprint": w.fingerprint, "mix": w.signature, "num_requests": w.num_requests,
                     "config": w.config, "label": describe(from_json(w.config)),
                     "default_tokens_per_s": w.default_tokens_per_s, "default_ttft_p99_s": w.default_ttft_p99_s,
                     "tokens_per_s": w.tokens_per_s, "ttft_p99_s": w.ttft_p99_s, "speedup": w.speedup,
                     "num_trials": w.num_trials, "tuned_at": w.tuned_at})
    return rows
