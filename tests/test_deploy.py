"""Deployment files: Kubernetes manifests (schema-validated), compose + HAProxy, Dockerfiles.

Kubernetes schemas come from ``kubernetes-validate`` (bundled, strict: unknown fields
fail), the compose file is checked against the Compose Specification schema vendored by
``check-jsonschema``. Then the cross-file facts a schema cannot see: probes hit the
server's real routes, grace periods cover the drain, selectors match, the HPA's custom
metric is one the server exports.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "docker" / "k8s"
MANIFESTS = sorted(K8S.rglob("*.yaml"))
K8S_VERSIONS = ("1.29.0", "1.37.0")  # oldest and newest we claim to support


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _by_kind(kind: str, folder: Path = K8S) -> dict:
    found = [d for p in sorted(folder.glob("*.yaml")) for d in _docs(p) if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind} in {folder}, found {len(found)}"
    return found[0]


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def _config_default(section: str, key: str):
    from base.config import load_config

    return getattr(getattr(load_config(environ={}), section), key)


# ---------------------------------------------------------------------- Kubernetes
@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(K8S)))
def test_manifest_validates_against_kubernetes_schema(path, version):
    import kubernetes_validate

    for doc in _docs(path):
        kubernetes_validate.validate(doc, version, strict=True)  # raises ValidationError


def test_schema_validator_rejects_a_broken_manifest():
    import kubernetes_validate

    bad = _by_kind("Deployment")
    bad = json.loads(json.dumps(bad))
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/x"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("folder", [K8S, K8S / "gpu"], ids=["cpu", "gpu"])
def test_deployment_probes_drain_and_resources(folder):
    dep = _by_kind("Deployment", folder)
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    port = {p["name"]: p["containerPort"] for p in c["ports"]}["http"]
    assert port == _config_default("server", "port")
    assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    # Grace period covers preStop + the server's own drain (its shutdown_grace_s) + slack.
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    drain = float(_env(c).get("VOXLOOP_SERVER__SHUTDOWN_GRACE_S") or _config_default("server", "shutdown_grace_s"))
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + drain + 5
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    req = c["resources"]["requests"]
    assert {"cpu", "memory"} <= set(req)
    if folder.name == "gpu":
        assert req["nvidia.com/gpu"] == c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_service_pdb_hpa_point_at_the_deployment():
    dep, svc, pdb = _by_kind("Deployment"), _by_kind("Service"), _by_kind("PodDisruptionBudget")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert svc["spec"]["ports"][0]["targetPort"] == "http"
    for folder in (K8S, K8S / "gpu"):
        hpa = _by_kind("HorizontalPodAutoscaler", folder)
        assert hpa["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
        assert hpa["spec"]["minReplicas"] > (0 if folder.name == "gpu" else 1)


def test_hpa_scales_on_cpu_and_on_a_metric_the_server_exports():
    from prometheus_client import generate_latest

    from pipeline.trace import Metrics

    hpa = _by_kind("HorizontalPodAutoscaler")
    kinds = {m["type"]: m for m in hpa["spec"]["metrics"]}
    assert kinds["Resource"]["resource"]["name"] == "cpu"
    metric = kinds["Pods"]["pods"]["metric"]["name"]
    exported = generate_latest(Metrics().registry).decode()
    assert re.search(rf"^# TYPE {metric} gauge$", exported, re.M), f"server exports no gauge {metric}"
    target = float(kinds["Pods"]["pods"]["target"]["averageValue"])
    dep = _by_kind("Deployment")
    max_sessions = int(_env(dep["spec"]["template"]["spec"]["containers"][0])["VOXLOOP_LIMITS__MAX_SESSIONS"])
    assert 0 < target < max_sessions, "scale before pods are full"
    adapter = yaml.safe_load(_by_kind("ConfigMap")["data"]["config.yaml"])
    assert any(metric in rule["seriesQuery"] for rule in adapter["rules"])


# ---------------------------------------------------------------------- compose + HAProxy
def test_compose_validates_against_compose_spec():
    import jsonschema

    schema = json.loads((resources.files("check_jsonschema.builtin_schemas.vendor")
                         / "compose-spec.json").read_text())
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    jsonschema.validate(compose, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**compose, "services": {"x": {"stop_signal": ["SIGINT"]}}}, schema)


def test_compose_topology_drains_and_is_health_checked():
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    app, lb = compose["services"]["voxloop"], compose["services"]["lb"]
    assert app["build"]["dockerfile"] == "docker/Dockerfile"
    assert app["stop_signal"] == "SIGINT"
    grace = float(app["environment"]["VOXLOOP_SERVER__SHUTDOWN_GRACE_S"])
    assert float(app["stop_grace_period"].rstrip("s")) > grace
    assert "${VOXLOOP_REPLICAS" in str(app["deploy"]["replicas"])
    assert lb["depends_on"]["voxloop"]["condition"] == "service_healthy"
    cfg = (ROOT / "docker" / "haproxy.cfg").read_text()
    port = _config_default("server", "port")
    assert re.search(rf"^\s*server-template \S+ \S+ voxloop:{port}$", cfg, re.M)
    assert any(f":{port}" in p for p in lb["ports"])


def test_loopback_bench_uses_the_same_haproxy_policy():
    """bench/scaleout tests the compose topology without containers: same LB rules."""
    from bench.scaleout.topology import HAPROXY_CFG

    compose_cfg = (ROOT / "docker" / "haproxy.cfg").read_text()
    for rule in ("balance leastconn", "option httpchk GET /ready", "http-check expect status 200",
                 "option redispatch 1", "retry-on conn-failure empty-response", "timeout tunnel 1h"):
        assert rule in compose_cfg and rule in HAPROXY_CFG, rule


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy not installed")
def test_haproxy_accepts_the_compose_config():
    r = subprocess.run(["haproxy", "-c", "-f", str(ROOT / "docker" / "haproxy.cfg")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


# ---------------------------------------------------------------------- Dockerfiles
def _stages(dockerfile: Path) -> list[list[str]]:
    """Instructions per stage, continuation lines joined."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    stages: list[list[str]] = []
    for line in (ln.strip() for ln in text.splitlines()):
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cuda"])
def test_dockerfile_runtime_stage_is_slim_nonroot_and_drains(name):
    stages = _stages(ROOT / "docker" / name)
    assert len(stages) >= 2
    build, runtime = "\n".join(stages[0]), "\n".join(stages[-1])
    assert "ca-certs" in build and "ca-certs" not in runtime, "extra CAs belong to the build stage only"
    assert "-DGGML_NATIVE=OFF" in build, "llama-cpp-python must be built with portable flags"
    assert sorted(re.findall(r"COPY --from=build (\S+)", runtime)) == ["/models", "/opt/venv"]
    assert re.search(r"^USER (?!root|0)\S+", runtime, re.M)
    assert re.search(rf"^EXPOSE {_config_default('server', 'port')}$", runtime, re.M)
    assert re.search(r"^STOPSIGNAL SIGINT$", runtime, re.M)
    assert re.search(r"^HEALTHCHECK .*/health", runtime, re.M)
    assert "build-essential" not in runtime and "wheelhouse" not in runtime
