"""`StepCostModel`: does a speculative step pay at this batch size? Measured, not assumed.

A verify step costs more than a plain decode step, by a factor that depends on the machine, the model
and the batch: each drafted sequence's attention runs on its own instead of in the batched decode
call, the logits cover k + 1 rows per drafted sequence, and the compiled decode step does not apply.
So the engine times its decode-only steps (every scheduled sequence decoding, drafts or not) and this
model keeps, per number b of running sequences, an exponential moving average of the seconds of a
plain step, t_plain(b), and of a step with drafts, t_spec(b).

A plain step emits b tokens; a speculative one emits b + A, where A, the expected accepted drafts, is
the sum over the drafting sequences of (acceptance EMA x draft length) (`policy.py`). Speculate when

    (b + A) / t_spec(b) > b / t_plain(b),   i.e. tokens per second are higher with drafts.

Before both times are known at a batch size, the model tries a speculative step, then a plain one. Every
`probe_every` decisions at a batch size it takes the other choice once, so the losing side's time and the
requests' acceptance rates stay current (about 1/probe_every of steps at a worse choice).
"""

from __future__ import annotations


class StepCostModel:
    """Seconds of decode-only steps with and without drafts, per running-sequence count.

    Args:
        ema_alpha: weight of the newest step in each average, in (0, 1].
        probe_every: decisions at one batch size between two probes of the other choice (>= 2).
    """

    def __init__(self, ema_alpha: float = 0.2, probe_every: int = 32) -> None:
        if not 0.0 < ema_alpha <= 1.0 or probe_every < 2:
            raise ValueError(f"need 0 < ema_alpha <= 1 and probe_every >= 2, got {ema_alpha}, {probe_every}")
        self.ema_alpha, self.probe_every = ema_alpha, probe_every
        self.plain_seconds: dict[int, float] = {}
        self.spec_seconds: dict[int, float] = {}
        self._num_decisions: dict[int, int] = {}

    def record(self, num_running: int, has_drafts: bool, seconds: float) -> None:
        """One decode-only step's wall time, started with `num_running` sequences running."""
        table = self.spec_seconds if has_drafts else self.plain_seconds
        old = table.get(num_running)
        table[num_running] = seconds if old is None else (1 - self.ema_alpha) * old + self.ema_alpha * seconds

    def pays(self, num_running: int, expected_accepted: float) -> bool:
        """Whether a step of `num_running` sequences should carry drafts expected to add
        `expected_accepted` tokens (see the module docstring)."""
        spec, plain = self.spec_seconds.get(num_running), self.plain_seconds.get(num_running)
        if spec is None:
            return True
        if plain is None:
            return False
        b = num_running
        better = (b + expected_accepted) * plain > b * spec  # (b + A) / t_spec > b / t_plain, without division
        count = self._num_decisions.get(b, 0) + 1
        self._num_decisions[b] = count % self.probe_every
        return not better if count == self.probe_every else better
