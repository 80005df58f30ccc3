"""The filter capability gate with real Envoys: a listener adds an HTTP filter of a type Envoy
1.40 has and 1.36 does not (`transform`). The 1.40 Envoy gets and applies it; the 1.36 Envoy,
whose node.extensions do not list the type, gets the listener without it and ACKs everything
(instead of NACKing the whole listener), and its status and the `capability_fallback` record
say which filter was left out and why."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from control_plane.cli.envoy_validate import find_envoy
from control_plane.desired import parse_desired
from control_plane.translate.bootstrap import ads_bootstrap
from control_plane.xds_port.server import BallastServer
from harness.ads_desired import desired_yaml
from harness.background_loop import BackgroundLoop
from harness.envoy_process import EnvoyProcess, free_port
from harness.eventually import eventually_blocking
from tests.support.envoy_releases import envoy_binary

pytestmark = pytest.mark.envoy

TRANSFORM = "envoy.extensions.filters.http.transform.v3.TransformConfig"
FILTER = f"""
    http_filters:
      - name: envoy.filters.http.transform
        typed_config: {{"@type": "type.googleapis.com/{TRANSFORM}"}}"""
TYPES = {"CDS", "EDS", "LDS", "RDS"}


@pytest.fixture
def fleet() -> Iterator[tuple[BackgroundLoop, BallastServer, list[tuple[str, dict[str, Any]]],
                              dict[str, EnvoyProcess]]]:
    binaries = {"1.36": envoy_binary("1.36"), "1.40": find_envoy()}
    text = desired_yaml(listener_port=free_port(), primary_port=free_port(),
                        secondary_port=free_port(), sjc_offset=1)
    text = text.replace("  - name: edge\n", "  - name: edge" + FILTER + "\n", 1)
    bg = BackgroundLoop()
    records: list[tuple[str, dict[str, Any]]] = []
    ballast = BallastServer(parse_desired(text, "<gate>"), xds_address="127.0.0.1:0",
                            record=lambda kind, fields: records.append((kind, fields)))
    envoys: dict[str, EnvoyProcess] = {}
    try:
        bg.run(ballast.start())
        for release, binary in binaries.items():
            admin = free_port()
            envoys[release] = EnvoyProcess(
                ads_bootstrap(node_id=f"ewr-{release}", pop="ewr", xds_port=ballast.port,
                              admin_port=admin, envoy_release=release),
                admin, binary=binary).start()
        for envoy in envoys.values():
            envoy.wait_ready(20)
        yield bg, ballast, records, envoys
    finally:
        for envoy in envoys.values():
            envoy.stop()
        bg.run(ballast.stop(0.2))
        bg.close()


def http_filters(envoy: EnvoyProcess) -> list[str]:
    dump = envoy.admin_json("/config_dump?resource=dynamic_listeners")
    (listener,) = [c for c in dump["configs"] if c["name"] == "edge"]
    chain = listener["active_state"]["listener"]["filter_chains"][0]
    return [f["name"] for f in chain["filters"][0]["typed_config"]["http_filters"]]


def test_only_envoys_that_list_the_filter_type_get_it(fleet: Any) -> None:
    bg, ballast, records, envoys = fleet

    def nodes() -> dict[str, dict[str, Any]]:
        return {s.node_id: s.as_dict() for s in bg.call(ballast.nodes.statuses)}

    def synced() -> bool:
        found = nodes()
        return len(found) == 2 and all(
            set(n["types"]) >= TYPES and n["status"] == "SYNCED" for n in found.values())

    eventually_blocking(synced, 20, "both Envoys SYNCED on CDS, EDS, LDS, RDS")
    assert http_filters(envoys["1.40"]) == ["envoy.filters.http.transform",
                                            "envoy.filters.http.router"]
    assert http_filters(envoys["1.36"]) == ["envoy.filters.http.router"]
    old = nodes()["ewr-1.36"]
    assert old["capability_key"].startswith("none-f"), old["capability_key"]
    assert "lack" in old["capability_reason"] and "HTTP filter type" in old["capability_reason"]
    assert nodes()["ewr-1.40"]["capability_key"] == "fifo"
    eventually_blocking(lambda: any(k == "capability_fallback" and f["node"] == "ewr-1.36"
                           for k, f in list(records)), 5, "ewr-1.36's capability_fallback")
    (fallback,) = [f for k, f in list(records)
                   if k == "capability_fallback" and f["node"] == "ewr-1.36"]
    assert (f"listener edge: filter envoy.filters.http.transform not sent: the node's Envoy "
            f"does not list {TRANSFORM} in node.extensions") in fallback["notes"]
