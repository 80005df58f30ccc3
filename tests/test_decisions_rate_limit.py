"""No client can rotate the decision log faster than the routine records' rate limit; decisions are
never suppressed (issue 8: "a handful of such connections rotated away all earlier history")."""

from __future__ import annotations

from pathlib import Path

from control_plane.decisions.log import log_files
from control_plane.decisions.rate_limit import RateLimit, RecordLimiter
from control_plane.decisions.read import iter_records
from control_plane.lifecycle.service import BallastService, ServiceConfig
from control_plane.translate.resources import CLUSTER_TYPE as CDS
from harness.eventually import eventually
from harness.xds_client import XdsClient, local_channel, make_node

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "desired.yaml"
ROUTINE = {"node_connected", "capability_fallback", "node_disconnected"}  # 3 per node here


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_bucket_allows_a_burst_then_the_rate_and_counts_the_rest() -> None:
    clock = Clock()
    limiter = RecordLimiter(RateLimit(burst_bytes=1000, bytes_per_s=100), clock)
    assert [limiter.take("node_connected", 300) for _ in range(4)] == [True, True, True, False]
    assert limiter.take("nack", 200) is False
    assert limiter.suppressed == {"node_connected": 1, "nack": 1}
    clock.now += 2.0  # 100 left + 200 refilled
    assert limiter.take("node_connected", 300) is True
    assert limiter.take("node_connected", 1) is False
    assert limiter.pending_note() == {"node_connected": 2, "nack": 1}
    assert limiter.pending_note() is None  # said once
    clock.now += 1000  # never more than the burst
    assert limiter.take("x", 1000) is True and limiter.take("x", 1) is False
    assert limiter.suppressed_total == 4


async def test_a_connection_storm_cannot_rotate_the_log_and_decisions_are_kept(
    tmp_path: Path,
) -> None:
    limit = RateLimit(burst_bytes=40_000, bytes_per_s=2_000)
    service = BallastService(ServiceConfig(
        desired_path=EXAMPLE, state_dir=tmp_path, xds_address="127.0.0.1:0",
        admin_address=None, probes=False, routine_records=limit,
    ))
    await service.start()
    try:
        channel = local_channel(f"127.0.0.1:{service.server.port}")
        try:
            for i in range(150):  # long node ids (within the limit): ~1.5 KB per record
                node_id = f"{i}-" + "i" * 1000
                client = await XdsClient(channel, make_node(node_id, "ewr")).start()
                await client.subscribe(CDS)
                await client.wait_for(lambda c: len(c.names(CDS)) > 0)
                await client.close()
        finally:
            await channel.close()
        # each stream's node_disconnected is recorded as its node leaves the registry
        await eventually(lambda: len(service.server.nodes) == 0, 10, "the storm's nodes gone")
        text = EXAMPLE.read_text().replace("port_offset: 1}", "port_offset: 2}")
        assert await service.reload.apply(text.encode())  # a decision, mid-storm
    finally:
        await service.stop(0)
    records = list(iter_records(tmp_path))
    kinds = [r["kind"] for r in records]
    assert kinds[0] == "config_applied" and kinds[1] == "startup"  # earliest records kept
    assert "config_applied" in kinds[2:] and kinds[-1] == "shutdown"
    routine = [r for r in records if r["kind"] in ROUTINE]
    assert 0 < len(routine) < 60  # ~40 KB burst + 2 KB/s of 450 records
    notes = [r for r in records if r["kind"] == "records_suppressed"]
    assert notes
    suppressed = sum(sum(n["detail"]["suppressed"].values()) for n in notes)
    assert suppressed + len(routine) == 450  # every routine record written or counted
    assert len(log_files(tmp_path)) == 1
    assert (tmp_path / "decisions.jsonl").stat().st_size < 120_000
