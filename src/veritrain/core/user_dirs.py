"""The user's own folders, outside every workspace: what a workspace's owner (or a forger who hands over a workspace)
can write never decides what the verifier believes.

- config: `$XDG_CONFIG_HOME/veritrain/` (default `~/.config/veritrain/`): the signing key pair, the trusted-keys file;
- cache: `$XDG_CACHE_HOME/veritrain/` (default `~/.cache/veritrain/`): what verify computed from a file's bytes (a
  checkpoint's state hash), keyed by their SHA-256 and veritrain's version; safe to delete at any time;
- state: `$XDG_STATE_HOME/veritrain/` (default `~/.local/state/veritrain/`): which runs this user started (the marks
  that let a command on such a run import the code it recorded without `--trust-code`).
"""

from __future__ import annotations

import os
from pathlib import Path


def _base(variable: str, default: str) -> Path:
    value = os.environ.get(variable)
    return Path(value).expanduser() if value and Path(value).is_absolute() else Path.home() / default


def config_dir() -> Path:
    return _base("XDG_CONFIG_HOME", ".config") / "veritrain"


def cache_dir() -> Path:
    return _base("XDG_CACHE_HOME", ".cache") / "veritrain"


def state_dir() -> Path:
    return _base("XDG_STATE_HOME", ".local/state") / "veritrain"
