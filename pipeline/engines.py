"""The shared model workers of one server process: ASR, LLM, TTS (and the segmenter factory).

Models load once per process and are shared by every session; each is owned by a
``ModelWorker``. Loading happens off the event loop so ``/health`` answers at once
and ``/ready`` turns 200 when the configured stages (``server.stages``) are loaded.
A stage that is not configured is never imported: a TTS-only server (``["tts"]``)
runs without faster-whisper and llama-cpp-python installed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from pipeline.llm_worker import BatchedLlm, SerialLlm
from pipeline.speech import BatchedSpeech, SpeechStage, ThreadedSpeech
from pipeline.workers import ModelWorker
from voxloop.config import Config

log = logging.getLogger(__name__)


@dataclass
class Engines:
    """Workers owning the models; a stage not in ``cfg.server.stages`` stays None.

    ``loaded`` is False until ``load()`` finishes.
    """

    cfg: Config
    asr: ModelWorker | None = None
    llm: BatchedLlm | SerialLlm | None = None
    tts: ModelWorker | None = None
    #: The end-of-turn model (``semantic_vad``), loaded with ASR; None: semantic_vad waits for silence.
    turn: ModelWorker | None = None
    #: How sessions get audio (``pipeline.speech``): batched hand-off for engines that batch.
    speech: SpeechStage | None = None
    load_s: dict[str, float] = field(default_factory=dict)

    @property
    def stages(self) -> tuple[str, ...]:
        """The configured stages ("asr", "llm", "tts"), ``server.stages``."""
        return self.cfg.server.stages

    @property
    def loaded(self) -> bool:
        return all(getattr(self, stage) is not None for stage in self.stages)

    def load_sync(self) -> None:
        """Load the configured models (blocking, seconds). Warm each up so the first turn is not slow."""
        cfg = self.cfg
        t0 = time.monotonic()
        from tts_engine.factory import create_engines

        tts = create_engines(cfg)
        for engine in {id(e): e for e in tts}.values():
            for _ in engine.synthesize("Warm up."):
                pass
        self.load_s["tts"] = time.monotonic() - t0
        self._set_asr_llm(*self._load_asr_llm())
        self._set_tts(tts)
        log.info("models loaded: %s", {k: round(v, 2) for k, v in self.load_s.items()})

    async def load_front_end(self, engine_socket: str) -> None:
        """A front-end process (``server.front_ends`` > 1): the voice's text side loads here and the GPU
        engine is the engine process's, reached at ``engine_socket``; ASR and LLM, if configured, load here."""
        from pipeline.engine_link import RemoteSpeech, SpeechText

        def load() -> tuple:
            t0 = time.monotonic()
            text = SpeechText(self.cfg)
            text.sentence_ids("Warm up.")
            self.load_s["tts_text"] = time.monotonic() - t0
            return (text, *self._load_asr_llm())

        text, asr, llm = await asyncio.get_running_loop().run_in_executor(None, load)
        worker = ModelWorker("tts-text", [text], queue_size=self.cfg.tts.queue_size)
        speech = RemoteSpeech(engine_socket, text, worker)
        await speech.connect()
        self._set_asr_llm(asr, llm)
        self.tts, self.speech = worker, speech  # last: ``loaded`` turns True
        log.info("front end ready: %s", {k: round(v, 2) for k, v in self.load_s.items()})

    def _load_asr_llm(self) -> tuple[Any, Any]:
        """ASR (with the end-of-turn model beside it) and LLM; blocking."""
        asr = (self._load_asr(), self._load_turn()) if "asr" in self.stages else None
        llm = self._load_llm() if "llm" in self.stages else None
        return asr, llm

    def _set_asr_llm(self, asr: Any, llm: Any) -> None:
        if asr is not None:
            asr, turn = asr
            self.turn = ModelWorker("turn", [turn], queue_size=64)
            self.asr = ModelWorker("asr", [asr], queue_size=64)
        if llm is not None:
            self.llm = BatchedLlm(llm)

    def _load_asr(self) -> Any:
        cfg = self.cfg
        t0 = time.monotonic()
        from asr.transcriber import Transcriber
        from asr.zh import postprocess_transcript

        def postprocess(text: str, language: str) -> str:
            return postprocess_transcript(text, language, cfg.asr.zh_simplified)

        asr = Transcriber.from_config(cfg, postprocess=postprocess)
        asr.warmup()
        self.load_s["asr"] = time.monotonic() - t0
        return asr

    def _load_turn(self) -> Any:
        t0 = time.monotonic()
        from asr.end_of_turn import EndOfTurnModel

        model = EndOfTurnModel.from_config(self.cfg)
        model.warmup()
        self.load_s["turn"] = time.monotonic() - t0
        return model

    def _load_llm(self) -> Any:
        t0 = time.monotonic()
        from llm.batched import BatchedChat, ReplyOptions

        llm = BatchedChat.from_config(self.cfg)  # evaluates the system prompt's KV once
        llm.generate("warmup", [{"role": "user", "content": "Hello!"}], ReplyOptions(max_tokens=4))
        llm.release("warmup")
        r = llm.report()
        log.info("LLM: %d sequences x %d tokens; weights %.0f MiB, KV cache %.0f MiB", r["sequences"],
                 self.cfg.llm.n_ctx, r["weights_bytes"] / 2**20, r["kv_bytes"] / 2**20)
        self.load_s["llm"] = time.monotonic() - t0
        return llm

    async def load(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.load_sync)

    def close(self) -> None:
        for w in (self.asr, self.turn, self.llm, self.tts):
            if w is not None:
                w.close()

    @classmethod
    def from_parts(cls, cfg: Config, asr: Any, llm: Any, tts: list[Any], turn: Any = None) -> "Engines":
        """Engines around ready-made engine objects (tests inject fakes for orchestration).

        ``asr``/``llm`` None: that stage is absent (match ``cfg.server.stages``); ``turn`` (an object with
        ``score(pcm16k) -> probability``) None: no end-of-turn model. An ``llm`` with
        ``submit``/``step`` (a ``BatchedChat``) gets its batching thread; one with
        ``stream(messages, cancel, max_tokens)`` answers one conversation at a time.
        """
        e = cls(cfg)
        e.asr = None if asr is None else ModelWorker("asr", [asr])
        e.turn = None if turn is None else ModelWorker("turn", [turn])
        if llm is not None:
            e.llm = BatchedLlm(llm) if hasattr(llm, "step") else SerialLlm(llm)
        e._set_tts(tts)
        return e

    def _set_tts(self, engines: list[Any]) -> None:
        """The TTS worker and speech stage. A batching engine (one object, ``submit_sentences``) gets
        one text front-end thread and bulk hand-off; others one worker thread per engine instance."""
        batching = len({id(e) for e in engines}) == 1 and hasattr(engines[0], "submit_sentences")
        if batching:
            self.tts = ModelWorker("tts-text", engines[:1], queue_size=self.cfg.tts.queue_size)
            self.speech = BatchedSpeech(engines[0], self.tts)
        else:
            self.tts = ModelWorker("tts", engines, queue_size=self.cfg.tts.queue_size)
            self.speech = ThreadedSpeech(self.tts)
