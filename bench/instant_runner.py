"""An orchestration stand-in for the GPU TTS engine's ``StepRunner``: the real ``BatchScheduler``
(and through ``CudaTtsEngine(runner=...)`` the real server) driven by launches that take no time, or
a fixed time per lane, on no device. Used by ``bench.tts_scheduler_host`` and ``bench.served_host``
to measure the host side alone."""

from __future__ import annotations

import time

import numpy as np
import torch

from tts_engine.torch_vits.buffers import HostBufferPool
from tts_engine.torch_vits.chunked import ChunkGeometry
from tts_engine.torch_vits.resample import ChunkResampler
from tts_engine.torch_vits.runner import RunnerOptions, fast_lane_names

HOP = 256
#: Phoneme-id symbols of the sentences' ids (the bundled voice has 256).
SYMBOLS = 256


class InstantRunner:
    """Stands in for ``StepRunner``: every encoder launch says ``frames`` frames, every decode
    returns silence, in rows shaped as the real runner's (resampled rows when
    ``options.output_rate`` differs from ``options.voice_rate``). ``launch_s`` = 0: nothing is ever
    busy; else each launch keeps its lane busy ``launch_s`` seconds after the lane's previous one
    ends (a lane's launches run one after another, lanes side by side, as CUDA streams), so steps
    gather as many rows as a GPU of that launch time lets them."""

    def __init__(self, options: RunnerOptions, frames: int, launch_s: float = 0.0) -> None:
        self.options = options
        self.device = torch.device("cpu")
        self.fast_lanes = fast_lane_names(options.fast_lanes)
        self.lanes = (*self.fast_lanes, "main")
        self.geometry = ChunkGeometry(options.chunk_frames, 0, 0, HOP)
        rate = options.voice_rate or 1
        self.resampler = ChunkResampler(rate, options.output_rate or rate, HOP)
        self.host_pool = HostBufferPool(pinned=False)
        self.stage_bytes: dict[str, int] = {}
        self.frames = frames
        self.launch_s = launch_s
        self._free_at = dict.fromkeys(self.lanes, 0.0)  # perf_counter() when each lane's last launch ends
        self._audio = {c: np.zeros((options.max_slots, self.resampler.row_samples(c)), np.int16)
                       for c in options.chunk_sizes}  # fmt: skip

    def _launch(self, lane: str) -> None:
        if self.launch_s:
            self._free_at[lane] = max(time.perf_counter(), self._free_at[lane]) + self.launch_s

    def max_encode_batch(self, phonemes: int) -> int:
        return max(self.options.encode_batches)

    def encode(self, items, lane: str = "fast") -> np.ndarray:
        """The host side of ``StepRunner.encode``: each item's ids copied into a padded row."""
        ids = np.zeros((len(items), max(len(it.ids) for it in items)), np.int64)
        for row, it in zip(ids, items):
            row[: len(it.ids)] = it.ids
        self._launch(lane)
        return np.full(len(items), self.frames)

    def decode(self, slots, starts, chunk=None, lane: str = "main", after=()) -> np.ndarray:
        self._launch(lane)
        return self._audio[chunk or self.options.chunk_frames][: len(slots)]

    def fetch_async(self, *arrays, lane: str = "main") -> list:
        return list(arrays)

    def busy(self, lane: str) -> bool:
        return time.perf_counter() < self._free_at[lane]

    def wait(self, lane: str) -> None:
        self.wait_event(self._free_at[lane])

    def mark(self, lane: str) -> float:
        """The lane's work so far ends at this ``perf_counter()`` time."""
        return self._free_at[lane]

    def done(self, event: float) -> bool:
        return time.perf_counter() >= event

    def wait_event(self, event: float) -> None:
        if (left := event - time.perf_counter()) > 0:
            time.sleep(left)

    def take_staged(self, lane: str) -> list:
        return []

    def give_staged(self, blocks: list) -> None:
        pass

    def release_staged(self, lane: str | None = None) -> None:
        pass
