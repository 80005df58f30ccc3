"""Real Envoy 1.40 processes (one per PoP) fed by a real Ballast ADS server, SotW and delta.

Ballast and the two demo origins run on an event loop in a background thread for the whole
module (per mode), so the Envoys, the origins and the server are started once per mode.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from control_plane.translate.bootstrap import ads_bootstrap
from control_plane.translate.resources import CLUSTER_TYPE, Capabilities
from control_plane.xds_port.server import BallastServer
from harness.ads_desired import desired
from harness.background_loop import BackgroundLoop
from harness.demo_origin import DemoOrigin
from harness.envoy_process import EnvoyProcess, free_port
from harness.eventually import eventually_blocking
from harness.intent_changes import set_desired, set_weights
from tests.support.forced_capabilities import force_capabilities

pytestmark = pytest.mark.envoy

TYPES = {"CDS", "EDS", "LDS", "RDS", "RTDS"}  # RTDS: the tier-lending runtime layer
LIFO_NACK = "Didn't find a registered queue policy implementation"


@dataclass
class Stack:
    mode: str
    bg: BackgroundLoop
    ballast: BallastServer
    origins: dict[str, DemoOrigin]
    envoys: dict[str, EnvoyProcess]
    listener_ports: dict[str, int]
    build: Callable[..., Any]
    records: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def node(self, pop: str) -> dict[str, Any]:
        statuses = self.bg.call(self.ballast.nodes.statuses)
        (status,) = [s.as_dict() for s in statuses if s.pop == pop]
        return status

    def get(self, pop: str, path: str, headers: dict[str, str] | None = None) -> dict[str, str]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.listener_ports[pop]}{path}", headers=headers or {}
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return {k.lower(): v for k, v in response.headers.items()}


def counter(envoy: EnvoyProcess, name: str) -> int:
    for line in envoy.admin(f"/stats?filter=^{name}$").splitlines():
        key, _, value = line.partition(": ")
        if key == name:
            return int(value)
    return 0


def applied_weights(envoy: EnvoyProcess, cluster: str) -> dict[str, int]:
    dump = envoy.admin_json("/config_dump?include_eds")
    for config in dump["configs"]:
        if not config["@type"].endswith("EndpointsConfigDump"):
            continue
        for item in config.get("dynamic_endpoint_configs", []):
            cla = item["endpoint_config"]
            if cla["cluster_name"] == cluster:
                return {
                    ep["locality"]["zone"]: int(ep.get("load_balancing_weight", 0))
                    for ep in cla["endpoints"]
                }
    return {}


@pytest.fixture(scope="module", params=["sotw", "delta"])
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    mode = request.param
    bg = BackgroundLoop()
    envoys: dict[str, EnvoyProcess] = {}
    origins: dict[str, DemoOrigin] = {}
    ballast: BallastServer | None = None
    try:
        first, second = sorted((free_port(), free_port()))
        ports = {"primary": free_port(), "secondary": free_port()}

        def build(**overrides: int) -> Any:
            return desired(
                listener_port=first,
                sjc_offset=second - first,
                primary_port=ports["primary"],
                secondary_port=ports["secondary"],
                **overrides,
            )

        records: list[tuple[str, dict[str, Any]]] = []
        ballast = BallastServer(
            build(),
            xds_address="127.0.0.1:0",
            record=lambda kind, fields: records.append((kind, fields)),
        )
        bg.run(ballast.start())
        for name, port in ports.items():
            origins[name] = bg.run(DemoOrigin(name, port).start())
        for pop in ("ewr", "sjc"):
            admin = free_port()
            bootstrap = ads_bootstrap(
                node_id=f"{pop}-1",
                pop=pop,
                xds_port=ballast.port,
                admin_port=admin,
                delta=mode == "delta",
            )
            envoys[pop] = EnvoyProcess(bootstrap, admin).start()
        for envoy in envoys.values():
            envoy.wait_ready()
        yield Stack(
            mode, bg, ballast, origins, envoys, {"ewr": first, "sjc": second}, build, records
        )
    finally:
        for envoy in envoys.values():
            envoy.stop()
        for origin in origins.values():
            bg.run(origin.stop())
        if ballast is not None:
            bg.run(ballast.stop(0.2))
        bg.close()


def test_envoys_ready_and_ack_every_type(stack: Stack) -> None:
    for pop in ("ewr", "sjc"):
        eventually_blocking(
            lambda pop=pop: stack.node(pop)["status"] == "SYNCED"
            and set(stack.node(pop)["types"]) == TYPES,
            3,
            f"{pop} Envoy ACKs CDS, EDS, LDS, RDS",
        )
        status = stack.node(pop)
        assert status["envoy_version"].startswith("1.40.")
        assert status["mode"] == stack.mode
        assert status["capability_key"] == "fifo"  # 1.40 has no adaptive LIFO
        assert all(t["last_acked"] == t["last_sent"] for t in status["types"].values())
    fallbacks = [f for kind, f in stack.records if kind == "capability_fallback"]
    assert {f["node"] for f in fallbacks} == {"ewr-1", "sjc-1"}


@pytest.mark.parametrize(
    ("path", "headers", "tier"),
    [
        ("/api/checkout/cart", {}, "critical"),
        ("/catalog", {"purpose": "prefetch"}, "background"),
        ("/catalog", {"user-agent": "Googlebot/2.1"}, "background"),
        ("/catalog", {}, "critical"),  # default tier
    ],
)
def test_traffic_reaches_the_tier_cluster(
    stack: Stack, path: str, headers: dict[str, str], tier: str
) -> None:
    for pop, envoy in stack.envoys.items():
        stat = f"cluster.shop.{tier}.upstream_rq_total"
        before = counter(envoy, stat)
        for _ in range(3):
            seen = stack.get(pop, path, headers)
            assert seen["x-seen-tier"] == tier
        assert counter(envoy, stat) == before + 3


def test_weight_change_applies_within_a_second_and_shifts_traffic(stack: Stack) -> None:
    envoy = stack.envoys["ewr"]
    try:
        for weights, origin in (
            ({"primary": 0, "secondary": 100}, "secondary"),
            ({"primary": 100, "secondary": 0}, "primary"),
        ):
            stack.bg.run(set_weights(stack.ballast.intent, "ewr", "shop", weights))
            expected = {name: w for name, w in weights.items() if w}
            eventually_blocking(
                lambda e=expected: {
                    z: w for z, w in applied_weights(envoy, "shop.critical").items() if w
                } == e,
                1.0,
                f"weights {weights} in ewr's config_dump",
            )
            origins = [stack.get("ewr", "/catalog")["x-origin"] for _ in range(20)]
            assert origins == [origin] * 20
        sjc = applied_weights(stack.envoys["sjc"], "shop.critical")
        assert sjc == {"primary": 95, "secondary": 5}  # the other PoP did not move
    finally:
        stack.bg.run(set_weights(stack.ballast.intent, "ewr", "shop",
                                 {"primary": 95, "secondary": 5}))


def test_cds_change_does_not_leave_clusters_warming(stack: Stack) -> None:
    for concurrency in (200, 120):
        stack.bg.run(set_desired(stack.ballast.intent,
                                 stack.build(max_origin_concurrency=concurrency)))
        version = stack.bg.call(
            lambda: stack.ballast.cache.resources("ewr", Capabilities()).type_version(
                CLUSTER_TYPE
            )
        )
        for pop in ("ewr", "sjc"):
            eventually_blocking(
                lambda pop=pop, v=version: stack.node(pop)["types"]["CDS"]["last_acked"] == v
                and stack.node(pop)["status"] == "SYNCED",
                2.0,
                f"{pop} ACKs the new CDS",
            )
            dump = stack.envoys[pop].admin_json("/config_dump?resource=dynamic_warming_clusters")
            assert dump.get("configs", []) == []
        stack.get("ewr", "/catalog")


def test_rejected_config_one_nack_no_loop_other_pop_unaffected(stack: Stack) -> None:
    before_nacks = len([r for r in stack.records if r[0] == "nack"])
    sjc_before = stack.node("sjc")
    try:
        stack.bg.call(
            lambda: force_capabilities(stack.ballast.cache, "ewr",
                                       Capabilities(adaptive_lifo=True), stack.ballast.hub.changed)
        )
        eventually_blocking(lambda: stack.node("ewr")["status"] == "NACKED", 2,
                            "ewr NACKs adaptive LIFO")
        sends = stack.node("ewr")["types"]["CDS"]["sends"]
        # A barrier instead of a pause: a weight change goes down the same stream after the
        # NACK; once Envoy has applied it, a resend loop of the rejected CDS would have shown.
        moved = {"primary": 90, "secondary": 10}
        stack.bg.run(set_weights(stack.ballast.intent, "ewr", "shop", moved))
        eventually_blocking(lambda: applied_weights(stack.envoys["ewr"], "shop.critical") == moved,
                            5, "ewr applies the EDS change sent after the NACK")
        nacks = [f for kind, f in stack.records if kind == "nack"][before_nacks:]
        assert len(nacks) == 1
        assert nacks[0]["node"] == "ewr-1" and nacks[0]["type"] == "CDS"
        assert LIFO_NACK in nacks[0]["message"]
        ewr = stack.node("ewr")
        assert ewr["types"]["CDS"]["sends"] == sends  # no resend loop
        assert ewr["types"]["CDS"]["last_nack"]["message"] == nacks[0]["message"]
        assert stack.get("ewr", "/catalog")["x-seen-tier"] == "critical"  # old config serves
        sjc = stack.node("sjc")
        assert sjc["status"] == "SYNCED" and sjc["types"] == sjc_before["types"]
    finally:
        stack.bg.call(lambda: force_capabilities(stack.ballast.cache, "ewr", None,
                                                 stack.ballast.hub.changed))
        stack.bg.run(set_weights(stack.ballast.intent, "ewr", "shop",
                                 {"primary": 95, "secondary": 5}))
    eventually_blocking(lambda: stack.node("ewr")["status"] == "SYNCED", 2, "ewr back in sync")
