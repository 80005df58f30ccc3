"""A standby whose certificate expires within the warning window is flagged by the probe — in the
decision log, `/status`, `ballast status` and `/metrics` — while its weight stays where it was
(no shift has happened or is needed to find out). A real Ballast with loopback HTTPS origins."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from control_plane.decisions.read import iter_records
from control_plane.lifecycle.service import BallastService, ServiceConfig
from harness.envoy_process import free_port
from harness.eventually import eventually
from tests.support.certs import make_ca, make_leaf
from tests.support.tls_origins import TlsOrigins

pytestmark = pytest.mark.timeout(60)

DESIRED = """\
pops:
  ewr: {{listen_address: 127.0.0.1}}
origin_groups:
  shop:
    origin_tls: {{ca_file: {ca_file}, expiry_warning_days: 14}}
    origins:
      primary: {{address: 127.0.0.1, port: {primary}, tls: true, sni: origin.test}}
      standby: {{address: 127.0.0.1, port: {standby}, tls: true, sni: origin.test}}
    preference:
      ewr: [primary, standby]
    health_check: {{interval: 1s, connect_timeout: 1s, read_timeout: 1s}}
listeners:
  - {{name: edge, port: {listener}, virtual_hosts: [{{name: shop, domains: ["*"],
      origin_group: shop}}]}}
"""


async def test_expiring_standby_certificate_is_flagged_before_any_shift(tmp_path: Path) -> None:
    ca = make_ca()
    ca_file, _ = ca.write(tmp_path, "ca")
    origins = TlsOrigins(tmp_path)
    primary = origins.start("primary", make_leaf(["origin.test"], ca, not_after_days=200))
    standby = origins.start("standby", make_leaf(["origin.test"], ca, not_after_days=5))
    desired = tmp_path / "desired.yaml"
    desired.write_text(DESIRED.format(ca_file=ca_file, primary=primary, standby=standby,
                                      listener=free_port()))
    state_dir = tmp_path / "state"
    service = BallastService(ServiceConfig(
        desired_path=desired, state_dir=state_dir, xds_address="127.0.0.1:0",
        admin_address="127.0.0.1:0", probe_interval_ms=200))
    await service.start()
    try:
        def flagged() -> list[dict[str, object]]:
            return [r for r in iter_records(state_dir) if r["kind"] == "certificate"]

        await eventually(lambda: bool(flagged()), 20, "a certificate record")
        (record,) = flagged()
        assert record["group"] == "shop" and record["pop"] is None
        assert record["detail"]["origin"] == "standby"
        assert record["detail"]["state"] == "expiring"
        assert str(record["rule"]).startswith(
            "certificate of origin standby of group shop expires in "), record["rule"]
        assert "within the 14-day warning window" in str(record["rule"])
        # no weight moved: the standby keeps its warm pool, the primary the rest
        assert service.server.intent.weights("ewr", "shop") == {"primary": 95, "standby": 5}
        kinds = {r["kind"] for r in iter_records(state_dir)}
        assert not kinds & {"shift", "leave", "return"}, kinds

        assert service.admin is not None
        async with aiohttp.ClientSession() as session:
            async with session.get(service.admin.url + "/status") as response:
                status = await response.json()
            async with session.get(service.admin.url + "/metrics") as response:
                exposition = await response.text()
        by_origin = {c["origin"]: c for c in status["certificates"]}
        assert by_origin["primary"]["problem"] is None and by_origin["primary"]["verified"]
        assert 199 < by_origin["primary"]["days_to_expiry"] <= 200
        assert by_origin["standby"]["state"] == "expiring"
        assert 4.9 < by_origin["standby"]["days_to_expiry"] <= 5

        samples = {
            (sample.name, sample.labels["origin"]): sample.value
            for family in text_string_to_metric_families(exposition)
            for sample in family.samples
            if sample.name.startswith("ballast_origin_certificate")
        }
        assert samples[("ballast_origin_certificate_ok", "standby")] == 0
        assert samples[("ballast_origin_certificate_ok", "primary")] == 1
        assert 4.9 < samples[("ballast_origin_certificate_days_to_expiry", "standby")] <= 5
        assert 199 < samples[("ballast_origin_certificate_days_to_expiry", "primary")] <= 200

        cli = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "control_plane", "status", "--server", service.admin.url],
            capture_output=True, text=True, timeout=30, check=False)
        assert cli.returncode == 0, cli.stderr
        assert "origin certificates:" in cli.stdout
        standby_line = next(line for line in cli.stdout.splitlines() if "shop/standby" in line)
        assert "verifies" in standby_line and "FAILING: expires in" in standby_line
        primary_line = next(line for line in cli.stdout.splitlines() if "shop/primary" in line)
        assert primary_line.rstrip().endswith("ok")
    finally:
        await service.stop()
        origins.close()


async def test_verification_off_is_warned_at_start_and_never_fails_the_origin(
        tmp_path: Path) -> None:
    ca = make_ca()
    ca_file, _ = ca.write(tmp_path, "ca")
    origins = TlsOrigins(tmp_path)
    primary = origins.start("primary", make_leaf(["origin.test"], ca))
    lab = origins.start("standby", make_leaf(["lab.invalid"], None, not_after_days=2))
    desired = tmp_path / "desired.yaml"
    text = DESIRED.format(ca_file=ca_file, primary=primary, standby=lab, listener=free_port())
    desired.write_text(text.replace(f"port: {lab}, tls: true, sni: origin.test}}",
                                    f"port: {lab}, tls: true, insecure_skip_verify: true}}"))
    state_dir = tmp_path / "state"
    service = BallastService(ServiceConfig(
        desired_path=desired, state_dir=state_dir, xds_address="127.0.0.1:0",
        admin_address=None, probe_interval_ms=200))
    await service.start()
    try:
        assert service.prober is not None
        prober = service.prober
        await eventually(lambda: ("shop", "standby") in prober.certificates, 20, "a check")
        status = prober.certificates[("shop", "standby")]
        assert status.passed and status.verified is None
        assert status.days_to_expiry is not None and status.days_to_expiry < 2
        (applied,) = [r for r in iter_records(state_dir) if r["kind"] == "config_applied"]
        (warning,) = applied["detail"]["warnings"]
        assert warning.startswith("origin_groups.shop.origins.standby.insecure_skip_verify: "
                                  "TLS verification is OFF")
        assert not [r for r in iter_records(state_dir) if r["kind"] == "certificate"]
    finally:
        await service.stop()
        origins.close()
