"""`link serve` and `link engine serve`: the two servers, the gateway and one engine on its own.

    link serve [--config link.yaml] [--port 8000]    the gateway (OpenAI API over every configured model)
    link serve --workers 4                          the gateway in 4 processes on one port (link/workers.py)
    link engine serve --model NAME --port 8000      one engine as an OpenAI-compatible server
    link engine serve --speculative ngram           with speculative decoding (serving/spec_decode/)
    link engine serve --no-auto-tune                without background kernel tuning (on by default)

Each loads and checks everything it can before binding its port, so a bad config, policy or model file, or a port
already in use, is one line `error: ...` (exit code 2), not a traceback from the server's start-up.
"""

from __future__ import annotations

import errno
import logging
import socket

import typer
from rich.console import Console

from cli.errors import fail

engine_app = typer.Typer(help="The inference engine on its own.", no_args_is_help=True)
err_console = Console(stderr=True)
# Our packages whose log records a server shows (a model's load and readiness, start-up problems): uvicorn configures
# only its own loggers, so without a handler their INFO lines would be dropped.
OUR_LOGGERS = ("link", "serving", "kernels", "routers", "protocol")


def show_our_logs(log_level: str) -> logging.Handler:
    """Send our packages' records at `log_level` ("info", "warning", ...) and above to stderr, one line each
    ("INFO     serving.model_loader: ..."). Returns the handler (tests remove it)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)-8s %(name)s: %(message)s"))
    level = logging.getLevelName(log_level.upper())
    for name in OUR_LOGGERS:
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(level if isinstance(level, int) else logging.INFO)
    return handler


def check_port(host: str, port: int, *, command: str, hint: str, listen: bool = False) -> socket.socket | None:
    """Bind `host:port` once and let go, as uvicorn will (SO_REUSEADDR set, so a socket in TIME_WAIT is no conflict);
    with `listen`, keep it: return the listening socket the workers of `link serve --workers N` share.

    Args:
        host: the interface ("127.0.0.1", "0.0.0.0", "::", a host name).
        port: the TCP port.
        command: the command that likely holds it, for the message ("link serve").
        hint: how to choose another port ("--port N or LINK_PORT=N").
    Raises:
        typer.Exit (code 2, after one `error:` line): the port is in use, or the address cannot be bound.
    """
    from link.workers import bind_listener

    try:
        sock = bind_listener(host, port)
    except socket.gaierror as exc:
        raise fail(f"cannot listen on {host}: {exc.strerror}; pass an interface such as 127.0.0.1 with --host") from None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise fail(f"port {port} on {host} is in use (another `{command}`?); pick another with {hint}") from None
        raise fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick another with {hint}") from None
    if listen:
        return sock
    sock.close()
    return None


def serve(
    config: str = typer.Option(None, "--config", "-c", help="link.yaml (default: LINK_CONFIG, else the embedded default)."),
    host: str = typer.Option(None, help="Interface to bind (default: LINK_HOST or 127.0.0.1)."),
    port: int = typer.Option(None, help="TCP port (default: LINK_PORT or 8000)."),
    log_level: str = typer.Option("info", help="uvicorn log level."),
    no_auto_tune: bool = typer.Option(False, "--no-auto-tune", help="Do not tune local models' kernels in the background "
                                                                   "(default: LINK_LOCAL_AUTO_TUNE, on)."),
    workers: int = typer.Option(None, min=1, max=64, help="Gateway processes sharing the port (default: LINK_WORKERS "
                                "or 1); budgets and rate limits stay exact across them."),
) -> None:
    """Run the gateway: one OpenAI-compatible API over the configured models and policies."""
    from pydantic import ValidationError
    from sqlalchemy.exc import SQLAlchemyError

    from link.app import create_app
    from link.config import ConfigError, load_config
    from link.policies.base import PolicyError, policy_entry_problems
    from link.policies.store import check_config_policies
    from link.settings import get_settings
    from link.state import registered_model_names, served_config
    from protocol.drain import serve_draining

    overrides = {k: v for k, v in {"config": config, "host": host, "port": port, "workers": workers}.items()
                 if v is not None}
    if no_auto_tune:
        overrides["local_auto_tune"] = False
    try:
        settings = get_settings(**overrides)
        # every mistake of the file at once, policy options included (they may name a model registered in the database)
        link_config = load_config(settings.config, check_policy=policy_entry_problems, served_models=registered_model_names(settings))
        # a bad policy stops here, not as a traceback from the server's start-up
        check_config_policies(served_config(settings, link_config))
        gateway = create_app(settings, link_config)
    except SQLAlchemyError as exc:
        raise fail(f"cannot open the database: {str(exc).splitlines()[0]}") from None
    except (ValidationError, ConfigError, PolicyError) as exc:
        raise fail(exc) from None
    listener = check_port(settings.host, settings.port, command="link serve", hint="--port N or LINK_PORT=N",
                          listen=settings.workers > 1)
    if settings.config is None:
        from link.config import DEFAULT_AUTO_POLICY, DEFAULT_ROUTER_COMMAND, default_router_path

        if not default_router_path().is_file():
            err_console.print(f"[yellow]note:[/yellow] {DEFAULT_AUTO_POLICY} is not served: no router file at "
                              f"{default_router_path()}; create it with: "
                              f"{DEFAULT_ROUTER_COMMAND.format(path=default_router_path())}")
    show_our_logs(log_level)
    if listener is not None:  # N processes on one socket; SIGTERM is forwarded to each, each drains, exit 0
        from link.workers import serve_gateway_workers

        raise typer.Exit(serve_gateway_workers(listener, settings, link_config, log_level=log_level))
    # SIGTERM drains: /health turns 503, requests in flight finish (LINK_DRAIN_TIMEOUT_S), then exit 0
    serve_draining(gateway, gateway.state.drain, timeout_s=settings.drain_timeout_s, host=settings.host,
                   port=settings.port, log_level=log_level)


@engine_app.command("serve")
def engine_serve(
    model: str = typer.Option("smollm2-135m-instruct", "--model", "-m", help="A model name from `link models`."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind."),
    port: int = typer.Option(8000, help="TCP port."),
    dtype: str = typer.Option("float32", help="float32 or bfloat16."),
    weights: str = typer.Option("auto", help="A GGUF file's quantized matrices: packed (kept as blocks, float32 "
                                "activations), float (dequantized to --dtype), or auto (packed where the C++ module builds)."),
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
    auto_tune: bool = typer.Option(True, "--auto-tune/--no-auto-tune", help="Tune kernels for the recorded shapes while the "
                                   "engine is idle; winners persist in $LINK_HOME/compile and are installed between steps."),
    drain_timeout_s: float = typer.Option(30.0, min=0, envvar="LINK_DRAIN_TIMEOUT_S", help="On SIGTERM, seconds the "
                                          "requests in flight get to finish while /health answers 503 (then exit 0)."),
) -> None:
    """Serve one local model over the OpenAI API (chat, completions, models, health, metrics)."""
    from protocol.drain import serve_draining
    from serving import ServingError
    from serving.api.server import create_engine_app
    from serving.engine.llm_engine import EngineConfig
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
                          speculative=spec, auto_tune=auto_tune)
    check_port(host, port, command="link engine serve", hint="--port N")
    try:  # load before binding the port, so an unknown model or a bad file is a one-line error
        loaded = load_model(default_registry().get(model), dtype, weights=weights)
    except ServingError as exc:
        raise fail(exc) from None
    show_our_logs("info")
    engine = create_engine_app(model, engine_config=config, loaded=loaded)
    serve_draining(engine, engine.state.drain, timeout_s=drain_timeout_s, host=host, port=port, log_level="info")
