"""`link models`: the local models of the registry (serving/registry.py), one row each."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from cli.tables import print_table

console = Console()


def models() -> None:
    """List the models of the local registry."""
    from serving.registry import default_registry

    table = Table(title="Local models")
    table.add_column("name", no_wrap=True)
    for column in ("architecture", "context", "chat format", "description"):
        table.add_column(column)
    for spec in default_registry():
        table.add_row(spec.name, spec.architecture, str(spec.context_length), spec.chat_format, spec.description)
    print_table(table, console)
