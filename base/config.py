"""Configuration: frozen dataclasses loaded from TOML, overridden by env and CLI.

Precedence (last wins): dataclass defaults < TOML file < ``VOXLOOP_SECTION__KEY``
environment variables < ``--set section.key=value`` CLI overrides.

Every field has a docstring-style comment (``#:``) saying what it is and its unit.
``None`` means "the model's own default". Unknown sections or keys are errors that
name the offending key, so a typo never silently does nothing.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from base.errors import ConfigError

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
ENV_PREFIX = "VOXLOOP_"
#: The model stages a server can run (``server.stages``).
STAGES = ("asr", "llm", "tts")
#: ``llm.backend`` values: the in-process engine, or an OpenAI-compatible server.
LLM_BACKENDS = ("llama.cpp", "openai")
#: How finely the GPU engine's captured batch sizes step (``tts.batch_buckets``,
#: ``tts.encode_batch_buckets``; ``tts_engine.torch_vits.runner.batch_buckets``).
BATCH_BUCKET_LEVELS = ("coarse", "fine", "finer")
#: ``tts.precision`` values: the GPU engine's flow and decoder in float32, bfloat16, float16, or int8
#: convolutions in the decoder (the rest float16); the encoder always runs in float32.
PRECISIONS = ("fp32", "bf16", "fp16", "int8")
#: Most fast lanes of the GPU TTS engine (``tts.fast_lanes``).
MAX_FAST_LANES = 4
#: ``tts.text_encoder_products`` values: the text encoder's feed-forward products through cuBLAS (bit for
#: bit) or as Triton convolutions skipping padding, in ``tl.dot``'s precisions
#: (``tts_engine.torch_vits.kernels.fused_ffn.PRODUCTS``; a copy, so that the config loads no torch).
TEXT_ENCODER_PRODUCTS = ("cublas", "ieee", "tf32x3", "tf32", "fp16x3")

#: What ``server.allowed_origins`` entries look like (besides ``*``): no path, query or user.
_ORIGIN = re.compile(r"https?://(\[[0-9A-Fa-f:.]+\]|[^\s/?#@:\[\]]+)(:\d{1,5})?", re.IGNORECASE)


@dataclass(frozen=True)
class ServerConfig:
    #: Interface to bind.
    host: str = "127.0.0.1"
    #: TCP port; 0 picks a free port (tests).
    port: int = 8765
    #: Seconds that in-flight turns may take to finish on SIGINT/SIGTERM before sessions are closed (1001).
    shutdown_grace_s: float = 10.0
    #: Optional bearer token required in ``Authorization: Bearer …``; None disables auth.
    auth_token: str | None = None
    #: Browser origins allowed beyond the default (the server's own page and loopback pages:
    #: ``http(s)://localhost``, ``127.0.0.1``, ``[::1]``, any port), each ``scheme://host[:port]``;
    #: ``"*"`` allows every web page the user visits to use this server (cross-site WebSocket
    #: hijacking), so pair it with ``auth_token``. Clients without an ``Origin`` header (not
    #: browsers) are never affected. See pipeline/origin.py.
    allowed_origins: tuple[str, ...] = ()
    #: Directory served at ``/``; None means the bundled ``web_client/``.
    web_root: str | None = None
    #: Model stages this server loads and runs, any of "asr", "llm", "tts"; "llm" needs "tts" (replies
    #: are spoken). ``["tts"]`` is a TTS-only server: ``x.tts.speak`` works, faster-whisper and
    #: llama.cpp are never imported, and events that need a missing stage (audio input needs asr + llm,
    #: ``response.create`` needs llm, ``x.tts.speak`` tts) get an ``unsupported_event_type`` error.
    #: ``["llm", "tts"]`` is a text chat server (no ASR); ``["asr"]`` (or ``["asr", "tts"]``) a
    #: transcription server: transcription sessions work, no LLM is loaded.
    stages: tuple[str, ...] = ("asr", "llm", "tts")
    #: Longest audio delta sent, ms of audio (``response.output_audio.delta`` / ``x.tts.audio.delta``).
    #: Fewer, larger deltas cost the server less per second of audio (one serialization and one
    #: socket write each); barge-in is unaffected (the server stops sending at once, the client
    #: drops what it queued). 20..1000.
    audio_delta_ms: int = 100
    #: WebSocket front-end processes. 1: one process does everything. N > 1 (``tts.backend =
    #: "cuda"``, Linux): this process owns the GPU engine and starts N front ends that share the
    #: port (SO_REUSEPORT) and each run sessions, text front end, resampling and JSON; they send
    #: TTS work to the engine process and get each GPU step's audio back in one message.
    #: ``limits.max_sessions`` counts across them; ``/metrics`` of any of them sums all of them.
    front_ends: int = 1
    #: With ``front_ends`` > 1: the stages besides TTS that the engine process runs for every front end
    #: (one CUDA context; every session's utterances and replies batch together), any of "asr", "llm".
    #: Unset: the stages configured on the GPU (``asr.device = "cuda"``, ``llm.n_gpu_layers != 0``);
    #: the others load in each front end.
    engine_stages: tuple[str, ...] | None = None
    #: Once the models are loaded, collect and ``gc.freeze()`` every object alive in each serving
    #: process (engine, front ends, LLM process), so Python's full garbage collections skip the
    #: loaded libraries and models (PyTorch, the voice, the graphs; a full collection holds
    #: every thread of its process). Off by default: on the H200 (uncompiled engine) the engine process
    #: still made full collections of 19-125 ms (per 10 s of served load) with it, and that run
    #: served less than the runs without it (commit 5f2aac7, docs/benchmarks.md 2026-12-02);
    #: not measured side by side. configs/gpu.toml turns it on: measured with the compiled engine, whose
    #: full collections took 553-979 ms without it (the engine it ships is not compiled, and its full
    #: collections run only while idle, ``gc_full``). ``/metrics``: ``voxloop_gc_pause_seconds`` either way.
    gc_freeze: bool = False
    #: When Python's full garbage collections run in each serving process: "auto" (the interpreter's
    #: own thresholds, whatever runs at the time) or "idle": only while the process has no work in
    #: flight (the engine process: no TTS request in the GPU scheduler and no utterance at the ASR;
    #: the LLM process: no reply; a front end or single server: nothing queued at any stage) and only
    #: when Python itself would run one, at most every 5 s and at the latest every 300 s under unbroken
    #: load (``pipeline.gc_pauses.IdleCollector``). configs/gpu.toml: "idle".
    gc_full: str = "auto"
    #: Python's thread switch interval in each serving process, ms (``sys.setswitchinterval``): how
    #: long a thread that wants the interpreter lock waits before it asks the running one to let go.
    #: Unset: Python's own 5 ms. The engine process's link threads wait that long behind the GPU
    #: scheduler's Python work before they send a finished chunk. 0.05..100. 0.5 ms on an H200
    #: gave no consistent gain over 5 ms in two pairs of runs (commit 529979d).
    switch_interval_ms: float | None = None

    def __post_init__(self) -> None:
        bad = [o for o in self.allowed_origins if o != "*" and not _ORIGIN.fullmatch(o)]
        if bad:
            raise ConfigError(f"server.allowed_origins: {bad} are not origins; write scheme://host[:port] "
                              '(e.g. https://voice.example.com) or "*" for any')
        if self.engine_stages is not None and not set(self.engine_stages) <= {"asr", "llm"}:
            raise ConfigError(f"server.engine_stages: any of 'asr', 'llm'; got {list(self.engine_stages)}")
        if not 1 <= self.front_ends <= 64:
            raise ConfigError(f"server.front_ends must be 1..64, got {self.front_ends}")
        if self.switch_interval_ms is not None and not 0.05 <= self.switch_interval_ms <= 100:
            raise ConfigError(f"server.switch_interval_ms must be 0.05..100 (ms), got {self.switch_interval_ms}")
        if self.gc_full not in ("auto", "idle"):
            raise ConfigError(f"server.gc_full must be 'auto' or 'idle', got {self.gc_full!r}")
        if not 20 <= self.audio_delta_ms <= 1000:
            raise ConfigError(f"server.audio_delta_ms must be 20..1000 ms, got {self.audio_delta_ms}")
        unknown = sorted(set(self.stages) - set(STAGES))
        if unknown:
            raise ConfigError(f"server.stages: unknown stage(s) {unknown}; known: {', '.join(STAGES)}")
        if not self.stages:
            raise ConfigError("server.stages: at least one of 'asr', 'llm', 'tts'")
        if "llm" in self.stages and "tts" not in self.stages:
            raise ConfigError("server.stages: 'llm' needs 'tts' (replies are spoken)")


@dataclass(frozen=True)
class LimitsConfig:
    #: Concurrent sessions; over it the upgrade gets HTTP 503 with Retry-After.
    max_sessions: int = 16
    #: Seconds sent in ``Retry-After`` when full.
    retry_after_s: int = 5
    #: Largest WebSocket message accepted, bytes (base64 audio included).
    max_message_bytes: int = 1_048_576
    #: Longest utterance kept for ASR, seconds; longer speech is committed at this length.
    max_utterance_s: float = 30.0
    #: A session is closed (1008) after this many minutes.
    max_session_minutes: float = 60.0
    #: Outgoing messages buffered per client (the last quarter, at most 64, kept for events other
    #: than audio, which waits for room: a slow client slows its speech down); full: closed (1008).
    send_queue_messages: int = 512
    #: A client that takes no message for this long while its audio waits for room is not reading:
    #: closed (1008), seconds.
    send_stall_s: float = 30.0
    #: Characters accepted in one text input / x.tts.speak request.
    max_text_chars: int = 20_000

    def __post_init__(self) -> None:
        if self.send_queue_messages < 32:  # a reply's closing events (up to 8) must fit in the reserve
            raise ConfigError(f"limits.send_queue_messages must be at least 32, got {self.send_queue_messages}")
        if not self.send_stall_s > 0:
            raise ConfigError(f"limits.send_stall_s must be positive seconds, got {self.send_stall_s}")


@dataclass(frozen=True)
class VadConfig:
    #: webrtcvad aggressiveness 0 (least) … 3 (most aggressive at calling audio non-speech).
    aggressiveness: int = 2
    #: Frame length fed to webrtcvad, ms (10, 20 or 30).
    frame_ms: int = 30
    #: Consecutive voiced frames needed to declare speech start.
    start_frames: int = 3
    #: Silence that ends a turn, ms.
    silence_duration_ms: int = 500
    #: Audio kept before the detected speech start, ms.
    prefix_padding_ms: int = 300
    #: Pause after which ASR starts speculatively (discarded if speech resumes), ms; 0 disables.
    speculative_pause_ms: int = 150
    #: Speech must last this long during assistant playback to count as barge-in, ms (ignores coughs).
    barge_in_min_ms: int = 250
    #: A frame webrtcvad calls voiced is silence when within this many dB of the noise floor (its
    #: hangover after a word's end); 0 turns the gate off. 0..20 dB.
    noise_gate_db: float = 3.0


@dataclass(frozen=True)
class TurnConfig:
    """End of turn (``semantic_vad``) and false interruptions; see docs/protocol.md."""

    #: smart-turn v3 ONNX file; None resolves the bundled one (``pipecat-ai`` package).
    model_path: str | None = None
    #: onnxruntime intra-op threads per end-of-turn scoring call.
    threads: int = 1
    #: ``semantic_vad``: the short pause after speech at which the end-of-turn model scores the
    #: utterance and the speculative turn starts, ms (rounded up to whole VAD frames: 150 is 5 frames
    #: of 30 ms, 150 ms; 160 would wait 180). ``server_vad`` uses ``vad.speculative_pause_ms``.
    #: Shorter answers sooner; each pause inside a sentence that long is scored too.
    pause_ms: int = 150
    #: ``semantic_vad``: a shorter pause after speech at which the speculative turn already starts
    #: (ASR, then the LLM; nothing is sent before the commit), ms (whole VAD frames); the score, and
    #: so the commit, still wait for ``pause_ms``. Speech resuming in between drops it (a wasted ASR
    #: run). None, or anything >= ``pause_ms``: at ``pause_ms``. 2 cores, 1 talker: with 60 the
    #: transcript (and the LLM's start) came 120-160 ms sooner than with 150 (docs/benchmarks.md, "Turn taking").
    asr_pause_ms: int | None = 60
    #: ``semantic_vad`` with ``asr_pause_ms`` shorter than ``pause_ms``: the end-of-turn score is
    #: asked at ``asr_pause_ms`` already, with the speculative turn. Only a complete score (``>=
    #: complete``, the words not capping it) is used: the turn commits once the silence reaches
    #: ``pause_ms``, without waiting for the model's run there (43 ms on the H200 host's CPU). Any
    #: other early score is dropped and the score asked again at ``pause_ms``, as with false (that
    #: one sets the wait for silence): the early score hears 60 ms of silence after the last word and
    #: is lower on average (mean -0.12 against one at 120 ms), which would make unsure turns wait
    #: longer. On bench/turn_set.py's 48 pauses (bench/results/turn_score_early-intel-r-xeon-r-processor-2c-2026-12-02.json)
    #: this rule changes the decision of 1 against a score at 120 or 150 ms for auto/medium (the end
    #: of a clip, committed sooner), 0 for high, 1 for low (also an end); scoring only early would
    #: change 2, 0 (8 vs 150 ms), 5. Cost: a second score on pauses the early one finds incomplete
    #: (auto: 33 of 48), nearly all of which then wait for silence (>= 500 ms).
    score_early: bool = True
    #: ``semantic_vad``, eagerness medium/auto: longest silence waited while the model says the
    #: user is not done, ms (low waits 1.5x, high 0.5x; never less than the silence stop).
    max_silence_ms: int = 2000
    #: ``semantic_vad``: speech during a reply first pauses it (``x.output_audio_buffer.paused``);
    #: a cough, "mm-hm" or noise resumes it, words cancel it. ``server_vad`` always cancels.
    pause_on_speech: bool = True
    #: A paused reply is cancelled once the speech over it lasts this long, words or not, ms.
    pause_max_speech_ms: int = 1000
    #: ``semantic_vad``: also score the end of turn from the words, with the LLM (llm/end_of_turn.py):
    #: the speculative transcript without its closing punctuation, read from the speculative reply's
    #: own prompt; the probability that the next token ends the sentence. False (or a GGUF whose
    #: chat template gives no prompt): the sound alone decides.
    score_words: bool = True
    #: ``semantic_vad`` with ``score_words``: the words' score at or above which the sentence is over.
    #: A turn is answered at the short pause only when the sound says complete and the words reach
    #: this. Higher: fewer sentences answered half-way, more finished ones wait ``long_stop_ms``
    #: (docs/protocol.md, "Tuning the end of turn").
    words_threshold: float = 0.03
    #: ``semantic_vad`` with ``score_words``: silence waited at least when the words are not done,
    #: and when they are but the sound doubts and the words are under ``words_sure``, ms. Keep it
    #: above the longest pause your users make inside a sentence (bench/turn_set.py's paused
    #: sentences: up to 900 ms). Speech over a paused reply that starts this soon after the user's
    #: last turn continues that turn, even an acknowledgement ("No, [pause] thanks.").
    long_stop_ms: int = 1200
    #: ``semantic_vad`` with ``score_words``: the words' score at or above which a turn the sound
    #: doubts waits only as long as the sound says (at most ``long_stop_ms``); finished words under
    #: it wait ``long_stop_ms``. 0.5: the model finds the end more likely than not. With the bundled
    #: model every head of bench/turn_set.py's paused sentences scores under it in its conversation,
    #: including those finished in their words ("Remind me to water the plants" 0.40, "My flight was
    #: cancelled" 0.31, whisper's "Book me a table" 0.11); docs/protocol.md, "Tuning the end of turn".
    words_sure: float = 0.5
    #: Speech that starts within this long of the end of a committed turn's speech, and is a turn
    #: (words), continues it: the reply is stopped, both parts become one user message and the whole
    #: is answered (docs/protocol.md, "Mended turns"), ms; 0: never.
    mend_ms: int = 2000

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ConfigError(f"turn.threads must be >= 1, got {self.threads}")
        if not 0.0 <= self.words_threshold <= 1.0:
            raise ConfigError(f"turn.words_threshold must be 0..1, got {self.words_threshold}")
        if not self.words_threshold <= self.words_sure <= 1.0:
            raise ConfigError(f"turn.words_sure must be turn.words_threshold..1, got {self.words_sure}")
        if self.long_stop_ms < 1 or self.mend_ms < 0:
            raise ConfigError("turn.long_stop_ms must be > 0 and turn.mend_ms >= 0")
        if self.max_silence_ms < 1 or self.pause_max_speech_ms < 1 or self.pause_ms < 1:
            raise ConfigError("turn.pause_ms, turn.max_silence_ms and turn.pause_max_speech_ms must be > 0")
        if self.asr_pause_ms is not None and self.asr_pause_ms < 1:
            raise ConfigError(f"turn.asr_pause_ms must be > 0 (none: at turn.pause_ms), got {self.asr_pause_ms}")


@dataclass(frozen=True)
class AsrConfig:
    #: CTranslate2 model directory; None resolves the bundled whisper base.
    model_path: str | None = None
    #: "cpu" or "cuda".
    device: str = "cpu"
    #: CTranslate2 compute type (int8, int8_float16, float16, float32).
    compute_type: str = "int8"
    #: Beam size; 1 is greedy (fastest).
    beam_size: int = 1
    #: Language code (e.g. "en", "zh"); None lets whisper detect it.
    language: str | None = "en"
    #: CPU threads for CTranslate2; 0 lets it choose.
    cpu_threads: int = 0
    #: Interval between partial transcripts while the user speaks, ms; 0 disables partials.
    partial_interval_ms: int = 1000
    #: Convert Traditional to Simplified Chinese in transcripts when language is zh.
    zh_simplified: bool = True
    #: Most utterances transcribed in one batched call (of sessions that ended a turn at about the same
    #: time: one encoder pass and one greedy decode for all). 1: one at a time, as fast on a CPU; on a
    #: GPU 8 utterances cost about twice one (configs/gpu.toml).
    max_batch: int = 1
    #: With ``device = "cuda"``: most GPU memory, MiB, that loading the ASR and a warm-up batch of
    #: ``max_batch`` utterances may take; more refuses start-up (0: no limit). What it took is in
    #: ``/metrics`` either way (``voxloop_asr_gpu_bytes``).
    gpu_budget_mb: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.max_batch <= 256:
            raise ConfigError(f"asr.max_batch must be 1..256, got {self.max_batch}")
        if self.gpu_budget_mb < 0:
            raise ConfigError(f"asr.gpu_budget_mb must be >= 0 (0: no limit), got {self.gpu_budget_mb}")


@dataclass(frozen=True)
class LlmConfig:
    #: Where replies come from: "llama.cpp" (in this process: the GGUF of ``model_path``, every
    #: conversation batched on one context) or "openai": any OpenAI-compatible
    #: ``/v1/chat/completions`` server (llama.cpp's llama-server, Ollama, vLLM, LM Studio, a hosted
    #: API) at ``base_url``, sent each conversation's whole history for each reply. With "openai"
    #: no model loads here: ``max_tokens``, ``temperature``, ``seed`` and ``system_prompt`` still
    #: apply, ``n_ctx`` is the server model's context (the history is cut to fit it), the other
    #: keys are the in-process engine's.
    backend: str = "llama.cpp"
    #: With ``backend = "openai"``: the server's API root, up to and including ``/v1``
    #: (e.g. ``http://127.0.0.1:8080/v1``).
    base_url: str | None = None
    #: With ``backend = "openai"``: the model the server is asked for; None: the first one its
    #: ``/models`` lists (llama-server, llama-cpp-python's server and LM Studio serve one).
    model: str | None = None
    #: With ``backend = "openai"``: the environment variable holding the API key (never the key
    #: itself in a file); unset or empty: requests carry no key (local servers need none).
    api_key_env: str = "OPENAI_API_KEY"
    #: With ``backend = "openai"``: longest wait for a connection to the server, seconds (also
    #: the whole of a ``/ready`` check).
    connect_timeout_s: float = 5.0
    #: With ``backend = "openai"``: longest wait for the next piece of a reply, the first one
    #: included (the server reads the prompt meanwhile), seconds; over it the reply fails
    #: (``model_error``).
    read_timeout_s: float = 30.0
    #: GGUF file; None resolves the bundled SmolLM2-135M-Instruct. Any chat (instruct) GGUF with a
    #: ``tokenizer.chat_template``: prompts are rendered with it, a run of same-role messages joined into
    #: one, and the system prompt folded into the first user turn when the template refuses a system role.
    model_path: str | None = None
    #: Context window of one conversation, tokens (history beyond it is cut, oldest first).
    n_ctx: int = 2048
    #: Conversations whose KV cache is kept at once (one llama.cpp sequence each, kept across their
    #: turns; the context holds ``(max_sequences + 1) * n_ctx`` tokens: SmolLM2-135M needs 23 KB of
    #: KV per token). More sessions than this share the sequences, least recently used first.
    max_sequences: int = 8
    #: Most tokens one ``llama_decode`` step evaluates: one per generating reply, the rest prompt
    #: chunks of replies still reading their prompt. Must be >= ``max_sequences``. On CPU keep it
    #: <= 48: llama.cpp's CPU kernels change path for larger batches and the logits then differ
    #: from one conversation's alone (by ~1), so greedy replies would depend on the batch.
    batch_tokens: int = 32
    #: CPU threads for llama.cpp; 0 lets it choose.
    n_threads: int = 0
    #: CPU threads for a step that reads prompt tokens while no ASR, end-of-turn or TTS job is queued
    #: or running in the process (a turn's first token waits for that step); 0 (or <= the LLM's
    #: threads): the LLM's threads. More threads than idle cores stall the step (llama.cpp waits for
    #: its slowest thread), so keep it <= the cores.
    prefill_threads: int = 0
    #: Layers offloaded to GPU (needs a CUDA build of llama-cpp-python); 0 = CPU only.
    n_gpu_layers: int = 0
    #: Reply length cap, tokens.
    max_tokens: int = 160
    #: Sampling temperature.
    temperature: float = 0.2
    #: System prompt used when the session sets no instructions.
    system_prompt: str = (
        "You are a helpful voice assistant. Answer in one or two short spoken sentences."
    )
    #: Seed for sampling; None is random.
    seed: int | None = 1234
    #: The LLM's fixed memory, MiB: weights + the KV cache of every sequence (on the GPU with
    #: ``n_gpu_layers``, else in RAM). Start-up fails over it, before the KV cache is allocated,
    #: naming what to lower. 0: no limit. ``/metrics``: ``voxloop_llm_memory_bytes``.
    memory_budget_mb: int = 0

    def __post_init__(self) -> None:
        if self.backend not in LLM_BACKENDS:
            raise ConfigError(f"llm.backend must be one of {', '.join(map(repr, LLM_BACKENDS))}, got {self.backend!r}")
        if self.base_url and not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"llm.base_url must be an http:// or https:// URL, got {self.base_url!r}")
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise ConfigError("llm.connect_timeout_s and llm.read_timeout_s must be > 0 s, got "
                              f"{self.connect_timeout_s} and {self.read_timeout_s}")
        if self.prefill_threads < 0:
            raise ConfigError(f"llm.prefill_threads must be >= 0 (0: the LLM's threads), got {self.prefill_threads}")
        if self.memory_budget_mb < 0:
            raise ConfigError(f"llm.memory_budget_mb must be >= 0 (0: no limit), got {self.memory_budget_mb}")
        if not 1 <= self.max_sequences <= 254:  # llama.cpp's 256 sequences: one for the system prompt, one for probes
            raise ConfigError(f"llm.max_sequences must be 1..254, got {self.max_sequences}")
        if self.batch_tokens < self.max_sequences:
            raise ConfigError(f"llm.batch_tokens ({self.batch_tokens}) must be >= llm.max_sequences "
                              f"({self.max_sequences}): every generating conversation takes one token per step")


@dataclass(frozen=True)
class VoiceSpec:
    """One named voice of ``tts.voices``: a Piper voice file and the settings it speaks with."""

    #: The name clients choose it by (``audio.output.voice``, ``x.tts.speak``'s ``voice``).
    name: str
    #: Piper voice ONNX file (its JSON config beside it); None: the server's voice (``tts.voice_path``).
    path: str | None = None
    #: Speaker of a multi-speaker voice; None: the server's ``tts.speaker_id``.
    speaker_id: int | None = None
    #: Length scale (>1 slower); None: the server's ``tts.length_scale``, else the voice's own.
    length_scale: float | None = None
    #: Noise scale; None: the server's ``tts.noise_scale``, else the voice's own.
    noise_scale: float | None = None
    #: Noise width (duration noise); None: the server's ``tts.noise_w``, else the voice's own.
    noise_w: float | None = None

    def __post_init__(self) -> None:
        if not self.name or self.name == DEFAULT_VOICE:
            raise ConfigError(f"tts.voices: each voice needs a name other than {DEFAULT_VOICE!r} "
                              f"(the server's own voice), got {self.name!r}")


#: The name of the server's own voice (``tts.voice_path``, else the bundled one).
DEFAULT_VOICE = "default"


@dataclass(frozen=True)
class TtsConfig:
    #: Piper voice ONNX file; None resolves the bundled en_US-joe-medium.
    voice_path: str | None = None
    #: Voice JSON config; None means ``<voice_path>.json``.
    voice_config_path: str | None = None
    #: "onnx" (CPU, onnxruntime) or "cuda" (PyTorch VITS).
    backend: str = "onnx"
    #: onnxruntime intra-op threads per session; 0 lets it choose.
    onnx_threads: int = 1
    #: Parallel onnxruntime sessions (workers) on CPU.
    onnx_workers: int = 1
    #: Precision of the GPU engine's flow and decoder (``PRECISIONS``): "fp32" (exact), "bf16", "fp16"
    #: (configs/gpu.toml: as fast as bf16 on the H200, SNR against fp32 >= 39 dB, bf16 ~20 dB) or "int8"
    #: (the decoder's convolutions in int8, the rest fp16: slower than fp16 on the H200).
    precision: str = "fp32"
    #: Device of the "cuda" backend (PyTorch VITS): "cuda", "cuda:N", or "cpu" (eager, no CUDA
    #: graphs: slow, for tests and for trying the GPU serving path on a machine without one).
    device: str = "cuda"
    #: CPU (onnx): speak each sentence in decoder chunks, first audio after the first chunk instead of
    #: the whole sentence, for ~20% more CPU per sentence; runs the voice exported once as chunked
    #: ONNX, which needs PyTorch (``voxloop models`` exports it). GPU (cuda) always streams.
    streaming: bool = False
    #: CPU (onnx), with ``streaming = false``: speak the first clause of each reply in decoder chunks
    #: (its first audio is what the user waits for) and the rest as whole sentences (cheaper, made
    #: while earlier audio plays). Loads the chunked export beside the whole-sentence voice.
    stream_first_clause: bool = False
    #: First decoder chunk of a clause, latent frames (one frame = hop samples: 64 = 0.74 s at 22050 Hz).
    chunk_frames: int = 64
    #: Largest later chunk, frames; 0 = the backend's default (GPU: chunk_frames; CPU: 512). Bigger
    #: chunks spend less work on context frames.
    tail_chunk_frames: int = 0
    #: Largest batch on GPU.
    max_batch: int = 64
    #: Longest utterance on GPU, latent frames (256 samples each at 22050 Hz: 3072 = 35.7 s); longer is cut.
    max_frames: int = 3072
    #: Capture the GPU steps as CUDA graphs at start-up (False: eager, for debugging).
    cuda_graphs: bool = True
    #: GPU decoder batch sizes captured as CUDA graphs (``tts_engine.torch_vits.runner.batch_buckets``):
    #: "fine" (powers of two, every multiple of 8 up to 64 and of 16 beyond: 15 sizes at max_batch
    #: 128; 9-15 rows padded to 16, larger batches by at most 29 %), "coarse" (powers of two only: 8
    #: sizes, about half the decoder's start-up, up to 49 % padding) or "finer" (every size up to 8,
    #: then steps of an eighth of the next power of two: 24 sizes, at most 19 % padding, more graphs
    #: to capture).
    batch_buckets: str = "fine"
    #: GPU encoder batch sizes captured (per phoneme bucket and fast lane), the same levels:
    #: "coarse", "fine" or "finer" (less row padding per encoder launch, more graphs to capture).
    encode_batch_buckets: str = "coarse"
    #: GPU: torch.compile the chunk decoder before capture (fuses elementwise work; ~1 min more start-up).
    #: H200, 50 clients: 684 vs 572 QPS in the engine, 655 served; one run (commit 8cad0c9).
    #: What it compiled is kept in ``<models.cache_dir>/inductor/<GPU-CUDA-torch>`` for the next start
    #: (``TORCHINDUCTOR_CACHE_DIR`` overrides; tts_engine/torch_vits/compile_cache.py).
    compile: bool = False
    #: GPU: torch.compile the encoder too (text encoder, durations, prior), one graph for every
    #: batch and phoneme bucket (dynamic shapes), before capture; more start-up.
    compile_encoder: bool = False
    #: GPU: high-priority CUDA streams (1-4) that run new requests' encoder and first chunk beside the
    #: later chunks of running ones, so first audio does not wait for them. A request arriving while a
    #: first-chunk launch runs starts on a free one at once instead of waiting for it; each more lane
    #: holds its own encoder and first-chunk CUDA graphs (device memory, start-up time).
    fast_lanes: int = 1
    #: GPU: frames decoded ahead for a new request while at most ``speculate_below`` requests run
    #: (0: off): its chunks after the first, in chunks of ``tail_chunk_frames``, queued right behind
    #: its encoder beside its first chunk instead of after the host learns its length. A lone
    #: sentence is done in one step instead of one per chunk; frames past its end are wasted work.
    speculate_frames: int = 0
    #: GPU: decode ahead only while at most this many requests run (new ones included).
    speculate_below: int = 2
    #: GPU: the engine's hand-written Triton kernels, each measured faster than PyTorch's form on the
    #: H200 or H100 (docs/benchmarks.md; ``tts_engine.torch_vits.runner.SHIPPED`` cites each): at fp16
    #: and bf16 the decoder's residual blocks, input, upsampling and output convolutions and the flow's
    #: WaveNet layers; at every precision the fp32 encoder's duration predictor, text encoder
    #: feed-forward (in ``text_encoder_products``), relative-position attention (with tensor-core
    #: ``text_encoder_products``: "tf32x3", "fp16x3" or "tf32") and prior expansion. Needs
    #: ``gpu.allocator = "native"`` with CUDA graphs and Triton (it comes with PyTorch's CUDA wheels);
    #: off: PyTorch's modules (cuBLAS and cuDNN) throughout, for comparison or a GPU Triton cannot serve.
    triton_kernels: bool = False
    #: With ``triton_kernels``: the text encoder's convolutions' products. "cublas": the stacked taps through
    #: cuBLAS (bit for bit PyTorch's fp32 sums as the engine computes them). Otherwise one Triton kernel per convolution that skips the
    #: time steps past each sentence's end (the phoneme bucket's padding), its products in "ieee" (fp32
    #: on the CUDA cores), "tf32x3" (three TF32 tensor-core products: close to fp32), "tf32" (one) or
    #: "fp16x3" (three fp16 products of high and low halves: close to fp32 at fp16's rate; its inputs
    #: must stay within fp16's range, |x| < 65 504, which the bundled voice's do by far: for a voice of
    #: your own, compare with bench.tts_gpu_experiments --encoder-products before using it); not
    #: bit for bit cuBLAS's sums, so a phoneme's frames can move where its length is within rounding of
    #: a whole frame (python -m bench.tts_gpu_experiments --encoder-products counts them). The
    #: attention kernel takes the same precision and needs a tensor-core one ("tf32x3", "fp16x3", "tf32":
    #: with fp32 products its kernel was ~10x the encoder); with "cublas" or "ieee" it stays PyTorch's.
    text_encoder_products: str = "cublas"
    #: GPU (cuda backend): the rate the engine delivers, Hz; 0 = the voice's own (22 050 Hz for Piper's
    #: medium voices). Each chunk is resampled inside its decoder step on the GPU (a 128-tap
    #: Kaiser-windowed sinc, ~80 dB stopband; the chunks join into the whole sentence resampled at
    #: once), so the front ends resample only for sessions that ask for another rate. It is also the
    #: default output rate when a request names none. 24000: the OpenAI Realtime format's rate.
    output_rate: int = 0
    #: GPU: phoneme-id lengths the encoder's graphs are captured for, ascending. A batch of new
    #: requests is padded to the smallest one that holds its longest clause; the largest is the
    #: longest clause accepted (longer ones are refused with an error). More sizes: less padding,
    #: more graphs to capture at start-up (each fast lane: one per size and encoder batch).
    phoneme_buckets: tuple[int, ...] = (32, 64, 128, 256, 512, 1024)
    #: Batching engine (GPU): a text of at most this many characters is phonemized on the event loop
    #: when the text thread is idle (espeak: ~0.4 ms for a 14-word sentence), saving two thread
    #: hand-offs; longer texts, or any while the thread is busy, go through the thread. 0: always the thread.
    inline_text_chars: int = 300
    #: Pending requests before new ones are refused.
    queue_size: int = 256
    #: GPU: retry hint, ms, in the ``Overloaded`` error of a request dropped because the GPU ran out of
    #: memory even at batch 1 (the scheduler halves its batch on an OOM and grows it back later).
    oom_retry_after_ms: int = 2000
    #: Length scale override (>1 is slower speech); None is the voice's default.
    length_scale: float | None = None
    #: Noise scale override; None is the voice's default.
    noise_scale: float | None = None
    #: Noise width (duration noise) override; None is the voice's default.
    noise_w: float | None = None
    #: Speaker id for multi-speaker voices; None is speaker 0.
    speaker_id: int | None = None
    #: More voices clients may choose (``audio.output.voice``, ``x.tts.speak``'s ``voice``) besides
    #: ``"default"`` (this section's voice): ``[{name = "calm", length_scale = 1.2}, {name = "anna",
    #: path = "VOICE.onnx", speaker_id = 3}]``. A voice of the server's own file shares its engine; a
    #: voice of another file gets its own CPU engine (onnxruntime), loaded at start, also on a GPU server
    #: (the GPU speaks the default voice only: docs/deploy.md).
    voices: tuple[VoiceSpec, ...] = ()
    #: Shortest first clause, characters (speech starts sooner).
    first_clause_min_chars: int = 8
    #: A first clause with no punctuation within this many words is cut after them, at a space (not
    #: after an article, preposition or pronoun): speech starts sooner, may be heard as a break (each
    #: clause is synthesized as a sentence). 2 cores: first clause ~0.1 s sooner with 4 (docs/benchmarks.md). 0: off.
    first_clause_max_words: int = 0
    #: Shortest later clause cut at a comma, characters.
    clause_min_chars: int = 40
    #: Longest clause before a forced break at a space, characters.
    clause_max_chars: int = 200
    #: User polyphone/lexicon overrides for Chinese (TSV or TOML); None for none.
    zh_lexicon_path: str | None = None

    def __post_init__(self) -> None:
        names = [v.name for v in self.voices]
        if len(names) != len(set(names)):
            raise ConfigError(f"tts.voices: names must differ, got {names}")
        if not self.phoneme_buckets or any(b < 1 for b in self.phoneme_buckets) or \
                list(self.phoneme_buckets) != sorted(set(self.phoneme_buckets)) or self.phoneme_buckets[-1] > 4096:
            raise ConfigError("tts.phoneme_buckets must be ascending positive lengths up to 4096 (the encoder's attention "
                              f"grows with the square of the length), got {list(self.phoneme_buckets)}")  # fmt: skip
        if self.text_encoder_products not in TEXT_ENCODER_PRODUCTS:
            raise ConfigError(f"tts.text_encoder_products must be one of {', '.join(TEXT_ENCODER_PRODUCTS)}, "
                              f"got {self.text_encoder_products!r}")  # fmt: skip
        if self.precision not in PRECISIONS:
            raise ConfigError(f"tts.precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if not 1 <= self.fast_lanes <= MAX_FAST_LANES:
            raise ConfigError(f"tts.fast_lanes must be 1..{MAX_FAST_LANES}, got {self.fast_lanes}")
        if self.compile_encoder and self.triton_kernels:
            raise ConfigError("tts.compile_encoder compiles the encoder whose layers tts.triton_kernels replaces: "
                              "set one of them")  # fmt: skip
        if self.speculate_frames < 0 or self.speculate_below < 1:
            raise ConfigError("tts.speculate_frames must be >= 0 (0: off) and tts.speculate_below >= 1, got "
                              f"{self.speculate_frames} and {self.speculate_below}")  # fmt: skip
        for name in ("batch_buckets", "encode_batch_buckets"):
            if getattr(self, name) not in BATCH_BUCKET_LEVELS:
                raise ConfigError(f"tts.{name} must be 'coarse', 'fine' or 'finer', got {getattr(self, name)!r}")
        # The bounds of tts_engine.engine.MIN_RATE / MAX_RATE, not imported: that loads numpy, which
        # `voxloop serve` must not load before it caps its BLAS threads.
        if self.output_rate and not (8_000 <= self.output_rate <= 192_000 and self.backend == "cuda"):
            raise ConfigError(f"tts.output_rate must be 0 (the voice's rate) or 8000..192000 Hz with tts.backend = "
                              f"'cuda' (it resamples on the GPU), got {self.output_rate} with {self.backend!r}")  # fmt: skip
        if self.first_clause_max_words < 0:
            raise ConfigError(f"tts.first_clause_max_words must be >= 0 (0: off), got {self.first_clause_max_words}")


@dataclass(frozen=True)
class GpuConfig:
    """The PyTorch side's CUDA memory (the cuda TTS backend): allocator and per-stage budgets.

    The ASR (CTranslate2) and the LLM (llama.cpp) allocate outside PyTorch's allocator; their
    budgets are ``asr.gpu_budget_mb`` and ``llm.memory_budget_mb``.
    """

    #: PyTorch allocator backend: "async" (one stream-ordered CUDA pool, ``cudaMallocAsync``,
    #: observed with cuda-python) or "native" (PyTorch's caching allocator). Chosen before CUDA
    #: initializes; changing it later in the same process is a ConfigError.
    allocator: str = "async"
    #: Bytes the async pool keeps reserved at synchronization points before returning memory to
    #: the driver, MiB; None keeps everything (PyTorch's own setting).
    release_threshold_mb: int | None = None
    #: Most device memory this process may allocate through PyTorch, MiB; 0 is the whole device.
    #: Over it, an allocation fails with out-of-memory and the TTS scheduler degrades its batch.
    memory_limit_mb: int = 0
    #: TTS weights and per-request slot buffers, MiB; 0 is no budget. Over it start-up fails.
    tts_state_budget_mb: int = 0
    #: TTS encoder step (its CUDA graphs and their memory), MiB; 0 is no budget. Graph buckets are
    #: captured smallest first; the first that brings the stage over budget is dropped with all
    #: larger ones (the batch limit shrinks, logged); none fitting is a start-up error.
    tts_encode_budget_mb: int = 0
    #: TTS flow + decoder step, MiB; 0 is no budget (same rule as ``tts_encode_budget_mb``).
    tts_decode_budget_mb: int = 0
    #: Host memory each TTS request buffer pool (pinned step staging; request audio) keeps for
    #: reuse, MiB; 0 disables the pools (every request allocates: for comparison only).
    host_pool_mb: int = 256


@dataclass(frozen=True)
class ModelsConfig:
    #: Cache directory for assembled models; None is ``$XDG_CACHE_HOME/voxloop`` (``~/.cache/voxloop``).
    cache_dir: str | None = None
    #: Allow downloading models from a hub when no local copy exists (never in tests).
    allow_network: bool = False


@dataclass(frozen=True)
class TraceConfig:
    #: JSON-lines file for per-turn traces; None disables the file.
    path: str | None = None
    #: Send ``x.turn.metrics`` to the client at turn end.
    send_to_client: bool = True


@dataclass(frozen=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    vad: VadConfig = field(default_factory=VadConfig)
    turn: TurnConfig = field(default_factory=TurnConfig)
    asr: AsrConfig = field(default_factory=AsrConfig)
    llm: LlmConfig = field(default_factory=LlmConfig)
    tts: TtsConfig = field(default_factory=TtsConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    models: ModelsConfig = field(default_factory=ModelsConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)

    def replace(self, section: str, **changes: Any) -> "Config":
        """Return a copy with fields of one section changed (validated like TOML input)."""
        return _merge(self, {section: changes}, source="replace")


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check/convert ``value`` to the annotated type ``tp``; strings come from env/CLI."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
            return None
        return _coerce(value, args[0], where)
    if origin is tuple:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (inner, *_rest) = typing.get_args(tp)
        return tuple(_coerce(v, inner, where) for v in value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        try:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected an integer, got {value!r}") from None
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected a number, got {value!r}") from None
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):  # a table (TOML inline table or [[array of tables]])
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        fields = _field_types(tp)
        unknown = sorted(set(value) - set(fields))
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {unknown}; known: {', '.join(sorted(fields))}")
        return tp(**{k: _coerce(v, fields[k], f"{where}.{k}") for k, v in value.items()})
    raise ConfigError(f"{where}: unsupported type {tp!r}")


#: Keys that configurations may still carry but the engine no longer reads, with why: a ConfigError
#: names the key and says what to do instead of the bare "unknown key".
REMOVED_KEYS = {
    "tts.fused_stages": "a decoder stage as two launches was slower than the per-step kernels (H100, "
                        "docs/benchmarks.md): delete the key",
    "tts.fused_blocks_channels_last": "time-major residual steps made the engine 7-10 % slower (H100, "
                                      "docs/benchmarks.md): delete the key",
    "tts.fused_block_taps": "the residual steps' taps are always unrolled (the loop was slower on an H100, "
                            "docs/benchmarks.md): delete the key",
    "tts.fused_block_products": "the fused residual blocks multiply in the model's fp16/bf16 (FP8 e4m3 was "
                                "slower and noisier on the H200, docs/benchmarks.md): delete the key",
    "tts.fused_attention_projections": "the fused attention's projections stay cuBLAS products (Triton "
                                       "products gave no gain on an H100, docs/benchmarks.md): delete the key",
    # Settings with one measured best value, now constants of the engine (tts_engine.torch_vits.runner.SHIPPED
    # cites each measurement) or one switch for all the Triton kernels.
    **dict.fromkeys(("tts.polyphase_upsampling", "tts.fused_blocks", "tts.fused_upsampling", "tts.fused_flow",
                     "tts.fused_duration_predictor", "tts.fused_text_encoder", "tts.fused_prior", "tts.fused_attention"),
                    "each Triton kernel was measured faster and they are one switch now, tts.triton_kernels "
                    "(true: every kernel where it applies): delete the key"),
    "tts.fused_attention_tile": "the attention kernel's program is fixed at its fastest, 32x32w4-loop (H100, "
                                "bench.encoder_attention): delete the key",
    "tts.encoder_convs": "the GPU encoder's convolutions are always cuBLAS products (as fast as cuDNN's, start-up "
                         "9.6 vs 17.9 s on the H200): delete the key",
    **dict.fromkeys(("tts.cudnn_benchmark", "tts.cudnn_benchmark_limit", "tts.cudnn_benchmark_stages"),
                    "cuDNN's algorithms are no longer timed at start-up (the untimed decoder was as fast, 852 vs "
                    "844 sentences/s on the H200, with the encoder on cuBLAS): delete the key"),
    "tts.fast_lane": "new requests always run on the fast lanes beside the later chunks (\"overlap\": 589 vs 512 "
                     "sentences/s served on the H200); their number is tts.fast_lanes: delete the key",
    "tts.flow_once": "the flow always runs once per utterance (H100: 1758 vs 1639-1643 sentences/s): delete the key",
    "tts.chunks_per_step": "a request's later chunks are always decoded in one step once its length is known "
                           "(H200: 790 vs 762 sentences/s): delete the key",
    "tts.main_in_flight": "two main-lane launches are always queued at once (H200: 852 vs 768 sentences/s, three "
                          "no better): delete the key",
}


def _merge(cfg: Config, data: Mapping[str, Any], source: str) -> Config:
    sections = _field_types(Config)
    new_sections = {}
    for name, values in data.items():
        if name not in sections:
            raise ConfigError(
                f"{source}: unknown section [{name}]; known: {', '.join(sorted(sections))}"
            )
        if not isinstance(values, Mapping):
            raise ConfigError(f"{source}: [{name}] must be a table")
        section_cls = sections[name]
        types_ = _field_types(section_cls)
        changes = {}
        for key, value in values.items():
            if f"{name}.{key}" in REMOVED_KEYS:
                raise ConfigError(f"{source}: {name}.{key} was removed: {REMOVED_KEYS[f'{name}.{key}']}")
            if key not in types_:
                raise ConfigError(
                    f"{source}: unknown key {name}.{key}; known: {', '.join(sorted(types_))}"
                )
            changes[key] = _coerce(value, types_[key], f"{source}: {name}.{key}")
        new_sections[name] = dataclasses.replace(getattr(cfg, name), **changes)
    return dataclasses.replace(cfg, **new_sections)


def _env_overrides(environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for key, value in environ.items():
        if not key.startswith(ENV_PREFIX) or "__" not in key:
            continue
        section, _, name = key[len(ENV_PREFIX):].partition("__")
        out.setdefault(section.lower(), {})[name.lower()] = value
    return out


def _cli_overrides(items: list[str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for item in items:
        path, sep, value = item.partition("=")
        section, dot, name = path.strip().partition(".")
        if not sep or not dot:
            raise ConfigError(f"--set expects section.key=value, got {item!r}")
        out.setdefault(section, {})[name] = value
    return out


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Load ``path`` (default ``configs/default.toml`` when present), then env, then overrides."""
    cfg = Config()
    if path is None and (CONFIG_DIR / "default.toml").exists():
        path = CONFIG_DIR / "default.toml"
    if path is not None:
        p = Path(path)
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {p}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{p}: invalid TOML: {exc}") from None
        cfg = _merge(cfg, data, str(p))
    cfg = _merge(cfg, _env_overrides(os.environ if environ is None else environ), "environment")
    return _merge(cfg, _cli_overrides(overrides or []), "--set")
