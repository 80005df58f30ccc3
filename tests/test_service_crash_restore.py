"""Issue 5: `kill -9` in the middle of a weight shift loses nothing.

`ballast serve` runs as a real process; real Envoys in two PoPs carry steady traffic. While the
primary is failing for `ewr` and weights are moving, Ballast is killed with SIGKILL and started
again. It restores the weights and streaks before answering any Envoy, the Envoys (which keep
serving while it is away) never see the default weights again, weights move on from where they
were without a jump, and every request sent through Envoy during the restart succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
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

from control_plane.decisions.read import iter_records
from control_plane.intent.sqlite_store import StateStore
from control_plane.translate.bootstrap import ads_bootstrap
from harness.demo_origin import DemoOrigin, Fault
from harness.envoy_process import EnvoyProcess, free_port
from harness.eventually import eventually
from harness.fleet import envoy_locality_weights, write_fast_desired
from harness.traffic import steady_traffic, stop_tasks

pytestmark = pytest.mark.envoy

ROOT = Path(__file__).resolve().parents[1]
UNREACHABLE = (OSError, urllib.error.URLError)  # Ballast not (yet) answering
HOME = {"primary": 95, "secondary": 5}
STEP_CAP = 12  # shift_step + jitter


def _serve(desired: Path, state: Path, xds: int, admin: int) -> subprocess.Popen[bytes]:
    with open(state.parent / "serve.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "control_plane.cli.main", "serve", str(desired),
             "--xds-address", f"127.0.0.1:{xds}", "--admin-address", f"127.0.0.1:{admin}",
             "--state-dir", str(state), "--probe-interval", "1s", "--log-level", "warning"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
        )


def _get(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, {}


@contextlib.asynccontextmanager
async def _origins() -> AsyncIterator[dict[str, DemoOrigin]]:
    origins = {
        name: await DemoOrigin(name, free_port()).start() for name in ("primary", "secondary")
    }
    try:
        yield origins
    finally:
        for origin in origins.values():
            await origin.stop()


async def test_kill_9_mid_shift_restores_weights_and_traffic_keeps_flowing(
    tmp_path: Path,
) -> None:
    async with _origins() as origins:
        listener, sjc_listener = sorted((free_port(), free_port()))
        desired = write_fast_desired(tmp_path / "desired.yaml", origins, listener, sjc_listener)
        state = tmp_path / "state"
        xds, admin = free_port(), free_port()
        admin_url = f"http://127.0.0.1:{admin}"
        envoys = {
            pop: EnvoyProcess(
                ads_bootstrap(node_id=f"{pop}-1", pop=pop, xds_port=xds, admin_port=port,
                              metrics_sink=True, needed_stats_only=True,
                              stats_flush_interval_ms=1000),
                port,
            )
            for pop, port in (("ewr", free_port()), ("sjc", free_port()))
        }
        results: list[tuple[float, int]] = []
        seen: list[dict[str, int]] = []
        stop = asyncio.Event()

        def record(status: int) -> None:
            results.append((time.monotonic(), status))

        async def watch_ewr() -> None:
            while not stop.is_set():
                with contextlib.suppress(OSError, KeyError, ValueError):
                    weights = await asyncio.to_thread(envoy_locality_weights, envoys["ewr"])
                    if weights and (not seen or seen[-1] != weights):
                        seen.append(weights)
                await asyncio.sleep(0.1)

        proc = _serve(desired, state, xds, admin)
        tasks: list[asyncio.Task[None]] = []
        try:
            await eventually(lambda: _get(f"{admin_url}/readyz")[0] == 200, 20, "ballast ready",
                             in_thread=True, ignore=UNREACHABLE)
            for envoy in envoys.values():
                envoy.start()
                await asyncio.to_thread(envoy.wait_ready, 20)
            tasks = [
                asyncio.create_task(steady_traffic(  # 25/s: one GET every 40 ms
                    f"http://127.0.0.1:{p}", ("/api/checkout",), 25, stop, record
                ))
                for p in (listener, sjc_listener)
            ]
            tasks.append(asyncio.create_task(watch_ewr()))
            await asyncio.sleep(3)
            origins["primary"].set_fault(Fault(error_rate=0.6, pops=("ewr",)))

            def mid_shift() -> bool:
                weights = _get(f"{admin_url}/weights")[1]["weights"]
                assert isinstance(weights, dict)
                return 60 <= weights["ewr"]["shop"]["primary"] <= 80

            await eventually(mid_shift, 45, "ewr in the middle of its shift", in_thread=True,
                             ignore=UNREACHABLE)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            killed_at = time.monotonic()
            store = StateStore(state)
            saved = store.load().groups[("ewr", "shop")]
            store.close()
            assert 55 <= saved.weights["primary"] <= 80, saved
            assert saved.controller.to_dict()["unhealthy_windows"].get("primary", 0) > 0
            await asyncio.sleep(1.5)  # Envoys are on their own

            proc = _serve(desired, state, xds, admin)
            await eventually(lambda: _get(f"{admin_url}/readyz")[0] == 200, 20,
                             "ballast ready again", in_thread=True, ignore=UNREACHABLE)
            ready_at = time.monotonic()
            restored = [r for r in iter_records(state) if r["kind"] == "state_restored"]
            assert restored[-1]["detail"]["restored"]["ewr/shop"] == saved.weights, restored[-1]
            # Envoy's ADS stream retries back off from 0.5 s up to 30 s (its default): while
            # a loaded machine restarts Ballast slowly, the next attempt can be that far away
            await eventually(
                lambda: _get(f"{admin_url}/nodes")[0] == 200
                and len(_get(f"{admin_url}/nodes")[1]["nodes"]) == 2,
                35,
                "both Envoys reconnected",
                in_thread=True,
                ignore=UNREACHABLE,
            )
            await asyncio.sleep(2)
            origins["primary"].set_fault(Fault())
        finally:
            await stop_tasks(stop, tasks)
            for envoy in envoys.values():
                envoy.stop()
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    during_restart = [status for at, status in results if killed_at <= at <= ready_at + 2]
    assert during_restart, "traffic flowed during the restart"
    assert all(status == 200 for status in during_restart), during_restart
    assert HOME not in seen[1:], f"Envoy went back to default weights: {seen}"
    assert seen[-1] != HOME and seen[-1]["primary"] <= saved.weights["primary"] + STEP_CAP, seen
    # Every weight Ballast decided, across the kill: each moves on from the one before, within
    # the step cap; the first decision after the restart starts from the saved weights.
    records = [r for r in iter_records(state) if r.get("pop") == "ewr" and r["weights_after"]]
    chain = [r["weights_after"]["primary"] for r in records]
    assert all(abs(a - b) <= STEP_CAP for a, b in itertools.pairwise(chain)), chain
    after_restart = [r for r in records if r["seq"] > restored[-1]["seq"]]
    assert after_restart and after_restart[0]["weights_before"] == saved.weights, after_restart
