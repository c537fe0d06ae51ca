"""Subcommands of the ``voxloop`` CLI, one module each."""

from __future__ import annotations

import argparse

from base.config import Config, load_config


def config_from_args(args: argparse.Namespace) -> Config:
    """The config selected by the global ``--config``/``--set`` flags and the environment."""
    return load_config(getattr(args, "config", None), getattr(args, "overrides", None))
