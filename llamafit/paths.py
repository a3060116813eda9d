"""llamafit's own folders: the cache (headers, probes, the demo model) and the data (launch history)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$LLAMAFIT_CACHE``, else ``$XDG_CACHE_HOME/llamafit``, else ``~/.cache/llamafit``."""
    env = os.environ.get("LLAMAFIT_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "llamafit" if xdg else Path.home() / ".cache" / "llamafit"


def data_dir() -> Path:
    """``$LLAMAFIT_DATA``, else ``$XDG_DATA_HOME/llamafit``, else ``~/.local/share/llamafit``."""
    env = os.environ.get("LLAMAFIT_DATA")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_DATA_HOME")
    return Path(xdg) / "llamafit" if xdg else Path.home() / ".local" / "share" / "llamafit"
