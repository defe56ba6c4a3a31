"""The `link` command line. Each subcommand is a thin shell over a library function.

    link models                                   list the registered local models
    link chat "What is the capital of France?"    answer one question
    link chat                                     interactive chat (Ctrl-D or /exit to leave)
    link engine serve --model NAME --port 8000    one engine as an OpenAI-compatible server
    link bench serving --json out.json            serving throughput and latency against transformers
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(help="TogetherLink: serve and route open LLMs behind one OpenAI-compatible API.", no_args_is_help=True)
console = Console()
err_console = Console(stderr=True)
engine_app = typer.Typer(help="The inference engine on its own.", no_args_is_help=True)
app.add_typer(engine_app, name="engine")
bench_app = typer.Typer(help="Benchmarks of the platform.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


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


@engine_app.command("serve")
def engine_serve(
    model: str = typer.Option("smollm2-135m-instruct", "--model", "-m", help="A model name from `link models`."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind."),
    port: int = typer.Option(8000, help="TCP port."),
    dtype: str = typer.Option("float32", help="float32 or bfloat16."),
    block_size: int = typer.Option(16, help="Tokens per KV cache block."),
    kv_cache_mb: int = typer.Option(256, help="KV cache memory in MiB."),
    max_num_seqs: int = typer.Option(32, help="Sequences in one batch at most."),
    max_num_batched_tokens: int = typer.Option(512, help="Tokens per engine step (prefill chunk budget)."),
    prefix_caching: bool = typer.Option(True, help="Reuse KV blocks across requests sharing a prefix."),
) -> None:
    """Serve one local model over the OpenAI API (chat, completions, models, health, metrics)."""
    import uvicorn

    from serving.api.server import create_engine_app
    from serving.llm_engine import EngineConfig

    config = EngineConfig(block_size=block_size, kv_cache_bytes=kv_cache_mb * 2**20, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=prefix_caching)
    uvicorn.run(create_engine_app(model, dtype=dtype, engine_config=config), host=host, port=port, log_level="info")


@bench_app.command("serving")
def bench_serving(
    model: str = typer.Option("smollm2-135m-instruct", "--model", "-m", help="A GGUF model name from `link models`."),
    concurrency: list[int] = typer.Option([1, 4, 16], "--concurrency", "-c", help="Concurrent clients; repeat for several levels."),
    num_prompts: int = typer.Option(32, help="Requests per concurrency level."),
    max_tokens: int = typer.Option(64, help="Output tokens of every request (EOS ignored)."),
    system: list[str] = typer.Option(["link", "transformers", "llama-cpp"], "--system", "-s", help="link, transformers, llama-cpp; repeat."),
    seed: int = typer.Option(0, help="Seed of the prompt shuffle."),
    data_dir: str = typer.Option(None, help="Shared data folder (default: $LINK_DATASETS_DIR or ../shared/data)."),
    dtype: str = typer.Option("float32", help="float32 or bfloat16, for link and transformers."),
    kv_cache_mb: int = typer.Option(256, help="KV cache memory of the link server in MiB."),
    max_num_seqs: int = typer.Option(32, help="Sequences in one batch at most (link server)."),
    json_path: str = typer.Option(None, "--json", help="Also write the full results (every request) to this JSON file."),
) -> None:
    """Serving throughput and latency of our engine against transformers and llama.cpp on real prompts."""
    import json
    from pathlib import Path

    from serving import ServingError

    from link.bench import render_report, run_serving_benchmark

    try:
        result = run_serving_benchmark(model, concurrency, num_prompts, max_tokens, system, seed, data_dir, dtype,
                                       kv_cache_mb, max_num_seqs, progress=lambda message: err_console.log(message, markup=False))
    except (ServingError, ValueError, FileNotFoundError) as exc:
        err_console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    Console(width=None if sys.stdout.isatty() else 160).print(render_report(result))
    if json_path is not None:
        Path(json_path).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    app()
