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

from pipeline.asr_stage import BatchingAsr
from pipeline.llm_worker import BatchedLlm, SerialLlm
from pipeline.speech import BatchedSpeech, SpeechStage, ThreadedSpeech
from pipeline.voices import Voice, load_voices
from pipeline.workers import ModelWorker
from base.config import DEFAULT_VOICE, Config
from base.errors import ConfigError

log = logging.getLogger(__name__)


def device_used_bytes(index: int = 0) -> int | None:
    """Memory in use on CUDA device ``index`` by all processes, bytes (PyTorch's ``cudaMemGetInfo``);
    None without PyTorch or CUDA."""
    try:
        import torch

        free, total = torch.cuda.mem_get_info(index)
    except Exception:  # noqa: BLE001 - no torch, no CUDA, no device: the share is unknown
        return None
    return total - free


@dataclass
class Engines:
    """Workers owning the models; a stage not in ``cfg.server.stages`` stays None.

    ``loaded`` is False until ``load()`` finishes.
    """

    cfg: Config
    #: ``BatchingAsr``, or ``RemoteAsr`` in a front end whose engine process runs the ASR.
    asr: Any = None
    #: ``BatchedLlm``/``SerialLlm``, ``ServerLlm`` (``llm.backend = "openai"``), or ``RemoteLlm`` in a
    #: front end whose engine process runs the LLM.
    llm: Any = None
    tts: ModelWorker | None = None
    #: The end-of-turn model (``semantic_vad``), loaded with ASR; None: semantic_vad waits for silence.
    turn: ModelWorker | None = None
    #: How sessions get audio (``pipeline.speech``): batched hand-off for engines that batch.
    speech: SpeechStage | None = None
    #: The voices clients may choose, by name (``"default"``: ``speech``; ``tts.voices``).
    voices: dict[str, Voice] = field(default_factory=dict)
    load_s: dict[str, float] = field(default_factory=dict)

    @property
    def stages(self) -> tuple[str, ...]:
        """The configured stages ("asr", "llm", "tts"), ``server.stages``."""
        return self.cfg.server.stages

    @property
    def loaded(self) -> bool:
        return all(getattr(self, stage) is not None for stage in self.stages)

    def not_ready(self) -> str | None:
        """Why a loaded stage cannot serve now (an LLM server that cannot be reached), or None."""
        check = getattr(self.llm, "not_ready", None)
        return check() if check is not None else None

    async def start_llm(self) -> None:
        start = getattr(self.llm, "start", None)  # ServerLlm: the first check of its server
        if start is not None:
            await start()

    def load_sync(self) -> None:
        """Load the configured models (blocking, seconds). Warm each up so the first turn is not slow."""
        cfg = self.cfg
        t0 = time.monotonic()
        from tts_engine.factory import create_engines

        tts = create_engines(cfg) if "tts" in self.stages else []
        for engine in {id(e): e for e in tts}.values():
            for _ in engine.synthesize("Warm up."):
                pass
        self.load_s["tts"] = time.monotonic() - t0
        self._set_turn(self.load_turn_model() if "asr" in self.stages else None)
        self._set_asr_llm(*self._load_asr_llm())
        if tts:
            self._set_tts(tts)
        log.info("models loaded: %s", {k: round(v, 2) for k, v in self.load_s.items()})

    async def load_front_end(self, engine_socket: str, llm_socket: str | None = None) -> None:
        """A front-end process (``server.front_ends`` > 1): the voice's text side loads here and the GPU
        engine is the engine process's, reached at ``engine_socket``; so is the ASR when the engine
        process runs it, and the LLM is the LLM process's at ``llm_socket``
        (``engine_link.engine_stages``); else they load here."""
        from pipeline.engine_link import EngineClient, RemoteAsr, RemoteLlm, RemoteSpeech, SpeechText, engine_stages

        remote = engine_stages(self.cfg)

        def load() -> tuple:
            t0 = time.monotonic()
            text = SpeechText(self.cfg)
            text.sentence_ids("Warm up.")
            self.load_s["tts_text"] = time.monotonic() - t0
            asr = self.load_asr_model() if "asr" in self.stages and "asr" not in remote else None
            llm = self.load_llm_model() if "llm" in self.stages and "llm" not in remote else None
            turn = self.load_turn_model() if "asr" in self.stages else None
            return text, asr, llm, turn

        text, asr, llm, turn = await asyncio.get_running_loop().run_in_executor(None, load)
        link = EngineClient(engine_socket)
        worker = ModelWorker("tts-text", [text], queue_size=self.cfg.tts.queue_size)
        speech = RemoteSpeech(link, text, worker, self.cfg.tts.inline_text_chars)
        remote_asr = RemoteAsr(link) if "asr" in remote else None
        llm_link = EngineClient(llm_socket) if "llm" in remote and llm_socket else None
        remote_llm = RemoteLlm(llm_link) if llm_link is not None else None
        await link.connect()
        if llm_link is not None:
            await llm_link.connect()
        self._set_asr_llm(asr, llm)
        self._set_turn(turn)
        self.asr = remote_asr or self.asr
        self.llm = remote_llm or self.llm
        await self.start_llm()
        self.voices = await asyncio.get_running_loop().run_in_executor(None, load_voices, self.cfg, speech)
        self.tts, self.speech = worker, speech  # last: ``loaded`` turns True
        log.info("front end ready (engine process runs %s): %s", ", ".join(("tts", *remote)),
                 {k: round(v, 2) for k, v in self.load_s.items()})

    def _load_asr_llm(self) -> tuple[Any, Any]:
        asr = self.load_asr_model() if "asr" in self.stages else None
        llm = self.load_llm_model() if "llm" in self.stages else None
        return asr, llm

    def _set_asr_llm(self, asr: Any, llm: Any) -> None:
        if asr is not None:
            self.asr = BatchingAsr(asr, max_batch=self.cfg.asr.max_batch)
        if llm is not None:
            self.llm = self._llm_stage(llm)

    def _llm_stage(self, llm: Any) -> Any:
        """The event loop's side of an LLM engine: a ``ChatServer`` streams on the loop itself, a
        ``BatchedChat`` (``submit``/``step``) gets its batching thread, another engine with
        ``stream(messages, cancel, max_tokens)`` answers one conversation at a time."""
        from llm.chat_completions import ChatServer

        if isinstance(llm, ChatServer):
            from pipeline.server_llm import ServerLlm

            return ServerLlm(llm)
        if hasattr(llm, "step"):
            return BatchedLlm(llm, spare_cores=self.cpu_stages_idle)
        return SerialLlm(llm)

    def cpu_stages_idle(self) -> bool:
        """No ASR, end-of-turn or TTS job queued or running here: the LLM may take more cores
        (``llm.prefill_threads``). Any thread."""
        return all(w is None or w.pending() == 0 for w in (self.asr, self.turn, self.tts))

    def load_asr_model(self) -> Any:
        """The ``Transcriber`` of ``cfg.asr``, warmed up (seconds)."""
        cfg = self.cfg
        t0 = time.monotonic()
        from asr.transcriber import Transcriber
        from asr.zh import postprocess_transcript

        def postprocess(text: str, language: str) -> str:
            return postprocess_transcript(text, language, cfg.asr.zh_simplified)

        on_gpu = cfg.asr.device == "cuda"
        before = device_used_bytes() if on_gpu else None
        asr = Transcriber.from_config(cfg, postprocess=postprocess)
        asr.warmup(batch=cfg.asr.max_batch if on_gpu else 1)
        after = device_used_bytes() if on_gpu else None
        # The ASR's share of the GPU: what the device's used memory grew by while it loaded and ran
        # its warm-up batch (CTranslate2 keeps what it allocated cached for the next calls).
        asr.gpu_bytes = None if before is None or after is None else max(0, after - before)
        budget = cfg.asr.gpu_budget_mb
        if budget and asr.gpu_bytes is not None and asr.gpu_bytes > budget * 2**20:
            raise ConfigError(
                f"the ASR took {asr.gpu_bytes / 2**20:.0f} MiB of GPU memory at start-up (model + a warm-up "
                f"batch of {cfg.asr.max_batch}), over asr.gpu_budget_mb = {budget}: lower asr.max_batch, use "
                "asr.compute_type = 'int8_float16', or raise the budget")
        if asr.gpu_bytes is not None:
            log.info("ASR on the GPU: %.0f MiB (model + a warm-up batch of %d)", asr.gpu_bytes / 2**20,
                     cfg.asr.max_batch)
        self.load_s["asr"] = time.monotonic() - t0
        return asr

    def load_turn_model(self) -> Any:
        """The end-of-turn model (``semantic_vad``), warmed up; it runs where the sessions are (small, CPU)."""
        t0 = time.monotonic()
        from asr.end_of_turn import EndOfTurnModel

        model = EndOfTurnModel.from_config(self.cfg)
        model.warmup()
        self.load_s["turn"] = time.monotonic() - t0
        return model

    def _set_turn(self, model: Any) -> None:
        if model is not None:
            self.turn = ModelWorker("turn", [model], queue_size=64)

    def load_llm_model(self) -> Any:
        """The ``BatchedChat`` of ``cfg.llm``, its system prompt evaluated and warmed up (seconds);
        with ``llm.backend = "openai"`` a ``ChatServer`` (nothing loads here; ``start`` checks it)."""
        t0 = time.monotonic()
        if self.cfg.llm.backend == "openai":
            from llm.chat_completions import ChatServer

            return ChatServer(self.cfg)
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
        await self.start_llm()

    def close(self) -> None:
        for w in (self.asr, self.turn, self.llm, self.tts, *(v.worker for v in self.voices.values())):
            if w is not None:
                w.close()

    @classmethod
    def from_parts(cls, cfg: Config, asr: Any, llm: Any, tts: list[Any], turn: Any = None) -> "Engines":
        """Engines around ready-made engine objects (tests inject fakes for orchestration).

        ``asr``/``llm`` None: that stage is absent (match ``cfg.server.stages``); ``turn`` (an object with
        ``score(pcm16k) -> probability``) None: no end-of-turn model. ``llm`` as ``_llm_stage`` takes it
        (a ``ChatServer`` is checked by ``await e.start_llm()``).
        """
        e = cls(cfg)
        e.asr = None if asr is None else BatchingAsr(asr, max_batch=cfg.asr.max_batch)
        e._set_turn(turn)
        if llm is not None:
            e.llm = e._llm_stage(llm)
        if tts:
            e._set_tts(tts)
        return e

    def _set_tts(self, engines: list[Any]) -> None:
        """The TTS worker, speech stage and voices. A batching engine (one object, ``submit_sentences``)
        gets one text front-end thread and bulk hand-off; others one worker thread per engine instance."""
        batching = len({id(e) for e in engines}) == 1 and hasattr(engines[0], "submit_sentences")
        if batching:
            worker = ModelWorker("tts-text", engines[:1], queue_size=self.cfg.tts.queue_size)
            speech: SpeechStage = BatchedSpeech(engines[0], worker, self.cfg.tts.inline_text_chars)
        else:
            worker = ModelWorker("tts", engines, queue_size=self.cfg.tts.queue_size)
            speech = ThreadedSpeech(worker)
        self.voices = load_voices(self.cfg, speech)
        self.speech, self.tts = speech, worker  # last: ``loaded`` turns True

    def voice(self, name: str | None) -> Voice:
        """The voice called ``name`` (None: the default); the protocol refused other names already."""
        return self.voices[name or DEFAULT_VOICE]
