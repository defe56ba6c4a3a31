"""The `link` command line. Each subcommand is a thin shell over a library function.

    link serve [--config link.yaml] [--port 8000]  the gateway (OpenAI API over every configured model)
    link models                                   list the registered local models
    link chat "What is the capital of France?"    answer one question
    link chat                                     interactive chat (Ctrl-D or /exit to leave)
    link engine serve --model NAME --port 8000    one engine as an OpenAI-compatible server
    link bench serving --json out.json            serving throughput and latency against transformers
    link bench gateway --json out.json            the gateway's overhead over a direct call, next to LiteLLM's proxy
    link keys create alice --budget-usd 5         an API key (printed once); `link keys list|revoke ID` (cli_keys.py)
    link route "prompt" --policy link/auto        explain a routing decision (cli_route.py)
    link router train|calibrate|eval              learned routers on outcome tables (cli_router.py)
    link eval run|replay|report                   benchmarks, replay, reports (evals/cli.py)
    link posttrain sft|eval|export                fine-tune to a tool-call harness, score, export (cli_posttrain.py)
    link compile tune|status                      tune kernels for the recorded shapes, show the winners (cli_compile.py)
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.table import Table

from cli.errors import fail

app = typer.Typer(help="TogetherLink: serve and route open LLMs behind one OpenAI-compatible API.", no_args_is_help=True)
console = Console()
err_console = Console(stderr=True)
engine_app = typer.Typer(help="The inference engine on its own.", no_args_is_help=True)
app.add_typer(engine_app, name="engine")
bench_app = typer.Typer(help="Benchmarks of the platform.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
# The eval CLI belongs to `evals` (a client of `link`); only this mount point knows about it.
from evals.cli import eval_app  # noqa: E402

app.add_typer(eval_app, name="eval")
app.command("route")(__import__("cli.route", fromlist=["route"]).route)  # `link route`: cli/route.py
from cli.router import router_app  # noqa: E402  (`link router train|calibrate|eval`)

app.add_typer(router_app, name="router")
from cli.keys import keys_app  # noqa: E402  (`link keys create|list|revoke`)

app.add_typer(keys_app, name="keys")
app.add_typer(__import__("cli.posttrain", fromlist=["posttrain_app"]).posttrain_app, name="posttrain")  # cli/posttrain.py
app.add_typer(__import__("cli.compile", fromlist=["compile_app"]).compile_app, name="compile")  # cli/compile.py


@app.command()
def serve(
    config: str = typer.Option(None, "--config", "-c", help="link.yaml (default: LINK_CONFIG, else the embedded default)."),
    host: str = typer.Option(None, help="Interface to bind (default: LINK_HOST or 127.0.0.1)."),
    port: int = typer.Option(None, help="TCP port (default: LINK_PORT or 8000)."),
    log_level: str = typer.Option("info", help="uvicorn log level."),
) -> None:
    """Run the gateway: one OpenAI-compatible API over the configured models and policies."""
    import uvicorn
    from pydantic import ValidationError
    from sqlalchemy.exc import SQLAlchemyError

    from link.app import create_app
    from link.config import ConfigError, load_config
    from link.policies.base import PolicyError
    from link.policies.store import check_config_policies
    from link.settings import get_settings
    from link.state import served_config

    overrides = {k: v for k, v in {"config": config, "host": host, "port": port}.items() if v is not None}
    try:
        settings = get_settings(**overrides)
        link_config = load_config(settings.config)
        # a bad policy stops here, not as a traceback from the server's start-up
        check_config_policies(served_config(settings, link_config))
        gateway = create_app(settings, link_config)
    except SQLAlchemyError as exc:
        raise fail(f"cannot open the database: {str(exc).splitlines()[0]}") from None
    except (ValidationError, ConfigError, PolicyError) as exc:
        raise fail(exc) from None
    if settings.config is None:
        from link.config import DEFAULT_AUTO_POLICY, DEFAULT_ROUTER_COMMAND, default_router_path

        if not default_router_path().is_file():
            err_console.print(f"[yellow]note:[/yellow] {DEFAULT_AUTO_POLICY} is not served: no router file at "
                              f"{default_router_path()}; create it with: "
                              f"{DEFAULT_ROUTER_COMMAND.format(path=default_router_path())}")
    uvicorn.run(gateway, host=settings.host, port=settings.port, log_level=log_level, timeout_graceful_shutdown=5)


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

    from cli.chat import answer, interactive_chat, stdin_reader

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
        raise fail(exc) from None


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
    speculative: str = typer.Option(None, help="Speculative decoding: ngram (prompt lookup) or draft (needs --draft-model); off when unset."),
    draft_model: str = typer.Option(None, help="Draft model (a registry name) for --speculative draft."),
    num_speculative_tokens: int = typer.Option(5, help="Most tokens drafted per step (k_max)."),
    speculative_adaptive: bool = typer.Option(True, help="Adapt k to each request's acceptance rate and back off at large batches."),
    speculative_disable_by_batch_size: int = typer.Option(
        4, help="No speculation in a step that starts with this many running sequences or more (1 = never)."),
    speculative_step_cost: bool = typer.Option(
        True, help="With --speculative-adaptive: draft only in steps whose measured cost the expected accepted drafts repay."),
) -> None:
    """Serve one local model over the OpenAI API (chat, completions, models, health, metrics)."""
    import uvicorn

    from serving import ServingError
    from serving.api.server import create_engine_app
    from serving.llm_engine import EngineConfig
    from serving.model_loader import load_model
    from serving.registry import default_registry

    from serving.spec_decode import SpeculativeConfig

    try:
        spec = None if speculative is None else SpeculativeConfig(
            method=speculative, draft_model=draft_model, num_speculative_tokens=num_speculative_tokens,
            adaptive=speculative_adaptive, disable_by_batch_size=speculative_disable_by_batch_size,
            step_cost=speculative_step_cost)
    except ValueError as exc:
        raise fail(exc) from None
    config = EngineConfig(block_size=block_size, kv_cache_bytes=kv_cache_mb * 2**20, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=prefix_caching,
                          speculative=spec)
    try:  # load before binding the port, so an unknown model or a bad file is a one-line error
        loaded = load_model(default_registry().get(model), dtype)
    except ServingError as exc:
        raise fail(exc) from None
    uvicorn.run(create_engine_app(model, engine_config=config, loaded=loaded), host=host, port=port, log_level="info")


@bench_app.command("serving")
def bench_serving(
    model: str = typer.Option("smollm2-135m-instruct", "--model", "-m", help="A GGUF model name from `link models`."),
    concurrency: list[int] = typer.Option([1, 4, 16], "--concurrency", "-c", help="Concurrent clients; repeat for several levels."),
    num_prompts: int = typer.Option(32, help="Requests per concurrency level."),
    max_tokens: int = typer.Option(64, help="Output tokens of every request (EOS ignored)."),
    system: list[str] = typer.Option(["link", "transformers", "llama-cpp"], "--system", "-s",
                                     help="link, transformers, llama-cpp, link-engine (our engine in-process, as llama-cpp); repeat."),
    seed: int = typer.Option(0, help="Seed of the prompt shuffle."),
    data_dir: str = typer.Option(None, help="Shared data folder (default: $LINK_DATASETS_DIR or ../shared/data)."),
    dtype: str = typer.Option("float32", help="float32 or bfloat16, for link and transformers."),
    kv_cache_mb: int = typer.Option(256, help="KV cache memory of the link server in MiB."),
    max_num_seqs: int = typer.Option(32, help="Sequences in one batch at most (link server)."),
    json_path: str = typer.Option(None, "--json", help="Also write the full results (every request) to this JSON file."),
    workload: str = typer.Option("default", help="default, repetitive (answers quote the prompt) or mixed (bursts of 1-16; link only)."),
    save_mix: str = typer.Option(None, "--save-mix", help="Write link's request shapes as a mix JSONL for `link compile tune-config`."),
) -> None:
    """Serving throughput and latency of our engine against transformers and llama.cpp on real prompts."""
    from serving import ServingError

    from benchmarks.link_bench import render_report, run_serving_benchmark, show_and_save

    try:
        result = run_serving_benchmark(model, concurrency, num_prompts, max_tokens, system, seed, data_dir, dtype,
                                       kv_cache_mb, max_num_seqs, progress=lambda message: err_console.log(message, markup=False),
                                       workload=workload, save_mix=save_mix)
    except (ServingError, ValueError, FileNotFoundError) as exc:
        raise fail(exc) from None
    show_and_save(render_report(result), result, json_path)


@bench_app.command("gateway")
def bench_gateway(
    concurrency: list[int] = typer.Option([1, 8, 32], "--concurrency", "-c", help="Concurrent clients; repeat for several levels."),
    requests: int = typer.Option(200, "--requests", help="Measured requests per cell (system, mode, concurrency)."),
    warmup: int = typer.Option(20, "--warmup", help="Warm-up requests before each cell (at least one per client)."),
    system: list[str] = typer.Option(["direct", "link", "link-lean", "litellm"], "--system", "-s",
                                     help="direct, link, link-lean, litellm; repeat (direct always runs)."),
    mode: list[str] = typer.Option(["whole", "stream"], "--mode", help="whole, stream; repeat."),
    pin: bool = typer.Option(True, "--pin/--no-pin", help="Pin load generator and server to different cores with taskset."),
    json_path: str = typer.Option(None, "--json", help="Also write the full results (every request) to this JSON file."),
) -> None:
    """The gateway's overhead over a direct call to an instant mock backend, next to LiteLLM's proxy."""
    from benchmarks.link_bench import show_and_save
    from benchmarks.link_bench.gateway import run_gateway_benchmark
    from benchmarks.link_bench.gateway_report import render_gateway_report

    try:
        result = run_gateway_benchmark(concurrency, requests, warmup, system, mode, pin=pin,
                                       progress=lambda message: err_console.log(message, markup=False))
    except ValueError as exc:
        raise fail(exc) from None
    show_and_save(render_gateway_report(result), result, json_path)


if __name__ == "__main__":
    app()
