"""The embedded metric source against a real Envoy 1.40 streaming to a real grpc.aio server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import grpc
import pytest

from control_plane.gen.ballast.v1 import metrics_service_pb2 as ms
from control_plane.gen.ballast.v1 import prometheus_metrics_pb2 as prom
from control_plane.observe.sink import METHOD, SinkStore
from control_plane.observe.source import Signals, wall_ms
from harness.demo_origin import Fault
from harness.eventually import eventually
from tests.support.metrics_sink import running_sink
from tests.support.observe_fleet import edge_fleet

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def sink() -> AsyncIterator[tuple[SinkStore, int]]:
    async with running_sink() as store_and_port:
        yield store_and_port


async def window_when(
    store: SinkStore, since_ms: int, done: Callable[[Signals], bool]
) -> Signals | None:
    """The store's signals since `since_ms`, once `done` holds for them."""
    now = wall_ms()
    signals = await store.window(now, now - since_ms)
    return signals if done(signals) else None


def total(signals: Signals, origin: str) -> int:
    return sum(group[origin].requests for group in signals.values() if origin in group)


def overflow_of(signals: Signals) -> int:
    return max((o.queue_overflow for o in signals.get(("ewr", "shop"), {}).values()), default=0)


async def wait_node(store: SinkStore, count: int = 1) -> None:
    await eventually(lambda: len(store.nodes()) >= count, 10, "Envoy opens a metrics stream",
                     interval=0.1)


@pytest.mark.envoy
async def test_per_origin_signals_pending_overflow_and_restart(sink: tuple[SinkStore, int]):
    store, port = sink
    async with edge_fleet(port, max_connections=4, max_pending_requests=5) as fleet:
        fleet.primary.set_fault(Fault(error_rate=0.5))
        fleet.secondary.set_fault(Fault(latency_ms=200))
        await wait_node(store)
        assert store.nodes() == {"edge-ewr-1": "ewr"}

        # Phase A: 60 requests, 2 at a time (no queueing): 5xx and latency per origin.
        start = wall_ms()
        statuses = await fleet.traffic(60, concurrency=2)
        sent = fleet.primary.total + fleet.secondary.total
        assert sent == 60 and statuses.count(503) == fleet.primary.errors
        signals = await eventually(lambda: window_when(
            store, start, lambda s: total(s, "primary") + total(s, "secondary") >= 60
        ), 8, "the sink counts all 60 requests", interval=0.2)
        shop = signals[("ewr", "shop")]
        primary, secondary = shop["primary"], shop["secondary"]
        assert (primary.requests, primary.errors_5xx) == (fleet.primary.total, fleet.primary.errors)
        assert primary.errors_5xx > 0
        assert (secondary.requests, secondary.errors_5xx) == (fleet.secondary.total, 0)
        assert primary.p95_ms is not None and primary.p95_ms < 50
        assert secondary.p50_ms is not None and 100 <= secondary.p50_ms <= 250
        assert secondary.p95_ms is not None and secondary.p95_ms >= 200
        assert secondary.p50_ms > 4 * primary.p95_ms
        assert primary.connect_failures == 0 and primary.probe_success is None
        assert wall_ms() - primary.observed_at_ms < 3000

        # Phase B: a burst beyond the breakers -> pending requests and overflow, per group.
        fleet.primary.set_fault(Fault())
        fleet.secondary.set_fault(Fault(latency_ms=1500))
        burst = wall_ms()
        traffic = asyncio.create_task(fleet.traffic(60, concurrency=60))
        peak = tier_peak = 0.0
        while not traffic.done():
            now = wall_ms()
            window = await store.window(now, 1500)
            for origin in window.get(("ewr", "shop"), {}).values():
                peak = max(peak, origin.pending_active)
            tiers = (await store.tier_pending(now, 1500)).get(("ewr", "shop"), {})
            tier_peak = max([tier_peak, *(t.pending_max for t in tiers.values())])
            await asyncio.sleep(0.1)
        statuses = traffic.result()
        overflow = overflow_of(await eventually(
            lambda: window_when(store, burst, lambda s: overflow_of(s) > 0), 8,
            "the sink shows the overflow", interval=0.2))
        assert overflow > 0 and peak > 0
        assert tier_peak >= peak  # the tier actions' signal: the window's peak per tier
        assert overflow == statuses.count(503)

        # Phase C: restart Envoy (every counter resets, a new stream) -> no negative/huge rates.
        before = fleet.primary.total + fleet.secondary.total
        await asyncio.to_thread(fleet.restart_envoy)
        await wait_node(store)
        after_restart = wall_ms()
        await fleet.traffic(20, concurrency=4)
        signals = await eventually(lambda: window_when(
            store, after_restart, lambda s: total(s, "primary") + total(s, "secondary") >= 20
        ), 8, "the sink counts the 20 requests after the restart", interval=0.2)
        assert total(signals, "primary") + total(signals, "secondary") == 20
        now = wall_ms()
        everything = await store.window(now, now - start + 1000)
        for origin in everything[("ewr", "shop")].values():
            assert origin.requests >= 0 and origin.errors_5xx >= 0 and origin.queue_overflow >= 0
        seen = total(everything, "primary") + total(everything, "secondary")
        assert seen <= before + 20 + overflow
        assert seen >= 60 + 20


def flush(value: float, node: str | None = None) -> bytes:
    labels = {"ballast_cluster": "shop.critical", "local_zone": "ewr", "upstream_zone": "primary"}
    metric = prom.Metric(
        label=[prom.LabelPair(name=k, value=v) for k, v in labels.items()],
        counter=prom.Counter(value=value),
    )
    message = ms.StreamMetricsMessage(envoy_metrics=[prom.MetricFamily(
        name="cluster.zone.upstream_rq_completed", type=prom.COUNTER, metric=[metric]
    )])
    if node is not None:
        message.identifier.node.id = node
        message.identifier.node.locality.zone = "ewr"
    return message.SerializeToString()


async def test_bad_payloads_are_logged_and_the_stream_goes_on(sink: tuple[SinkStore, int], caplog):
    store, port = sink
    start = wall_ms()

    async def messages() -> AsyncIterator[bytes]:
        yield flush(1)  # no identifier yet: dropped
        yield flush(5, node="raw-client")
        yield b"\xff\xff\xff not a protobuf"
        await asyncio.sleep(0.05)
        yield flush(float("nan"))
        yield flush(9)

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_unary(METHOD, request_serializer=None, response_deserializer=None)
        assert await call(messages()) == b""
    now = wall_ms()
    signals = await store.window(now, now - start + 1000)
    assert signals[("ewr", "shop")]["primary"].requests == 4
    text = caplog.text
    assert "before any node identifier" in text
    assert "undecodable StreamMetricsMessage" in text
    assert "not a finite" in text
    assert store.nodes() == {}


def test_a_host_series_new_on_a_running_connection_counts_from_zero() -> None:
    """Issue 33: a change that sends traffic to a new origin address shows in the first export
    that has it (it was taken as a baseline only, and the window read 0 attempts for a flush);
    a connection's first export is a baseline, as on the metrics_service streams. Abandoned
    attempts come from rq_success."""
    from control_plane.observe.envoy_stats import HostPoint
    from harness.models import example_desired

    store = SinkStore(desired=example_desired())

    def export(at: int, **by_port: dict[str, float]) -> None:
        store.ingest_hosts("ipv4:127.0.0.1:5000", [
            HostPoint("ewr", "shop.critical", f"127.0.0.1:{port}", stat, value)  # type: ignore[arg-type]
            for port, stats in by_port.items() for stat, value in stats.items()], at)

    export(1000, **{"8081": {"rq_total": 500, "rq_success": 500, "rq_error": 0}})
    export(2000, **{"8081": {"rq_total": 510, "rq_success": 510, "rq_error": 0},
                    "8082": {"rq_total": 7, "rq_success": 0, "rq_error": 7}})
    export(3000, **{"8081": {"rq_total": 530, "rq_success": 512, "rq_error": 0},
                    "8082": {"rq_total": 9, "rq_success": 0, "rq_error": 9}})
    first = store.read_window(2000, 1500)[("ewr", "shop")]
    assert first["primary"].requests == 10  # history before the first export: a baseline
    assert (first["secondary"].requests, first["secondary"].errors_5xx) == (7, 7)
    both = store.read_window(3000, 2500)[("ewr", "shop")]
    assert (both["secondary"].requests, both["secondary"].errors_5xx) == (9, 9)
    assert (both["primary"].requests, both["primary"].abandoned) == (30, 18)


def test_a_windows_start_after_a_nodes_first_flush_waits_for_that_flushs_host_stats() -> None:
    """Issue 33: a wave's window starts just after the node's first stats flush after its ACK,
    the metrics_service flush and the OTLP export of the same flush's per-host stats both; an
    export that comes late moves the start after it."""
    from control_plane.observe.envoy_stats import HostPoint

    store = SinkStore()
    stream = store.open_stream("ewr-1", "ewr")
    point = [HostPoint("ewr", "shop.critical", "127.0.0.1:8081", "rq_total", 1.0)]
    for at in (1000, 2000):
        store.ingest(stream, [], at)
        store.ingest_hosts("c1", point, at + 5)
    assert store.stats_after("ewr-1", "ewr", 2500, 1000) is None  # no flush since
    store.ingest(stream, [], 3000)
    # c1 exported since 2500 (at 2005) but not yet the 3000 flush's host stats
    assert store.stats_after("ewr-1", "ewr", 2500, 1000) is None
    store.ingest_hosts("c1", point, 3700)  # late: the start moves after it
    assert store.stats_after("ewr-1", "ewr", 2500, 1000) == 3701
    assert store.stats_after("ewr-1", "sjc", 2500, 1000) == 3001  # another PoP's exports
