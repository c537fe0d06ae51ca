"""Push-to-talk turns over the Realtime client: the logic behind ``voxloop ptt``.

A push-to-talk session has ``turn_detection: null``: the client sends the user's audio,
then ``input_audio_buffer.commit`` when the talk key is released. voxloop answers a
commit by itself; a GA-style server waits for ``response.create``, which
:func:`await_reply` sends when no response starts within ``respond_after_s``.

This module has the WAV-file mode (no audio hardware) and what both modes print; the
live microphone/speaker mode is in ``voxloop/ptt_live.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from realtime import events as ev
from voxloop.client import RealtimeClient, Reply
from voxloop.client_tools import Toolbox
from base.errors import VoxloopError
from base.wav import read_wav, write_wav

#: The session a push-to-talk client asks for: no server VAD, binary audio frames.
PTT_SESSION: dict[str, Any] = {"audio": {"input": {"turn_detection": None}}}
Print = Callable[[str], None]


@dataclass
class TurnReport:
    """One push-to-talk turn as the user saw it."""

    reply: Reply
    #: Monotonic time (s) the commit was sent (the talk key released).
    released_at: float

    @property
    def first_audio_after_release_ms(self) -> float | None:
        """Release of the talk key to the first reply audio received, ms."""
        if self.reply.first_audio_at is None:
            return None
        return 1000 * (self.reply.first_audio_at - self.released_at)



async def await_reply(client: RealtimeClient, timeout_s: float = 60.0, respond_after_s: float = 1.0) -> Reply:
    """The reply to a committed user turn (see the module docstring about ``response.create``)."""
    kinds = (ev.InputAudioTranscriptionCompleted, ev.InputAudioTranscriptionFailed)
    heard = await client.wait_for(kinds, timeout_s)
    if isinstance(heard, ev.InputAudioTranscriptionCompleted) and heard.transcript.strip():
        try:
            client.unread(await client.wait_for(ev.ResponseCreated, respond_after_s))
        except TimeoutError:
            await client.create_response()
    client.unread(heard)
    return await client.collect_response(timeout_s)


async def push_to_talk(client: RealtimeClient, pcm: np.ndarray, sample_rate: int,
                       realtime: bool = False, timeout_s: float = 60.0) -> TurnReport:
    """One turn: send int16 ``pcm`` at ``sample_rate`` Hz, commit, collect the reply.

    ``realtime`` paces the audio like a microphone; otherwise it goes out at once.
    """
    await client.stream_audio(pcm, sample_rate, realtime=realtime, chunk_ms=100)
    await client.commit()
    released_at = time.monotonic()
    reply = await client.answer_calls(await await_reply(client, timeout_s), timeout_s)  # runs --tools calls
    return TurnReport(reply, released_at)


def format_turn(report: TurnReport) -> list[str]:
    """The lines printed for a finished turn: both transcripts and the latencies."""
    reply = report.reply
    lines = [f"you:       {reply.user_transcript or '(nothing heard)'}"]
    if reply.status == "no_response":
        return lines
    lines += [format_call(r.name, r.arguments, r.output) for r in reply.tool_results]
    status = "" if reply.status == "completed" else f"  [{reply.status}{', ' + reply.reason if reply.reason else ''}]"
    lines.append(f"assistant: {reply.transcript}{status}")
    lines.append("latency:   " + format_latency(report.first_audio_after_release_ms, reply.metrics))
    return lines


def format_call(name: str, arguments: str, output: str | None = None) -> str:
    """``call:      get_weather({"city": "Oslo"}) -> {"sky": "sunny"}``."""
    return f"call:      {name}({arguments})" + ("" if output is None else f" -> {output}")


def format_latency(first_audio_ms: float | None, metrics: dict[str, Any]) -> str:
    """``first audio 812 ms after release (server: asr 540, llm first token 110, …) ms``."""
    stages = metrics.get("stages_ms") or {}
    parts = []
    if "asr_start" in stages and "asr_final" in stages:
        parts.append(f"asr {stages['asr_final'] - stages['asr_start']:.0f}")
    for key, label in (("llm_first_token", "llm first token"), ("tts_first_audio", "tts first audio"),
                       ("first_audio_sent", "first audio sent")):
        if key in stages:
            parts.append(f"{label} {stages[key]:.0f}")
    head = "no audio" if first_audio_ms is None else f"first audio {first_audio_ms:.0f} ms after release"
    return head + (f" (server, from commit: {', '.join(parts)} ms)" if parts else "")


def output_paths(output: Path | None, count: int) -> list[Path | None]:
    """Where each turn's reply goes: ``output`` itself for one turn, ``stem-N.wav`` for several."""
    if output is None:
        return [None] * count
    if count == 1:
        return [output]
    return [output.with_name(f"{output.stem}-{i + 1}{output.suffix or '.wav'}") for i in range(count)]


async def run_wav_turns(url: str, inputs: Sequence[Path], output: Path | None = None, *,
                        token: str | None = None, realtime: bool = False, timeout_s: float = 60.0,
                        out: Print = print, tools: Toolbox | None = None) -> list[TurnReport]:
    """One push-to-talk turn per input WAV; each reply is written to its output WAV.

    The reply counts as fully played (``x.playback`` finished) once it is written. ``tools``: the
    functions the model may call (``--tools FILE.py``); their calls run and are printed.
    """
    clips = [read_wav(path) for path in inputs]  # bad files fail before connecting
    reports = []
    async with RealtimeClient.connect(url, token=token, session=PTT_SESSION, binary_audio=True,
                                      tools=tools) as client:
        for (pcm, rate), path, target in zip(clips, inputs, output_paths(output, len(clips)), strict=True):
            out(f"--- {path} ({len(pcm) / rate:.1f} s)")
            report = await push_to_talk(client, pcm, rate, realtime=realtime, timeout_s=timeout_s)
            reply = report.reply
            for line in format_turn(report):
                out(line)
            if reply.status == "failed":
                raise VoxloopError(f"the server failed to answer ({reply.reason or 'no reason given'})",
                                   code="response_failed")
            if reply.item_id and len(reply.pcm):
                await client.report_playback(reply.item_id, 1000 * reply.audio_s, finished=True,
                                             response_id=reply.response_id)
            if target is not None:
                write_wav(target, reply.pcm, reply.sample_rate)
                out(f"reply:     {target} ({reply.audio_s:.1f} s at {reply.sample_rate} Hz)")
            reports.append(report)
    return reports
