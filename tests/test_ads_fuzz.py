"""Fuzzing a running `ballast serve` over ADS (issue 8, "what it must show").

Hypothesis draws client scripts — SotW and delta streams whose requests carry arbitrary and
oversized node fields, type URLs, names, nonces, initial versions and NACKs, some clients never
reading their responses — and throws waves of them at a real server process for a bounded time
(about 20 s). Meanwhile a well-behaved node keeps its config and the desired state changes every
second. What must hold:

- the server never crashes and answers `/healthz` afterwards;
- its peak RSS (VmHWM) stays under `RSS_BOUND_MB`;
- the well-behaved node receives and ACKs every change within `CHANGE_TO_ACK_BOUND_S` of the
  SIGHUP that made it (an upper bound of its push-to-ACK);
- the decision log keeps its earliest records (client-caused records are rate-limited, so fuzzing
  cannot rotate them away).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.service.discovery.v3 import ads_pb2_grpc
from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryRequest, DiscoveryRequest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from control_plane.decisions.log import log_files
from control_plane.decisions.read import iter_records
from control_plane.translate.resources import CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE
from harness.background_loop import BackgroundLoop
from harness.envoy_process import free_port
from harness.eventually import eventually_blocking
from harness.xds_client import XdsClient, local_channel, make_node

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "desired.yaml"
RSS_BOUND_MB = 400
CHANGE_TO_ACK_BOUND_S = 3.0
WAVES = 14
WAVE_S = 1.2
TYPES = [CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE]


@dataclass
class Server:
    proc: subprocess.Popen[str]
    xds: int
    admin: int
    desired: Path
    state_dir: Path
    log: Path

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin}{path}", timeout=5) as r:
            return bytes(r.read())

    def peak_rss_mb(self) -> float:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        line = next(line for line in status.splitlines() if line.startswith("VmHWM:"))
        return int(line.split()[1]) / 1024


# each change reaches sjc at once (the change-to-ACK bound is the subject, not a rollout's waves)
IMMEDIATE = "rollout: {strategy: immediate}\n"


def _example(sjc_offset: int = 1) -> str:
    """The example desired state, every change immediate, sjc's port offset `sjc_offset`."""
    return (EXAMPLE.read_text() + IMMEDIATE).replace("port_offset: 1}",
                                                     f"port_offset: {sjc_offset}}}")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    desired = tmp_path / "desired.yaml"
    desired.write_text(_example())
    xds, admin = free_port(), free_port()
    log = open(tmp_path / "serve.log", "w")  # noqa: SIM115 - the server writes it
    proc = subprocess.Popen(
        [sys.executable, "-m", "control_plane.cli.main", "serve", str(desired),
         "--xds-address", f"127.0.0.1:{xds}", "--admin-address", f"127.0.0.1:{admin}",
         "--state-dir", str(tmp_path / "state"), "--no-probes", "--log-level", "warning"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
    )
    running = Server(proc, xds, admin, desired, tmp_path / "state", tmp_path / "serve.log")

    def ready() -> bool:
        assert proc.poll() is None, running.log.read_text()
        return b'"ready": true' in running.get("/readyz")

    eventually_blocking(ready, 20, "ballast serve ready", interval=0.1, ignore=(OSError,))
    try:
        yield running
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()


# -- what fuzzing clients send ------------------------------------------------------------------

_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["ewr", "sjc", "shop.critical", "edge", "*", "", "1", "2"]),
    st.integers(1, 3).map(lambda n: "x" * (10 ** (n + 2))),  # 1 KB .. 100 KB
)
_big = st.sampled_from([0, 0, 0, 20_000, 3_000_000])  # characters of one oversized field


@st.composite
def _node_id(draw: st.DrawFn) -> str:
    size = draw(_big)
    return "n" * size if size else draw(st.text(max_size=30))


@st.composite
def _names(draw: st.DrawFn) -> list[str]:
    if draw(st.integers(0, 6)) == 0:
        return [f"junk-{i}" for i in range(draw(st.sampled_from([10_001, 50_000])))]
    return draw(st.lists(_text, max_size=12))


@st.composite
def _sotw(draw: st.DrawFn) -> DiscoveryRequest:
    request = DiscoveryRequest(
        type_url=draw(st.one_of(st.sampled_from(TYPES), _text)),
        version_info=draw(_text), response_nonce=draw(_text), resource_names=draw(_names()),
    )
    if draw(st.booleans()):
        request.error_detail.code = draw(st.integers(0, 16))
        request.error_detail.message = draw(_text) + "m" * draw(_big)
    return request


@st.composite
def _delta(draw: st.DrawFn) -> DeltaDiscoveryRequest:
    request = DeltaDiscoveryRequest(
        type_url=draw(st.one_of(st.sampled_from(TYPES), _text)),
        response_nonce=draw(_text),
        resource_names_subscribe=draw(_names()),
        resource_names_unsubscribe=draw(st.lists(_text, max_size=5)),
        initial_resource_versions=draw(st.dictionaries(_text, _text, max_size=5)),
    )
    if draw(st.booleans()):
        request.error_detail.message = draw(_text) + "m" * draw(_big)
    return request


@dataclass
class Script:
    delta: bool
    node_id: str
    zone: str
    requests: list[Any]
    reads: bool  # False: never reads its responses


@st.composite
def _script(draw: st.DrawFn) -> Script:
    delta = draw(st.booleans())
    requests = draw(st.lists(_delta() if delta else _sotw(), min_size=1, max_size=6))
    return Script(delta, draw(_node_id()), draw(st.sampled_from(["ewr", "sjc", "sjc", "lax"])),
                  requests, draw(st.booleans()))


async def _play(script: Script, port: int, repeat_for: float) -> int:
    """Replay `script` on one connection until `repeat_for` has passed, opening a new stream
    whenever the server ends one (a client that keeps at it); the number of streams opened."""
    channel = local_channel(f"127.0.0.1:{port}")
    stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
    first = script.requests[0]
    first.node.id = script.node_id
    first.node.locality.zone = script.zone
    ends = time.monotonic() + repeat_for
    streams = 0
    try:
        while time.monotonic() < ends:
            streams += 1
            await _one_stream(stub, script, ends)
    finally:
        await channel.close()
    return streams


async def _one_stream(
    stub: ads_pb2_grpc.AggregatedDiscoveryServiceStub, script: Script, ends: float
) -> None:
    call = stub.DeltaAggregatedResources() if script.delta else stub.StreamAggregatedResources()

    async def drain() -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            while await call.read() is not grpc.aio.EOF:
                pass

    reader = asyncio.create_task(drain()) if script.reads else None
    try:
        while time.monotonic() < ends:
            for request in script.requests:
                await asyncio.wait_for(call.write(request), max(0.01, ends - time.monotonic()))
            await asyncio.sleep(0.01)
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError, TimeoutError):
        pass  # refused, ended, or stalled by flow control: all fine
    finally:
        call.cancel()
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader


# -- the well-behaved node and the desired-state changes ----------------------------------------

async def _polite_node(port: int) -> XdsClient:
    client = await XdsClient(local_channel(f"127.0.0.1:{port}"), make_node("sjc-polite", "sjc")
                             ).start()
    await client.subscribe(CLUSTER_TYPE)
    await client.wait_for(lambda c: bool(c.names(CLUSTER_TYPE)))
    await client.subscribe(ENDPOINT_TYPE, sorted(client.names(CLUSTER_TYPE)))
    await client.subscribe(LISTENER_TYPE)
    await client.wait_for(lambda c: bool(c.names(LISTENER_TYPE)))
    await client.subscribe(ROUTE_TYPE, ["edge"])
    await client.wait_for(lambda c: bool(c.names(ROUTE_TYPE)))
    return client


async def _change_and_wait(server: Server, client: XdsClient, offset: int) -> float:
    """Move sjc's listeners (a new LDS for every sjc node); seconds from SIGHUP until the polite
    node has received and ACKed it."""
    seen = len(client.responses(LISTENER_TYPE))
    server.desired.write_text(_example(offset))
    started = time.monotonic()
    server.proc.send_signal(signal.SIGHUP)

    def acked(c: XdsClient) -> bool:
        fresh = c.responses(LISTENER_TYPE)[seen:]
        return bool(fresh) and c.state.acked.get(LISTENER_TYPE) == fresh[-1].version

    await client.wait_for(acked, timeout=CHANGE_TO_ACK_BOUND_S * 3)
    return time.monotonic() - started


# -- the suite ------------------------------------------------------------------------------------

@pytest.mark.timeout(180)
def test_fuzzed_clients_cannot_crash_bloat_or_slow_the_server(server: Server) -> None:
    first_records = [r["seq"] for r in iter_records(server.state_dir)][:2]
    assert first_records == [1, 2]
    baseline = server.peak_rss_mb()
    bg = BackgroundLoop()
    latencies: list[float] = []
    client = bg.run(_polite_node(server.xds))
    waves = [0]
    streams: list[int] = []

    @settings(max_examples=WAVES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(_script(), min_size=3, max_size=8))
    def wave(scripts: list[Script]) -> None:
        waves[0] += 1

        async def play_all() -> None:
            streams.extend(await asyncio.gather(*(_play(s, server.xds, WAVE_S) for s in scripts)))

        pending = asyncio.run_coroutine_threadsafe(
            _change_and_wait(server, client, 2 + waves[0] % 2), bg.loop)
        asyncio.run(play_all())
        latencies.append(pending.result(CHANGE_TO_ACK_BOUND_S * 4))
        assert server.proc.poll() is None, "ballast serve died"

    try:
        wave()
        assert server.proc.poll() is None
        assert server.get("/healthz")
        peak = server.peak_rss_mb()
        median = sorted(latencies)[len(latencies) // 2]
        print(f"fuzz: {waves[0]} waves, {len(streams)} clients, {sum(streams)} streams, "
              f"peak RSS {peak:.0f} MB (at start {baseline:.0f} MB), change-to-ACK max "
              f"{max(latencies):.2f} s, median {median:.2f} s")
        assert peak < RSS_BOUND_MB
        assert max(latencies) < CHANGE_TO_ACK_BOUND_S
        assert "Traceback" not in server.log.read_text()  # nothing failed inside either
        assert len(log_files(server.state_dir)) == 1  # nothing rotated away
        assert [r["seq"] for r in iter_records(server.state_dir)][:2] == first_records
    finally:
        bg.run(client.close())
        bg.close()
