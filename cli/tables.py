"""Tables on stdout at the right width: a terminal's own width; piped, `$COLUMNS` when it is set (`COLUMNS=80
link keys list | cat` reads whole at 80 columns); piped with `$COLUMNS` unset, the table's natural width, so that a
script reading the rows, one per line, never sees a name or id cut with "…".

A table wider than its width folds its cells, never its headers: each column keeps at least its header's longest
word, and the widest columns give up room first (Rich's own squeeze cuts headers to "creat…" and no-wrap cells).

    print_table(table)                 # a rich.table.Table
"""

from __future__ import annotations

import os

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

MIN_WIDTH = 80  # a piped table is never narrower than Rich's own default


def table_width(table: Table, console: Console) -> int | None:
    """The width to print `table` at on `console`: None (the console's own: the terminal's, or `$COLUMNS`, which
    Rich reads) when `console` writes to a terminal or `$COLUMNS` is set; else the table's natural width in columns,
    at least `MIN_WIDTH`."""
    if console.is_terminal or os.environ.get("COLUMNS", "").isdigit():
        return None
    natural = console.measure(table, options=console.options.update_width(10_000)).maximum
    return max(natural, MIN_WIDTH)


def fit_columns(table: Table, width: int, console: Console) -> None:
    """Set the column widths of `table` so that it fits in `width` columns, folding cells but no header word.

    Water-filling: every column is capped at one level L (the largest that fits) but never below its header's longest
    word (nor, where there is room for it, a no-wrap column below its natural width: the narrowest no-wrap columns
    first) nor above its natural width. Leaves `table` as it is when it already fits, or when the headers alone do not.
    """
    options = console.options.update_width(10_000)
    columns = table.columns
    natural = [max(console.measure(cell, options=options).maximum for cell in (column.header, *column.cells))
               for column in columns]
    room = width - (console.measure(table, options=options).maximum - sum(natural))  # less borders and padding
    floors = [max((cell_len(word) for word in str(column.header).split()), default=1) for column in columns]
    if sum(natural) <= room or sum(floors) > room:
        return
    # the no-wrap columns (money, names, ids) stay on one line where the others can make room: all of them, else
    # as many as fit, the narrowest first (a $0.00001 budget split over two lines reads as $0.0000)
    for index in sorted((i for i, column in enumerate(columns) if column.no_wrap), key=lambda i: natural[i]):
        whole = floors[:index] + [max(floors[index], natural[index])] + floors[index + 1:]
        if sum(whole) <= room:
            floors = whole

    def fitted(level: int) -> list[int]:
        return [max(floor, min(n, level)) for n, floor in zip(natural, floors)]

    level = max(natural)
    while level > 1 and sum(fitted(level)) > room:
        level -= 1
    for column, column_width in zip(columns, fitted(level)):
        column.width, column.no_wrap, column.overflow = column_width, False, "fold"


def print_table(table: Table, console: Console | None = None) -> None:
    """Print `table` on `console` (default: a new stdout console) at `table_width`, its columns fitted to it."""
    console = console or Console()
    width = table_width(table, console)
    if width is not None:
        console = Console(width=width, file=console.file)
    fit_columns(table, console.width, console)
    console.print(table)
