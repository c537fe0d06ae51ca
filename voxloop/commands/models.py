"""``voxloop models``: print each model's source, path, size, checksum; prepare missing ones.

Preparing: whisper base is assembled once; with ``tts.streaming`` (CPU) the voice is
exported once as chunked ONNX (needs PyTorch, ~10 s).
"""

from __future__ import annotations

import argparse
import json

from tts_engine import chunked_voice
from base import models
from voxloop.commands import config_from_args


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="show and prepare the models (assembles whisper, exports the streaming voice)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--no-checksum", action="store_true", help="skip sha256 of large files")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    infos = models.resolve_all(cfg)
    if chunked_voice.needs_chunked_voice(cfg):
        infos.append(chunked_voice.resolve_chunked_voice(cfg))
    rows = [models.describe(i, with_checksum=not args.no_checksum) for i in infos]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        print(f"{r['kind']:4} {r['source']}")
        print(f"     path    {r['path']}")
        print(f"     size    {r['size_mb']} MB   license {r['license']}")
        print(f"     sha256  {r['sha256'] or '-'}")
    return 0
