"""`StepCostModel`: does a speculative step pay at this batch size? Measured, not assumed.

A verify step costs more than a plain decode step, by a factor that depends on the machine, the model
and the batch: each drafted sequence's attention runs on its own instead of in the batched decode
call, the logits cover k + 1 rows per drafted sequence, and the compiled decode step does not apply.
So the engine times its decode-only steps (every scheduled sequence decoding, drafts or not) and this
model keeps, per number b of running sequences, an exponential moving average of the seconds of a
plain step, t_plain(b), and of a step with drafts, t_spec(b).

A plain step emits b tokens; a speculative one emits b + A, where A, the expected accepted drafts, is
the sum over the drafting sequences of (acceptance EMA r x draft length k) (`policy.py`). Speculate when

    (b + A) / t_spec(b) > b / t_plain(b),   i.e. tokens per second are higher with drafts.

The predicted A is corrected by what the drafted steps really kept: the model keeps moving averages
of the predicted and of the accepted drafts of the steps that drafted, and scales a prediction by their
ratio, c = accepted / predicted (`calibration`; it starts at 1, as if the first drafted step had been
preceded by one that kept what it predicted, so one step moves c by ema_alpha and never straight to 0).
The per-request averages that A is built from are optimistic exactly when speculation is chosen: a step
drafts when a noisy average happens to be high, and the one-token checks of steps without drafts
measure the first draft token, the likeliest to be kept. On bursts of 3 non-repetitive requests (SmolLM2, 2-core CPU, a
verify step 1.8x a plain one) 17 of 174 decode steps drafted without it and 6 of 184 with it, c near 0.4.

Before both times are known at a batch size, the model tries a speculative step, then a plain one. Every
`probe_every` decisions at a batch size it takes the other choice once, so the losing side's time and the
requests' acceptance rates stay current. A probe that drafts against the rule and loses, its realized
(b + accepted) / seconds below b / t_plain(b), doubles that batch size's interval, up to
`max_probe_every`; one that wins brings it back to `probe_every`. So where speculation keeps losing,
probes fall from 1 step in 32 to 1 in 256 (each costs t_spec - t_plain, 35-45 ms of a 50 ms step at
b = 2-3 on a 2-core CPU), and text that turns repetitive is found again by the first probe that wins.
"""

from __future__ import annotations


class StepCostModel:
    """Seconds of decode-only steps with and without drafts, per running-sequence count.

    Args:
        ema_alpha: weight of the newest step in each average, in (0, 1].
        probe_every: decisions at one batch size between two probes of the other choice (>= 2).
        max_probe_every: the longest interval after drafting probes that lost (>= probe_every).
    """

    def __init__(self, ema_alpha: float = 0.2, probe_every: int = 32, max_probe_every: int = 256) -> None:
        if not 0.0 < ema_alpha <= 1.0 or probe_every < 2 or max_probe_every < probe_every:
            raise ValueError(f"need 0 < ema_alpha <= 1 and 2 <= probe_every <= max_probe_every, got {ema_alpha}, "
                             f"{probe_every}, {max_probe_every}")
        self.ema_alpha, self.probe_every, self.max_probe_every = ema_alpha, probe_every, max_probe_every
        self.probe_interval: dict[int, int] = {}   # b -> decisions between probes (probe_every until a probe loses)
        self._drafting_probe: int | None = None    # b of the last decision when it was a probe that drafts
        self.plain_seconds: dict[int, float] = {}
        self.spec_seconds: dict[int, float] = {}
        self._num_decisions: dict[int, int] = {}
        self.predicted_ema = self.accepted_ema = 0.0   # drafts per drafted step: predicted A, accepted

    @property
    def calibration(self) -> float:
        """c = accepted / predicted drafts over recent drafted steps (1.0 before any)."""
        return self.accepted_ema / self.predicted_ema if self.predicted_ema > 0 else 1.0

    def observe_accepted(self, predicted: float, accepted: int) -> None:
        """A drafted step's predicted A and the drafts its sequences really kept."""
        if predicted <= 0:
            return
        a = self.ema_alpha
        if self.predicted_ema == 0.0:   # prior: c = 1 at this step's scale, so one step moves c by alpha, not to its own ratio
            self.predicted_ema = self.accepted_ema = predicted
        self.predicted_ema = (1 - a) * self.predicted_ema + a * predicted
        self.accepted_ema = (1 - a) * self.accepted_ema + a * accepted

    def record(self, num_running: int, has_drafts: bool, seconds: float) -> None:
        """One decode-only step's wall time, started with `num_running` sequences running."""
        table = self.spec_seconds if has_drafts else self.plain_seconds
        old = table.get(num_running)
        table[num_running] = seconds if old is None else (1 - self.ema_alpha) * old + self.ema_alpha * seconds

    def pays(self, num_running: int, expected_accepted: float) -> bool:
        """Whether a step of `num_running` sequences should carry drafts predicted to add
        `expected_accepted` tokens, before calibration (see the module docstring)."""
        spec, plain = self.spec_seconds.get(num_running), self.plain_seconds.get(num_running)
        if spec is None:
            return True
        if plain is None:
            return False
        b, expected = num_running, expected_accepted * self.calibration
        better = (b + expected) * plain > b * spec  # (b + A) / t_spec > b / t_plain, without division
        count = self._num_decisions.get(b, 0) + 1
        interval = self.probe_interval.get(b, self.probe_every)
        self._num_decisions[b] = count % interval
        probe = count >= interval
        self._drafting_probe = b if probe and not better else None
        return not better if probe else better

    def observe_probe(self, num_running: int, accepted: int, seconds: float) -> None:
        """A drafted step's result: when it was a probe against the rule (`pays` said no but probed), back
        off on a loss and return to `probe_every` on a win (see the module docstring)."""
        if self._drafting_probe != num_running:
            return
        self._drafting_probe = None
        b, plain = num_running, self.plain_seconds.get(num_running)
        if plain is None:
            return
        won = (b + accepted) * plain > b * seconds
        interval = self.probe_interval.get(b, self.probe_every)
        self.probe_interval[b] = self.probe_every if won else min(2 * interval, self.max_probe_every)
