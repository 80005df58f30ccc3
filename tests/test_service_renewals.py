"""Issue 37: certificate renewals follow `rollout.renewals`, and N renewals within a bake do not
restart the canary N times.

A `BallastService` in-process serves an HTTPS listener in three PoPs (ewr the canary, then sjc,
then lax); its certificate files are renewed on disk (each file replaced by a rename, as certbot
does) and the file watcher reads them. What each PoP is served is read from the output cache
(the SDS Secret Ballast sends that PoP's Envoys), what Ballast decided from its decision log.
No Envoy connects: the rollout driver reads made-up nodes applying what their PoP serves and
healthy windows (`tests/support/rollout_inputs.py`), so a wave passes once baked.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from control_plane.decisions.read import iter_records
from control_plane.lifecycle.service import BallastService, ServiceConfig
from control_plane.translate.resources import SECRET_TYPE, Capabilities
from harness.envoy_process import free_port
from harness.eventually import eventually
from tests.support.rollout_inputs import with_made_up_inputs
from tests.support.tls_listeners import TlsSite

pytestmark = pytest.mark.timeout(90)

POPS = ("ewr", "sjc", "lax")
BAKE_S = 8  # the renewals below come well within it, however loaded the machine
SECRET = "https.shop"
DESIRED = """\
pops:
  ewr: {{listen_address: 127.0.0.1, port_offset: 0}}
  sjc: {{listen_address: 127.0.0.1, port_offset: 1}}
  lax: {{listen_address: 127.0.0.1, port_offset: 2}}
origin_groups:
  shop:
    origins:
      primary: {{address: 127.0.0.1, port: {origin}}}
rollout: {{canary: [ewr], waves: [50%, 100%], bake: {bake}, renewals: {renewals},
          stats_flush_interval: 1s}}
classification:
  default_tier: critical
  rules:
    - {{name: checkout, path_prefix: /api/checkout, tier: critical}}
{marker}listeners:
  - name: https
    port: {port}
    tls:
      certificates:
        - {{name: shop, hostnames: [shop.test], cert_file: {cert}, key_file: {key}}}
    virtual_hosts:
      - {{name: all, domains: ["*"], origin_group: shop}}
"""


class Site:
    """The desired-state file and the certificate files it names."""

    def __init__(self, folder: Path) -> None:
        self.tls = TlsSite(folder / "certs")
        self.path = folder / "desired.yaml"
        self.origin, self.port = free_port(), free_port()

    def renew(self) -> bytes:
        """A new certificate and key for shop.test on disk; the chain's bytes."""
        self.tls.write("shop", "shop.test")
        return self.tls.cert_file("shop").read_bytes()

    def write(self, *, bake: str, renewals: str, marker: str | None = None) -> None:
        self.path.write_text(DESIRED.format(
            origin=self.origin, port=self.port, bake=bake, renewals=renewals,
            cert=self.tls.cert_file("shop"), key=self.tls.key_file("shop"),
            marker="" if marker is None else
            f"    - {{name: {marker}, path_prefix: /{marker}, tier: critical}}\n"))


@contextlib.asynccontextmanager
async def serving(site: Site, state_dir: Path) -> AsyncIterator[BallastService]:
    service = BallastService(ServiceConfig(
        desired_path=site.path, state_dir=state_dir, xds_address="127.0.0.1:0",
        admin_address=None, probes=False, reload_poll_s=0.1, rollout_poll_ms=100))
    await service.start()
    with_made_up_inputs(service, POPS)
    try:
        yield service
    finally:
        await service.stop(0.1)


def chains(service: BallastService) -> dict[str, bytes]:
    """PoP -> the certificate chain its Envoys are sent."""
    served = {}
    for pop in POPS:
        secret = service.server.cache.resources(pop, Capabilities()).of_type(SECRET_TYPE)[SECRET]
        served[pop] = bytes(secret.message.tls_certificate.certificate_chain.inline_bytes)
    return served


def records(state_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [r for r in iter_records(state_dir) if r["kind"] == kind]


async def test_renewals_within_a_bake_keep_the_canary_baking(tmp_path: Path) -> None:
    """`renewals: waves`: a renewal rolls out like a change (the canary first); three more
    within its bake follow it in the canary, the bake not restarted (no supersede), and the
    wave passes one bake after it first started. Then, `renewals: immediate` (the default):
    during a change's rollout, a renewal reaches every PoP at once — the canary on the change
    with it, the others on the last passed version with it — and the rollout goes on in its
    wave; with no rollout in progress, it is a rollout that passes at once."""
    site = Site(tmp_path)
    first = site.renew()
    site.write(bake=f"{BAKE_S}s", renewals="waves")
    state = tmp_path / "state"
    async with serving(site, state) as service:
        assert chains(service) == dict.fromkeys(POPS, first)
        renewed = site.renew()
        await eventually(lambda: service.rollouts.rollout is not None, 10, "the renewal's rollout")
        rollout = service.rollouts.rollout
        assert rollout.phase == "baking" and rollout.wave == 0 and not rollout.immediate
        started, baking_since = rollout.started_ms, rollout.wave_started_ms
        assert chains(service) == {"ewr": renewed, "sjc": first, "lax": first}
        for n in range(1, 4):  # three renewals, each applied before the next, within the bake
            renewed = site.renew()
            # (its record is written before the swap: what is served is waited for too)
            await eventually(lambda n=n, renewed=renewed: len(records(
                state, "certificates_renewed")) == n and chains(service)["ewr"] == renewed, 10,
                f"renewal {n + 1} taken by the rollout")
            rollout = service.rollouts.rollout
            assert (rollout.started_ms, rollout.wave_started_ms, rollout.wave, rollout.phase) \
                == (started, baking_since, 0, "baking"), rollout
            assert chains(service) == {"ewr": renewed, "sjc": first, "lax": first}
        assert records(state, "rollout_superseded") == []
        assert len(records(state, "rollout_started")) == 1
        note = records(state, "certificates_renewed")[-1]
        assert "bake not restarted" in note["rule"] and "rollout.renewals waves" in note["rule"]
        await eventually(lambda: records(state, "wave_passed"), 10, "the canary's wave passes")
        passed = records(state, "wave_passed")[0]
        assert passed["detail"]["before"]["wave_started_ms"] == baking_since
        assert passed["detail"]["now_ms"] - baking_since < 2 * BAKE_S * 1000  # one bake
        await eventually(lambda: service.rollouts.rollout.phase == "passed", 20, "passed")
        assert chains(service) == dict.fromkeys(POPS, renewed)

        # renewals: immediate, during a change's rollout (a new route, a long bake)
        site.write(bake="60s", renewals="immediate", marker="v2")
        await eventually(lambda: service.rollouts.rollout.phase == "baking", 10, "v2's canary")
        rollout = service.rollouts.rollout
        v2, v1 = rollout.to_version, rollout.from_version
        started, baking_since = rollout.started_ms, rollout.wave_started_ms
        now = site.renew()
        await eventually(lambda: chains(service) == dict.fromkeys(POPS, now)
                         and service.rollouts.rollout.to_version != v2, 10,
                         "the renewal on every PoP at once")
        rollout = service.rollouts.rollout
        assert (rollout.started_ms, rollout.wave_started_ms, rollout.wave, rollout.phase) == (
            started, baking_since, 0, "baking"), rollout
        assert v1 != rollout.from_version and v2 != rollout.to_version
        versions = service.server.intent.intent.versions()
        assert versions == {"ewr": rollout.to_version, "sjc": rollout.from_version,
                            "lax": rollout.from_version}, versions
        note = records(state, "certificates_renewed")[-1]
        assert "sjc, lax get" in note["rule"] and "rollout.renewals immediate" in note["rule"]

        # renewals: immediate, no rollout in progress: every PoP at once, as a rollout
        await service.rollouts.act("promote", "test")
        last = site.renew()
        await eventually(lambda: chains(service) == dict.fromkeys(POPS, last)
                         and service.rollouts.rollout.immediate, 10,
                         "the renewal on every PoP at once")
        rollout = service.rollouts.rollout
        assert rollout.phase == "passed" and rollout.immediate, rollout
        assert "rollout.renewals: immediate" in rollout.reason
        assert len(records(state, "rollout_superseded")) == 0

    # a restart serves what the files hold now, and a renewal while down is served at once
    await service.stop(0.1)
    while_down = site.renew()
    async with serving(site, state) as service:
        assert chains(service) == dict.fromkeys(POPS, while_down)
        restored = records(state, "state_restored")[-1]
        assert "renewed while Ballast was down" in restored["rule"], restored
