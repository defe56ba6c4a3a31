"""`link eval`: run suites against targets, replay policies on outcome tables, write reports.

The Typer app lives here and mounts the commands of `cli_offline.py` (`replay`, `report`, `export`) and `cli_run.py`
(`run`), which know nothing of it. `cli/app.py` mounts `eval_app` as `link eval`. Each command is a thin
shell over a library function.
"""

from __future__ import annotations

import typer

from evals.cli_offline import export, replay, report
from evals.cli_run import run

eval_app = typer.Typer(help="Benchmarks graded automatically: run, replay policies offline, report.",
                       no_args_is_help=True)
eval_app.command()(replay)
eval_app.command()(report)
eval_app.command()(export)
eval_app.command("run")(run)
