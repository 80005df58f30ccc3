"""The event loop never stalls on work that grows with the desired state: a hot reload that
re-translates every PoP runs on a worker thread, and meanwhile the loop keeps answering and
pushing one PoP's weight changes.

A real `BallastService` with a desired state of 8 PoPs x 160 groups (every PoP translated at
start-up), one simulated delta node in PoP p000 over real gRPC, a loop-lag probe (a 5 ms
sleep, measured) and an operator's probe of the admin API's `/healthz` from another thread
(each answer timed). The reload changes every group, so every cluster of every PoP is
re-translated (and each PoP's diff rendered). The bounds are relative to the reload's own
duration, which is what the loop would have stalled for when the work ran on it: no machine
time is asserted. The reload is made long enough (1.6-2.1 s here) for a push's own cost during
it (GIL hand-overs with the worker, 0.1 s) to stay a small share: at 40 groups it took 0.4-0.5
s, and a quarter of that was within reach of one push (5 of 18 runs failed).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from control_plane.decisions.read import iter_records
from control_plane.lifecycle.service import BallastService, ServiceConfig
from control_plane.translate.resources import CLUSTER_TYPE, ENDPOINT_TYPE, Capabilities
from harness.ads_desired import fleet_yaml
from harness.envoy_process import free_port
from harness.eventually import eventually
from harness.intent_changes import set_weights
from harness.loop_probes import HealthzProbe
from harness.xds_client import XdsClient, local_channel, make_node

POPS, GROUPS = 8, 160
PROBE_S = 0.005


class LagProbe:
    """How late the loop runs a 5 ms sleep's wake-up, sample by sample."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            started = time.perf_counter()
            await asyncio.sleep(PROBE_S)
            self.lags.append(time.perf_counter() - started - PROBE_S)


    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def test_a_full_retranslation_does_not_delay_a_small_pops_push(tmp_path: Path) -> None:
    path = tmp_path / "desired.yaml"
    # a full retranslation: the reload reaches every PoP at once
    path.write_text(fleet_yaml(pops=POPS, groups=GROUPS, rollout="immediate"))
    service = BallastService(ServiceConfig(
        desired_path=path, state_dir=tmp_path / "state", xds_address=f"127.0.0.1:{free_port()}",
        admin_address=f"127.0.0.1:{free_port()}", probes=False,
        reconcile_interval_ms=3_600_000, debounce_s=0.0, freeze_heap=True,  # as ballast serve
    ))
    await service.start()
    cache = service.server.cache
    pops = service.server.intent.desired.pop_names
    assert all(cache.cached(pop, Capabilities()) is not None for pop in pops)
    channel = local_channel(f"127.0.0.1:{service.server.port}")
    client = await XdsClient(channel, make_node("edge-1", "p000"), delta=True).start()
    try:
        await client.subscribe(CLUSTER_TYPE)
        # per group: 3 tier clusters and its standby's mirror cluster
        await client.wait_for(lambda c: len(c.names(CLUSTER_TYPE)) == GROUPS * 4, 30)
        await client.subscribe(ENDPOINT_TYPE, sorted(client.names(CLUSTER_TYPE)))
        await client.wait_for(lambda c: len(c.names(ENDPOINT_TYPE)) == GROUPS * 4, 30)  # + mirror
        # the first reconcile tick (every pair: a hold, no metrics) is done before anything
        # is measured
        await eventually(lambda: sum(r["kind"] == "hold" for r in iter_records(tmp_path / "state"))
                         == POPS * GROUPS, 60, "a hold record for every (PoP, group)")

        async def push(step: int) -> float:
            """Shift g000 in p000; seconds until the node holds the new assignment."""
            started = time.perf_counter()
            share = 10 + step % 80
            await set_weights(service.server.intent, "p000", "g000",
                              {"o0": share, "o1": 100 - share})
            want = cache.resources("p000", Capabilities()).of_type(ENDPOINT_TYPE)[
                "g000.critical"].version
            await client.wait_for(
                lambda c: c.state.resources[ENDPOINT_TYPE]["g000.critical"][0] == want, 30)
            return time.perf_counter() - started

        probe = LagProbe()
        probe.start()
        assert service.admin is not None
        healthz = HealthzProbe(f"{service.admin.url}/healthz")
        healthz.start()
        edited = fleet_yaml(pops=POPS, groups=GROUPS, max_origin_concurrency=100,
                            rollout="immediate").encode()
        started = time.perf_counter()
        reload = asyncio.create_task(service.reload.apply(edited))
        during: list[float] = []
        while not reload.done():
            during.append(await push(len(during)))
        assert await reload
        duration = time.perf_counter() - started
        await probe.stop()
        await asyncio.to_thread(healthz.stop)
    finally:
        await client.close()
        await channel.close()
        await service.stop()
    assert service.server.intent.desired.origin_groups[0].max_origin_concurrency == 100
    worst = max(probe.lags)
    # on the loop, the reload would have stalled it (and any push) for its whole duration
    assert len(during) >= 3, (during, duration)
    assert max(during) < duration / 4, (max(during), duration, during)
    assert worst < duration / 4, (worst, duration)
    assert healthz.answers and healthz.worst() < duration / 4, (healthz.answers, duration)
