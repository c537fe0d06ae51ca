"""The ``voxloop`` command. Each subcommand lives in ``voxloop/commands/<name>.py``
with ``add_parser(subparsers)`` and ``run(args) -> int``."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from base.errors import VoxloopError

COMMANDS = ("serve", "say", "models", "trace", "g2p", "ptt")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voxloop", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="TOML config file (default: configs/default.toml)")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
        help="override one config value (repeatable), e.g. --set llm.max_tokens=80",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"voxloop.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"voxloop.commands.{name}":
                raise
            continue
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.run(args) or 0)
    except VoxloopError as exc:
        print(f"voxloop: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
