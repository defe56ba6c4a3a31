"""The replica benchmark's processes: N `link engine serve` replicas on disjoint cores and, over them, one `link serve`
gateway per routing, each listing the engines as replicas of one model, all on 127.0.0.1.

    plan = plan_cores(sorted(os.sched_getaffinity(0)), num_replicas=2)   # CorePlan(engines=[(0,), (1,)], threads=1, rest=())
    with Fleet("smollm2-135m-instruct", plan) as fleet:     # engines, then a gateway per routing, all healthy
        fleet.warm_up()                          # one short request to each engine and one through each gateway
        before = fleet.engine_states()           # each engine's GET /v1/engine/state
        ... load on fleet.urls["cache_aware"] with fleet.headers, model fleet.model_name ...

Fair shares: the cores this process may use are split into N equal, disjoint slices (`plan_cores`), each engine is
pinned to its slice with `taskset` and gets OMP_NUM_THREADS = MKL_NUM_THREADS = the slice's size (torch's intra-op
pool, which our C++ kernels share through `at::parallel_for`); the cores left over (none when N divides the count)
hold the gateways, else these float over all cores (as does the load generator). With more replicas than cores each
engine gets one thread and engines share cores in turn.

Engines run with an empty temporary $LINK_HOME each (the model files linked in: `link_server.fresh_link_home`) and
`--no-auto-tune`: no stored kernel winner (some set their own thread count) and no background tuning taking cores
between requests. Both gateways route over the same engines: one `replica_routing: cache_aware`, one
`fewest_outstanding`; only the one under measurement gets requests. They run without request log and budgets (the
gateway's own overhead is `link bench gateway`'s subject), master key only, with the default
`LINK_REPLICA_STATE_INTERVAL_S` (2 s) for the cache-aware load polls, and generous timeouts (`TIMEOUT_S`,
`FIRST_TOKEN_TIMEOUT_S`): on a loaded CPU a queued request may wait minutes for its first token, which is latency
to measure, not a failure to retry elsewhere. For the same reason they probe their replicas' health only at start
(`LINK_HEALTH_INTERVAL_S` = `HEALTH_INTERVAL_S`): an engine on one busy core answered `/health` in up to 4.5 s while
it prefilled (measured on a 2-core machine under other load), and the gateway's fixed 5 s probe timeout then ejects
it; with both replicas busy, both were ejected and requests got 503 `no_healthy_deployment` in a trial run.
"""

from __future__ import annotations

import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from benchmarks.link_bench.link_server import fresh_link_home
from benchmarks.link_bench.processes import ServerProcess, can_pin, free_port, python_env

ROUTINGS = ("cache_aware", "fewest_outstanding")
MASTER_KEY = "sk-link-bench-replicas-0123456789abcdef"
STARTUP_TIMEOUT_S = 300.0
TIMEOUT_S, FIRST_TOKEN_TIMEOUT_S = 1800.0, 900.0  # the gateway's per-replica bounds (its defaults: 600 s and 60 s)
HEALTH_INTERVAL_S = 3600.0  # one health probe at the gateway's start, none during the measurement (see the docstring)


@dataclass(frozen=True)
class CorePlan:
    """Where each process runs. engines: per replica, the cores it is pinned to (None: not pinned); threads: each
    engine's intra-op threads; rest: the cores of the gateway and the load generator (empty: not pinned)."""

    engines: list[tuple[int, ...] | None]
    threads: int
    rest: tuple[int, ...] = ()

    def to_dict(self) -> dict:
        return {"engines": [list(c) if c else None for c in self.engines], "threads_per_engine": self.threads,
                "gateway_and_client": list(self.rest) or None}


def plan_cores(available: Sequence[int], num_replicas: int, *, pin: bool = True) -> CorePlan:
    """Split `available` cores into `num_replicas` equal disjoint slices (the remainder to the gateway and client);
    with more replicas than cores, one thread each, replica i on core i mod count. `pin` False: nobody pinned, each
    engine len(available) // num_replicas threads (at least 1).

    Raises:
        ValueError: `num_replicas` below 1 or no cores.
    """
    cores = sorted(available)
    if num_replicas < 1 or not cores:
        raise ValueError(f"need at least one replica and one core, got {num_replicas} replicas and cores {cores}")
    per = len(cores) // num_replicas
    if not pin:
        return CorePlan([None] * num_replicas, max(per, 1))
    if per == 0:
        return CorePlan([(cores[i % len(cores)],) for i in range(num_replicas)], 1)
    return CorePlan([tuple(cores[i * per:(i + 1) * per]) for i in range(num_replicas)], per, tuple(cores[num_replicas * per:]))


def gateway_config(model_name: str, engine_model: str, engine_urls: Sequence[str], routing: str) -> dict:
    """The gateway's link.yaml: one `kind: openai` entry per engine under one `model_name`, the first carrying
    `replica_routing`; no policies.

    Raises:
        ValueError: an unknown routing or no engines.
    """
    if routing not in ROUTINGS or not engine_urls:
        raise ValueError(f"routing must be one of {ROUTINGS} and there must be engines, got {routing!r}, {list(engine_urls)}")
    models = [{"name": model_name, "kind": "openai", "model": engine_model, "api_base": f"{url}/v1", "timeout_s": TIMEOUT_S,
               "first_token_timeout_s": FIRST_TOKEN_TIMEOUT_S} for url in engine_urls]
    models[0]["replica_routing"] = routing
    return {"models": models, "policies": []}


def start_engine(model: str, home: Path, cores: tuple[int, ...] | None, threads: int, kv_cache_mb: int | None) -> ServerProcess:
    """`link engine serve --no-auto-tune` of `model` on a free port, pinned to `cores`, with `threads` threads."""
    port = free_port()
    cmd = [sys.executable, "-m", "cli", "engine", "serve", "--model", model, "--port", str(port), "--no-auto-tune"]
    if kv_cache_mb is not None:
        cmd += ["--kv-cache-mb", str(kv_cache_mb)]
    env = python_env(LINK_HOME=str(home), OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env.pop("LINK_COMPILE_DB", None)
    return ServerProcess(cmd, port, cores=cores, env=env)


def start_gateway(config: dict, home: Path, cores: tuple[int, ...] | None) -> ServerProcess:
    """`link serve` with `config` (written to home/link.yaml) in a development home without log or budgets."""
    import yaml

    (home / "link.yaml").write_text(yaml.safe_dump(config))
    env = python_env(LINK_HOME=str(home), LINK_MASTER_KEY=MASTER_KEY, LINK_ENVIRONMENT="development",
                     LINK_REQUEST_LOG="false", LINK_BUDGETS="false", LINK_HEALTH_INTERVAL_S=str(HEALTH_INTERVAL_S))
    for name in ("LINK_DATABASE_URL", "LINK_REDIS_URL", "LINK_CONFIG"):
        env.pop(name, None)
    port = free_port()
    return ServerProcess([sys.executable, "-m", "cli", "serve", "--config", str(home / "link.yaml"), "--port", str(port),
                          "--log-level", "warning"], port, cores=cores, env=env)


@dataclass
class Fleet:
    """N engines and a gateway per routing over them, started on enter and stopped (SIGTERM) on exit.

    Args:
        model: the engines' model (a registry name). plan: `plan_cores`'s placement.
        kv_cache_mb: each engine's KV cache (None: `link engine serve`'s default).
        routings: the gateways to start, by routing name.
    Raises (on enter):
        RuntimeError: a server did not become healthy (with the end of its output).
    """

    model: str
    plan: CorePlan
    kv_cache_mb: int | None = None
    routings: tuple[str, ...] = ROUTINGS
    engines: list[ServerProcess] = field(default_factory=list, init=False)
    gateways: dict[str, ServerProcess] = field(default_factory=dict, init=False)
    _stack: ExitStack = field(default_factory=ExitStack, init=False, repr=False)

    @property
    def model_name(self) -> str:
        """The public name the gateways serve the replicas under."""
        return f"bench/{self.model}"

    @property
    def urls(self) -> dict[str, str]:
        """routing -> its gateway's base URL."""
        return {routing: gateway.url for routing, gateway in self.gateways.items()}

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {MASTER_KEY}"}

    def __enter__(self) -> Fleet:
        try:
            for cores in self.plan.engines:
                home = self._stack.enter_context(fresh_link_home())
                engine = start_engine(self.model, home, cores if cores and can_pin(cores) else None, self.plan.threads,
                                      self.kv_cache_mb)
                self._stack.callback(engine.stop)
                self.engines.append(engine)
            with ThreadPoolExecutor(len(self.engines)) as pool:  # they load side by side
                list(pool.map(lambda e: e.wait_healthy(timeout_s=STARTUP_TIMEOUT_S), self.engines))
            rest = self.plan.rest if self.plan.rest and can_pin(self.plan.rest) else None
            for routing in self.routings:  # after the engines: a gateway ejects a replica whose first probe fails
                home = Path(self._stack.enter_context(tempfile.TemporaryDirectory(prefix="link-bench-replicas-")))
                config = gateway_config(self.model_name, self.model, [e.url for e in self.engines], routing)
                self.gateways[routing] = gateway = start_gateway(config, home, rest)
                self._stack.callback(gateway.stop)
            for gateway in self.gateways.values():
                gateway.wait_healthy(timeout_s=STARTUP_TIMEOUT_S)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()  # the gateways first, then the engines, then their homes

    def warm_up(self, max_tokens: int = 2) -> None:
        """One short chat request ("Say hello.") to each engine, then one through each gateway, so first-call costs
        fall outside the measured load; the text is shorter than one prefix chunk, so no gateway remembers anything.

        Raises:
            RuntimeError: an answer other than 200.
        """
        import httpx

        body = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": max_tokens, "temperature": 0}
        targets = [*((e.url, self.model, {}) for e in self.engines), *((url, self.model_name, self.headers) for url in self.urls.values())]
        for url, model, headers in targets:
            response = httpx.post(f"{url}/v1/chat/completions", json={**body, "model": model}, headers=headers, timeout=300)
            if response.status_code != 200:
                raise RuntimeError(f"warm-up request to {url} answered {response.status_code}: {response.text[:300]}")

    def engine_states(self) -> list[dict]:
        """Each engine's `GET /v1/engine/state` body (serving/engine/cache_state.py), in replica order."""
        import httpx

        return [httpx.get(f"{e.url}/v1/engine/state", timeout=60).json() for e in self.engines]

    def gateway_output(self, routing: str, num_chars: int = 2000) -> str:
        """The end of `routing`'s gateway output (its warnings: ejections, failed attempts)."""
        return self.gateways[routing].output(num_chars)
