"""Where the serving layer keeps state: `$LINK_HOME` (default `~/.link`)."""

from __future__ import annotations

import os
from pathlib import Path


def link_home() -> Path:
    """The state directory: `$LINK_HOME`, else `~/.link`. Created on first use."""
    home = Path(os.environ.get("LINK_HOME") or Path.home() / ".link").expanduser()
    home.mkdir(parents=True, exist_ok=True)
    return home


def cache_dir(kind: str) -> Path:
    """A cache subdirectory of `link_home()` (tokenizers, assembled models, ...)."""
    path = link_home() / "cache" / kind
    path.mkdir(parents=True, exist_ok=True)
    return path
