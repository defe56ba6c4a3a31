"""How every `link` subcommand reports an error: `error: <message>` on one line of stderr, exit code 2.

    raise fail(exc) from None          # in a Typer command

The message is printed as text, not Rich markup (a config value such as "[/x]" would otherwise be read as a
tag, or crash the print), and is not wrapped, so a log keeps it on one line.
"""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape


def fail(message: object) -> typer.Exit:
    """Print `error: message` (stderr, one line) and return the exit (code 2) to raise."""
    Console(stderr=True).print(f"[red]error:[/red] {escape(str(message))}", highlight=False, soft_wrap=True)
    return typer.Exit(2)
