"""`capability_fallback` records: small (notes said of many clusters grouped), and recorded for a
node once until its fallback changes; every fallback served is counted in a metric (issue 39:
6 KB a record, one per node connection, rotated the soak's decision log)."""

from __future__ import annotations

import json

from control_plane.own_metrics.registry import BallastMetrics
from control_plane.translate.resources import CLUSTER_TYPE as CDS
from control_plane.xds_port.ads_observer import grouped_notes
from control_plane.xds_port.server import BallastServer
from harness.ads_desired import desired
from harness.xds_client import XdsClient, local_channel, make_node

LIFO = "adaptive_lifo requested, node lacks envoy.queue_policy.adaptive_lifo: FIFO sent"


def test_notes_said_of_many_subjects_are_grouped() -> None:
    clusters = [f"g{g:03d}.{tier}: {LIFO}" for g in range(20) for tier in ("critical", "normal")]
    listener = ("listener edge: filter transform not sent: the node's Envoy does not list "
                "envoy.x in node.extensions")
    assert grouped_notes([*clusters, listener]) == [
        f"g000.critical, g000.normal, g001.critical and 37 more: {LIFO}", listener]
    assert grouped_notes(clusters[:2]) == [f"g000.critical, g000.normal: {LIFO}"]
    assert grouped_notes([f"a: {LIFO}", "no subject"]) == [f"a: {LIFO}", "no subject"]
    assert grouped_notes([]) == []


async def test_a_reconnecting_node_records_its_fallback_once_until_it_changes() -> None:
    records: list[tuple[str, dict]] = []
    metrics = BallastMetrics()
    ballast = BallastServer(desired(listener_port=10000, primary_port=8081, secondary_port=8082),
                            xds_address="127.0.0.1:0", metrics=metrics,
                            record=lambda kind, fields: records.append((kind, fields)))
    await ballast.start()
    channel = local_channel(f"127.0.0.1:{ballast.port}")

    async def connect(node_id: str, *, fifo: bool = True) -> None:
        node = make_node(node_id, "sjc")  # sjc wants adaptive LIFO: these nodes lack it
        if not fifo:
            del node.extensions[:]  # no queue policy listed at all: another fallback
        client = await XdsClient(channel, node).start()
        await client.subscribe(CDS)
        await client.wait_for(lambda c: len(c.names(CDS)) > 0)
        await client.close()

    def fallbacks() -> list[dict]:
        return [fields for kind, fields in records if kind == "capability_fallback"]

    try:
        for _ in range(10):
            await connect("node-1")
        (first,) = fallbacks()  # reconnecting to the same fallback is not news
        assert first["node"] == "node-1" and first["pop"] == "sjc"
        assert first["capabilities"] == "fifo" and "adaptive_lifo" in first["reason"]
        assert first["notes_total"] >= 1 and "adaptive_lifo requested" in first["notes"][0]
        assert len(json.dumps(first)) < 1000
        connected = [f for kind, f in records if kind == "node_connected"]
        assert len(connected) == 10 and {f["capabilities"] for f in connected} == {"fifo"}
        await connect("node-2")  # another node: its own record
        await connect("node-1", fifo=False)  # node-1's fallback changed: recorded
        await connect("node-1", fifo=False)
        await connect("node-1")  # and back: changed again
        assert [(f["node"], f["capabilities"]) for f in fallbacks()] == [
            ("node-1", "fifo"), ("node-2", "fifo"), ("node-1", "none"), ("node-1", "fifo")]
        served = metrics.registry.get_sample_value("ballast_capability_fallbacks_total",
                                                   {"pop": "sjc"})
        assert served == 14  # every fallback served is counted
    finally:
        await channel.close()
        await ballast.stop(0.2)
