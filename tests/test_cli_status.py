"""`ballast status` against a real Ballast and a real Envoy 1.40 that NACKs adaptive LIFO.

Adaptive LIFO is forced on PoP ewr (`tests/support/forced_capabilities.py`); Envoy 1.40 has no such
queue policy and rejects the CDS update with its own message, which `ballast status` shows.
A simulated node in sjc stays SYNCED next to it. Tier actions are set in the cache of sjc (as the
reconcile loop would) and shown under the table and in the node detail.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from control_plane.cli import status
from control_plane.cli.admin_client import AdminClient, AdminError
from control_plane.cli.main import main
from control_plane.desired.model import TierActions
from control_plane.translate.bootstrap import ads_bootstrap
from control_plane.translate.resources import Capabilities
from harness.ads_desired import desired
from harness.background_loop import BackgroundLoop
from harness.envoy_process import EnvoyProcess, free_port
from harness.eventually import eventually_blocking
from harness.intent_changes import set_tier_actions
from harness.xds_client import XdsClient
from tests.support.admin_stack import (
    AdminStack,
    connect_node,
    sample,
    samples,
    start_stack,
)
from tests.support.forced_capabilities import force_capabilities

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
        bg.call(lambda: force_capabilities(stack.ballast.cache, "ewr",
                                           Capabilities(adaptive_lifo=True)))
        admin = free_port()
        envoy = EnvoyProcess(
            ads_bootstrap(node_id="ewr-1", pop="ewr", xds_port=stack.ballast.port,
                          admin_port=admin, delta=False),
            admin,
        ).start()
        sim = bg.run(connect_node(stack, "sjc-sim", "sjc"))
        the_fleet = Fleet(bg, stack, envoy, sim)
        eventually_blocking(lambda: the_fleet.node("ewr-1")["types"].get("CDS", {}).get("status")
                            == "NACKED", 10, "Envoy NACKs the adaptive LIFO clusters")
        eventually_blocking(lambda: the_fleet.node("sjc-sim")["status"] == "SYNCED", 5,
                            "sim node synced")
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
        "NODE", "POP", "ENVOY", "QUEUE", "MODE", "CONNECTED", "CDS", "EDS", "LDS", "RDS",
        "STATUS"
    ]
    ewr = next(line for line in lines if line.startswith("ewr-1 "))
    assert ewr.split()[1:5] == ["ewr", fleet.node("ewr-1")["envoy_version"], "lifo", "sotw"]
    assert ewr.split()[2].startswith("1.40.")
    assert ewr.rstrip().endswith("NACKED")
    cds = fleet.node("ewr-1")["types"]["CDS"]
    assert f"{cds['last_sent'][:8]}/" in ewr and "NACK" in ewr  # sent, not what it ACKed
    sjc = next(line for line in lines if line.startswith("sjc-sim "))
    assert sjc.rstrip().endswith("SYNCED") and "NACK" not in sjc
    assert "ewr-1 NACKED:" in out
    assert LIFO_NACK in out
    assert f"CDS version {cds['last_sent'][:8]} rejected, still NACKED" in out
    assert lines[-1] == "tier actions: none active"


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
    assert "  tier actions:  none active\n" in out
    assert LIFO_NACK in out

    assert main(["status", "sjc-sim", "--server", fleet.stack.url]) == 0
    detail = capsys.readouterr().out
    assert "capability key fifo, because its node.extensions list envoy.queue_policy.fifo " \
        "and do not list envoy.queue_policy.adaptive_lifo" in detail
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


def test_pops_with_active_tier_actions(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    intent = fleet.stack.ballast.intent
    shed_only = TierActions(demote_tier=None, demote_to=None, demote_share=0)
    fleet.bg.run(set_tier_actions(intent, "sjc", "shop", TierActions()))
    try:
        assert main(["status", "--server", fleet.stack.url]) == 0
        out = capsys.readouterr().out
        assert out.endswith(
            "\n\ntier actions active:\n"
            "  sjc  shop  normal: 50% demoted to background (answered at the edge: background "
            "is shed); background: shed to its floor (503 beyond)\n"
        )
        assert main(["status", "sjc-sim", "--server", fleet.stack.url]) == 0
        assert ("  tier actions:  shop: normal: 50% demoted to background (answered at the "
                "edge: background is shed); background: shed to its floor (503 beyond)\n"
                ) in capsys.readouterr().out
        assert main(["status", "ewr-1", "--server", fleet.stack.url]) == 0
        assert "  tier actions:  none active\n" in capsys.readouterr().out

        fleet.bg.run(set_tier_actions(intent, "ewr", "shop", shed_only))
        assert main(["status", "--server", fleet.stack.url]) == 0
        assert capsys.readouterr().out.splitlines()[-3:] == [
            "tier actions active:",
            "  ewr  shop  background: shed to its floor (503 beyond)",
            "  sjc  shop  normal: 50% demoted to background (answered at the edge: background "
            "is shed); background: shed to its floor (503 beyond)",
        ]
    finally:
        fleet.bg.run(set_tier_actions(intent, "sjc", "shop", None))
        fleet.bg.run(set_tier_actions(intent, "ewr", "shop", None))
        eventually_blocking(lambda: fleet.node("sjc-sim")["status"] == "SYNCED", 5,
                            "sim node synced")
    assert main(["status", "--server", fleet.stack.url]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "tier actions: none active"


def test_tier_actions_unknown_when_the_server_cannot_say(
    fleet: Fleet, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_get = AdminClient.get

    def old_server(self: AdminClient, path: str, params: Any = None) -> Any:
        if path == "/tier-actions":
            raise AdminError(f"{self}{path}: HTTP 404: Not Found", 404)
        return real_get(self, path, params)

    monkeypatch.setattr(AdminClient, "get", old_server)
    assert main(["status", "--server", fleet.stack.url]) == 0
    captured = capsys.readouterr()
    assert "tier actions" not in captured.out
    assert "ballast status: tier actions unknown: " in captured.err and "HTTP 404" in captured.err
    assert main(["status", "sjc-sim", "--server", fleet.stack.url]) == 0
    assert "  tier actions:  unknown (the server did not say)" in capsys.readouterr().out


def test_tier_action_lines() -> None:
    assert status.tier_action_lines({"ewr": {}, "sjc": {}}) == ["tier actions: none active"]
    assert status.tier_action_lines({
        "sjc": {"shop": TierActions().to_dict(), "media": {"description": "as the server says"}},
        "ewr": {},
        "lhr-2": {"shop": TierActions(shed_tier=None).to_dict()},
    }) == [
        "tier actions active:",
        "  lhr-2  shop   normal: 50% demoted to background",
        "  sjc    media  as the server says",
        "  sjc    shop   normal: 50% demoted to background (answered at the edge: background "
        "is shed); background: shed to its floor (503 beyond)",
    ]
