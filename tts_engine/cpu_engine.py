"""``OnnxTtsEngine``: the CPU ``TtsEngine`` (Piper voice, onnxruntime, soxr).

Three lines from a notebook::

    engine = OnnxTtsEngine.from_config(load_config())
    for chunk in engine.synthesize("Hello there. How are you?"):
        play(chunk.pcm, chunk.sample_rate)

Sentences are those of espeak-ng, exactly as Piper splits them, so ids equal Piper's.
Whole-sentence mode (``tts.streaming = false``): each sentence is one run of Piper's
model and one ``AudioChunk`` (``final=True``); audio equals Piper's. Streaming mode
(``chunked_dir``): each sentence is several chunks from the voice's chunked export
(``tts_engine.onnx_streaming``), the first after one small decoder chunk; the joined
chunks equal the whole sentence's audio (within ~1e-4 of full scale of Piper's).
Audio is not peak-normalized per sentence (Piper's default): per-clause gain would
make the level jump between streamed clauses.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from tts_engine.engine import AudioChunk, SynthesisOptions, check_phoneme_ids, resolve_options
from tts_engine.frontend import TextFrontend
from tts_engine.onnx_backend import InferenceScales, OnnxVits, to_int16
from tts_engine.resample import StreamResampler
from tts_engine.onnx_streaming import ChunkedOnnxVits, ChunkPlan
from tts_engine.voice import Voice
from base.config import Config
from base.errors import ModelError

log = logging.getLogger(__name__)

#: Output rates accepted in ``SynthesisOptions.sample_rate``, Hz.


class OnnxTtsEngine:
    """Text or phoneme ids in, int16 ``AudioChunk``s out: one per sentence, or several when streaming."""

    def __init__(
        self,
        voice: Voice,
        *,
        threads: int = 1,
        workers: int = 1,
        defaults: SynthesisOptions | None = None,
        max_text_chars: int | None = None,
        chunked_dir: str | Path | None = None,
        chunk_plan: ChunkPlan | None = None,
        stream_urgent_only: bool = False,
    ) -> None:
        """``threads``: onnxruntime intra-op threads per session (0 = its choice);
        ``workers``: parallel sessions; ``defaults``: options used where a request says None
        (then the voice's own); ``max_text_chars``: longest accepted text (None = no limit);
        ``chunked_dir``: the voice's chunked export (``tts_engine.chunked_voice.resolve_chunked_voice``):
        stream each sentence in chunks of ``chunk_plan`` (None: whole sentences);
        ``stream_urgent_only``: with ``chunked_dir``, keep the whole-sentence model too and stream
        only what is asked with ``synthesize(..., stream=True)`` (a reply's first clause)."""
        self.voice = voice
        self.frontend = TextFrontend(voice.config, max_text_chars=max_text_chars)
        if chunked_dir is not None and voice.config.num_speakers > 1:
            raise ModelError(f"{voice.model_path}: streaming supports single-speaker voices only")
        #: Whole-sentence model (Piper's graph), or None when every sentence streams.
        self.model = (None if chunked_dir is not None and not stream_urgent_only
                      else OnnxVits(voice.model_path, threads=threads, workers=workers))  # fmt: skip
        #: Chunked model, or None for whole sentences.
        self.chunked = None if chunked_dir is None else ChunkedOnnxVits(chunked_dir, threads=threads, workers=workers)
        self.chunk_plan = chunk_plan or ChunkPlan()
        self.defaults = defaults or SynthesisOptions()
        #: Native sample rate of the voice, Hz.
        self.sample_rate = voice.sample_rate

    @classmethod
    def from_config(cls, cfg: Config) -> OnnxTtsEngine:
        """The voice, threads, defaults and text limit from ``cfg`` (models via ``base.models``)."""
        from base import models

        onnx_path = models.resolve_voice(cfg).path
        voice = Voice.load(onnx_path, models.voice_config_path(cfg, onnx_path))
        tts = cfg.tts
        if tts.zh_lexicon_path:  # user polyphone entries for Chinese voices
            from tts_engine.zh import configure

            configure(tts.zh_lexicon_path)
        defaults = SynthesisOptions.from_config(tts)
        chunked_dir = None
        streams = tts.streaming or tts.stream_first_clause
        if streams and voice.config.num_speakers > 1:
            log.warning("tts.streaming: %s has %d speakers; speaking whole sentences", onnx_path.name,
                        voice.config.num_speakers)
        elif streams:
            from tts_engine.chunked_voice import resolve_chunked_voice

            chunked_dir = resolve_chunked_voice(cfg).path  # exported here on first use
        engine = cls(
            voice,
            threads=tts.onnx_threads,
            workers=tts.onnx_workers,
            defaults=defaults,
            max_text_chars=cfg.limits.max_text_chars,
            chunked_dir=chunked_dir,
            chunk_plan=ChunkPlan(tts.chunk_frames, tts.tail_chunk_frames or ChunkPlan.tail_frames),
            stream_urgent_only=not tts.streaming,
        )
        engine.reserve_memory()
        return engine

    def reserve_memory(self) -> None:
        """Size the whole-sentence sessions' arenas at start for the longest sentence the frontend
        makes (``OnnxVits.reserve_arena``): a server's memory then stays flat under load. About two
        seconds of CPU per session on a 2-core VM."""
        if self.model is not None:
            scales, _, _ = self._resolve(None)
            (ids,) = self.frontend.sentence_ids("The quick brown fox jumps over the lazy dog, twice.")
            self.model.reserve_arena(ids, scales)

    @property
    def streaming(self) -> bool:
        """True when every sentence is spoken in several chunks."""
        return self.chunked is not None and self.model is None

    @property
    def can_stream(self) -> bool:
        """True when ``synthesize(..., stream=True)`` speaks in chunks."""
        return self.chunked is not None

    def synthesize(self, text: str, options: SynthesisOptions | None = None,
                   stream: bool = False) -> Iterator[AudioChunk]:
        """Speak ``text``; chunks (one per sentence, or several when streaming) as soon as each is ready.

        ``stream``: in decoder chunks even when the engine speaks whole sentences by default
        (``stream_urgent_only``; ignored without the chunked export). Text is checked and
        phonemized at call time (InvalidInput for a bad option or text over the limit); audio
        is made lazily. Text with no letter or digit yields nothing.
        """
        scales, speaker_id, rate = self._resolve(options)
        sentences = list(self.frontend.sentence_ids(text))
        return self._speak(sentences, scales, speaker_id, rate, stream)

    def synthesize_ids(self, phoneme_ids: Sequence[int], options: SynthesisOptions | None = None) -> Iterator[AudioChunk]:
        """Speak one already-encoded clause (Piper layout: BOS ... EOS); its last chunk is final."""
        scales, speaker_id, rate = self._resolve(options)
        return self._speak([self._check_ids(phoneme_ids)], scales, speaker_id, rate)

    def _speak(
        self, sentences: list[list[int]], scales: InferenceScales, speaker_id: int | None, rate: int,
        stream: bool = False,
    ) -> Iterator[AudioChunk]:
        resampler = StreamResampler(self.sample_rate, rate)
        last = len(sentences) - 1
        for index, ids in enumerate(sentences):
            for audio, final in self._pieces(ids, scales, speaker_id, stream):
                pcm = to_int16(resampler.process(audio, last=final and index == last))
                if len(pcm) or final:
                    yield AudioChunk(pcm=pcm, sample_rate=rate, clause_index=index, final=final)

    def _pieces(
        self, ids: list[int], scales: InferenceScales, speaker_id: int | None, stream: bool = False
    ) -> Iterator[tuple[np.ndarray, bool]]:
        """Float32 audio of one sentence at the voice's rate, as ``(audio, is_last)`` pieces."""
        if self.chunked is not None and (stream or self.model is None):
            yield from self.chunked.stream(ids, scales, self.chunk_plan, self.sample_rate)
        else:
            assert self.model is not None
            yield self.model.infer(ids, scales, speaker_id), True

    def _resolve(self, options: SynthesisOptions | None) -> tuple[InferenceScales, int | None, int]:
        """Request options over engine defaults over the voice's own; validated."""
        r = resolve_options(options, self.defaults, self.voice)
        scales = InferenceScales(noise_scale=r.noise_scale, length_scale=r.length_scale, noise_w=r.noise_w)
        return scales, r.speaker_id, r.sample_rate

    def _check_ids(self, phoneme_ids: Sequence[int]) -> list[int]:
        return check_phoneme_ids(phoneme_ids, self.voice.config.num_symbols)
