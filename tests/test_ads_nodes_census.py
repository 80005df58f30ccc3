"""`NodeRegistry.census`: per-PoP counts and a few listed statuses, equal to what the full
snapshot says."""

from __future__ import annotations

from collections import Counter

from control_plane.ads.nodes import NodeRegistry
from control_plane.translate.resources import CLUSTER_TYPE, ENDPOINT_TYPE


def _registry() -> NodeRegistry:
    registry = NodeRegistry()
    for n in (3, 1, 2, 0):
        for pop in ("ewr", "sjc"):
            entry = registry.connect(node_id=f"{pop}-{n}", pop=pop, mode="sotw",
                                     envoy_version="1.40.0" if n else "1.36.2",
                                     capability_key="fifo", capability_reason="test")
            entry.sent(CLUSTER_TYPE, "v1")
            entry.sent(ENDPOINT_TYPE, "v1")
            entry.acked(ENDPOINT_TYPE, "v1")
            if pop == "ewr" and n in (1, 3):
                entry.nacked(CLUSTER_TYPE, "v1", "bad cluster")
            elif n:
                entry.acked(CLUSTER_TYPE, "v1")
    return registry


def test_census_counts_like_the_snapshot_and_lists_the_first_by_node_id() -> None:
    registry = _registry()
    census = registry.census(listed=2, nacked=1)
    for pop in ("ewr", "sjc"):
        full = registry.statuses(pop)
        assert {s.pop for s in full} == {pop}
        assert census[pop].by_status_version == Counter(
            (s.status, s.envoy_version) for s in full)
        assert [s.node_id for s in census[pop].listed] == [f"{pop}-0", f"{pop}-1"]
    assert census["ewr"].by_status_version == Counter(
        {("NACKED", "1.40.0"): 2, ("SYNCED", "1.40.0"): 1, ("STALE", "1.36.2"): 1})
    assert [s.node_id for s in census["ewr"].nacked] == ["ewr-1"]
    assert census["sjc"].nacked == []
    assert len(registry.statuses()) == 8
