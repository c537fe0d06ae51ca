"""``voxloop ptt``: push-to-talk desktop client (microphone + speaker, or WAV files)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from voxloop.commands import config_from_args
from base.errors import InvalidInput


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ptt", help="push-to-talk client: hold SPACE to talk (or --input-wav FILE without audio hardware)",
        description="Hold SPACE to talk, release to send. A terminal shows no key releases: holding "
                    "SPACE is read from its auto-repeat (release = repeats stop, ~0.2 s late); with key "
                    "repeat off, or after a tap, press SPACE once to start and again to stop. "
                    "Talking over the assistant stops its playback. q or Ctrl-D quits.")
    p.add_argument("--url", help="server WebSocket URL (default: ws://<server.host>:<server.port>/v1/realtime)")
    p.add_argument("--token", help="bearer token (default: server.auth_token from the config)")
    p.add_argument("--input-wav", type=Path, action="append", metavar="FILE",
                   help="16-bit WAV to send as one push-to-talk turn (repeatable); no audio hardware needed")
    p.add_argument("--output-wav", type=Path, metavar="FILE",
                   help="write the reply here (FILE-1.wav, FILE-2.wav… for several inputs); needs --input-wav")
    p.add_argument("--realtime", action="store_true", help="send input WAVs at real-time pace, like a microphone")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S", help="seconds to wait for each reply")
    p.add_argument("--input-device", help="microphone (sounddevice name or index; default: the system's)")
    p.add_argument("--output-device", help="speaker (sounddevice name or index; default: the system's)")
    p.add_argument("--tools", type=Path, metavar="FILE.py",
                   help="offer the public functions of this Python file as tools the model may call "
                        "(schemas from their type hints); calls and results are printed")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    host = "127.0.0.1" if cfg.server.host in ("0.0.0.0", "::", "") else cfg.server.host
    url = args.url or f"ws://{host}:{cfg.server.port}/v1/realtime"
    token = args.token if args.token is not None else cfg.server.auth_token
    tools = None
    if args.tools is not None:
        from voxloop.client_tools import load_tools

        tools = load_tools(args.tools)
        print(f"tools: {', '.join(tools.tools)}")
    if args.input_wav:
        from voxloop.ptt import run_wav_turns

        asyncio.run(run_wav_turns(url, args.input_wav, args.output_wav, token=token,
                                  realtime=args.realtime, timeout_s=args.timeout, tools=tools))
        return 0
    if args.output_wav is not None:
        raise InvalidInput("--output-wav needs --input-wav (live replies are played, not written)")
    asyncio.run(_live(url, token, _device(args.input_device), _device(args.output_device), tools))
    return 0


def _device(value: str | None) -> int | str | None:
    return int(value) if value is not None and value.isdigit() else value


async def _live(url: str, token: str | None, input_device, output_device, tools=None) -> None:
    from voxloop.client import RealtimeClient
    from voxloop.ptt import PTT_SESSION
    from voxloop.ptt_live import LiveConversation, open_sounddevice, terminal_keys

    audio = open_sounddevice()  # fails with a clear message before connecting
    async with RealtimeClient.connect(url, token=token, session=PTT_SESSION, binary_audio=True,
                                      tools=tools) as client:
        print(f"connected to {url}: hold SPACE to talk, q to quit")
        await LiveConversation(client, audio, input_device=input_device, output_device=output_device).run(
            terminal_keys())
