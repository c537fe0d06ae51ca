"""The cuBLAS 12 check for CTranslate2 on the GPU (asr/cublas.py), with fake libraries and loaders."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from asr.cublas import CT2_CUBLAS, RESTART_MARK, arrange_cublas, find_cublas
from base.errors import ModelError


def lib(d: Path, name: str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(b"\x7fELF fake")
    return d / name


def never(name: str) -> bool:
    return False


def test_nothing_to_do_when_cublas_12_loads(tmp_path):
    assert find_cublas(tmp_path / "cache", loads=lambda name: name == CT2_CUBLAS, dirs=[]) == []
    assert not (tmp_path / "cache").exists()


def test_a_pip_wheel_directory_goes_on_the_path(tmp_path):
    wheel = tmp_path / "site" / "nvidia" / "cublas" / "lib"
    lib(wheel, CT2_CUBLAS)
    lib(tmp_path / "cuda13", "libcublas.so.13")
    assert find_cublas(tmp_path / "cache", loads=never, dirs=[tmp_path / "cuda13", wheel]) == [wheel]


def test_cuda_13_only_gets_a_shim_symlink(tmp_path):
    real = lib(tmp_path / "cuda-13.0" / "lib", "libcublas.so.13")
    dirs = find_cublas(tmp_path / "cache", loads=never, dirs=[real.parent])
    shim = tmp_path / "cache" / "cublas12-shim"
    assert dirs == [shim, real.parent]  # the real directory too: cuBLAS 13 loads cuBLASLt 13 from it
    link = shim / CT2_CUBLAS
    assert link.is_symlink() and Path(os.readlink(link)) == real.resolve()
    # Idempotent, and repointed when cuBLAS 13 moved.
    assert find_cublas(tmp_path / "cache", loads=never, dirs=[real.parent]) == dirs
    moved = lib(tmp_path / "other", "libcublas.so.13")
    find_cublas(tmp_path / "cache", loads=never, dirs=[moved.parent])
    assert Path(os.readlink(link)) == moved.resolve()


def test_no_cublas_at_all_is_an_exact_error(tmp_path):
    with pytest.raises(ModelError) as err:
        find_cublas(tmp_path / "cache", loads=never, dirs=[tmp_path])
    message = str(err.value)
    assert CT2_CUBLAS in message and "libcublas.so.13" in message and str(tmp_path) in message
    assert "pip install nvidia-cublas-cu12" in message and 'asr.device = "cpu"' in message


def test_serve_restarts_once_with_the_library_path(tmp_path):
    environ = {"LD_LIBRARY_PATH": "/opt/x"}
    restarts = []
    found = [tmp_path / "shim", tmp_path / "real"]
    arrange_cublas(tmp_path, environ, lambda exe, argv: restarts.append((exe, argv)), find=lambda root: found)
    assert environ["LD_LIBRARY_PATH"] == f"{found[0]}:{found[1]}:/opt/x"
    assert restarts == [(sys.executable, [sys.executable, *sys.orig_argv[1:]])]
    # The restarted process: the library loads now -> nothing more.
    arrange_cublas(tmp_path, environ, lambda *a: restarts.append(a), find=lambda root: [])
    assert len(restarts) == 1
    # ... or it still does not: an error instead of a restart loop.
    with pytest.raises(ModelError, match="does not load"):
        arrange_cublas(tmp_path, dict(environ, **{RESTART_MARK: environ[RESTART_MARK]}),
                       lambda *a: restarts.append(a), find=lambda root: found)
    assert len(restarts) == 1


def test_real_host_check_runs(tmp_path):
    """On this host: either cuBLAS 12 loads, a directory is found, or the error names the fix."""
    try:
        dirs = find_cublas(tmp_path)
    except ModelError as exc:
        assert "pip install nvidia-cublas-cu12" in str(exc)
    else:
        assert all(d.is_dir() for d in dirs)
