"""One CUDA memory pool for the process: configured before CUDA starts, observed while serving.

With ``gpu.allocator = "async"`` every PyTorch allocation of the process is served by the
device's stream-ordered pool (``cudaMallocAsync``); PyTorch's CUDA graphs then allocate from
CUDA's graph memory pool of the same device. cuda-python reads both pools' counters:
reserved (held from the driver) and used (handed out), current and high-water, in bytes.
With ``"native"`` the figures come from PyTorch's caching allocator (its graph pools included).

``configure_allocator`` must run before the first CUDA call of the process (``voxloop serve``
and the GPU benchmarks call it first thing); ``GpuMemory`` is created afterwards.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass
from typing import Any

from base.config import GpuConfig
from base.errors import ConfigError

log = logging.getLogger(__name__)

ALLOCATORS = {"async": "cudaMallocAsync", "native": "native"}
_MIB = 2**20


def configure_allocator(allocator: str) -> None:
    """Select PyTorch's CUDA allocator backend (``PYTORCH_CUDA_ALLOC_CONF``) for this process.

    ConfigError for an unknown name, or when CUDA already runs with another backend.
    """
    if allocator not in ALLOCATORS:
        raise ConfigError(f"gpu.allocator must be one of {sorted(ALLOCATORS)}, got {allocator!r}")
    backend = ALLOCATORS[allocator]
    conf = [p for p in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").split(",") if p and not p.startswith("backend:")]
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ",".join([f"backend:{backend}", *conf])
    # CTranslate2 reads this if it ever runs on this GPU; not exercised here (its wheels need cuBLAS 12).
    if allocator == "async":
        os.environ.setdefault("CT2_CUDA_ALLOCATOR", "cuda_malloc_async")
    import torch

    if torch.cuda.is_initialized():
        running = torch.cuda.get_allocator_backend()
        if running != backend:
            raise ConfigError(f"gpu.allocator = {allocator!r} but CUDA already started with the {running!r} allocator")


@dataclass(frozen=True)
class PoolStats:
    """Device memory of this process, bytes."""

    allocator: str
    #: Held from the driver by the allocator (async: the device pool), now and highest.
    reserved: int
    reserved_high: int
    #: Handed out to tensors, now and highest.
    used: int
    used_high: int
    #: CUDA graph memory (async backend: graph memory pool; native: inside ``reserved``).
    graph_reserved: int
    graph_reserved_high: int
    #: The whole device, every process: total and in use (``cudaMemGetInfo``).
    device_total: int
    device_used: int

    def as_mb(self) -> dict[str, Any]:
        return {k: (round(v / _MIB, 1) if isinstance(v, int) else v) for k, v in asdict(self).items()}


class GpuMemory:
    """Applies ``GpuConfig`` to the running CUDA device and reads the pool's counters."""

    def __init__(self, cfg: GpuConfig, device: Any = None) -> None:
        import torch

        self.cfg = cfg
        self.device = torch.device(device if device is not None else "cuda")
        self.index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        torch.cuda.init()
        self.backend = torch.cuda.get_allocator_backend()
        if self.backend != ALLOCATORS.get(cfg.allocator):
            raise ConfigError(
                f"gpu.allocator = {cfg.allocator!r} but PyTorch runs the {self.backend!r} allocator: "
                "configure_allocator() must run before CUDA starts"
            )
        self._rt = _cudart() if self.backend == "cudaMallocAsync" else None
        if self.backend == "cudaMallocAsync" and self._rt is None:
            log.warning("cuda-python is not installed: pool figures come from PyTorch's counters only")
        self._pool = self._call("cudaDeviceGetMemPool", self.index) if self._rt else None
        if self._pool is not None and cfg.release_threshold_mb is not None:
            self._set_pool_attr("cudaMemPoolAttrReleaseThreshold", cfg.release_threshold_mb * _MIB)
        if cfg.memory_limit_mb:
            total = torch.cuda.get_device_properties(self.index).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, cfg.memory_limit_mb * _MIB / total), self.index)

    # ---------------------------------------------------------------- cuda-python

    def _call(self, name: str, *args: Any) -> Any:
        assert self._rt is not None
        err, *value = getattr(self._rt, name)(*args)
        if int(err) != 0:
            raise RuntimeError(f"{name} failed: {err}")
        return value[0] if value else None

    def _pool_attr(self, name: str) -> int:
        return int(
            self._call(
                "cudaMemPoolGetAttribute",
                self._pool,
                getattr(self._rt.cudaMemPoolAttr, name),
            )
        )

    def _set_pool_attr(self, name: str, value: int) -> None:
        attr = getattr(self._rt.cudaMemPoolAttr, name)
        self._call("cudaMemPoolSetAttribute", self._pool, attr, _cuuint64(value))

    def _graph_attr(self, name: str) -> int:
        return int(
            self._call(
                "cudaDeviceGetGraphMemAttribute",
                self.index,
                getattr(self._rt.cudaGraphMemAttributeType, name),
            )
        )

    # ---------------------------------------------------------------- figures

    def stats(self) -> PoolStats:
        """The pool's counters now (bytes)."""
        import torch

        free, total = torch.cuda.mem_get_info(self.index)
        if self._pool is not None:
            return PoolStats(
                self.backend,
                self._pool_attr("cudaMemPoolAttrReservedMemCurrent"),
                self._pool_attr("cudaMemPoolAttrReservedMemHigh"),
                self._pool_attr("cudaMemPoolAttrUsedMemCurrent"),
                self._pool_attr("cudaMemPoolAttrUsedMemHigh"),
                self._graph_attr("cudaGraphMemAttrReservedMemCurrent"),
                self._graph_attr("cudaGraphMemAttrReservedMemHigh"),
                total,
                total - free,
            )
        s = torch.cuda.memory_stats(self.index)
        return PoolStats(
            self.backend,
            s.get("reserved_bytes.all.current", 0),
            s.get("reserved_bytes.all.peak", 0),
            s.get("allocated_bytes.all.current", 0),
            s.get("allocated_bytes.all.peak", 0),
            0,
            0,
            total,
            total - free,
        )

    def reset_high_water(self) -> None:
        """Start the high-water marks again from the current values."""
        import torch

        torch.cuda.reset_peak_memory_stats(self.index)
        if self._pool is not None:
            for name in (
                "cudaMemPoolAttrReservedMemHigh",
                "cudaMemPoolAttrUsedMemHigh",
            ):
                self._set_pool_attr(name, 0)
            for name in (
                "cudaGraphMemAttrReservedMemHigh",
                "cudaGraphMemAttrUsedMemHigh",
            ):
                attr = getattr(self._rt.cudaGraphMemAttributeType, name)
                self._call(
                    "cudaDeviceSetGraphMemAttribute",
                    self.index,
                    attr,
                    _cuuint64(0),
                )

    def footprint(self) -> int:
        """Bytes in use by this process's tensors and graphs now: what a stage adds to it is that
        stage's cost. Counts memory handed out, not held (the async pool and the graph pool keep
        freed memory reserved for reuse), so stages measure the same whatever ran before (the
        caller collects Python's garbage before its first reading: ``StepRunner``)."""
        import torch

        torch.cuda.synchronize(self.index)
        if self._pool is not None:
            return self._pool_attr("cudaMemPoolAttrUsedMemCurrent") + self._graph_attr("cudaGraphMemAttrUsedMemCurrent")
        torch.cuda.empty_cache()  # native: graph pools are private blocks, counted in reserved
        return self.stats().reserved


def _cuuint64(value: int) -> Any:
    """cuda-python's ``cuuint64_t`` (in ``cuda.bindings.driver`` since 12.6; in ``cuda.cuda`` before)."""
    try:
        from cuda.bindings import driver
    except ImportError:
        from cuda import cuda as driver  # type: ignore[no-redef]
    return driver.cuuint64_t(value)


def _cudart() -> Any:
    """cuda-python's runtime bindings (``cuda.bindings.runtime``, or ``cuda.cudart`` before 12.6); None if absent."""
    try:
        from cuda.bindings import runtime
    except ImportError:
        try:
            from cuda import cudart as runtime  # type: ignore[no-redef]
        except ImportError:
            return None
    return runtime


__all__ = ["ALLOCATORS", "GpuMemory", "PoolStats", "configure_allocator"]
