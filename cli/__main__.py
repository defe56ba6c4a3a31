"""`python -m cli ...`: the `link` command from a checkout (tests and benchmarks spawn servers this way)."""

from cli.app import app

app(prog_name="link")
