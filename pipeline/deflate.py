"""permessage-deflate that never compresses audio.

Browsers, the ``openai`` SDK and the ``websockets`` client all offer permessage-deflate, and
the server accepts it: RFC 7692 lets a sender leave any message uncompressed (RSV1 clear),
and every compliant peer reads such a message as is. This extension uses that freedom:

* audio is sent uncompressed: binary frames (the fast path carries only audio) and the JSON
  audio deltas, recognised by their first bytes (every event is serialized with ``"type"``
  first, see ``realtime.protocol``). Deflating a 100 ms JSON audio delta costs ≈ 0.17 ms of CPU
  (≈ 1.7 ms per second of speech sent, i.e. one core per ≈ 600 listeners) and only takes back
  most of base64's overhead (to 0.66 of the JSON, ≈ 0.88 of the PCM); at 50 clients on an H200
  it was half the event loop's time;
* every other text event (session objects, transcripts, errors) is compressed, with the
  context kept between messages as negotiated: ≈ 4 µs each, to about a third of their size.
  Figures: ``python -m bench.ws_serialize`` (bench/results/ws_serialize-*.json).

Skipped messages do not enter the compressor, so its window stays valid for the next
compressed one. Received messages are decoded as negotiated (compressed or not).
"""

from __future__ import annotations

from collections.abc import Sequence

from websockets.extensions.base import Extension
from websockets.extensions.permessage_deflate import PerMessageDeflate, ServerPerMessageDeflateFactory
from websockets.frames import CTRL_OPCODES, Frame, Opcode
from websockets.typing import ExtensionParameter

#: How a JSON audio delta starts (``"type"`` first, compact separators).
AUDIO_PREFIXES = (b'{"type":"response.output_audio.delta"', b'{"type":"x.tts.audio.delta"')


def is_audio(frame: Frame) -> bool:
    """True for the first frame of an audio message (binary, or a JSON audio delta)."""
    return frame.opcode is Opcode.BINARY or bytes(frame.data[:40]).startswith(AUDIO_PREFIXES)


class AudioPassthroughDeflate(PerMessageDeflate):
    """``PerMessageDeflate`` whose encoder sends audio messages uncompressed."""

    _skipping = False  # inside a fragmented audio message

    def encode(self, frame: Frame) -> Frame:
        if frame.opcode in CTRL_OPCODES:
            return frame
        if frame.opcode is not Opcode.CONT:
            self._skipping = is_audio(frame)
        if self._skipping:
            return frame
        return super().encode(frame)


class AudioPassthroughDeflateFactory(ServerPerMessageDeflateFactory):
    """Negotiates permessage-deflate like websockets' default server, with audio left uncompressed."""

    def __init__(self) -> None:
        # websockets' defaults for servers: small windows keep per-connection memory low.
        super().__init__(server_max_window_bits=12, client_max_window_bits=12, compress_settings={"memLevel": 5})

    def process_request_params(
        self, params: Sequence[ExtensionParameter], accepted_extensions: Sequence[Extension]
    ) -> tuple[list[ExtensionParameter], PerMessageDeflate]:
        response, ext = super().process_request_params(params, accepted_extensions)
        return response, AudioPassthroughDeflate(
            ext.remote_no_context_takeover,
            ext.local_no_context_takeover,
            ext.remote_max_window_bits,
            ext.local_max_window_bits,
            ext.compress_settings,
        )
