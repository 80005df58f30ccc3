"""`ballast serve` as a subprocess: a real Envoy gets its config; SIGTERM stops it cleanly."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from control_plane.cli.main import main
from control_plane.translate.bootstrap import XdsClientTls, ads_bootstrap
from harness.ads_desired import write_desired
from harness.demo_origin import DemoOrigin
from harness.envoy_process import EnvoyProcess, free_port
from harness.eventually import eventually

ROOT = Path(__file__).resolve().parents[1]


def ballast(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "control_plane.cli.main", "serve", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def isolated(tmp_path: Path) -> tuple[str, ...]:
    """Own state dir, any free admin port, no probes: tests never share anything."""
    return ("--state-dir", str(tmp_path / "state"), "--admin-address", "127.0.0.1:0",
            "--no-probes")


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture
async def origin() -> AsyncIterator[DemoOrigin]:
    the_origin = await DemoOrigin("primary", free_port()).start()
    try:
        yield the_origin
    finally:
        await the_origin.stop()


def fetch(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/catalog", timeout=5) as response:
        return str(response.headers["x-origin"])


@pytest.mark.envoy
async def test_sigterm_closes_streams_and_envoy_keeps_serving(
    tmp_path: Path, origin: DemoOrigin
) -> None:
    listener, sjc_listener = sorted((free_port(), free_port()))
    xds, admin = free_port(), free_port()
    path = write_desired(
        tmp_path / "desired.yaml",
        listener_port=listener,
        sjc_offset=sjc_listener - listener,
        primary_port=origin.port,
        secondary_port=free_port(),
    )
    proc = ballast(str(path), "--xds-address", f"127.0.0.1:{xds}", *isolated(tmp_path))
    envoy = EnvoyProcess(ads_bootstrap(node_id="ewr-1", pop="ewr", xds_port=xds, admin_port=admin),
                         admin)
    try:
        envoy.start()
        await asyncio.to_thread(envoy.wait_ready, 15)
        assert await asyncio.to_thread(fetch, listener) == "primary"
        assert "connected_state: 1" in envoy.admin("/stats?filter=control_plane.connected_state")
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.to_thread(proc.communicate, None, 10)
        took = time.monotonic() - started
        assert proc.returncode == 0, stderr
        assert took < 3.0
        assert "shutting down" in stderr and "disconnected" in stderr
        state = "/stats?filter=control_plane.connected_state"
        await eventually(  # Envoy notices the closed stream (loaded CI: slowly)
            lambda: "connected_state: 0" in envoy.admin(state), 5,
            "Envoy sees the xDS stream closed", in_thread=True, interval=0.1)
        for _ in range(5):  # the last config keeps serving
            assert await asyncio.to_thread(fetch, listener) == "primary"
        dump = json.loads(envoy.admin("/config_dump"))
        assert any(c["@type"].endswith("ListenersConfigDump") for c in dump["configs"])
    finally:
        stop(proc)
        envoy.stop()


def test_serve_reports_bad_desired_state(tmp_path: Path) -> None:
    path = tmp_path / "desired.yaml"
    path.write_text("pops: {ewr: {port_offset: -1}}\nlisteners: nope\n")
    proc = ballast(str(path), "--xds-address", f"127.0.0.1:{free_port()}", *isolated(tmp_path))
    try:
        _, stderr = proc.communicate(timeout=20)
        assert proc.returncode == 1
        assert str(path) in stderr
        assert "Traceback" not in stderr
    finally:
        stop(proc)


def healthy(admin: int, proc: subprocess.Popen[str]) -> bool:
    """`ballast serve` answers /healthz (and has not exited)."""
    assert proc.poll() is None, proc.communicate()[1]
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/healthz", timeout=2):
        return True


@pytest.mark.envoy
async def test_serve_with_mtls_and_an_admin_token_from_the_command_line(
    tmp_path: Path, origin: DemoOrigin
) -> None:
    """`ballast serve --tls-cert --tls-key --client-ca --admin-token-file`, wired end to end:
    an Envoy with `ballast certs`' files and `ballast bootstrap --tls-*` gets its config, the
    admin API wants the token."""
    certs = tmp_path / "certs"
    assert main(["certs", str(certs), "--node", "ewr/ewr-1", "--admin-token"]) == 0
    listener, xds, admin, envoy_admin = free_port(), free_port(), free_port(), free_port()
    path = write_desired(tmp_path / "desired.yaml", listener_port=listener,
                         primary_port=origin.port, secondary_port=free_port())
    proc = ballast(
        str(path), "--xds-address", f"127.0.0.1:{xds}", "--state-dir", str(tmp_path / "state"),
        "--admin-address", f"127.0.0.1:{admin}", "--no-probes",
        "--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key"),
        "--client-ca", str(certs / "ca.pem"), "--admin-token-file", str(certs / "admin.token"),
    )
    bootstrap = ads_bootstrap(
        node_id="ewr-1", pop="ewr", xds_port=xds, admin_port=envoy_admin,
        tls=XdsClientTls(cert=str(certs / "nodes/ewr/ewr-1.pem"),
                         key=str(certs / "nodes/ewr/ewr-1.key"), ca=str(certs / "ca.pem")),
    )
    envoy = EnvoyProcess(bootstrap, envoy_admin)
    try:
        # the admin API binds after xDS: once it answers, the Envoy's first connect finds the
        # port (else its retry back-off can outlast the wait on a loaded machine)
        await eventually(lambda: healthy(admin, proc), 30, "ballast serve answers /healthz",
                         in_thread=True, ignore=(OSError,))
        envoy.start()
        await asyncio.to_thread(envoy.wait_ready, 15)
        assert await asyncio.to_thread(fetch, listener) == "primary"
        status = f"http://127.0.0.1:{admin}/status"
        with pytest.raises(urllib.error.HTTPError) as refused:
            await asyncio.to_thread(urllib.request.urlopen, status, None, 5)
        assert refused.value.code == 401
        token = (certs / "admin.token").read_text().strip()
        request = urllib.request.Request(status, headers={"Authorization": f"Bearer {token}"})
        with await asyncio.to_thread(urllib.request.urlopen, request, None, 5) as response:
            summary = json.loads(response.read())
        assert summary["xds_tls"]["last_error"] is None and summary["admin_auth"] == "token"
        os.killpg(proc.pid, signal.SIGTERM)
        _, stderr = await asyncio.to_thread(proc.communicate, None, 10)
        assert proc.returncode == 0, stderr
        assert "serving xDS (mTLS)" in stderr
    finally:
        envoy.stop()
        stop(proc)
