"""A tier's pending limit bounded in time reaches a real Envoy 1.40 through the RTDS layer and
takes effect: Ballast's ADS server, the tier controller's state -> actions -> runtime layer
(`decide/tiers.py` part 4, `translate/runtime.py`), one held origin with one critical slot.

With the limit 2 in the layer, the third waiting request overflows and is answered with the
critical tier's shed action (`x-ballast-shed: critical`, Envoy's `upstream_rq_pending_overflow`);
with the limit raised to 5 over the same stream, four requests wait and none overflows. The CDS
limit (`max_queue_depth`) stays 2000 throughout: only the runtime override bounds the queue.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from control_plane.decide.tiers import TierState, actions_in_force
from control_plane.desired import parse_desired
from control_plane.translate.bootstrap import ads_bootstrap
from control_plane.translate.runtime import pending_key
from control_plane.xds_port.server import BallastServer
from harness.background_loop import BackgroundLoop
from harness.envoy_process import EnvoyProcess, free_port
from harness.eventually import eventually_blocking
from harness.intent_changes import set_tier_actions
from tests.support.held_origin import HeldOrigin, held_origins

pytestmark = pytest.mark.envoy

KEY = pending_key("shop.critical")
DESIRED = """\
pops:
  ewr: {{listen_address: 127.0.0.1}}
tiers:   # critical: one slot (ceil(5 % of 20)); no retry, no attempt times out meanwhile
  critical: {{share: 5, read_timeout: 30s, retries: 0}}
  normal: {{share: 25}}
  background: {{share: 70}}
origin_groups:
  shop:
    max_origin_concurrency: 20
    origins:
      primary: {{address: 127.0.0.1, port: {origin}}}
classification:
  default_tier: critical
listeners:
  - name: edge
    port: {listener}
    virtual_hosts:
      - {{name: shop, domains: ["*"], origin_group: shop}}
"""


def fetch(port: int) -> tuple[int, dict[str, str]]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/checkout")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}


def stat(envoy: EnvoyProcess, name: str) -> int:
    text = envoy.admin(f"/stats?filter=^{name}$")
    return int(text.split(":")[1]) if ":" in text else 0


def runtime_value(envoy: EnvoyProcess) -> str | None:
    entry = envoy.admin_json("/runtime").get("entries", {}).get(KEY)
    return None if entry is None else entry.get("final_value")


class Edge:
    """Ballast's ADS server (desired state above) and one Envoy of PoP ewr on it."""

    def __init__(self, bg: BackgroundLoop, origin: HeldOrigin) -> None:
        self.listen = free_port()
        desired = parse_desired(DESIRED.format(origin=origin.port, listener=self.listen),
                                "<queue-limit-test>")
        self.group = desired.group("shop")
        self.bg = bg
        self.ballast = BallastServer(desired, xds_address="127.0.0.1:0")
        bg.run(self.ballast.start())
        admin = free_port()
        self.envoy = EnvoyProcess(ads_bootstrap(node_id="ewr-1", pop="ewr",
                                                xds_port=self.ballast.port, admin_port=admin),
                                  admin).start()

    def bound(self, limit: int) -> None:
        """The tier controller's state with the critical queue bounded at `limit`, through
        the one path it takes to Envoy (actions in force -> the PoP's runtime layer)."""
        actions = actions_in_force(self.group, TierState(queue_limits=(("critical", limit),)))
        assert actions is not None and dict(actions.pending_limits) == {"critical": limit}
        self.bg.run(set_tier_actions(self.ballast.intent, "ewr", "shop", actions))
        eventually_blocking(lambda: runtime_value(self.envoy) == str(limit), 10,
                            f"Envoy's runtime has {KEY} = {limit}")

    def stop(self) -> None:
        self.envoy.stop()
        self.bg.run(self.ballast.stop(0.2))


@pytest.fixture
def edge_and_origin() -> Iterator[tuple[Edge, HeldOrigin]]:
    bg = BackgroundLoop()
    try:
        with held_origins("origin") as origins:
            origin = origins["origin"]
            edge = Edge(bg, origin)
            try:
                edge.envoy.wait_ready()
                yield edge, origin
            finally:
                origin.release()
                edge.stop()
    finally:
        bg.close()


def queue_up(edge: Edge, origin: HeldOrigin, waiting: int) -> tuple[list[threading.Thread],
                                                                     list[int]]:
    """One request held at the origin (the tier's one slot busy) and `waiting` more in the
    critical tier's pending queue; their threads and (once released) statuses."""
    statuses: list[int] = []
    origin.hold()
    threads = [threading.Thread(target=lambda: statuses.append(fetch(edge.listen)[0]))
               for _ in range(waiting + 1)]
    threads[0].start()
    origin.wait_held(1)
    for thread in threads[1:]:
        thread.start()
    eventually_blocking(
        lambda: stat(edge.envoy, "cluster.shop.critical.upstream_rq_pending_active") == waiting,
        10, f"{waiting} critical requests pending")
    return threads, statuses


def release(origin: HeldOrigin, threads: list[threading.Thread]) -> None:
    origin.release()
    for thread in threads:
        thread.join(timeout=30)


def test_the_runtime_pending_limit_bounds_the_tier_queue_in_envoy(
    edge_and_origin: tuple[Edge, HeldOrigin],
) -> None:
    edge, origin = edge_and_origin
    assert edge.group.guarantee(edge.group.tier("critical")) == 1
    assert edge.group.tier("critical").max_queue_depth == 2000  # the CDS limit: not the bound
    overflow = "cluster.shop.critical.upstream_rq_pending_overflow"

    edge.bound(2)
    threads, statuses = queue_up(edge, origin, waiting=2)
    status, headers = fetch(edge.listen)  # the third in line: over the limit of 2
    release(origin, threads)
    assert (status, headers.get("x-ballast-shed")) == (503, "critical"), (status, headers)
    assert stat(edge.envoy, overflow) == 1
    assert sorted(statuses) == [200, 200, 200]
    assert origin.served == 3  # the overflowing request never reached the origin

    edge.bound(5)
    threads, statuses = queue_up(edge, origin, waiting=4)  # twice the old limit, waiting
    release(origin, threads)
    assert statuses == [200] * 5
    assert stat(edge.envoy, overflow) == 1  # nothing more overflowed
    assert origin.served == 8
