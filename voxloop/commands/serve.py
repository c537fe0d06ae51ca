"""``voxloop serve``: run the voice chat server (WebSocket + HTTP on one port)."""

from __future__ import annotations

import argparse
import asyncio
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
    # numpy's BLAS (OpenBLAS) on one thread: its only work here is the log-mel features' small
    # matrix product (ASR, end-of-turn model), where a pool of BLAS threads mostly waits for
    # cores the engines hold. Features of a 3 s utterance on busy cores, p50: 20.3 -> 1.3 ms
    # (2-core VM), 96 -> 1.9 ms (16-core GPU host, where they were 63 % of the ASR thread's
    # time at 200 talkers); python -m bench.blas_threads. Inherited by the spawned processes.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from pipeline import heap
    from pipeline.origin import exposure_warning

    heap.limit_arenas()  # before the model threads start (pipeline/heap.py)
    cfg = config_from_args(args)
    changes = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if changes:
        cfg = cfg.replace("server", **changes)
    if "asr" in cfg.server.stages and cfg.asr.device == "cuda":
        from asr.cublas import arrange_cublas
        from base.models import cache_dir

        arrange_cublas(cache_dir(cfg))  # may restart this process once with LD_LIBRARY_PATH set
    if "llm" in cfg.server.stages and cfg.llm.n_gpu_layers != 0 and cfg.server.front_ends == 1:
        try:  # a CUDA build of llama.cpp loaded after numpy crashed loading the model on a CUDA 13 host
            import llama_cpp  # noqa: F401
        except ImportError:
            pass  # BatchedChat says what to install
    if (warning := exposure_warning(cfg.server.host, cfg.server.auth_token)) is not None:
        log.warning("%s", warning)
    if cfg.server.front_ends > 1:
        from pipeline.front_ends import serve_front_ends

        return serve_front_ends(cfg)
    asyncio.run(_serve(cfg))
    return 0


async def _serve(cfg) -> None:
    from pipeline.engines import Engines
    from pipeline.hub import Hub

    engines = Engines(cfg)
    hub = Hub(cfg, engines)
    await hub.start()  # /health answers while models load; /ready turns 200 after
    loader = asyncio.create_task(_load(engines, cfg, hub))
    serving = asyncio.create_task(hub.serve_until_signal())
    await asyncio.wait({loader, serving}, return_when=asyncio.FIRST_COMPLETED)
    if loader.done() and loader.exception() is not None:
        serving.cancel()
        await hub.stop(grace_s=0)
        raise loader.exception()  # a VoxloopError (e.g. ModelError) becomes a clear CLI error
    await serving
    log.info("stopped")


async def _load(engines, cfg, hub) -> None:  # noqa: ANN001
    from pipeline import gc_pauses

    await engines.load()
    gc_pauses.manage(cfg, "server", lambda: any(hub.stage_depths().values()))
