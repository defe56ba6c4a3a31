"""The `link` command line: the root Typer app, one module per subcommand group. Each subcommand is a thin
shell over a library function.

    link serve [--config link.yaml] [--port 8000]  the gateway (OpenAI API over every configured model) (serve.py)
    link models                                   list the registered local models (models.py)
    link chat "What is the capital of France?"    answer one question; without a question, an interactive chat (chat.py)
    link engine serve --model NAME --port 8000    one engine as an OpenAI-compatible server (serve.py)
    link bench serving --json out.json            serving throughput and latency against transformers (bench.py)
    link bench gateway --json out.json            the gateway's overhead over a direct call, next to LiteLLM's proxy
    link keys create alice --budget-usd 5         an API key (printed once); `link keys list|revoke ID` (keys.py)
    link route "prompt" --policy link/auto        explain a routing decision (route.py)
    link router train|calibrate|eval              learned routers on outcome tables (router.py)
    link eval run|replay|report                   benchmarks, replay, reports (evals/cli.py: evals owns its CLI)
    link posttrain sft|eval|export                fine-tune to a tool-call harness, score, export (posttrain.py)
    link compile tune|status                      tune kernels for the recorded shapes, show the winners (compile.py)

Every subcommand reports an error the same way (errors.py). The modules import their libraries inside the
commands, so `link --help` stays fast.
"""

from __future__ import annotations

import typer
from typer.core import TyperGroup

from cli.bench import bench_app
from cli.chat import chat
from cli.compile import compile_app
from cli.keys import keys_app
from cli.models import models
from cli.posttrain import posttrain_app
from cli.route import route
from cli.router import router_app
from cli.serve import engine_app, serve
from evals.cli import eval_app



class WholeHelpGroup(TyperGroup):
    """A command group whose help lists each subcommand with the first sentence of its help whole, wrapped at the
    terminal's width (click cuts it to one line with "...")."""

    def format_commands(self, ctx, formatter) -> None:
        rows = [(name, command.get_short_help_str(limit=10_000)) for name, command in
                ((name, self.get_command(ctx, name)) for name in self.list_commands(ctx))
                if command is not None and not command.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


# The help of every subcommand, which inherits the root's rich_markup_mode, is click's plain layout: it wraps each
# text at the terminal's width, where Rich's option table cuts long option names and unbroken words
# ("--max-num-batched-t…") at 80 columns.
app = typer.Typer(help="TogetherLink: serve and route open LLMs behind one OpenAI-compatible API.",
                  no_args_is_help=True, cls=WholeHelpGroup, rich_markup_mode=None)
# the order of `link --help`: commands first, then groups
for command in (route, serve, models, chat):
    app.command()(command)
for group, name in ((engine_app, "engine"), (bench_app, "bench"), (eval_app, "eval"), (router_app, "router"),
                    (keys_app, "keys"), (posttrain_app, "posttrain"), (compile_app, "compile")):
    app.add_typer(group, name=name, cls=WholeHelpGroup)


if __name__ == "__main__":
    app()
