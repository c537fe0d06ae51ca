"""The scale-out topology on loopback: N ``voxloop serve`` processes behind HAProxy.

The same shape as docker/compose.yaml (replicas + an HAProxy that proxies WebSocket
upgrades and health-checks each replica's ``/ready``), without containers:

    topo = Topology(replicas=2)
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
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from bench.harness import ROOT, free_port

HAPROXY_CFG = """\
global
    maxconn 4096
    log stderr format raw local0 info

defaults
    mode http
    log global
    option httplog
    option redispatch 1
    retries 3
    retry-on conn-failure empty-response
    timeout connect 1s
    timeout client 60s
    timeout server 60s
    timeout tunnel 1h
    timeout http-request 10s

frontend voxloop
    bind 127.0.0.1:{lb_port}
    default_backend replicas

backend replicas
    balance leastconn
    option httpchk GET /ready
    http-check expect status 200
    default-server inter {check_ms}ms fall 1 rise 1
{servers}
"""


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
    proc: subprocess.Popen | None = None


class Topology:
    """Replicas + HAProxy on 127.0.0.1, each in its own process group."""

    def __init__(self, replicas: int = 2, check_ms: int = 500, grace_s: float = 5.0,
                 max_sessions: int = 32) -> None:
        if shutil.which("haproxy") is None:
            raise FileNotFoundError("haproxy is not installed (apt-get install haproxy)")
        self.dir = Path(tempfile.mkdtemp(prefix="voxloop-scaleout-"))
        self.check_ms, self.grace_s, self.max_sessions = check_ms, grace_s, max_sessions
        self.replicas = [Replica(i, free_port(), self.dir / f"replica{i}.log") for i in range(replicas)]
        self.lb_port = free_port()
        self._lb: subprocess.Popen | None = None

    @property
    def lb_url(self) -> str:
        return f"ws://127.0.0.1:{self.lb_port}/v1/realtime"

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout_s: float = 180.0) -> None:
        for r in self.replicas:
            self.start_replica(r.index)
        self.wait_ready([r.index for r in self.replicas], timeout_s)
        self._start_lb()

    def start_replica(self, index: int) -> None:
        r = self.replicas[index]
        env = dict(os.environ, VOXLOOP_SERVER__SHUTDOWN_GRACE_S=str(self.grace_s),
                   VOXLOOP_LIMITS__MAX_SESSIONS=str(self.max_sessions), VOXLOOP_TRACE__PATH="none")
        with open(r.log_path, "ab") as log:
            r.proc = subprocess.Popen(
                [sys.executable, "-m", "voxloop", "serve", "--host", "127.0.0.1", "--port", str(r.port)],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, indices: list[int], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for i in indices:
            r = self.replicas[i]
            while http_get(r.port, "/ready")[0] != 200:
                if r.proc is None or r.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"replica {i} not ready:\n{self.log_tail(i)}")
                time.sleep(0.25)

    def _start_lb(self) -> None:
        servers = "\n".join(f"    server r{r.index} 127.0.0.1:{r.port} check" for r in self.replicas)
        cfg = self.dir / "haproxy.cfg"
        cfg.write_text(HAPROXY_CFG.format(lb_port=self.lb_port, check_ms=self.check_ms, servers=servers))
        check = subprocess.run(["haproxy", "-c", "-q", "-f", str(cfg)], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy rejected its config:\n{check.stdout}{check.stderr}")
        with open(self.dir / "haproxy.log", "ab") as log:
            self._lb = subprocess.Popen(["haproxy", "-db", "-f", str(cfg)], stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 10
        while http_get(self.lb_port, "/ready")[0] != 200:
            if self._lb.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"haproxy not serving:\n{(self.dir / 'haproxy.log').read_text()}")
            time.sleep(0.1)

    def kill(self, index: int, sig: int = signal.SIGKILL) -> None:
        proc = self.replicas[index].proc
        assert proc is not None and proc.poll() is None, f"replica {index} is not running"
        os.kill(proc.pid, sig)

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
                    r.proc.wait(timeout=self.grace_s + 10)
                except subprocess.TimeoutExpired:
                    r.proc.kill()
                    r.proc.wait(timeout=10)
        if self._lb is not None and self._lb.poll() is None:
            self._lb.terminate()
            self._lb.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------------ observing
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
