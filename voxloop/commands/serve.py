"""``voxloop serve``: run the voice chat server (WebSocket + HTTP on one port)."""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import os

from voxloop.commands import config_from_args

log = logging.getLogger("voxloop.serve")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the voice chat server")
    p.add_argument("--host", help="interface to bind (default from config: 127.0.0.1)")
    p.add_argument("--port", type=int, help="TCP port (default from config: 8765)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    # whisper (CTranslate2) and llama.cpp both use libgomp; spinning idle OpenMP threads
    # steal the 2nd core from whichever stage runs next (measured: processing p50
    # 551 -> 473 ms, python -m bench.voice_latency). Must be set before those libraries load.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    bound_c_heap()
    cfg = config_from_args(args)
    changes = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if changes:
        cfg = cfg.replace("server", **changes)
    asyncio.run(_serve(cfg))
    return 0


#: glibc ``mallopt`` parameters (malloc.h): M_ARENA_MAX, M_MMAP_THRESHOLD.
_M_ARENA_MAX, _M_MMAP_THRESHOLD = -8, -3


def bound_c_heap(arenas: int = 2, mmap_threshold: int = 128 * 1024) -> bool:
    """Keep the C heap from holding on to freed memory (glibc only; False elsewhere).

    By default every thread that allocates gets a malloc arena of its own and the mmap
    threshold rises with the largest block freed, so the audio and tensor buffers of the
    model threads are carved from heaps that never shrink: measured in a 4-minute soak,
    80 MB of free-but-kept heap and RSS 76 MB higher at start. With ``arenas`` arenas and a
    fixed threshold (blocks of ``mmap_threshold`` bytes or more are mmapped and returned
    when freed) the kept heap stays near 1 MB. Left alone when the operator tunes malloc
    (``MALLOC_ARENA_MAX`` / ``GLIBC_TUNABLES`` set). Call before the models load.
    """
    if "MALLOC_ARENA_MAX" in os.environ or "GLIBC_TUNABLES" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    return bool(mallopt(_M_ARENA_MAX, arenas)) and bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold))


async def _serve(cfg) -> None:
    from pipeline.engines import Engines
    from pipeline.hub import Hub

    from pipeline.origin import exposure_warning

    engines = Engines(cfg)
    hub = Hub(cfg, engines)
    await hub.start()  # /health answers while models load; /ready turns 200 after
    if (warning := exposure_warning(cfg.server.host, cfg.server.auth_token)) is not None:
        log.warning("%s", warning)
    loader = asyncio.create_task(engines.load())
    serving = asyncio.create_task(hub.serve_until_signal())
    await asyncio.wait({loader, serving}, return_when=asyncio.FIRST_COMPLETED)
    if loader.done() and loader.exception() is not None:
        serving.cancel()
        await hub.stop(grace_s=0)
        raise loader.exception()  # a VoxloopError (e.g. ModelError) becomes a clear CLI error
    await serving
    log.info("stopped")
