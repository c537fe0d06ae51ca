"""Where compiled GPU kernels are kept, so that the next start of the server reuses them.

Inductor caches compiled graphs and Triton kernels on disk, by default under the system's
temporary directory: gone after a reboot or with a container's restart. With ``tts.compile`` or
``tts.compile_encoder`` the engine points that cache at ``<models.cache_dir>/inductor/<key>``, the
key naming the GPU, its compute capability, the CUDA runtime and torch, so caches of other
devices or versions stay apart (Inductor also keys each entry on its own inputs). Triton's own
cache (the fused residual blocks of ``tts.triton_kernels``; by default under ``~/.triton``, gone
with a container) goes to ``<models.cache_dir>/triton/<key>`` the same way. A
``TORCHINDUCTOR_CACHE_DIR`` / ``TRITON_CACHE_DIR`` set by the user wins.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

log = logging.getLogger(__name__)

ENV = "TORCHINDUCTOR_CACHE_DIR"
TRITON_ENV = "TRITON_CACHE_DIR"


def cache_key(device_name: str, capability: tuple[int, int], cuda: str | None, torch_version: str) -> str:
    """A directory name for one GPU model + CUDA + torch, e.g. ``NVIDIA-H200-sm90-cuda13.0-torch2.11.0``."""
    raw = f"{device_name}-sm{capability[0]}{capability[1]}-cuda{cuda or 'none'}-torch{torch_version}"
    return re.sub(r"[^A-Za-z0-9.+_-]+", "-", raw).strip("-")


def use_compile_cache(root: Path, key: str, env: str = ENV) -> Path | None:
    """Set the cache of environment variable ``env`` (Inductor's, or ``TRITON_ENV``) to ``root/key``
    (created) unless the user set it; returns the directory in use, or None (the compiler's default,
    logged) when ``root`` is not writable (a read-only models volume)."""
    if os.environ.get(env):
        return Path(os.environ[env])
    path = Path(root).expanduser() / key
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK):
            raise PermissionError(f"{path} is not writable")
    except OSError as e:
        log.warning("compiled kernels cannot be kept in %s (%s): the compiler's default directory is used, "
                    "which a reboot or a container's restart may lose; set %s or models.cache_dir", path, e, env)
        return None
    os.environ[env] = str(path)
    return path


def use_device_compile_cache(root: Path, device: str, env: str = ENV) -> Path | None:
    """``use_compile_cache`` keyed by the CUDA ``device`` this process compiles for."""
    import torch

    props = torch.cuda.get_device_properties(device)
    return use_compile_cache(root, cache_key(props.name, (props.major, props.minor), torch.version.cuda,
                                             torch.__version__), env)  # fmt: skip
