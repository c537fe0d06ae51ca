"""``voxloop say "text" -o out.wav``: speak text with the CPU TTS engine; write a WAV and/or play it."""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import numpy as np

from voxloop.commands import config_from_args
from base.errors import InvalidInput, VoxloopError
from base.wav import write_wav

log = logging.getLogger(__name__)


AUDIO_DEVICE_ERROR = "audio_device_error"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("say", help="speak text with the TTS voice (write a WAV and/or play it)")
    p.add_argument("text", help="text to speak")
    p.add_argument("-o", "--output", type=Path, help="16-bit mono WAV file to write")
    p.add_argument("--voice", type=Path, help="Piper voice .onnx (its .onnx.json beside it); default tts.voice_path")
    p.add_argument("--rate", type=int, metavar="HZ", help="output sample rate (default: the voice's)")
    p.add_argument("--length-scale", type=float, metavar="X", help=">1 speaks slower (default: the voice's)")
    p.add_argument("--speaker", type=int, metavar="N", help="speaker id of a multi-speaker voice")
    p.add_argument("--play", action="store_true", help="play through the default output device (needs PortAudio)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tts_engine.cpu_engine import OnnxTtsEngine
    from tts_engine.engine import SynthesisOptions

    if args.output is None and not args.play:
        raise InvalidInput("nothing to do: give -o FILE.wav and/or --play")
    player = output_device() if args.play else None  # fail before synthesis, not after
    cfg = config_from_args(args)
    if args.voice is not None:
        cfg = cfg.replace("tts", voice_path=str(args.voice), voice_config_path=None)
    engine = OnnxTtsEngine.from_config(cfg)
    options = SynthesisOptions(length_scale=args.length_scale, speaker_id=args.speaker, sample_rate=args.rate)
    start = time.perf_counter()
    chunks = list(engine.synthesize(args.text, options))
    if not chunks:
        raise InvalidInput("nothing to say: the text has no letters or digits")
    pcm = np.concatenate([c.pcm for c in chunks])
    rate = chunks[0].sample_rate
    elapsed = time.perf_counter() - start
    log.info("%.2f s of audio at %d Hz in %.2f s (RTF %.3f)", len(pcm) / rate, rate, elapsed, elapsed * rate / len(pcm))
    if args.output is not None:
        write_wav(args.output, pcm, rate)
        print(args.output)
    if player is not None:
        play(player, pcm, rate)
    return 0



def output_device():
    """The ``sounddevice`` module once PortAudio and a default output device are known to work.

    Raises VoxloopError (code audio_device_error) with a clear message otherwise.
    """
    try:
        import sounddevice
    except OSError as exc:  # sounddevice raises OSError when libportaudio is not installed
        raise VoxloopError(
            f"cannot play audio: {exc} (install it, e.g. `apt-get install libportaudio2`); use -o FILE.wav instead",
            code=AUDIO_DEVICE_ERROR,
        ) from None
    try:
        sounddevice.check_output_settings(channels=1, dtype="int16")
    except (sounddevice.PortAudioError, ValueError) as exc:
        raise VoxloopError(
            f"cannot play audio: no usable output device ({exc}); use -o FILE.wav instead",
            code=AUDIO_DEVICE_ERROR,
        ) from None
    return sounddevice


def play(sounddevice, pcm: np.ndarray, sample_rate: int) -> None:
    """Play mono int16 ``pcm`` at ``sample_rate`` Hz on the default output and wait until done."""
    try:
        sounddevice.play(pcm, sample_rate, blocking=True)
    except sounddevice.PortAudioError as exc:
        raise VoxloopError(f"cannot play audio: {exc}", code=AUDIO_DEVICE_ERROR) from None
