"""A stopped Envoy leaves no files behind but a log it was told to write elsewhere, and can be
started again (real Envoy, admin-only bootstrap)."""

from __future__ import annotations

from pathlib import Path

from harness.envoy_process import EnvoyProcess, free_port


def admin_only(port: int) -> dict[str, object]:
    return {"admin": {"address": {"socket_address": {"address": "127.0.0.1",
                                                      "port_value": port}}}}


def test_stop_removes_the_private_folder_and_keeps_a_log_written_elsewhere(
    tmp_path: Path,
) -> None:
    port = free_port()
    envoy = EnvoyProcess(admin_only(port), port).start()
    folder = envoy.log_path.parent
    try:
        envoy.wait_ready()
        assert (folder / "bootstrap.json").exists()
    finally:
        envoy.stop()
    assert not folder.exists()
    envoy.start()  # again after a stop
    try:
        envoy.wait_ready()
    finally:
        envoy.stop()
    assert not folder.exists()
    kept = tmp_path / "envoy.log"
    port = free_port()
    envoy = EnvoyProcess(admin_only(port), port, log_path=kept).start()
    try:
        envoy.wait_ready()
    finally:
        envoy.stop()
    assert kept.exists()
