"""Verified origin TLS through a real Envoy 1.40: loopback HTTPS origins with certificates made
by the test. Envoy serves through an origin whose certificate chains to the configured CA and
names the expected host (and matches a pin, when pinned); it refuses a self-signed, a wrong-name,
an expired and a wrongly pinned one; `insecure_skip_verify` accepts anything. Ballast's
certificate probe fails exactly the origins Envoy refused.
"""

from __future__ import annotations

import asyncio
import dataclasses
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from control_plane.cli.envoy_validate import find_envoy
from control_plane.desired.model import Desired, Listener, Origin, VirtualHost
from control_plane.observe.probes import Prober, probe_targets
from control_plane.translate import static_bootstrap, translate_pop
from control_plane.translate.resources import Capabilities
from harness.envoy_process import EnvoyProcess, free_port
from harness.models import example_desired, shop_group
from tests.support.certs import Issued, make_ca, make_leaf
from tests.support.tls_origins import TlsOrigins

pytestmark = pytest.mark.envoy

NAME = "origin.test"


@pytest.fixture
def tls_origins(tmp_path: Path) -> Iterator[TlsOrigins]:
    running = TlsOrigins(tmp_path)
    yield running
    running.close()


def fleet(cases: dict[str, tuple[Issued, dict[str, object]]], origins: TlsOrigins,
          ca_file: Path) -> Desired:
    """One origin group (and virtual host `<case>.test`) per case, its only origin on TLS."""
    groups, hosts = [], []
    for case, (issued, fields) in cases.items():
        origin = Origin(name="only", address="127.0.0.1", port=origins.start(case, issued),
                        tls=True, sni=NAME, ca_file=str(ca_file), **fields)  # type: ignore[arg-type]
        group = shop_group(origin, None)
        group = dataclasses.replace(group, name=case, origins=(origin,),
                                    preference={"ewr": ("only",), "sjc": ("only",)})
        groups.append(group)
        hosts.append(VirtualHost(name=case, domains=(f"{case}.test",), origin_group=case))
    base = example_desired()
    listener = Listener(name="edge", port=free_port(), virtual_hosts=tuple(hosts))
    return dataclasses.replace(base, origin_groups=tuple(groups), listeners=(listener,))


def status_of(port: int, case: str) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/home",
                                     headers={"host": f"{case}.test"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code


def ssl_stats(envoy: EnvoyProcess, case: str) -> dict[str, int]:
    stats = envoy.admin_json(f"/stats?format=json&filter=^cluster[.]{case}[.]critical[.]ssl[.]")
    return {item["name"].rsplit(".", 1)[1]: int(item["value"])
            for item in stats["stats"] if "value" in item and int(item["value"])}


def test_envoy_serves_only_through_verified_certificates(
        tmp_path: Path, tls_origins: TlsOrigins) -> None:
    find_envoy()
    ca = make_ca()
    ca_file, _ = ca.write(tmp_path, "ca")
    other_ca = make_ca("another CA")
    good = make_leaf([NAME], ca)
    cases: dict[str, tuple[Issued, dict[str, object]]] = {
        "valid": (good, {}),
        "wildcard": (make_leaf(["*.test"], ca), {}),
        "self_signed": (make_leaf([NAME], None), {}),
        "other_ca": (make_leaf([NAME], other_ca), {}),
        "wrong_name": (make_leaf(["other.test"], ca), {}),
        "expired": (make_leaf([NAME], ca, not_before_days=-30, not_after_days=-1), {}),
        "pinned": (good, {"spki_pins": (good.spki_sha256,)}),
        "cert_pinned": (good, {"cert_pins": (good.cert_sha256,)}),
        "wrong_pin": (good, {"spki_pins": (make_leaf([NAME], ca).spki_sha256,)}),
        "named": (make_leaf(["internal.test"], ca), {"verify_name": "internal.test"}),
        "skip": (make_leaf(["other.test"], None), {"verify": False}),
    }
    desired = fleet(cases, tls_origins, ca_file)
    bootstrap = static_bootstrap(translate_pop(desired, "ewr", Capabilities()))
    admin_port = free_port()
    bootstrap["admin"]["address"]["socket_address"]["port_value"] = admin_port
    port = desired.listeners[0].port
    with EnvoyProcess(bootstrap, admin_port) as envoy:
        envoy.wait_ready()
        got = {case: status_of(port, case) for case in cases}
        stats = {case: ssl_stats(envoy, case) for case in cases}
    assert got == {
        "valid": 200, "wildcard": 200, "self_signed": 503, "other_ca": 503, "wrong_name": 503,
        "expired": 503, "pinned": 200, "cert_pinned": 200, "wrong_pin": 503, "named": 200,
        "skip": 200,
    }, stats
    refused = {case for case, status in got.items() if status == 503}
    assert {case: tls_origins.served[case] for case in refused} == dict.fromkeys(refused, 0)
    # Ballast's certificate probe records the same verdicts for the same origins
    prober = Prober(probe_targets(desired))
    async def one_round() -> None:
        async with aiohttp.ClientSession() as session:
            await prober.probe_once(session)
    asyncio.run(one_round())
    failing = {case for (case, _), status in prober.certificates.items() if not status.passed}
    assert failing == refused, {k: v.problem for k, v in prober.certificates.items()}
    assert prober.certificates[("skip", "only")].verified is None
    assert stats["wrong_name"].get("fail_verify_san", 0) > 0, stats
    for case in ("self_signed", "other_ca", "expired"):
        assert stats[case].get("fail_verify_error", 0) > 0, stats
    assert stats["wrong_pin"].get("fail_verify_cert_hash", 0) > 0, stats
