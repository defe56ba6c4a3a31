"""`link chat`: chat with a local model from the terminal, one question or an interactive session.

    link chat "What is the capital of France?"    answer one question
    link chat                                     interactive chat (Ctrl-D or /exit to leave, /reset clears)

`answer` and `interactive_chat` run the conversation over a `serving.LLM`; the command loads the model and
wires them to the terminal (or to stdin when it is not one). The load (tens of seconds on a small CPU) is a
progress bar over the weights' bytes on stderr, and its end a line there, so stdout holds only the answers.
"""

from __future__ import annotations

import sys
from typing import Callable, TextIO

import typer
from rich.console import Console

from cli.errors import fail
from cli.progress import err_console, megabytes, progress_bar
from serving import SamplingParams  # cheap: serving loads its heavy modules lazily

console = Console()


def answer(llm, messages: list[dict], params: SamplingParams) -> str:
    """The model's reply to a conversation (list of {"role", "content"})."""
    return llm.chat(messages, params)[0].outputs[0].text.strip()


def interactive_chat(llm, params: SamplingParams, read: Callable[[str], str], write: Callable[[str], None], system: str | None = None) -> list[dict]:
    """Run a multi-turn chat until EOF or `/exit`; `/reset` clears the history. Returns the history.

    Args:
        read: prompts the user and returns a line (raises EOFError at the end of input).
        write: shows a reply.
    """
    history: list[dict] = [{"role": "system", "content": system}] if system else []
    while True:
        try:
            line = read("you> ").strip()
        except (EOFError, KeyboardInterrupt):
            return history
        if not line:
            continue
        if line in ("/exit", "/quit"):
            return history
        if line == "/reset":
            history = history[:1] if system else []
            write("(history cleared)")
            continue
        history.append({"role": "user", "content": line})
        reply = answer(llm, history, params)
        history.append({"role": "assistant", "content": reply})
        write(reply)


def stdin_reader(stream: TextIO) -> Callable[[str], str]:
    """A `read` function over a text stream (for tests and pipes)."""

    def read(prompt: str) -> str:
        line = stream.readline()
        if not line:
            raise EOFError
        return line

    return read


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
    from serving import LLM, ServingError

    try:
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)
        with progress_bar(f"loading {model}", unit="bytes") as update:
            llm = LLM(model, dtype=dtype, progress=update)
        err_console.print(f"loaded {model} in {llm.loaded.load_seconds:.1f} s ({megabytes(llm.loaded.resident_bytes)} "
                          "resident)", markup=False, highlight=False)
        messages = [{"role": "system", "content": system}] if system else []
        if question is not None:
            console.print(answer(llm, messages + [{"role": "user", "content": question}], params), markup=False, highlight=False)
            return
        console.print(f"[bold]{model}[/bold]: /reset clears the history, /exit or Ctrl-D leaves.")
        reader = console.input if sys.stdin.isatty() else stdin_reader(sys.stdin)
        interactive_chat(llm, params, reader, lambda text: console.print(text, markup=False, highlight=False), system)
    except ServingError as exc:
        raise fail(exc) from None
