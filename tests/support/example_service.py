"""A real `BallastService` on `examples/desired.yaml` in a temporary folder, for the tests that
reload an edit of it (the file's text is handed over for editing)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from control_plane.lifecycle.service import BallastService, ServiceConfig
from harness.envoy_process import free_port

EXAMPLE = Path("examples/desired.yaml")


@asynccontextmanager
async def example_service(tmp_path: Path, **config: Any
                          ) -> AsyncIterator[tuple[BallastService, str]]:
    """Started on a free xDS port without admin API or probes (`config` overrides), stopped
    after; yields it with the desired file's text."""
    text = EXAMPLE.read_text()
    path = tmp_path / "desired.yaml"
    path.write_text(text)
    service = BallastService(ServiceConfig(**{
        "desired_path": path, "state_dir": tmp_path / "state",
        "xds_address": f"127.0.0.1:{free_port()}", "admin_address": None, "probes": False,
        **config}))
    await service.start()
    try:
        yield service, text
    finally:
        await service.stop()
