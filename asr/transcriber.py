"""Speech to text with faster-whisper (CTranslate2), tuned for short utterances.

``Transcriber(model_dir).transcribe(pcm16k)`` returns a ``Transcript``.

Latency: faster-whisper always pads the log-mel features to a 30 s window (3000
frames), so whisper base spends ~0.45 s encoding mostly silence for a 2 s
utterance. CTranslate2's encoder accepts shorter windows, so utterances up to
``30 - WINDOW_PAD_S`` seconds are encoded in a window of the speech plus
``WINDOW_PAD_S`` (at least ``MIN_WINDOW_S``) of zero padding, and decoded greedily
without timestamps. Padding matters: with little or none (whisper.cpp's
``audio_ctx`` trick) the decoder does not see the speech end and repeats the
sentence until the token limit; with 5 s of padding, on 36 synthetic utterances
(0.6-6 s, clean and at 15 dB SNR), the word error rate equalled the 30 s window's
and the total time was 3.8x lower. A result that still looks like a loop (token
budget of ``TOKENS_PER_S`` hit, a block of 4+ tokens said twice in a row or a
shorter one three times, or zlib compression ratio > ``MAX_COMPRESSION_RATIO``) is
decoded again in the full 30 s window, which is exactly what faster-whisper would
have done; a false alarm ("no, no, no") only costs that second decode.
Longer audio goes through ``WhisperModel.transcribe`` (sequential 30 s windows,
with timestamps so that windows end at segment boundaries).

Hallucination guard: whisper invents text ("Thank you.") for silence and noise. A
segment whose no-speech probability > ``NO_SPEECH_PROB`` (0.6) *and* whose average
token log-probability < ``MIN_AVG_LOGPROB`` (-1.0) is dropped: whisper itself
thinks there is no speech, and what it wrote is unlikely (the rule and thresholds
of openai-whisper's ``no_speech_threshold``/``logprob_threshold``).
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from base.config import Config
from base.errors import InvalidInput, ModelError

SAMPLE_RATE = 16000  # Hz, what whisper takes
MIN_AUDIO_S = 0.1  # shorter audio is returned as empty text without running the model
#: Audio whose RMS is below this (full scale 1.0; -70 dBFS, ~10 int16 steps) holds no speech: empty text
#: without running the model. Whisper answers digital silence with invented words ("you"): with int8
#: weights on a CPU without VNNI its no-speech probability came out 0.593, under the 0.6 that drops them.
SILENT_RMS = 10 ** (-70 / 20)
FULL_WINDOW_S = 30.0  # whisper's trained input length
WINDOW_PAD_S = 5.0  # zero padding after the speech in a short window
MIN_WINDOW_S = 10.0
NO_SPEECH_PROB = 0.6
MIN_AVG_LOGPROB = -1.0
MAX_COMPRESSION_RATIO = 2.4  # as faster-whisper / openai-whisper
TOKENS_PER_S = 15.0  # token budget per second of audio (fast Chinese is ~8 tokens/s)
TOKEN_MARGIN = 12
FRAMES_PER_S = 100  # log-mel frames (hop 160 samples at 16 kHz)

#: ``postprocess(text, language) -> text``, applied to every segment
#: (e.g. zh Traditional -> Simplified).
Postprocess = Callable[[str, str], str]


@dataclass(frozen=True)
class TranscriptSegment:
    """A piece of the transcript; times in seconds from the start of the audio."""

    text: str
    start_s: float
    end_s: float
    avg_logprob: float
    no_speech_prob: float


@dataclass(frozen=True)
class Transcript:
    """The text of one utterance. ``audio_s``: input length; ``elapsed_s``: compute time."""

    text: str
    language: str | None
    segments: tuple[TranscriptSegment, ...]
    audio_s: float
    elapsed_s: float


def _to_float32(pcm: np.ndarray) -> np.ndarray:
    """int16 or float32 mono 16 kHz PCM -> float32 in [-1, 1]."""
    if not isinstance(pcm, np.ndarray) or pcm.ndim != 1:
        raise InvalidInput("ASR expects 1-D mono PCM at 16 kHz (int16 or float32)")
    if pcm.dtype == np.int16:
        return pcm.astype(np.float32) / 32768.0
    if pcm.dtype == np.float32:
        return pcm
    raise InvalidInput(f"ASR expects int16 or float32 PCM, got {pcm.dtype}")


def _silent(audio: np.ndarray) -> bool:
    """float32 audio in [-1, 1] whose RMS is below ``SILENT_RMS``."""
    return float(np.sqrt(np.mean(np.square(audio, dtype=np.float64)))) < SILENT_RMS


def _is_hallucination(no_speech_prob: float, avg_logprob: float) -> bool:
    return no_speech_prob > NO_SPEECH_PROB and avg_logprob < MIN_AVG_LOGPROB


def _repeats(tokens: list[int], longest: int = 64) -> bool:
    """Whether a block of >= 4 tokens occurs twice in a row, or a shorter one three times."""
    n = len(tokens)
    for period in range(1, min(longest, n // 2) + 1):
        need = period if period >= 4 else 2 * period  # matches after the first occurrence
        run = 0
        for i in range(period, n):
            run = run + 1 if tokens[i] == tokens[i - period] else 0
            if run >= need:
                return True
    return False


def _compression_ratio(text: str) -> float:
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


class Transcriber:
    """faster-whisper on one model directory. Not for concurrent calls: one worker owns it.

    ``model_dir``: a CTranslate2 whisper directory (never a model name: no downloads).
    ``language``: default language code, or None to detect it per utterance.
    ``postprocess``: optional ``(text, language) -> text`` hook applied to each segment.
    ``cpu_threads``: 0 means one per available core, at most 4.
    """

    sample_rate = SAMPLE_RATE

    def __init__(
        self,
        model_dir: str | Path,
        device: str = "cpu",
        compute_type: str = "int8",
        beam_size: int = 1,
        language: str | None = "en",
        cpu_threads: int = 0,
        postprocess: Postprocess | None = None,
    ) -> None:
        model_dir = Path(model_dir)
        if not (model_dir / "model.bin").is_file():
            raise ModelError(f"{model_dir} is not a CTranslate2 whisper directory (no model.bin)")
        from faster_whisper import WhisperModel

        if cpu_threads <= 0:  # CTranslate2's own default is 4, which oversubscribes small hosts
            cpu_threads = min(4, len(os.sched_getaffinity(0)))
        try:
            self._model = WhisperModel(
                str(model_dir), device=device, compute_type=compute_type,
                cpu_threads=cpu_threads, local_files_only=True,
            )
        except (RuntimeError, ValueError, OSError) as exc:
            raise ModelError(f"cannot load whisper from {model_dir}: {exc}") from exc
        self.model_dir = model_dir
        self.beam_size = beam_size
        self.language = self._check_language(language)
        self.postprocess = postprocess
        #: GPU memory the model took at start-up, bytes (set by the server when it measured it).
        self.gpu_bytes: int | None = None
        self._tokenizers: dict[str, object] = {}

    @classmethod
    def from_config(cls, cfg: Config, postprocess: Postprocess | None = None) -> "Transcriber":
        """From ``cfg.asr``; without ``postprocess``, zh transcripts become Simplified
        when ``asr.zh_simplified`` (``asr.zh.postprocess_transcript``)."""
        from base.models import resolve_asr

        if postprocess is None and cfg.asr.zh_simplified:
            from asr.zh import postprocess_transcript as postprocess
        a = cfg.asr
        return cls(resolve_asr(cfg).path, device=a.device, compute_type=a.compute_type,
                   beam_size=a.beam_size, language=a.language, cpu_threads=a.cpu_threads,
                   postprocess=postprocess)

    @property
    def whisper_model(self):  # noqa: ANN201 - faster_whisper.WhisperModel, imported lazily
        """The faster-whisper model this transcriber drives (its own ``transcribe`` decodes the whole
        30 s window: what ``bench.engines`` compares the short-window encoding with)."""
        return self._model

    def warmup(self, batch: int = 1) -> None:
        """Run the model once on 1 s of a tone so the first real call is not slower; with
        ``batch`` > 1 also one batched call of that many 4 s tones (what a full batch of
        questions allocates on a GPU)."""
        def tone(seconds: int) -> np.ndarray:
            t = np.arange(seconds * SAMPLE_RATE, dtype=np.float32) / SAMPLE_RATE
            return (0.1 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)

        self.transcribe(tone(1))
        if batch > 1:
            self.transcribe_batch([tone(4)] * batch)

    # --- transcription -------------------------------------------------------

    def transcribe(self, pcm: np.ndarray, language: str | None = None, prompt: str | None = None) -> Transcript:
        """Transcribe mono 16 kHz PCM (int16 or float32 in [-1, 1]).

        ``language``: a code ("en", "zh"), "auto" to detect, or None for the default.
        ``prompt``: text the speech is likely to follow or contain (names, terms): whisper's
        initial prompt, read by the decoder before the audio's first token.
        """
        started = time.perf_counter()
        audio = _to_float32(pcm)
        audio_s = len(audio) / SAMPLE_RATE
        lang = self.language if language is None else self._check_language(language)
        if audio_s < MIN_AUDIO_S or _silent(audio):
            return Transcript("", lang, (), audio_s, time.perf_counter() - started)
        if audio_s <= FULL_WINDOW_S - WINDOW_PAD_S:
            lang, raw = self._transcribe_window(audio, lang, prompt)
        else:
            lang, raw = self._transcribe_long(audio, lang, prompt)
        return self._transcript(raw, lang, audio_s, started)

    def transcribe_batch(self, pcms: Sequence[np.ndarray], language: str | None = None,
                         prompt: str | None = None) -> list[Transcript]:
        """Transcribe several utterances (e.g. of different sessions) like ``transcribe`` each,
        all with the same ``prompt``.

        Utterances whose short windows have the same length (every one under
        ``MIN_WINDOW_S - WINDOW_PAD_S`` = 5 s of audio) are encoded and decoded in one
        batched call. The rest go one by one: long audio, language detection, and an
        utterance that looks like a loop (decoded again alone, as ``transcribe`` would).
        ``elapsed_s`` of a batched transcript is the whole batch's time.
        """
        started = time.perf_counter()
        lang = self.language if language is None else self._check_language(language)
        out: list[Transcript | None] = [None] * len(pcms)
        groups: dict[int, list[tuple[int, np.ndarray, np.ndarray]]] = {}
        for i, pcm in enumerate(pcms):
            audio = _to_float32(pcm)
            audio_s = len(audio) / SAMPLE_RATE
            if lang is None or audio_s < MIN_AUDIO_S or audio_s > FULL_WINDOW_S - WINDOW_PAD_S or _silent(audio):
                out[i] = self.transcribe(pcm, language, prompt)
                continue
            features = self._model.feature_extractor(audio)
            groups.setdefault(_window_frames(features), []).append((i, audio, features))
        for frames, items in groups.items():
            budgets = [int(TOKENS_PER_S * len(a) / SAMPLE_RATE) + TOKEN_MARGIN for _, a, _ in items]
            decoded = self._generate(self._encode([f for _, _, f in items], frames), lang, budgets,
                                     [len(a) / SAMPLE_RATE for _, a, _ in items], prompt)
            for (i, audio, _), (seg, looped) in zip(items, decoded):
                if looped:  # as transcribe: the full window again (alone)
                    out[i] = self.transcribe(pcms[i], language, prompt)
                else:
                    out[i] = self._transcript([seg], lang, len(audio) / SAMPLE_RATE, started)
        return [t for t in out if t is not None]

    def _transcript(self, raw: list[TranscriptSegment], lang: str, audio_s: float, started: float) -> Transcript:
        segments = tuple(self._finish(s, lang) for s in raw if not _is_hallucination(
            s.no_speech_prob, s.avg_logprob))
        text = " ".join(s.text for s in segments if s.text) if _spaced(lang) else "".join(
            s.text for s in segments)
        return Transcript(text, lang, segments, audio_s, time.perf_counter() - started)

    def _finish(self, seg: TranscriptSegment, lang: str) -> TranscriptSegment:
        text = seg.text.strip()
        if self.postprocess is not None and text:
            text = self.postprocess(text, lang).strip()
        return TranscriptSegment(text, seg.start_s, seg.end_s, seg.avg_logprob, seg.no_speech_prob)

    def _transcribe_window(
        self, audio: np.ndarray, lang: str | None, prompt: str | None = None
    ) -> tuple[str, list[TranscriptSegment]]:
        """One short window (speech + padding); the full window again if it looks like a loop."""
        features = self._model.feature_extractor(audio)
        frames = _window_frames(features)
        audio_s = len(audio) / SAMPLE_RATE
        budget = int(TOKENS_PER_S * audio_s) + TOKEN_MARGIN
        lang, seg, looped = self._decode(features, frames, lang, budget, audio_s, prompt)
        if looped and frames < FULL_WINDOW_S * FRAMES_PER_S:
            lang, seg, _ = self._decode(
                features, int(FULL_WINDOW_S * FRAMES_PER_S), lang, budget, audio_s, prompt)
        return lang, [seg]

    def _decode(
        self, features: np.ndarray, frames: int, lang: str | None, budget: int, audio_s: float,
        prompt: str | None = None,
    ) -> tuple[str, TranscriptSegment, bool]:
        encoded = self._encode([features], frames)
        if lang is None:
            lang = self._detect_language(encoded)
        (seg, looped), = self._generate(encoded, lang, [budget], [audio_s], prompt)
        return lang, seg, looped

    def _encode(self, features: Sequence[np.ndarray], frames: int):
        from faster_whisper.transcribe import get_ctranslate2_storage

        window = np.zeros((len(features), features[0].shape[0], frames), dtype=np.float32)
        for b, f in enumerate(features):
            n = min(frames, f.shape[-1] - 1)  # as faster-whisper: the last frame is partial
            window[b, :, :n] = f[:, :n]
        return self._model.model.encode(get_ctranslate2_storage(window))

    def _generate(self, encoded, lang: str, budgets: list[int], audio_s: list[float],
                  text_prompt: str | None = None) -> list[tuple[TranscriptSegment, bool]]:
        """Greedy decode of utterances sharing one window length in one call: (segment, looks looped)
        each. The batch runs to the largest budget; an utterance that reaches its own budget counts
        as looped, as it would alone. ``text_prompt``: whisper's initial prompt (faster-whisper's
        ``get_prompt``: previous-text tokens before the start sequence)."""
        tok, suppress = self._tokenizer(lang)
        previous = tok.encode(" " + text_prompt.strip()) if text_prompt and text_prompt.strip() else None
        prompt = self._model.get_prompt(tok, previous, without_timestamps=True)
        budgets = [min(b, self._model.max_length - len(prompt)) for b in budgets]
        results = self._model.model.generate(
            encoded, [prompt] * len(budgets), beam_size=self.beam_size, max_length=len(prompt) + max(budgets),
            return_scores=True, return_no_speech_prob=True, suppress_blank=True,
            suppress_tokens=suppress,
        )
        out = []
        for result, budget, seconds in zip(results, budgets, audio_s):
            tokens = [t for t in result.sequences_ids[0] if t < tok.eot]
            # As faster-whisper: the score is the length-normalised log-probability.
            avg_logprob = result.scores[0] * len(tokens) / (len(tokens) + 1)
            text = tok.decode(tokens)
            looped = (len(tokens) >= budget or _repeats(tokens)
                      or _compression_ratio(text) > MAX_COMPRESSION_RATIO)
            out.append((TranscriptSegment(text, 0.0, seconds, avg_logprob, result.no_speech_prob), looped))
        return out

    def _transcribe_long(
        self, audio: np.ndarray, lang: str | None, prompt: str | None = None
    ) -> tuple[str, list[TranscriptSegment]]:
        segments, info = self._model.transcribe(
            # Timestamps let each window end at a segment boundary instead of mid-word.
            audio, language=lang, initial_prompt=prompt or None, beam_size=self.beam_size, temperature=0.0,
            without_timestamps=False, condition_on_previous_text=False, vad_filter=False,
            no_speech_threshold=NO_SPEECH_PROB, log_prob_threshold=MIN_AVG_LOGPROB,
        )
        out = [TranscriptSegment(s.text, s.start, s.end, s.avg_logprob, s.no_speech_prob)
               for s in segments]
        return info.language, out

    # --- languages -----------------------------------------------------------

    def _detect_language(self, encoded) -> str:
        if not self._model.model.is_multilingual:
            return "en"
        token, _prob = self._model.model.detect_language(encoded)[0][0]
        return token[2:-2]  # "<|en|>" -> "en"

    def _tokenizer(self, lang: str):
        if lang not in self._tokenizers:
            from faster_whisper.tokenizer import Tokenizer
            from faster_whisper.transcribe import get_suppressed_tokens

            multilingual = self._model.model.is_multilingual
            tok = Tokenizer(self._model.hf_tokenizer, multilingual, task="transcribe",
                            language=lang if multilingual else None)
            self._tokenizers[lang] = (tok, list(get_suppressed_tokens(tok, [-1])))
        return self._tokenizers[lang]

    def _check_language(self, language: str | None) -> str | None:
        if language is None or language == "auto":
            return None
        from faster_whisper.tokenizer import _LANGUAGE_CODES

        if language not in _LANGUAGE_CODES:
            raise InvalidInput(f"unknown ASR language {language!r}; use a whisper code like 'en'")
        if not self._model.model.is_multilingual and language != "en":
            raise InvalidInput(f"{self.model_dir.name} is English-only; got language {language!r}")
        return language


def _window_frames(features: np.ndarray) -> int:
    """Frames of the short encoder window for ``features``: the speech plus padding (module doc)."""
    content = features.shape[-1] - 1
    frames = max(int(MIN_WINDOW_S * FRAMES_PER_S), content + int(WINDOW_PAD_S * FRAMES_PER_S))
    return min(int(FULL_WINDOW_S * FRAMES_PER_S), frames + frames % 2)


def _spaced(lang: str | None) -> bool:
    """Whether segments of this language are joined with spaces."""
    return lang not in ("zh", "ja", "th", "lo", "my", "yue")
