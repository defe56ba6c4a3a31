"""The `link` command: the one application shell over every package.

    link --help                      # the installed entry point (pyproject: `link = "cli.app:app"`)
    python -m cli --help             # the same from a checkout, without installing

`app.py` builds the Typer app and mounts one module per subcommand group. Nothing imports `cli`: the
dependencies point one way, `cli -> web, evals, posttrain -> link -> routers, serving -> kernels`
(checked by tests/test_layering.py). Commands stay thin: each maps to one library function.
"""
