"""The state directory: ``--state-dir``, else ``$BALLAST_STATE_DIR``, else ``var/ballast``."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_STATE_DIR = "var/ballast"
STATE_DIR_ENV = "BALLAST_STATE_DIR"


def state_dir(explicit: str | None = None) -> Path:
    return Path(explicit or os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)
