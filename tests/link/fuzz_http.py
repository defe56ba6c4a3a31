"""Property-based fuzzing of a running gateway's HTTP surface from its own OpenAPI schema (schemathesis).

    report = fuzz_gateway(gateway.url, headers=AUTH, max_examples=30)
    report.examples        # {"POST /v1/chat/completions": 30, ...}: requests sent per operation
    report.failures        # [Failure(operation, status, elapsed_s, request body, response text)]: 5xx or slow

Each operation in `/openapi.json` gets `max_examples` generated requests: positive ones (valid by the schema)
and, with `negative=True`, as many that break it (wrong types, missing fields, out-of-range numbers). An operation
with nothing to break (no body, and no parameter but plain strings in the path: any text is a valid path segment)
gets no negative run: hypothesis would only spend about 0.7 s of rejected draws on it before giving up. A request
fails the run when it answers a 5xx or takes longer than `max_latency_s` (a hang). Generation is derandomized, so a
run is repeatable and a failure it found is found again.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field

import requests


@dataclass(frozen=True)
class Failure:
    operation: str
    status: int | None          # None: no answer within the client's timeout
    elapsed_s: float
    request: str                # the path and query parameters and the body sent (truncated)
    answer: str                 # the response text (truncated)


@dataclass
class FuzzReport:
    examples: Counter = field(default_factory=Counter)
    statuses: Counter = field(default_factory=Counter)   # (operation, status) -> count
    failures: list[Failure] = field(default_factory=list)

    @property
    def num_requests(self) -> int:
        return sum(self.examples.values())

    def requests_to(self, prefix: str) -> int:
        """How many requests went to paths under `prefix` (e.g. "/v1/")."""
        return sum(n for op, n in self.examples.items() if op.split(" ", 1)[1].startswith(prefix))

    def summary(self) -> str:
        rows = [f"{op}: {n} examples, statuses {dict(sorted((s, c) for (o, s), c in self.statuses.items() if o == op))}"
                for op, n in sorted(self.examples.items())]
        return "\n".join(rows + [f"{len(self.failures)} failures"])


def _text(value, limit: int = 600) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=repr)
    return text if len(text) <= limit else text[:limit] + "..."


# Keys of a parameter's JSON schema that constrain nothing (a schema of "type" and these accepts any value of the type).
ANNOTATIONS = frozenset({"title", "description", "default", "example", "examples"})


def _can_break(operation) -> bool:
    """Whether a request breaking `operation`'s schema exists: it has a body, or a parameter other than an
    unconstrained string in the path."""
    if operation.body:
        return True
    for parameter in operation.iter_parameters():
        schema = parameter.definition.get("schema") or {}
        if parameter.location.value != "path" or schema.get("type") != "string" or set(schema) - ANNOTATIONS - {"type"}:
            return True
    return False


def _request(case) -> str:
    parts = {"path": case.path_parameters, "query": case.query, "body": case.body}
    return _text({name: value for name, value in parts.items() if value and not type(value).__name__ == "NotSet"})


def fuzz_gateway(url: str, *, headers: dict[str, str], max_examples: int = 25, negative: bool = True,
                 max_latency_s: float = 10.0, skip: tuple[str, ...] = (), models: tuple[str, ...] = ()) -> FuzzReport:
    """Fuzz every operation of the server at `url` (its `/openapi.json`), `max_examples` requests each per mode.

    Args:
        url: the server's root, e.g. "http://127.0.0.1:8123".
        headers: sent with every request (the admin key, so that the routes themselves are exercised).
        max_examples: generated requests per operation and mode (positive, negative).
        max_latency_s: an answer slower than this counts as a failure (a hang).
        skip: operation labels ("DELETE /api/keys/{key_id}") not to fuzz.
        models: names the server serves, the first a model: every other generated body that names a `model` gets
            one of them instead (a random name only reaches the 404), so the requests also exercise the backends,
            and one with `models` (a policy) gets the first.
    Returns:
        the counts per operation and status, and every failure (5xx, timeout or slow answer).
    """
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    report = FuzzReport()
    session = requests.Session()
    modes = [GenerationMode.POSITIVE] + ([GenerationMode.NEGATIVE] if negative else [])
    for result in schema.get_all_operations():
        operation = result.ok()
        label = f"{operation.method.upper()} {operation.path}"
        if label in skip:
            continue
        for mode in modes if _can_break(operation) else modes[:1]:
            @settings(max_examples=max_examples, deadline=None, database=None, derandomize=True,
                      phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def run(case) -> None:
                picked = report.num_requests % (2 * len(models)) if models else len(models)
                if picked < len(models) and isinstance(case.body, dict):
                    if isinstance(case.body.get("model"), str):
                        case.body["model"] = models[picked]
                    if isinstance(case.body.get("models"), list):   # a policy over a model the server serves
                        case.body["models"] = [models[0]]
                started = time.monotonic()
                try:
                    response = case.call(base_url=url, session=session, headers=headers,
                                         timeout=max_latency_s + 5)
                except requests.Timeout:
                    report.failures.append(Failure(label, None, time.monotonic() - started, _request(case), ""))
                    return
                elapsed = time.monotonic() - started
                report.examples[label] += 1
                report.statuses[(label, response.status_code)] += 1
                if response.status_code >= 500 or elapsed > max_latency_s:
                    report.failures.append(Failure(label, response.status_code, elapsed, _request(case),
                                                   _text(response.text)))

            try:
                run()
            except Unsatisfiable:  # nothing to break: an operation without parameters has no negative case
                continue
    session.close()
    return report
