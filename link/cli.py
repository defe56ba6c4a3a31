"""The `link` command line. Each subcommand is a thin shell over a library function.

    link models                                   list the registered local models
    link chat "What is the capital of France?"    answer one question
    link chat                                     interactive chat (Ctrl-D or /exit to leave)
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(help="TogetherLink: serve and route open LLMs behind one OpenAI-compatible API.", no_args_is_help=True)
console = Console()
err_console = Console(stderr=True)


@app.command()
def models() -> None:
    """List the models of the local registry."""
    from serving.registry import default_registry

    table = Table(title="Local models")
    table.add_column("name", no_wrap=True)
    for column in ("architecture", "context", "chat format", "description"):
        table.add_column(column)
    for spec in default_registry():
        table.add_row(spec.name, spec.architecture, str(spec.context_length), spec.chat_format, spec.description)
    console.print(table)


@app.command()
def chat(
    question: str = typer.Argument(None, help="Ask one question and exit; omit for an interactive chat."),
    model: str = typer.Option("smollm2-135m-instruct", "--model", "-m", help="A model name from `link models`."),
    temperature: float = typer.Option(0.0, help="0 = greedy."),
    max_tokens: int = typer.Option(256, help="Longest reply in tokens."),
    seed: int = typer.Option(None, help="Seed for reproducible sampling."),
    system: str = typer.Option(None, help="A system message."),
    dtype: str = typer.Option("float32", help="float32 or bfloat16."),
) -> None:
    """Chat with a local model."""
    from serving import LLM, SamplingParams, ServingError

    from link.chat import answer, interactive_chat, stdin_reader

    try:
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)
        with console.status(f"loading {model} ...", spinner="dots"):
            llm = LLM(model, dtype=dtype)
        messages = [{"role": "system", "content": system}] if system else []
        if question is not None:
            console.print(answer(llm, messages + [{"role": "user", "content": question}], params), markup=False, highlight=False)
            return
        console.print(f"[bold]{model}[/bold] loaded in {llm.loaded.load_seconds:.1f} s. /reset clears the history, /exit or Ctrl-D leaves.")
        reader = console.input if sys.stdin.isatty() else stdin_reader(sys.stdin)
        interactive_chat(llm, params, reader, lambda text: console.print(text, markup=False, highlight=False), system)
    except ServingError as exc:
        err_console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


if __name__ == "__main__":
    app()
