"""`grpc_services:` in the desired state: each service an origin group of its own (no tiers, no
tier actions, no mirrors) whose weights, ramp and rollout are any group's."""

from __future__ import annotations

from control_plane.desired import parse_desired
from control_plane.desired.model import GrpcService, home_weights

ONLY_GRPC = """\
pops:
  ewr: {}
  sjc: {}
failover: {interval: 10s, min_warm_pool: 10}
standby_ramp: {mirror_percent: 5}
grpc_services:
  shop-api:
    port: 50051
    origins:
      primary: {address: 10.0.0.1}
      secondary: {address: "::1", port: 50052}
    preference: {sjc: [secondary, primary], ewr: [primary, secondary]}
    failover: {shift_step: 5}
    health_check: {service: shop.v1.Catalog}
"""


def test_a_fleet_of_grpc_clients_needs_no_origin_group_or_listener() -> None:
    desired = parse_desired(ONLY_GRPC, "grpc.yaml")
    (group,) = desired.origin_groups
    assert desired.grpc_services == (group,) and desired.listeners == ()
    assert group.grpc == GrpcService("shop-api", 50051, health_service="shop.v1.Catalog")
    assert group.grpc.listener_names == ("shop-api", "shop-api:50051")
    assert [(o.name, o.address, o.port, o.tls) for o in group.origins] == [
        ("primary", "10.0.0.1", 50051, False), ("secondary", "::1", 50052, False)]
    assert group.tiers == () and not group.tier_actions.enabled
    assert group.standby_ramp.mirror_percent == 0  # the global mirror is Envoy's only
    assert group.failover.interval_ms == 10_000 and group.failover.shift_step == 5
    assert group.home_weights("sjc") == home_weights(("secondary", "primary"), 10)
    assert group.health_check.interval_ms == 5000


def test_target_tls_limits_and_timeout() -> None:
    text = ONLY_GRPC.replace("    port: 50051\n", "    port: 50051\n    target: shop.internal\n"
                             "    tls: true\n    max_requests: 64\n    timeout: 1500ms\n")
    (group,) = parse_desired(text, "grpc.yaml").origin_groups
    assert group.grpc == GrpcService("shop.internal", 50051, tls=True, max_requests=64,
                                     timeout_ms=1500, health_service="shop.v1.Catalog")
    assert group.max_origin_concurrency == 64
    assert all(o.tls for o in group.origins)
