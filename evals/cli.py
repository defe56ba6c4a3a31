"""`link eval`: run suites against targets, replay policies on outcome tables, write reports.

The Typer app lives here; `cli_run.py` adds `run`, `cli_offline.py` adds `replay` and `report`. `cli/app.py`
mounts `eval_app` as `link eval`. Each command is a thin shell over a library function.
"""

from __future__ import annotations

import typer

eval_app = typer.Typer(help="Benchmarks graded automatically: run, replay policies offline, report.",
                       no_args_is_help=True)

from evals import cli_offline, cli_run  # noqa: E402,F401  (each adds its commands to eval_app)
