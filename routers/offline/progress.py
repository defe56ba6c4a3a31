"""Progress of an offline evaluation, counted in steps (one learned router fitted and measured on one split).

    steps = ProgressSteps(total=folds * len(types), report=lambda done, total, label: ...)
    steps.start("encoding 1,000 prompts"); ...; steps.step("fold 1/5, knn")

Library code never prints: `link router eval` (cli/router.py) draws the reports as a progress bar on stderr.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class ProgressSteps:
    """The steps of an evaluation counted as they finish.

    Attributes:
        total: the steps the evaluation will take.
        report: called with (steps done, total, label of the step just finished), or None.
    """

    total: int
    report: Callable[[int, int, str], None] | None = None
    done: int = 0

    def start(self, label: str) -> None:
        """Report a step of preparation (e.g. encoding the prompts) before any router step."""
        if self.report is not None:
            self.report(self.done, self.total, label)

    def step(self, label: str) -> None:
        self.done += 1
        if self.report is not None:
            self.report(self.done, self.total, label)
