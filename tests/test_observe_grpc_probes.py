"""Active probes of a gRPC service's origins: the standard health service's Check, against
real gRPC servers."""

from __future__ import annotations

from control_plane.desired import parse_desired
from control_plane.observe.grpc_probe import check_request, serving_status
from control_plane.observe.probes import Prober, probe_targets
from harness.envoy_process import free_port
from harness.grpc_fleet import grpc_desired
from harness.grpc_origin import GrpcFault, GrpcOrigin


def test_health_messages_by_hand() -> None:
    assert check_request("") == b""
    assert check_request("shop.v1.Catalog") == b"\x0a\x0fshop.v1.Catalog"
    assert serving_status(b"\x08\x01") == 1
    assert serving_status(b"\x08\x02") == 2
    assert serving_status(b"") == 0
    assert serving_status(b"\x12\x02ab\x08\x01") == 1  # an unknown field first
    assert serving_status(b"\x08\x96\x01") == 150  # a varint of two bytes


async def test_probes_ask_each_origins_health_service() -> None:
    primary = await GrpcOrigin("primary", free_port()).start()
    secondary = await GrpcOrigin("secondary", free_port()).start()
    desired = parse_desired(grpc_desired(primary.port, secondary.port), "grpc.yaml")
    clock = iter(range(1_000, 100_000, 10))
    prober = Prober(probe_targets(desired), clock=lambda: next(clock))
    try:
        assert {(t.origin, t.grpc_health) for t in prober.targets} == {
            ("primary", ""), ("secondary", "")}
        secondary.set_fault(GrpcFault(fail_health=True))
        await prober.probe_once(None)  # type: ignore[arg-type]  # no HTTP target to GET
        await secondary.stop()
        await prober.probe_once(None)  # type: ignore[arg-type]
        assert [passed for _, passed in prober.results("shop-api", "primary")] == [True] * 4
        assert [passed for _, passed in prober.results("shop-api", "secondary")] == [False] * 4
        assert primary.health_checks == 4 and secondary.health_checks == 2  # two a round
        assert len(prober.latencies("shop-api", "primary", 100_000, 100_000)) == 4
    finally:
        await primary.stop()
        await secondary.stop()
