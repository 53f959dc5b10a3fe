"""Argument types the subcommands share."""

from __future__ import annotations

import argparse
from pathlib import Path


def path_arg(text: str) -> Path:
    """A path typed on the command line; an empty one is refused (``Path("")`` would silently be ``.``)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not a path: name a file or a directory")
    return Path(text)
