"""Live push-to-talk: microphone and speaker through sounddevice, SPACE as the talk key.

A terminal sends key *presses* only, never key-ups. Holding a key makes the terminal
repeat it (after the OS's initial delay, usually 250-600 ms, then ~30 per second), so
:class:`TalkKey` reads SPACE like this:

* a press starts talking;
* if repeats follow within ``HOLD_DETECT_S``, the key is held: talking stops at the first
  gap in the repeats longer than ``RELEASE_GAP_S`` (release, ~0.2 s late);
* if no repeat follows (a tap, or key repeat is off), talking goes on until the next
  press: press-to-start / press-to-stop.

Talking over the assistant stops its playback at once, cancels the response if it is
still running and tells the server what was heard (``conversation.item.truncate``);
playback progress goes out as ``x.playback`` every ``REPORT_EVERY_S``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import soxr

from realtime import events as ev
from voxloop.client import RealtimeClient
from base.errors import VoxloopError
from voxloop.ptt import format_call, format_latency

HOLD_DETECT_S = 0.8  # longer than common key-repeat delays (250-660 ms)
RELEASE_GAP_S = 0.2  # several repeat intervals (~33 ms each)
REPORT_EVERY_S = 0.25
MIN_TALK_MS = 100  # shorter talk is dropped (the server refuses commits under 100 ms)
AUDIO_DEVICE_ERROR = "audio_device_error"
NO_HARDWARE_HINT = "to run without audio hardware: voxloop ptt --input-wav question.wav --output-wav reply.wav"


class TalkKey:
    """SPACE presses (with auto-repeat) -> ``"start"`` / ``"stop"`` (see the module docstring)."""

    def __init__(self, hold_detect_s: float = HOLD_DETECT_S, release_gap_s: float = RELEASE_GAP_S) -> None:
        self.hold_detect_s = hold_detect_s
        self.release_gap_s = release_gap_s
        self.state = "idle"  # idle | pressed | holding | toggled
        self._last = 0.0

    def press(self, now: float) -> str | None:
        """A SPACE character arrived at ``now`` (monotonic s)."""
        last, self._last = self._last, now
        if self.state == "idle":
            self.state = "pressed"
            return "start"
        if self.state == "toggled":
            self.state = "idle"
            return "stop"
        if self.state == "pressed" and now - last <= self.hold_detect_s:
            self.state = "holding"
        return None

    def tick(self, now: float) -> str | None:
        """Call often (every ~20-50 ms): detects a release, or decides it was a tap."""
        if self.state == "pressed" and now - self._last > self.hold_detect_s:
            self.state = "toggled"
        elif self.state == "holding" and now - self._last > self.release_gap_s:
            self.state = "idle"
            return "stop"
        return None


def open_sounddevice() -> Any:
    """The ``sounddevice`` module once PortAudio, a microphone and a speaker are known to work.

    Raises VoxloopError (code ``audio_device_error``) with what is missing and what to do.
    """
    try:
        import sounddevice
    except OSError as exc:  # sounddevice raises OSError when libportaudio is missing
        raise VoxloopError(
            f"cannot use audio devices: {exc} — the PortAudio library (Debian/Ubuntu package "
            f"libportaudio2) is not installed: `sudo apt-get install libportaudio2`; or, {NO_HARDWARE_HINT}",
            code=AUDIO_DEVICE_ERROR) from None
    for kind, check in (("microphone", sounddevice.check_input_settings),
                        ("speaker", sounddevice.check_output_settings)):
        try:
            check(channels=1, dtype="int16")
        except (sounddevice.PortAudioError, ValueError) as exc:
            raise VoxloopError(f"cannot use audio devices: no usable {kind} ({exc}); {NO_HARDWARE_HINT}",
                               code=AUDIO_DEVICE_ERROR) from None
    return sounddevice


class Playback:
    """Reply audio waiting for the speaker (thread-safe: the output callback pulls from it).

    Positions are per assistant item, in ms of that item's audio played.
    """

    def __init__(self, sample_rate: int) -> None:
        self.sample_rate = sample_rate  # Hz of the pushed and pulled audio
        self._lock = threading.Lock()
        self._chunks: collections.deque[np.ndarray] = collections.deque()
        self._offset = 0  # samples of _chunks[0] already played
        self.item_id: str | None = None
        self.response_id: str | None = None
        self._played = 0  # samples of the item played
        self._ended = False  # all of the item's audio was pushed
        self.paused = False  # the server paused the reply (speech over it): hold the queue

    def push(self, item_id: str, response_id: str, pcm: np.ndarray) -> None:
        """Queue int16 audio of ``item_id``; audio of a new item replaces what is queued."""
        with self._lock:
            if item_id != self.item_id:
                self._chunks.clear()
                self._offset, self._played, self._ended, self.paused = 0, 0, False, False
                self.item_id, self.response_id = item_id, response_id
            if len(pcm):
                self._chunks.append(pcm)

    def end_item(self) -> None:
        """All audio of the current item has been pushed."""
        with self._lock:
            self._ended = True

    def pull(self, frames: int) -> np.ndarray:
        """The next ``frames`` int16 samples to play (zero-padded when the queue runs dry)."""
        out = np.zeros(frames, np.int16)
        filled = 0
        with self._lock:
            while filled < frames and self._chunks and not self.paused:
                head = self._chunks[0]
                take = min(frames - filled, len(head) - self._offset)
                out[filled:filled + take] = head[self._offset:self._offset + take]
                filled += take
                self._offset += take
                if self._offset == len(head):
                    self._chunks.popleft()
                    self._offset = 0
            self._played += filled
        return out

    @property
    def queued_ms(self) -> float:
        with self._lock:
            return 1000 * (sum(len(c) for c in self._chunks) - self._offset) / self.sample_rate

    def position(self) -> tuple[str | None, str | None, float, bool]:
        """``(item_id, response_id, played_ms, finished)``; finished: pushed to the end and played."""
        with self._lock:
            finished = self._ended and not self._chunks
            return self.item_id, self.response_id, 1000 * self._played / self.sample_rate, finished

    def pause(self, item_id: str) -> None:
        """Stop playing ``item_id`` where it is, keeping (and still accepting) its audio."""
        with self._lock:
            if item_id == self.item_id:
                self.paused = True

    def resume(self, item_id: str) -> None:
        """Play on from where ``pause`` stopped."""
        with self._lock:
            if item_id == self.item_id:
                self.paused = False

    def stop(self) -> tuple[str | None, float]:
        """Empty the queue at once; returns the interrupted item and its ms played."""
        with self._lock:
            item, played_ms = self.item_id, 1000 * self._played / self.sample_rate
            still_playing = item is not None and not (self._ended and not self._chunks)
            self._chunks.clear()
            self._offset, self.item_id, self.response_id, self.paused = 0, None, None, False
        return (item, played_ms) if still_playing else (None, played_ms)


class LiveConversation:
    """Keys and microphone in, speaker and transcript out, over one client connection.

    ``audio`` is the sounddevice module (tests pass a stand-in); ``write`` prints text.
    """

    def __init__(self, client: RealtimeClient, audio: Any, write: Callable[[str], None] | None = None,
                 input_device: Any = None, output_device: Any = None) -> None:
        self.client = client
        self.audio = audio
        self.write = write or _stdout_write
        self.devices = (input_device, output_device)
        self.mic_rate = int(audio.query_devices(input_device, "input")["default_samplerate"])
        self.speaker_rate = int(audio.query_devices(output_device, "output")["default_samplerate"])
        self.playback = Playback(self.speaker_rate)
        self.talking = False
        self.talk_ms = 0.0
        self.active: str | None = None  # response in progress
        self.dropped: set[str] = set()  # responses talked over: their late audio is not played
        self.released_at: float | None = None
        self.first_audio_at: float | None = None
        self._mic: asyncio.Queue[np.ndarray] = asyncio.Queue(maxsize=500)
        self._to_session = soxr.ResampleStream(self.mic_rate, client.session.input_rate, 1, dtype="int16")
        self._to_speaker: soxr.ResampleStream | None = None
        self._reported: tuple[str | None, float, bool] = (None, -1.0, False)
        self.calls: list[Any] = []  # function calls of the response in progress
        self._tasks: set[asyncio.Task] = set()  # calls being run

    async def run(self, keys: AsyncIterator[str]) -> None:
        """Converse until ``keys`` yields ``"quit"`` or ends (or the connection closes)."""
        loop = asyncio.get_running_loop()

        def on_mic(indata: np.ndarray, frames: int, t: Any, status: Any) -> None:
            loop.call_soon_threadsafe(self._mic_chunk, indata[:, 0].copy())

        def on_speaker(outdata: np.ndarray, frames: int, t: Any, status: Any) -> None:
            outdata[:, 0] = self.playback.pull(frames)

        mic = self.audio.InputStream(samplerate=self.mic_rate, channels=1, dtype="int16", device=self.devices[0],
                                     blocksize=self.mic_rate // 50, callback=on_mic)
        speaker = self.audio.OutputStream(samplerate=self.speaker_rate, channels=1, dtype="int16",
                                          device=self.devices[1], blocksize=self.speaker_rate // 50,
                                          callback=on_speaker)
        with mic, speaker:
            # Any of these ending ends the conversation: quit, the server closing, an error.
            tasks = [asyncio.create_task(c) for c in (self._keys(keys), self._send_mic(), self._receive(),
                                                      self._report())]
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        for t in done:
            if not t.cancelled() and t.exception() is not None:
                raise t.exception()

    async def _keys(self, keys: AsyncIterator[str]) -> None:
        async for action in keys:
            if action == "quit":
                return
            await (self.start_talking() if action == "start" else self.stop_talking())

    # ------------------------------------------------------------------ talking
    def _mic_chunk(self, pcm: np.ndarray) -> None:
        if not self.talking:
            return
        with contextlib.suppress(asyncio.QueueFull):  # the network is 10 s behind: drop
            self._mic.put_nowait(pcm)

    async def _send_mic(self) -> None:
        while True:
            pcm = self._to_session.resample_chunk(await self._mic.get())
            if len(pcm):
                self.talk_ms += 1000 * len(pcm) / self.client.session.input_rate
                await self.client.send_audio(pcm, self.client.session.input_rate)

    async def start_talking(self) -> None:
        """Talk key down: silence the assistant (barge-in), then record."""
        item, played_ms = self.playback.stop()
        if self.active is not None:
            self.dropped.add(self.active)
            await self.client.cancel_response(self.active)
        if item is not None:
            await self.client.truncate(item, played_ms)
            self.write(f"\n(interrupted after {played_ms / 1000:.1f} s)\n")
        await self.client.clear()
        self.talking, self.talk_ms = True, 0.0
        self.write("(listening: release SPACE to send)\n")

    async def stop_talking(self) -> None:
        """Talk key up: flush the microphone and commit the turn."""
        self.talking = False
        while not self._mic.empty():
            await asyncio.sleep(0.01)  # let _send_mic pass on what was recorded
        if self.talk_ms < MIN_TALK_MS:
            await self.client.clear()
            self.write("(too short: hold SPACE while you talk)\n")
            return
        await self.client.commit()
        self.released_at = time.monotonic()

    # ------------------------------------------------------------------ server events
    async def _receive(self) -> None:
        async for event in self.client.events():
            self._on_event(event)

    def _on_event(self, event: ev.ServerEvent) -> None:
        if isinstance(event, ev.InputAudioTranscriptionCompleted):
            self.write(f"you:       {event.transcript or '(nothing heard)'}\n")
        elif isinstance(event, ev.ResponseCreated):
            self.active, self.first_audio_at = event.response.id, None
            self._to_speaker = soxr.ResampleStream(self.client.session.output_rate, self.speaker_rate, 1,
                                                   dtype="int16")
            self.write("assistant: ")
        elif isinstance(event, ev.ResponseOutputAudioTranscriptDelta | ev.ResponseOutputTextDelta):
            if event.response_id not in self.dropped:
                self.write(event.delta)
        elif isinstance(event, ev.ResponseOutputAudioDelta):
            self._on_audio(event)
        elif isinstance(event, ev.ResponseOutputItemDone) and isinstance(event.item, ev.FunctionCallItem):
            if event.item.status == "completed" and event.response_id not in self.dropped:
                self.calls.append(event.item)
                self.write("\n" + format_call(event.item.name, event.item.arguments))
        elif isinstance(event, ev.ResponseDone):
            self._on_done(event.response)
        elif isinstance(event, ev.XOutputAudioBufferPaused):  # semantic_vad: speech over the reply
            self.playback.pause(event.item_id)
        elif isinstance(event, ev.XOutputAudioBufferResumed):  # it was a cough or an "mm-hm"
            self.playback.resume(event.item_id)
        elif isinstance(event, ev.XOutputAudioBufferCleared):  # it was an interruption
            self.dropped.add(event.response_id)
            self.playback.stop()
        elif isinstance(event, ev.XTurnMetrics):
            first = self.first_audio_at
            ms = None if first is None or self.released_at is None else 1000 * (first - self.released_at)
            self.write("latency:   " + format_latency(ms, event.metrics) + "\n")
        elif isinstance(event, ev.ErrorEvent) and event.error.code != "response_cancel_not_active":
            self.write(f"\nserver error {event.error.code}: {event.error.message}\n")

    def _on_audio(self, event: ev.ResponseOutputAudioDelta) -> None:
        if event.response_id in self.dropped or self._to_speaker is None:
            return
        self.first_audio_at = self.first_audio_at or time.monotonic()
        self.playback.push(event.item_id, event.response_id, self._to_speaker.resample_chunk(event.pcm))

    def _on_done(self, response: Any) -> None:
        if response.id == self.active:
            self.active = None
        if response.id in self.dropped:
            return
        if self._to_speaker is not None and self.playback.response_id == response.id:
            self.playback.push(self.playback.item_id or "", response.id,
                               self._to_speaker.resample_chunk(np.zeros(0, np.int16), last=True))
            self.playback.end_item()
        details = response.status_details
        tail = "" if response.status == "completed" else f"  [{response.status}" + (
            f", {details.reason}]" if details and details.reason else "]")
        self.write(tail + "\n")
        calls, self.calls = self.calls, []
        if calls and response.status == "completed":  # run them (--tools), then the answer
            task = asyncio.create_task(self._answer(calls))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _answer(self, calls: list[Any]) -> None:
        for result in await self.client.send_call_outputs(calls):
            self.write(format_call(result.name, result.arguments, result.output) + "\n")
        await self.client.create_response()

    async def _report(self) -> None:
        """``x.playback`` while playing, and once with ``finished`` at the end of an item."""
        while True:
            await asyncio.sleep(REPORT_EVERY_S)
            item, response, played_ms, finished = self.playback.position()
            if item is None or (item, played_ms, finished) == self._reported:
                continue  # nothing new (a finished item stays unchanged)
            self._reported = (item, played_ms, finished)
            await self.client.report_playback(item, played_ms, finished=finished, response_id=response)


def _stdout_write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


async def terminal_keys(key: TalkKey | None = None, tick_s: float = 0.03) -> AsyncIterator[str]:
    """``"start"``/``"stop"`` from SPACE on the terminal (cbreak mode), ``"quit"`` on q / Ctrl-D."""
    import termios
    import tty

    fd = sys.stdin.fileno()
    if not os.isatty(fd):
        raise VoxloopError("live push-to-talk needs a terminal (stdin is not a tty); "
                           "use --input-wav FILE for a scripted turn", code="not_a_terminal")
    key = key or TalkKey()
    chars: asyncio.Queue[str] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)  # keys arrive one by one, unechoed; Ctrl-C still interrupts
    loop.add_reader(fd, lambda: chars.put_nowait(os.read(fd, 64).decode("utf-8", "replace") or "\x04"))
    try:
        while True:
            try:
                typed = await asyncio.wait_for(chars.get(), tick_s)
            except TimeoutError:
                typed = ""
            now = time.monotonic()
            if "q" in typed.lower() or "\x04" in typed:
                yield "quit"
                return
            for action in [key.press(now) for ch in typed if ch == " "] + [key.tick(now)]:
                if action is not None:
                    yield action
    finally:
        loop.remove_reader(fd)
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
