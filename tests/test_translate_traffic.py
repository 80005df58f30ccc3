"""Real traffic through a real Envoy 1.40 started from a PoP's static bootstrap.

Checks what unit tests cannot: classification sends requests to the right tier (seen by the
origin as `x-ballast-tier`), an origin at weight 0 gets no requests, and tier actions (shedding
and demotion) do in Envoy what the routes say.
"""

from __future__ import annotations

import dataclasses
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator

import pytest

from control_plane.cli.envoy_validate import find_envoy
from control_plane.desired.model import Desired, Origin, TierActions
from control_plane.translate import PopIntent, static_bootstrap, translate_pop
from control_plane.translate.resources import Capabilities
from harness.envoy_process import EnvoyProcess, free_port
from harness.models import example_desired, shop_group
from tests.support.tier_origins import Origins

pytestmark = pytest.mark.envoy


@pytest.fixture
def origins() -> Iterator[Origins]:
    running = Origins()
    yield running
    running.close()


def desired_on_free_ports(origins: Origins) -> Desired:
    group = shop_group(
        Origin(name="primary", address="127.0.0.1", port=origins.port("primary")),
        Origin(name="secondary", address="127.0.0.1", port=origins.port("secondary")),
    )
    desired = example_desired(group)
    (listener,) = desired.listeners
    moved = dataclasses.replace(listener, port=free_port())
    return dataclasses.replace(desired, listeners=(moved,))


def get(port: int, path: str, headers: dict[str, str] | None = None) -> int:
    return get_with_headers(port, path, headers)[0]


def get_with_headers(
    port: int, path: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str]]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status), {k.lower(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}


def upstream_requests(envoy: EnvoyProcess) -> dict[str, int]:
    """upstream_rq_total per tier cluster, from the Envoy's own stats (mirror clusters: none)."""
    stats = envoy.admin_json("/stats?format=json&filter=^cluster[.]shop[.].*[.]upstream_rq_total$")
    return {
        item["name"].split(".")[2]: int(item["value"])
        for item in stats["stats"]
        if "value" in item and not item["name"].split(".")[2].startswith("mirror-")
    }


def test_classification_and_weight_zero_with_real_traffic(origins: Origins) -> None:
    find_envoy()
    desired = desired_on_free_ports(origins)
    weights = {"shop": {"primary": 0, "secondary": 100}}
    bootstrap = static_bootstrap(translate_pop(desired, "ewr", Capabilities(),
                                               PopIntent(weights=weights)))
    admin_port = free_port()
    bootstrap["admin"]["address"]["socket_address"]["port_value"] = admin_port
    port = desired.listeners[0].port
    with EnvoyProcess(bootstrap, admin_port) as envoy:
        envoy.wait_ready()
        for _ in range(10):
            assert get(port, "/api/checkout/cart") == 200
            assert get(port, "/_next/image?x=1") == 200
            assert get(port, "/home", {"x-purpose": "prefetch"}) == 200
            assert get(port, "/home", {"user-agent": "crawlbot/1.0"}) == 200
            assert get(port, "/home", {"x-ballast-tier": "background"}) == 200
    # primary (weight 0) gets nothing; a client's own x-ballast-tier is overwritten
    assert origins.seen == Counter(
        {
            ("secondary", "critical"): 20,
            ("secondary", "background"): 20,
            ("secondary", "normal"): 10,
        }
    )


def test_tier_actions_shed_and_demote_in_one_pop_only(origins: Origins) -> None:
    """ewr runs with the seed's actions (demote 50% of normal, shed background to its floor),
    sjc without."""
    find_envoy()
    desired = desired_on_free_ports(origins)
    port = desired.listeners[0].port
    envoys = {}
    for pop, actions in (("ewr", {"shop": TierActions()}), ("sjc", {})):
        bootstrap = static_bootstrap(translate_pop(desired, pop, Capabilities(),
                                                   PopIntent(tier_actions=actions)))
        admin_port = free_port()
        bootstrap["admin"]["address"]["socket_address"]["port_value"] = admin_port
        envoys[pop] = EnvoyProcess(bootstrap, admin_port).start()
    try:
        for envoy in envoys.values():
            envoy.wait_ready()
        ewr_port, sjc_port = port, port + desired.pop("sjc").port_offset
        # background is shed but keeps its floor (6 slots): one request at a time gets through
        for _ in range(5):
            assert get(ewr_port, "/home", {"purpose": "prefetch"}) == 200
        # half of normal is demoted into the shed background pool, so it is answered at the
        # edge with normal's own action (reject: 503); the other half reaches the origin
        answers = [get_with_headers(ewr_port, "/home", {"x-purpose": "prefetch"})
                   for _ in range(40)]
        shed = [h for status, h in answers if status == 503]
        assert all(h.get("x-ballast-shed") == "normal" and h.get("retry-after") == "60"
                   for h in shed)
        assert 8 <= len(shed) <= 32, len(shed)  # 50 % per request: p < 1e-4 outside
        ewr = upstream_requests(envoys["ewr"])
        assert ewr == {"critical": 0, "normal": 40 - len(shed), "background": 5}, ewr
        by_tier = Counter[str]()
        for (_, tier), count in origins.seen.items():
            by_tier[tier] += count
        assert by_tier == Counter({"normal": ewr["normal"], "background": 5})

        origins.seen.clear()
        for _ in range(5):
            assert get(sjc_port, "/home", {"purpose": "prefetch"}) == 200
        for _ in range(10):
            assert get(sjc_port, "/home", {"x-purpose": "prefetch"}) == 200
        assert upstream_requests(envoys["sjc"]) == {"critical": 0, "normal": 10, "background": 5}
        assert sum(c for (_, tier), c in origins.seen.items() if tier == "background") == 5
    finally:
        for envoy in envoys.values():
            envoy.stop()
