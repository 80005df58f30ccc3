"""`make run`'s demo: a real fleet comes up from a desired-state file and stops on Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from harness.envoy_process import free_port
from harness.eventually import eventually_blocking
from harness.fleet import fast_desired

pytestmark = pytest.mark.envoy
ROOT = Path(__file__).resolve().parents[1]


def _wait_for_line(proc: subprocess.Popen[str], text: str, timeout: float) -> str:
    stdout = proc.stdout
    assert stdout is not None
    seen: list[str] = []

    def heard() -> bool:
        line = stdout.readline()
        if not line and proc.poll() is not None:
            raise AssertionError(f"no {text!r} from the demo, which exited: {''.join(seen)}")
        seen.append(line)
        return text in line

    eventually_blocking(heard, timeout, f"{text!r} from the demo", interval=0)
    return "".join(seen)


def test_demo_serves_both_pops_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    listener, sjc_listener = sorted((free_port(), free_port()))
    desired = tmp_path / "desired.yaml"
    desired.write_text(fast_desired(
        sjc_offset=sjc_listener - listener, primary=free_port(), secondary=free_port(),
        listener=listener,
    ))
    envoy_admin, admin = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.demo", str(desired),
         "--state-dir", str(tmp_path / "state"), "--xds-port", str(free_port()),
         "--admin-port", str(admin), "--envoy-admin-port", str(envoy_admin)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    try:
        guide = _wait_for_line(proc, "Ctrl-C stops everything", 40)
        assert "over mTLS" in guide
        assert f"127.0.0.1:{listener}/api/checkout" in guide
        assert f"127.0.0.1:{sjc_listener}/api/checkout" in guide
        for port in (listener, sjc_listener):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/checkout", timeout=5) as r:
                # either origin of the group: 5 % of requests go to the warm standby, and a
                # critical request the primary has not answered within 50 ms is hedged to it
                assert r.headers["x-origin"] in ("primary", "secondary")
                assert r.headers["x-seen-tier"] == "critical"
        status = f"http://127.0.0.1:{admin}/status"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(status, timeout=5)
        assert refused.value.code == 401  # the admin API wants the demo's token
        token = (tmp_path / "state" / "certs" / "admin.token").read_text().strip()
        request = urllib.request.Request(status, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=5) as r:
            assert json.loads(r.read())["xds_tls"]["reloads"] == 0
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0, out
        assert "demo stopped" in out
        for port in (listener, sjc_listener, envoy_admin, envoy_admin + 1):
            with pytest.raises(ConnectionRefusedError), socket.create_connection(
                ("127.0.0.1", port), timeout=2
            ):
                pass  # nothing of the demo is left listening
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
