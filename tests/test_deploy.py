"""The deployment files hold together, checked offline (no container runtime, no cluster, no network here):

- every Kubernetes manifest in deploy/k8s/ validates, strictly (no unknown field), against the Kubernetes API's
  JSON schemas that `kubernetes-validate` ships, and the objects refer to one another correctly (the autoscaler's
  target, the Secret's keys, the ConfigMap, the probes on /health and /health/live, the grace period past the drain);
- deploy/compose.yaml validates against the Compose spec's JSON schema (shipped inside `check-jsonschema`) and has
  the topology the guide promises (nginx -> 2 gateways -> 2 engines, PostgreSQL, Redis);
- the link.yaml of the ConfigMap and deploy/link.yaml load with the gateway's own loader (`link.config.load_config`)
  and name the engines the manifests run, as replicas of one model;
- the Dockerfile is multi-stage, runs as a non-root user, and installs with `make install`, the target CI's
  `make test` builds first (.ci/run), so the image and CI share one install recipe and one torch pin.
The topology itself runs as processes on loopback: tests/link/test_gateway_engine_replicas.py and
test_gateway_replicas.py (gateways sharing a database, engine replicas), tests/link/test_drain.py (SIGTERM).
"""

from __future__ import annotations

import json
import re
from importlib.resources import files
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from link.config import load_config

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.30.0"  # the oldest Kubernetes release the manifests promise to work on
DRAIN_TIMEOUT_S = 30    # LINK_DRAIN_TIMEOUT_S's default (link/settings.py)


def manifests() -> list[dict]:
    docs = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        docs += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return docs


def one(kind: str, name: str) -> dict:
    found = [d for d in manifests() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


@pytest.mark.parametrize("doc", manifests(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_each_manifest_validates_strictly_against_the_kubernetes_schema(doc):
    # raises ValidationError on a wrong or unknown field; returns the schema version it checked against
    used = kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert used.split(".")[:2] == K8S_VERSION.lstrip("v").split(".")[:2]


def test_the_validator_rejects_a_broken_manifest():
    broken = json.loads(json.dumps(one("Deployment", "link-gateway")))
    broken["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)
    broken = json.loads(json.dumps(one("HorizontalPodAutoscaler", "link-gateway")))
    broken["spec"]["metrics"][0]["resource"]["target"]["averageUtilisation"] = 70  # misspelt: unknown in strict mode
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_the_kinds_the_guide_describes_are_all_there():
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in manifests())
    assert kinds == [("ConfigMap", "link-config"), ("Deployment", "link-gateway"),
                     ("HorizontalPodAutoscaler", "link-gateway"), ("Secret", "link-secrets"),
                     ("Service", "link-engine"), ("Service", "link-gateway"), ("StatefulSet", "link-engine")]


def test_the_autoscaler_scales_the_gateway_on_a_metric():
    hpa = one("HorizontalPodAutoscaler", "link-gateway")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "link-gateway"}
    assert 2 <= hpa["minReplicas"] < hpa["maxReplicas"]
    assert [m["resource"]["name"] for m in hpa["metrics"]] == ["cpu"]
    # a Utilization target is a share of the request: the gateway's container must request CPU
    container = one("Deployment", "link-gateway")["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["requests"]["cpu"]


@pytest.mark.parametrize("kind,name,port", [("Deployment", "link-gateway", 8000), ("StatefulSet", "link-engine", 8001)])
def test_pods_probe_health_run_as_non_root_with_limits_and_outlast_the_drain(kind, name, port):
    pod = one(kind, name)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert pod["terminationGracePeriodSeconds"] > DRAIN_TIMEOUT_S + 5  # the drain, uvicorn's grace, the shutdown
    (container,) = pod["containers"]
    assert container["ports"] == [{"name": "http", "containerPort": port}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/health/live", "port": "http"}
    assert set(container["resources"]) == {"requests", "limits"}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LINK_DRAIN_TIMEOUT_S"] == str(DRAIN_TIMEOUT_S)
    assert env["LINK_HOME"] in {m["mountPath"] for m in container["volumeMounts"]}  # writable: the root file system is not


def test_the_gateway_reads_its_secrets_and_config_from_the_objects_that_hold_them():
    pod = one("Deployment", "link-gateway")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    secret = one("Secret", "link-secrets")["stringData"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})}
    assert set(refs) == {"LINK_MASTER_KEY", "LINK_DATABASE_URL", "LINK_REDIS_URL"}
    assert all(ref["name"] == "link-secrets" and ref["key"] in secret for ref in refs.values())
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LINK_ENVIRONMENT"] == "production" and env["LINK_HOST"] == "0.0.0.0"
    config_volume = next(v for v in pod["volumes"] if "configMap" in v)
    assert config_volume["configMap"]["name"] == "link-config"
    mount = next(m for m in container["volumeMounts"] if m["name"] == config_volume["name"])
    assert env["LINK_CONFIG"] == mount["mountPath"] + "/link.yaml"


def test_the_configmap_link_yaml_loads_and_lists_every_engine_pod_as_a_replica(tmp_path):
    path = tmp_path / "link.yaml"
    path.write_text(one("ConfigMap", "link-config")["data"]["link.yaml"])
    config = load_config(path)
    engines = one("StatefulSet", "link-engine")
    service = one("Service", "link-engine")["spec"]
    assert service["clusterIP"] == "None" and engines["spec"]["serviceName"] == "link-engine"
    expected = [f"http://link-engine-{i}.link-engine:{service['ports'][0]['port']}/v1"
                for i in range(engines["spec"]["replicas"])]
    assert [m.api_base for m in config.models] == expected
    assert {m.name for m in config.models} == {"smollm2-135m-instruct"}  # one model name: replicas of one model
    model_arg = engines["spec"]["template"]["spec"]["containers"][0]["args"]
    assert model_arg[:2] == ["engine", "serve"]
    assert {m.model for m in config.models} == {model_arg[model_arg.index("--model") + 1]}


def test_compose_validates_against_the_compose_spec_schema():
    schema = json.loads((files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    assert list(validator.iter_errors(compose())) == []
    broken = compose()
    broken["services"]["proxy"]["ports"] = {"8000": 8080}  # a mapping where the spec wants a list
    assert list(validator.iter_errors(broken))


def test_compose_runs_a_proxy_two_gateways_two_engines_postgres_and_redis():
    services = compose()["services"]  # PyYAML applies the `<<` merge keys of the x- blocks
    assert sorted(services) == ["engine-1", "engine-2", "gateway-1", "gateway-2", "postgres", "proxy", "redis"]
    for name in ("gateway-1", "gateway-2"):
        gateway = services[name]
        env = gateway["environment"]
        assert gateway["command"] == ["serve"] and env["LINK_INSTANCE_ID"] == name
        assert re.fullmatch(r"postgresql://link:\$\{POSTGRES_PASSWORD:\?[^}]+\}@postgres:5432/link", env["LINK_DATABASE_URL"])
        assert env["LINK_REDIS_URL"] == "redis://redis:6379/0"
        assert env["LINK_MASTER_KEY"].startswith("${LINK_MASTER_KEY:?")  # compose refuses to start without one
        assert env["LINK_CONFIG"] == "/etc/link/link.yaml" and "./link.yaml:/etc/link/link.yaml:ro" in gateway["volumes"]
        assert int(gateway["stop_grace_period"].rstrip("s")) > int(env["LINK_DRAIN_TIMEOUT_S"])
    for name in ("engine-1", "engine-2"):
        command = services[name]["command"]
        assert command[:2] == ["engine", "serve"] and command[command.index("--port") + 1] == "8001"
    assert services["postgres"]["image"].startswith("postgres:") and services["redis"]["image"].startswith("redis:")
    proxy = services["proxy"]
    assert proxy["image"].startswith("nginx:") and "./nginx.conf:/etc/nginx/nginx.conf:ro" in proxy["volumes"]
    nginx = (DEPLOY / "nginx.conf").read_text()
    assert re.findall(r"^\s*server (gateway-\d):8000\b", nginx, re.MULTILINE) == ["gateway-1", "gateway-2"]
    assert "proxy_buffering off;" in nginx  # streams pass through as written
    assert re.search(r"listen (\d+);", nginx).group(1) == proxy["ports"][0].split(":")[1]


def test_the_compose_link_yaml_loads_and_names_both_engines_as_replicas_of_one_model():
    config = load_config(DEPLOY / "link.yaml")
    assert [m.api_base for m in config.models] == ["http://engine-1:8001/v1", "http://engine-2:8001/v1"]
    assert {(m.name, m.kind) for m in config.models} == {("smollm2-135m-instruct", "openai")}
    engines = compose()["services"]
    assert {engines[f"engine-{i}"]["command"][engines[f"engine-{i}"]["command"].index("--model") + 1]
            for i in (1, 2)} == {m.model for m in config.models}


def _make_prerequisites(makefile: str, target: str) -> set[str]:
    """`target`'s prerequisites in the Makefile, transitively, with $(VAR) references resolved to their values."""
    variables = dict(re.findall(r"^(\w+)\s*:?=\s*(\S+)\s*$", makefile, re.MULTILINE))
    rules = {}
    for name, prerequisites in re.findall(r"^([$()\w.-]+):(?!=)\s*([^\n|]*)", makefile, re.MULTILINE):
        resolve = lambda word: re.sub(r"\$\((\w+)\)", lambda m: variables.get(m.group(1), ""), word)
        rules.setdefault(resolve(name), set()).update(resolve(p) for p in prerequisites.split())
    seen, todo = set(), [target]
    while todo:
        for prerequisite in rules.get(todo.pop(), ()):
            if prerequisite not in seen:
                seen.add(prerequisite)
                todo.append(prerequisite)
    return seen


def test_the_image_installs_with_the_make_target_ci_builds_first():
    dockerfile = (ROOT / "Dockerfile").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^make test\b", ci, re.MULTILINE)  # CI: `make test`
    stamp = re.search(r"^STAMP := (\S+)", makefile, re.MULTILINE).group(1)
    assert stamp in _make_prerequisites(makefile, "test")          # ... which installs through $(STAMP)
    assert stamp in _make_prerequisites(makefile, "install")        # ... the target `make install` builds
    runs = re.findall(r"^RUN (.*?)(?<!\\)$", dockerfile, re.MULTILINE | re.DOTALL)
    installs = [r for r in runs if re.search(r"\bmake install\b", r)]
    assert len(installs) == 1 and "pip install" not in "\n".join(runs)  # no second install recipe
    assert "TORCH_SPEC" not in installs[0]  # the Makefile's torch pin, whatever the variant
    assert re.search(r"^TORCH_SPEC \?= torch==2\.13\.0$", makefile, re.MULTILINE)


def test_the_image_is_multi_stage_non_root_cpu_by_default_and_the_context_leaves_local_state_out():
    dockerfile = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM \S+(?: AS (\w+))?$", dockerfile, re.MULTILINE)
    assert stages == ["build", "runtime"]
    assert "COPY --from=build /app /app" in dockerfile
    (user,) = re.findall(r"^USER (\S+)$", dockerfile, re.MULTILINE)
    assert user.split(":")[0] not in {"0", "root"}
    assert re.search(r"^ARG TORCH_VARIANT=cpu$", dockerfile, re.MULTILINE)  # the CUDA variant: --build-arg TORCH_VARIANT=cuda
    assert re.search(r"^ENTRYPOINT \[\"link\"\]$", dockerfile, re.MULTILINE)
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", ".link", "**/__pycache__"} <= ignored
