"""cuBLAS for CTranslate2 on the GPU: found, arranged, or a start-up error that says what to install.

The CTranslate2 4.x wheels link the CUDA runtime statically and ``dlopen`` **libcublas.so.12**,
resolving 9 functions by name, all present with the same signatures in cuBLAS 13. So:

- libcublas.so.12 loads as it is: nothing to do;
- it is in a known directory that is not on the loader's path (PyPI's ``nvidia-cublas-cu12``
  wheel in site-packages, a CUDA toolkit under /usr/local): that directory goes on
  ``LD_LIBRARY_PATH``;
- only libcublas.so.13 exists (a CUDA-13-only host): a private directory
  ``<models cache>/cublas12-shim`` gets a symlink ``libcublas.so.12 -> .../libcublas.so.13`` and
  goes on ``LD_LIBRARY_PATH`` with the real library's directory;
- neither: ``ModelError`` naming the file and the fix.

The dynamic loader reads ``LD_LIBRARY_PATH`` only when a process starts, so ``voxloop serve``
restarts itself once (``os.execv``) with the new path, before any CUDA library is loaded.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from collections.abc import Callable, Iterable, MutableMapping
from pathlib import Path

from base.errors import ModelError

log = logging.getLogger(__name__)

CT2_CUBLAS = "libcublas.so.12"
STAND_INS = ("libcublas.so.13",)
#: Set on the restarted process: the directories it was restarted with.
RESTART_MARK = "VOXLOOP_CUBLAS_PATH"
MISSING = (
    'asr.device = "cuda": CTranslate2 needs cuBLAS 12 ({so12}) and this host has neither it nor '
    "cuBLAS 13 ({so13}) to stand in for it (looked on the loader path and in: {dirs}). Install one: "
    "`pip install nvidia-cublas-cu12` (any driver for CUDA 12), or the CUDA 13 toolkit's cuBLAS "
    '(driver >= 580); or set asr.device = "cpu".'
)


def can_load(name: str) -> bool:
    """True when the dynamic loader finds and loads library ``name`` from this process."""
    try:
        ctypes.CDLL(name)
    except OSError:
        return False
    return True


def search_dirs() -> list[Path]:
    """Where cuBLAS is installed without being on the loader path: pip wheels, CUDA toolkits."""
    dirs: list[Path] = []
    for entry in sys.path:
        nvidia = Path(entry or ".") / "nvidia"
        dirs += [nvidia / sub for sub in ("cublas/lib", "cu13/lib", "cu12/lib")]
    usr_local = Path("/usr/local")
    dirs += sorted(usr_local.glob("cuda*/targets/*/lib")) + sorted(usr_local.glob("cuda*/lib64"))
    dirs += [Path(d) for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64")]
    return list(dict.fromkeys(d for d in dirs if d.is_dir()))


def find_cublas(shim_root: Path, loads: Callable[[str], bool] = can_load,
                dirs: Iterable[Path] | None = None) -> list[Path]:
    """Directories to put first on ``LD_LIBRARY_PATH`` so that libcublas.so.12 loads ([] if it does).

    Creates the shim directory under ``shim_root`` when only cuBLAS 13 exists; raises
    ``ModelError`` (``MISSING``) when there is no cuBLAS at all.
    """
    if loads(CT2_CUBLAS):
        return []
    dirs = list(search_dirs() if dirs is None else dirs)
    for d in dirs:
        if (d / CT2_CUBLAS).exists():
            return [d]
    for d in dirs:
        for name in STAND_INS:
            if (d / name).exists():
                return [_shim(shim_root / "cublas12-shim", (d / name).resolve()), d]
    raise ModelError(MISSING.format(so12=CT2_CUBLAS, so13=" / ".join(STAND_INS),
                                    dirs=", ".join(map(str, dirs)) or "none"))


def _shim(shim: Path, target: Path) -> Path:
    """``shim/libcublas.so.12 -> target``, replaced atomically when it points elsewhere."""
    shim.mkdir(parents=True, exist_ok=True)
    link = shim / CT2_CUBLAS
    if not (link.is_symlink() and Path(os.readlink(link)) == target):
        tmp = shim / f".{CT2_CUBLAS}.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target)
        os.replace(tmp, link)
        log.info("cuBLAS 12 missing: %s now points to %s", link, target)
    return shim


def arrange_cublas(shim_root: Path, environ: MutableMapping[str, str] = os.environ,
                   restart: Callable[[str, list[str]], None] = os.execv,
                   find: Callable[[Path], list[Path]] = find_cublas) -> None:
    """Make libcublas.so.12 loadable for CTranslate2, restarting this process once if need be.

    Call before anything loads CUDA libraries. Raises ``ModelError`` when cuBLAS is missing, or
    when the restarted process still cannot load it.
    """
    dirs = find(shim_root)
    if not dirs:
        return
    path = ":".join(map(str, dirs))
    if environ.get(RESTART_MARK) == path:
        raise ModelError(f"{CT2_CUBLAS} does not load even with LD_LIBRARY_PATH={path} (is that cuBLAS "
                         'built for another CUDA version or architecture?); set asr.device = "cpu" '
                         "or install `pip install nvidia-cublas-cu12`")
    old = environ.get("LD_LIBRARY_PATH", "")
    environ["LD_LIBRARY_PATH"] = f"{path}:{old}" if old else path
    environ[RESTART_MARK] = path
    log.info("restarting with LD_LIBRARY_PATH=%s so that CTranslate2 finds %s", environ["LD_LIBRARY_PATH"],
             CT2_CUBLAS)
    restart(sys.executable, [sys.executable, *sys.orig_argv[1:]])
