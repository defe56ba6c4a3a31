"""Chat with a local model from the terminal: one question, or an interactive session."""

from __future__ import annotations

from typing import Callable, TextIO

from serving import SamplingParams


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
