"""`ballast status` against a real Ballast and a real Envoy 1.40 that NACKs adaptive LIFO.

Adaptive LIFO is forced on PoP ewr (`cache.override_capabilities`); Envoy 1.40 has no such
queue policy and rejects the CDS update with its own message, which `ballast status` shows.
A simulated node in sjc stays SYNCED next to it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from control_plane.app.envoy_process import EnvoyProcess, free_port
from control_plane.cli.main import main
from control_plane.translate.bootstrap import ads_bootstrap
from control_plane.translate.resources import Capabilities
from tests.support.admin_stack import (
    AdminStack,
    connect_node,
    sample,
    samples,
    start_stack,
    wait_until,
)
from tests.support.ads_desired import desired
from tests.support.background_loop import BackgroundLoop
from tests.support.xds_client import XdsClient

pytestmark = pytest.mark.envoy

LIFO_NACK = "Didn't find a registered queue policy implementation for name: " \
    "'envoy.queue_policy.adaptive_lifo'"


@dataclass
class Fleet:
    bg: BackgroundLoop
    stack: AdminStack
    envoy: EnvoyProcess
    sim: tuple[XdsClient, grpc.aio.Channel]

    def node(self, node_id: str) -> dict[str, Any]:
        """The registry's view of a connected node; empty while it is not connected."""
        statuses = self.bg.call(lambda: self.stack.ballast.nodes.by_node(node_id))
        return statuses[0].as_dict() if statuses else {"types": {}, "status": None}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    bg = BackgroundLoop()
    state_dir: Path = tmp_path_factory.mktemp("state")
    first, second = sorted((free_port(), free_port()))
    the_desired = desired(listener_port=first, sjc_offset=second - first,
                          primary_port=free_port(), secondary_port=free_port())
    stack = bg.run(start_stack(the_desired, state_dir))
    envoy: EnvoyProcess | None = None
    sim: tuple[XdsClient, grpc.aio.Channel] | None = None
    try:
        bg.call(lambda: stack.ballast.cache.override_capabilities(
            "ewr", Capabilities(adaptive_lifo=True)))
        admin = free_port()
        envoy = EnvoyProcess(
            ads_bootstrap(node_id="ewr-1", pop="ewr", xds_port=stack.ballast.port,
                          admin_port=admin, delta=False),
            admin,
        ).start()
        sim = bg.run(connect_node(stack, "sjc-sim", "sjc"))
        the_fleet = Fleet(bg, stack, envoy, sim)
        wait_until(lambda: the_fleet.node("ewr-1")["types"].get("CDS", {}).get("status")
                   == "NACKED", 10, "Envoy NACKs the adaptive LIFO clusters")
        wait_until(lambda: the_fleet.node("sjc-sim")["status"] == "SYNCED", 5, "sim node synced")
        yield the_fleet
    finally:
        if envoy is not None:
            envoy.stop()
        if sim is not None:
            bg.run(sim[0].close())
            bg.run(sim[1].close())
        bg.run(stack.stop())
        bg.close()


def test_table_shows_the_nacked_node_with_envoys_message(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "--server", fleet.stack.url]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == [
        "NODE", "POP", "ENVOY", "MODE", "CONNECTED", "CDS", "EDS", "LDS", "RDS", "STATUS"
    ]
    ewr = next(line for line in lines if line.startswith("ewr-1 "))
    assert ewr.split()[1:4] == ["ewr", fleet.node("ewr-1")["envoy_version"], "sotw"]
    assert ewr.split()[2].startswith("1.40.")
    assert ewr.rstrip().endswith("NACKED")
    cds = fleet.node("ewr-1")["types"]["CDS"]
    assert f"{cds['last_sent'][:8]}/" in ewr and "NACK" in ewr  # sent, not what it ACKed
    sjc = next(line for line in lines if line.startswith("sjc-sim "))
    assert sjc.rstrip().endswith("SYNCED") and "NACK" not in sjc
    assert "ewr-1 NACKED:" in out
    assert LIFO_NACK in out
    assert f"CDS version {cds['last_sent'][:8]} rejected, still NACKED" in out


def test_node_detail_shows_queue_policy_and_why(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "ewr-1", "--server", fleet.stack.url]) == 0
    out = capsys.readouterr().out
    assert out.startswith("node ewr-1 (stream ")
    assert ": NACKED" in out.splitlines()[0]
    assert "queue policy:  adaptive LIFO for the tiers that ask for it — capability key lifo, " \
        "because override for PoP ewr" in out
    assert "CDS   NACKED" in out
    assert LIFO_NACK in out

    assert main(["status", "sjc-sim", "--server", fleet.stack.url]) == 0
    detail = capsys.readouterr().out
    assert "capability key fifo, because its node.extensions does not list " \
        "envoy.queue_policy.adaptive_lifo" in detail
    assert "last NACKs" not in detail


def test_json_and_the_metrics_count_envoys_nack(
    fleet: Fleet, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BALLAST_ADMIN", fleet.stack.url)
    assert main(["status", "--json"]) == 0
    nodes = json.loads(capsys.readouterr().out)["nodes"]
    assert {n["node_id"]: n["status"] for n in nodes} == {"ewr-1": "NACKED", "sjc-sim": "SYNCED"}
    parsed = samples(fleet.bg.call(fleet.stack.metrics.exposition).decode())
    assert sample(parsed, "ballast_xds_nacks_total", type="CDS") == 1
    assert sample(parsed, "ballast_connected_nodes", pop="ewr") == 1


def test_unknown_node_and_unreachable_server_exit_1(
    fleet: Fleet, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["status", "nope", "--server", fleet.stack.url]) == 1
    assert "node 'nope' is not connected" in capsys.readouterr().err
    dead = f"http://127.0.0.1:{free_port()}"
    assert main(["status", "--server", dead]) == 1
    assert f"cannot reach the Ballast admin API at {dead}" in capsys.readouterr().err
    monkeypatch.setenv("BALLAST_ADMIN", "not a url")
    assert main(["status"]) == 1
    assert "$BALLAST_ADMIN: 'not a url' is not a server URL" in capsys.readouterr().err
    with pytest.raises(SystemExit) as bad:
        main(["status", "--server", "ftp://x"])
    assert bad.value.code == 2
