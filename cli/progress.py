"""Progress of long steps on stderr (Rich), so stdout stays the command's machine-readable output.

Library code never prints: it takes a callback (`progress(done, total)` for a model's load,
`progress(done, total, label)` for a router evaluation) and the commands draw it here. A live bar or spinner
is drawn only on a terminal; elsewhere (a pipe, a log) the step's description is written as a plain line, then
one line per counted step (none per byte), and the commands write one more when the step ends.

    with progress_bar("loading smollm2-135m-instruct", unit="bytes") as update:
        llm = LLM(name, progress=update)
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

err_console = Console(stderr=True, soft_wrap=True)  # a line for a log is never wrapped


@contextlib.contextmanager
def progress_bar(description: str, unit: str = "steps") -> Iterator[Callable[..., None]]:
    """A Rich progress bar on stderr; yields `update(done, total, label=None)`.

    Args:
        description: what is in progress ("loading smollm2-135m-instruct").
        unit: "bytes" (sizes in kB/MB/GB) or "steps" (done/total counts).
    """
    live = err_console.is_terminal
    counter = DownloadColumn() if unit == "bytes" else MofNCompleteColumn()
    bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), counter, TimeElapsedColumn(),
                   console=err_console, transient=True, disable=not live)  # off a terminal: lines only, below
    task = bar.add_task(description, total=None)

    def update(done: int, total: int, label: str | None = None) -> None:
        bar.update(task, completed=done, total=total,
                   description=f"{description}: {label}" if label else description)
        if not live and unit != "bytes":  # a line per step for a log; a load's hundreds of tensors get none
            err_console.print(f"{description}: {done}/{total}" + (f" {label}" if label else ""), markup=False,
                              highlight=False)

    if not live:
        err_console.print(f"{description} ...", markup=False, highlight=False)
    with bar:
        yield update


def status(message: str) -> contextlib.AbstractContextManager:
    """A spinner with `message` on stderr while the block runs (off a terminal: `message` as a line)."""
    if not err_console.is_terminal:
        err_console.print(message, markup=False, highlight=False)
    return err_console.status(message, spinner="dots")


def megabytes(num_bytes: int) -> str:
    """A size for people: "134.5 MB"."""
    return f"{num_bytes / 1e6:.1f} MB"
