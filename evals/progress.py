"""The runner's live display: one Rich progress bar per target with its accuracy, errors and spend so far.

    with RunProgress(["smollm2-135m-instruct", "gemma-3-270m"], total=200) as bars:
        bars.advance("gemma-3-270m", score=1.0, cost_usd=0.0, error=None)

Disabled (`enabled=False`, tests and non-interactive use), it only keeps the counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


@dataclass
class TargetTally:
    """Running counts of one target: `done` pairs, summed `score`, `errors`, `cost_usd` (answers + judge)."""

    done: int = 0
    score: float = 0.0
    errors: int = 0
    cost_usd: float = 0.0

    @property
    def accuracy(self) -> float:
        """Mean score of the pairs done so far (0 before any)."""
        return self.score / self.done if self.done else 0.0


class RunProgress:
    """Progress bars of one run (`total` items per target)."""

    def __init__(self, names: list[str], total: int, *, enabled: bool = True, console: Console | None = None):
        self.tallies = {name: TargetTally() for name in names}
        self.enabled = enabled
        self._progress = None
        self._tasks: dict[str, int] = {}
        if enabled:
            self._progress = Progress(TextColumn("[bold]{task.fields[name]}"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("acc {task.fields[acc]:.3f}  err {task.fields[err]}  ${task.fields[usd]:.4f}"),
                                      TimeElapsedColumn(), console=console or Console(stderr=True))
            for name in names:
                self._tasks[name] = self._progress.add_task(name, total=total, name=name, acc=0.0, err=0, usd=0.0)

    def __enter__(self) -> RunProgress:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()

    def advance(self, name: str, score: float, cost_usd: float, error: str | None) -> None:
        """Count one finished pair of target `name`."""
        tally = self.tallies[name]
        tally.done += 1
        tally.score += score
        tally.errors += 1 if error else 0
        tally.cost_usd += cost_usd
        if self._progress is not None:
            self._progress.update(self._tasks[name], advance=1, acc=tally.accuracy, err=tally.errors, usd=tally.cost_usd)
