"""The Docker Compose topology of deploy/compose.yaml as processes on loopback, for machines without a container
runtime (issue 39: "the compose topology, or its loopback equivalent, answers through the `openai` client").

Everything is read from the shipped files, with each compose address ("engine-1:8001") swapped for a free loopback
port:

- deploy/compose.yaml: the services by their command (`serve`: a gateway, `engine serve`: an engine), each engine's
  command line (`--host` and `--port` swapped, `--no-auto-tune` added), each gateway's environment
  (LINK_INSTANCE_ID, LINK_ENVIRONMENT=production, the database and Redis URLs, ...), the link.yaml it mounts at
  LINK_CONFIG, and the role, password and database the postgres service's image would create;
- that link.yaml (deploy/link.yaml): the one model and its two replicas, each `api_base` pointed at its engine;
- deploy/nginx.conf: the front proxy, run by nginx when installed (upstreams, listen port and /tmp paths
  rewritten, one worker process: see `front_proxy`), else by `RoundRobinProxy`, a per-request round-robin HTTP
  forwarder over the same upstreams in the same order (nginx's default balancing; it does not replay nginx's retry
  of a 503 on the other gateway).

PostgreSQL and Redis are private servers on free ports (tests/link/private_services.py). Each engine gets one
intra-op thread (the two share a 2-core machine) and an empty $LINK_HOME of its own (a container's fresh volume).
Through the official `openai` client pointed at the proxy: NUM_CHATS chat requests (two whole answers, then two
streamed, in turn) and models.list. Counted exactly: requests sent == answered == request-log rows in the shared
database, half of them per gateway (the rows' `instance`), and each engine's own finished-request counter equals the
rows naming its deployment.

    LINK_HOME=.link .venv/bin/python -m pytest -q tests/link/test_compose_topology.py
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator, NamedTuple

import pytest
import yaml

from benchmarks.link_bench.link_server import fresh_link_home
from benchmarks.link_bench.processes import ServerProcess, free_port, python_env, stop_process
from tests.link.gateway_launch import MASTER_KEY, start_gateway_process
from tests.link.mock_launch import ROOT, wait_healthy
from tests.link.private_services import PrivatePostgres, PrivateRedis, missing_binaries
from tests.link.test_fleet_faults import query, wait_for
from tests.link.test_gateway_engine_replicas import num_finished

pytestmark = [pytest.mark.slow,  # two real engines (SmolLM2)
              pytest.mark.skipif(bool(missing_binaries()), reason=f"needs {' and '.join(missing_binaries())}")]

COMPOSE = ROOT / "deploy" / "compose.yaml"
NGINX = shutil.which("nginx", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin"]))
LOOPBACK = "127.0.0.1"
SERVICE_PORTS = {"postgres": 5432, "redis": 6379}  # the official images' ports, as the gateways' URLs name them
NUM_CHATS = 8  # two whole, two streamed, in turn: with round-robin each gateway answers two of each
MESSAGES = [{"role": "user", "content": "Name a colour."}]
MAX_TOKENS = 8
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
                        "content-length"})


# -- reading the compose file ----------------------------------------------------------------------------------------

def interpolate(value: object, variables: dict[str, str]) -> str:
    """Compose's `${NAME}`, `${NAME:?message}` and `${NAME:-default}` in `value`, from `variables`.

    Raises:
        KeyError: a variable without a default is not in `variables` (with compose's message).
    """
    def one(match: re.Match) -> str:
        name, operator, rest = match.groups()
        if name in variables:
            return variables[name]
        if operator == ":-":
            return rest
        raise KeyError(f"compose variable {name} is unset: {rest or 'no default'}")
    return re.sub(r"\$\{(\w+)(?:(:[?-])([^}]*))?\}", one, str(value))


def to_loopback(text: str, addresses: dict[str, int]) -> str:
    """`text` with each compose address ("service:port") of `addresses` swapped for 127.0.0.1:<its loopback port>,
    and the wildcard host 0.0.0.0 for 127.0.0.1."""
    for address, port in addresses.items():
        text = text.replace(address, f"{LOOPBACK}:{port}")
    return text.replace("0.0.0.0", LOOPBACK)


def environment(service: dict, variables: dict[str, str], addresses: dict[str, int]) -> dict[str, str]:
    return {name: to_loopback(interpolate(value, variables), addresses)
            for name, value in (service.get("environment") or {}).items()}


def health_path(service: dict) -> str:
    """The path of a service's healthcheck URL ("/health/live")."""
    return re.search(r"http://127\.0\.0\.1:\d+(/[\w/.-]*)", " ".join(service["healthcheck"]["test"])).group(1)


def mounted_config(service: dict, env: dict[str, str]) -> Path:
    """The file (beside compose.yaml) that `service` mounts where its LINK_CONFIG points."""
    for volume in service["volumes"]:
        source, target = volume.split(":")[:2]
        if target == env["LINK_CONFIG"]:
            return (COMPOSE.parent / source).resolve()
    raise AssertionError(f"nothing is mounted at LINK_CONFIG={env['LINK_CONFIG']}: {service['volumes']}")


def create_compose_database(postgres: PrivatePostgres, service: dict, variables: dict[str, str]) -> None:
    """The role (with its password) and the database that the postgres image creates from POSTGRES_USER,
    POSTGRES_PASSWORD and POSTGRES_DB, the role owning the database."""
    import psycopg
    from psycopg import sql

    env = {name: interpolate(value, variables) for name, value in service["environment"].items()}
    with psycopg.connect(f"{postgres.server_url}/postgres", autocommit=True, connect_timeout=5) as connection:
        user = sql.Identifier(env["POSTGRES_USER"])
        password = sql.Literal(env["POSTGRES_PASSWORD"])
        connection.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(user, password))
        connection.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(env["POSTGRES_DB"]), user))


# -- the front proxy -------------------------------------------------------------------------------------------------

class RoundRobinProxy:
    """deploy/nginx.conf's part where nginx is not installed: an HTTP reverse proxy on a free loopback port sending
    each request to the next of `upstreams` ("127.0.0.1:port") in turn. The request body is read whole (nginx buffers
    it too), the answer streamed back chunk by chunk as it comes (nginx.conf's `proxy_buffering off`). Runs an aiohttp
    server and client on an event loop in a thread of its own."""

    def __init__(self, upstreams: list[str]):
        self.upstreams = upstreams
        self.port = free_port()
        self._turn = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="round-robin-proxy")

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    async def _start(self) -> None:
        from aiohttp import ClientSession, ClientTimeout, web

        self._session = ClientSession(auto_decompress=False, timeout=ClientTimeout(total=None, sock_read=600))
        app = web.Application(client_max_size=16 * 2**20)  # nginx.conf's client_max_body_size
        app.router.add_route("*", "/{path:.*}", self._forward)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, LOOPBACK, self.port).start()

    async def _forward(self, request):
        from aiohttp import web
        from multidict import CIMultiDict

        upstream = self.upstreams[next(self._turn) % len(self.upstreams)]
        headers = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP)
        headers["X-Forwarded-For"] = request.remote or LOOPBACK
        body = await request.read()
        async with self._session.request(request.method, f"http://{upstream}{request.rel_url}", headers=headers,
                                         data=body or None) as answer:
            response = web.StreamResponse(status=answer.status, headers=CIMultiDict(
                (k, v) for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP))
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
        return response

    async def _stop(self) -> None:
        await self._runner.cleanup()
        await self._session.close()

    def __enter__(self) -> RoundRobinProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@contextmanager
def front_proxy(conf_path: Path, addresses: dict[str, int]) -> Iterator[str]:
    """The proxy of `conf_path` (deploy/nginx.conf) on a free loopback port, its upstreams moved to loopback; yields
    its URL. nginx runs the rewritten file itself when installed (`NGINX`), else `RoundRobinProxy` takes its
    upstreams in order.

    Raises:
        AssertionError: the file names no upstream server.
    """
    conf = to_loopback(conf_path.read_text(), addresses)
    block = re.search(r"upstream\s+\w+\s*\{(.*?)\}", conf, re.S)
    upstreams = re.findall(r"^\s*server\s+([\w.-]+:\d+)", block.group(1) if block else "", re.M)
    assert upstreams and all(u.startswith(f"{LOOPBACK}:") for u in upstreams), f"upstreams not on loopback: {upstreams}"
    if NGINX is None:
        with RoundRobinProxy(upstreams) as proxy:
            yield proxy.url
        return
    port = free_port()
    # Its own folder under the system temp dir: nginx's workers (`nobody` under root) cannot enter pytest's tmp_path.
    with tempfile.TemporaryDirectory(prefix="link-nginx-") as folder:
        conf = re.sub(r"listen\s+\d+;", f"listen {LOOPBACK}:{port};", conf).replace("/tmp/", f"{folder}/")
        # One worker: each keeps its own round-robin turn (the upstream has no `zone`), and the client's new connections
        # (one after each stream) may land on another worker, so with several the split over the gateways varies.
        conf = re.sub(r"worker_processes\s+\w+;", "worker_processes 1;", conf)
        # No access log, and the temp folders the file does not name in its own folder too (not /var/lib/nginx).
        extra = "".join(f"\n    {kind}_temp_path {folder}/{kind};" for kind in ("fastcgi", "uwsgi", "scgi"))
        (Path(folder) / "nginx.conf").write_text(conf.replace("http {", "http {\n    access_log off;" + extra, 1))
        process = subprocess.Popen([NGINX, "-p", folder, "-c", f"{folder}/nginx.conf", "-e", f"{folder}/error.log",
                                    "-g", "daemon off;"])
        try:
            wait_healthy(f"http://{LOOPBACK}:{port}", 30, process, path="/health/live")  # a gateway's, through nginx
            yield f"http://{LOOPBACK}:{port}"
        finally:
            stop_process(process, 10)


# -- the client ------------------------------------------------------------------------------------------------------

class Answer(NamedTuple):
    request_id: str  # the gateway's x-link-request-id
    text: str
    prompt_tokens: int
    completion_tokens: int
    stream: bool


def ask(client, model: str, *, stream: bool) -> Answer:
    """One chat request through the `openai` client (greedy, MAX_TOKENS), whole or streamed with a usage chunk."""
    create = client.chat.completions.with_raw_response.create
    if not stream:
        raw = create(model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0)
        completion = raw.parse()
        usage = completion.usage
        return Answer(raw.headers["x-link-request-id"], completion.choices[0].message.content, usage.prompt_tokens,
                      usage.completion_tokens, False)
    raw = create(model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0, stream=True,
                 stream_options={"include_usage": True})
    chunks = list(raw.parse())
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    usage = chunks[-1].usage
    return Answer(raw.headers["x-link-request-id"], text, usage.prompt_tokens, usage.completion_tokens, True)


# -- the test --------------------------------------------------------------------------------------------------------

def start_engines(engines: dict[str, dict], variables: dict[str, str], addresses: dict[str, int],
                  stack: ExitStack) -> dict[str, ServerProcess]:
    """Each engine service's command on a free loopback port (its compose address added to `addresses`), one thread
    and a fresh $LINK_HOME each; returns them, by service name, as they start loading."""
    servers = {}
    for name, service in sorted(engines.items()):
        command, port = list(service["command"]), free_port()
        at = {flag: command.index(flag) + 1 for flag in ("--host", "--port")}
        addresses[f"{name}:{command[at['--port']]}"] = port
        command[at["--host"]], command[at["--port"]] = LOOPBACK, str(port)
        home = stack.enter_context(fresh_link_home())
        env = python_env(**environment(service, variables, addresses), LINK_HOME=str(home), OMP_NUM_THREADS="1",
                         MKL_NUM_THREADS="1")
        env.pop("LINK_COMPILE_DB", None)
        servers[name] = server = ServerProcess([sys.executable, "-m", "cli", *command, "--no-auto-tune"], port, env=env)
        stack.callback(server.stop)
    return servers


def start_gateways(gateways: dict[str, dict], variables: dict[str, str], addresses: dict[str, int], home: Path,
                   stack: ExitStack) -> tuple[dict[str, dict[str, str]], dict, dict]:
    """Each gateway service as `link serve` with its compose environment on loopback and its mounted link.yaml
    (written under `home`, engines on loopback); returns (environment by service, link.yaml as read, the gateways by
    service) once each answers /health. Their compose addresses are added to `addresses`."""
    envs = {name: environment(service, variables, addresses) for name, service in gateways.items()}
    sources = {mounted_config(gateways[name], env) for name, env in envs.items()}
    assert len(sources) == 1, f"the gateways mount different link.yaml files: {sources}"
    source = sources.pop()
    config_path = home / "link.yaml"
    config_path.write_text(to_loopback(source.read_text(), addresses))

    def start(name: str):
        env = {**envs[name], "LINK_CONFIG": str(config_path)}
        container_port = env.pop("LINK_PORT")  # start_gateway_process passes a free one as --port
        gateway = start_gateway_process(config_path, env["LINK_DATABASE_URL"], home / name, timeout_s=120, **env)
        return f"{name}:{container_port}", gateway

    with ThreadPoolExecutor(len(gateways)) as pool:  # both start at once (a few seconds each)
        futures = [pool.submit(start, name) for name in sorted(gateways)]
    for future in futures:
        if future.exception() is None:
            stack.callback(future.result()[1].stop)
    started = {}
    for name, future in zip(sorted(gateways), futures):
        address, started[name] = future.result()  # raises the first start's failure, the others stopped on exit
        addresses[address] = started[name].port
    return envs, yaml.safe_load(source.read_text()), started


def test_the_compose_topology_answers_through_the_openai_client(tmp_path):
    from openai import OpenAI

    services = yaml.safe_load(COMPOSE.read_text())["services"]
    gateways = {name: s for name, s in services.items() if s.get("command") == ["serve"]}
    engines = {name: s for name, s in services.items() if (s.get("command") or [])[:2] == ["engine", "serve"]}
    assert sorted(gateways) == ["gateway-1", "gateway-2"] and sorted(engines) == ["engine-1", "engine-2"]
    variables = {"LINK_MASTER_KEY": MASTER_KEY, "POSTGRES_PASSWORD": secrets.token_urlsafe(16)}

    with PrivatePostgres.start() as postgres, PrivateRedis.start() as redis:
        create_compose_database(postgres, services["postgres"], variables)
        addresses = {f"{name}:{port}": server.port
                     for (name, port), server in zip(SERVICE_PORTS.items(), (postgres, redis))}
        with ExitStack() as stack:
            # Compose starts the gateways once the engines are healthy; here they start while the engines load (the
            # slow part), and no request is sent before each gateway's /health reports both replicas in rotation.
            engine_servers = start_engines(engines, variables, addresses, stack)
            envs, config, gateway_servers = start_gateways(gateways, variables, addresses, tmp_path, stack)
            with ThreadPoolExecutor(len(engine_servers)) as pool:  # they load side by side
                list(pool.map(lambda n: engine_servers[n].wait_healthy(health_path(engines[n]), timeout_s=300),
                              engine_servers))
            for gateway in gateway_servers.values():
                wait_healthy(gateway.url, 60, gateway.process)  # 200: both replicas in rotation
            proxy_url = stack.enter_context(front_proxy(COMPOSE.parent / "nginx.conf", addresses))

            model = config["models"][0]["name"]
            client = OpenAI(base_url=f"{proxy_url}/v1", api_key=MASTER_KEY, max_retries=0, timeout=120)
            before = {name: num_finished(server) for name, server in engine_servers.items()}
            answers = [ask(client, model, stream=i // 2 % 2 == 1) for i in range(NUM_CHATS)]
            cards = client.models.list().data
            wait_for(lambda: sum(num_finished(s) - before[n] for n, s in engine_servers.items()) == NUM_CHATS, 10.0,
                     "the engines' finished-request counters")
            served = {name: num_finished(server) - before[name] for name, server in engine_servers.items()}
            database_url = envs["gateway-1"]["LINK_DATABASE_URL"]
            wait_for(lambda: query(database_url, "SELECT count(*) AS n FROM request_log")[0]["n"] == NUM_CHATS,
                     30.0, f"{NUM_CHATS} request-log rows")
        # Every process of the topology has drained and exited: nothing more can be written.
        columns = ("id, instance, deployment, model, stream, status, http_status, prompt_tokens, completion_tokens, "
                   "cost_usd")
        rows = {row["id"]: row for row in query(database_url, f"SELECT {columns} FROM request_log")}

    # The shipped link.yaml: one model, its two entries replicas of it, one on each engine.
    replicas = [entry for entry in config["models"] if entry["name"] == model]
    assert len(replicas) == len(config["models"]) == 2
    deployment_of = {name: f"{model}#{i}" for i, entry in enumerate(replicas) for name in engines
                     if f"//{name}:" in entry["api_base"]}
    assert sorted(deployment_of.values()) == [f"{model}#0", f"{model}#1"]
    # models.list: the model, served by two replicas.
    assert [card.id for card in cards] == [model]
    assert cards[0].link == {"type": "model", "kind": "openai", "replicas": 2}
    # Every request answered, whole or streamed; greedy decoding gives one text on every engine and both ways.
    assert len(answers) == NUM_CHATS and [a.stream for a in answers] == [False, False, True, True] * (NUM_CHATS // 4)
    texts = {answer.text for answer in answers}
    assert len(texts) == 1 and texts.pop().strip()
    assert all(0 < a.completion_tokens <= MAX_TOKENS and a.prompt_tokens > 0 for a in answers)
    # One log row per request in the shared database, as the client saw it.
    assert len(rows) == NUM_CHATS and set(rows) == {a.request_id for a in answers}
    for answer in answers:
        row = rows[answer.request_id]
        assert (row["status"], row["http_status"], row["model"], row["stream"]) == ("ok", 200, model, answer.stream)
        assert (row["prompt_tokens"], row["completion_tokens"]) == (answer.prompt_tokens, answer.completion_tokens)
        prices = replicas[int(row["deployment"].rsplit("#", 1)[1])]
        assert row["cost_usd"] == pytest.approx((answer.prompt_tokens * prices["input_cost_per_million"]
                                                 + answer.completion_tokens * prices["output_cost_per_million"]) / 1e6)
    # Round-robin: each gateway (its LINK_INSTANCE_ID in the rows) answered half, two whole and two streamed.
    instances = {env["LINK_INSTANCE_ID"] for env in envs.values()}
    assert instances == {"gateway-1", "gateway-2"}
    assert Counter((r["instance"], r["stream"]) for r in rows.values()) == {
        (instance, stream): NUM_CHATS // 4 for instance in instances for stream in (False, True)}
    # Both engines served, and each engine's own counter equals the rows naming it. The split between them is not
    # asserted: fewest outstanding alternates only while both are in rotation, and a loaded machine can slow a probe.
    by_deployment = Counter(row["deployment"] for row in rows.values())
    assert set(by_deployment) == set(deployment_of.values()) and sum(by_deployment.values()) == NUM_CHATS
    assert {deployment_of[name]: count for name, count in served.items()} == by_deployment
