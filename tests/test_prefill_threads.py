"""``llm.prefill_threads``: the LLM thread asks, per step, whether the other CPU stages are idle
(fakes; the engine's side is in test_llm.py)."""

from __future__ import annotations

import asyncio
import threading
import time

from conftest import scaled

from pipeline.engines import Engines
from pipeline.llm_worker import BatchedLlm
from base.config import Config


class StepRecorder:
    """A ``BatchedChat`` stand-in recording what each step was told."""

    def __init__(self) -> None:
        self.spare: list[bool] = []

    def wait(self, timeout_s: float) -> None:
        time.sleep(0.001)

    def step(self, wait_s: float = 0.0, spare_cores: bool = False) -> list:
        self.spare.append(spare_cores)
        return []

    def close(self) -> None:
        pass


def until(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + scaled(timeout_s)
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.002)


def test_each_step_asks_whether_the_cores_are_spare():
    engine, spare = StepRecorder(), [False]
    llm = BatchedLlm(engine, spare_cores=lambda: spare[0])
    try:
        until(lambda: len(engine.spare) >= 2)
        spare[0] = True
        n = len(engine.spare)
        until(lambda: len(engine.spare) > n + 1)
    finally:
        llm.stop()
    assert engine.spare[0] is False and engine.spare[-1] is True


async def test_a_running_end_of_turn_score_keeps_the_llm_on_its_own_threads():
    class Turn:
        def score(self, pcm) -> float:
            return 0.5

    engines = Engines.from_parts(Config(), None, StepRecorder(), [object()], turn=Turn())  # a TTS never called
    try:
        assert engines.cpu_stages_idle()
        release = threading.Event()
        job = engines.turn.submit(lambda model: release.wait(scaled(5)))
        until(lambda: engines.turn.pending() == 1)
        assert not engines.cpu_stages_idle()
        release.set()
        await asyncio.wait_for(job, scaled(5))
        until(engines.cpu_stages_idle)
    finally:
        engines.close()
