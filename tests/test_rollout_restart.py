"""Issue 23: `kill -9` of Ballast in the middle of a rollout, then a restart.

`ballast serve` runs as a real process with real Envoys in three PoPs. A change rolls out; while
its canary wave (ewr) bakes, Ballast is killed with SIGKILL and started again. The restarted
server serves exactly what was served before the kill — ewr the new version, sjc and lax the
old one (no Envoy is pushed anything else) — and the rollout goes on from its saved state (the
canary baking again from the restart, its nodes ACKing anew) to pass on every PoP.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from control_plane.decisions.read import iter_records
from harness.envoy_process import free_port
from harness.eventually import eventually
from harness.rollout_fleet import POPS, RolloutFleet, origins_and_envoys

pytestmark = pytest.mark.envoy

ROOT = Path(__file__).resolve().parents[1]
UNREACHABLE = (OSError, urllib.error.URLError)
ROUTES = "/config_dump?resource=dynamic_route_configs"
MARKER = "/restart-marker"


def _serve(fleet: RolloutFleet, admin: int) -> subprocess.Popen[bytes]:
    with open(fleet.path.parent / "serve.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "control_plane.cli.main", "serve", str(fleet.path),
             "--xds-address", f"127.0.0.1:{fleet.ports.xds}",
             "--admin-address", f"127.0.0.1:{admin}", "--state-dir", str(fleet.state_dir),
             "--no-probes", "--log-level", "warning"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
        )


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=2) as response:
        return json.loads(response.read())


def _rollout(admin_url: str) -> dict[str, Any]:
    shown: dict[str, Any] = _get(f"{admin_url}/rollout")
    return shown


def _on_marker(fleet: RolloutFleet) -> dict[str, bool]:
    return {pop: MARKER in envoy.admin(ROUTES) for pop, envoy in fleet.envoys.items()}


async def test_kill_9_mid_rollout_resumes_where_it_was(tmp_path: Path) -> None:
    async with origins_and_envoys(tmp_path) as fleet:
        admin = free_port()
        admin_url = f"http://127.0.0.1:{admin}"
        proc = _serve(fleet, admin)
        history: list[dict[str, bool]] = []
        stop = asyncio.Event()

        async def watch() -> None:  # what each Envoy holds, as it changes, across the kill
            while not stop.is_set():
                held = await asyncio.to_thread(_on_marker, fleet)
                if not history or history[-1] != held:
                    history.append(held)
                await asyncio.sleep(0.1)

        watcher: asyncio.Task[None] | None = None
        try:
            await eventually(lambda: _get(f"{admin_url}/readyz"), 20, "ballast ready",
                             in_thread=True, ignore=UNREACHABLE)
            for envoy in fleet.envoys.values():
                await asyncio.to_thread(envoy.wait_ready, 20)
            fleet.start_traffic()
            await eventually(lambda: all(v["applied"] == 1 for v in
                                         _rollout(admin_url)["pop_versions"].values()),
                             20, "every Envoy synced", in_thread=True, ignore=UNREACHABLE)
            old = {pop: v["version"] for pop, v in _rollout(admin_url)["pop_versions"].items()}
            # a few seconds of traffic reported before the change: each PoP's own baseline
            # (taken when its wave starts and saved with the rollout: it outlives the kill)
            await eventually(lambda: fleet.origins["primary"].total > 240, 20,
                             "traffic through every PoP")
            watcher = asyncio.create_task(watch())
            fleet.write(marker=MARKER.strip("/"), bake="6s")
            await eventually(lambda: _on_marker(fleet)["ewr"], 20, "the canary on the change",
                             in_thread=True)
            before_kill = _rollout(admin_url)
            assert before_kill["rollout"]["phase"] == "baking", before_kill
            assert before_kill["rollout"]["wave"] == 0, before_kill
            new = before_kill["rollout"]["to_version"]
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            assert _on_marker(fleet) == {"ewr": True, "sjc": False, "lax": False}

            proc = _serve(fleet, admin)
            await eventually(lambda: _get(f"{admin_url}/readyz"), 20, "ballast ready again",
                             in_thread=True, ignore=UNREACHABLE)
            restarted = _rollout(admin_url)
            # what was served before the kill, PoP by PoP, and the rollout where it was
            # (the canary bakes again from the restart: its nodes reconnect and ACK anew)
            assert restarted["rollout"]["to_version"] == new, restarted
            assert restarted["rollout"]["phase"] == "baking", restarted
            assert restarted["rollout"]["wave"] == 0, restarted
            assert "bakes again from now: Ballast restarted" in restarted["rollout"]["reason"]
            versions = {pop: v["version"] for pop, v in restarted["pop_versions"].items()}
            assert versions == {"ewr": new, "sjc": old["sjc"], "lax": old["lax"]}, versions
            restored = [r for r in iter_records(fleet.state_dir) if r["kind"] == "state_restored"
                        and "rollout" in r["rule"]]
            assert restored and restored[-1]["detail"]["pop_versions"]["ewr"] == new, restored
            await eventually(lambda: _rollout(admin_url)["rollout"]["phase"] == "passed", 60,
                             "the rollout to pass after the restart", in_thread=True,
                             ignore=UNREACHABLE)
            await eventually(lambda: all(_on_marker(fleet).values()), 20,
                             "every Envoy on the new version", in_thread=True)
        finally:
            stop.set()
            if watcher is not None:
                await watcher
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    # no Envoy ever went back, and none got the change before the one of the wave before it
    order = [tuple(held[pop] for pop in POPS) for held in history]
    assert order[0] == (False, False, False), history
    assert order[-1] == (True, True, True), history
    assert all(a <= b for prev, cur in itertools.pairwise(order)
               for a, b in zip(prev, cur, strict=True)), history
    assert all(list(state) == sorted(state, reverse=True) for state in order), history
    records = list(iter_records(fleet.state_dir))
    waves = [r["detail"]["pops"] for r in records if r["kind"] == "wave_started"]
    assert waves == [["ewr"], ["sjc"], ["lax"]], waves
    assert fleet.statuses[0] == 0, fleet.statuses
