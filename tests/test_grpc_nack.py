"""A gRPC client's NACK, shown by `ballast status` and not answered with a loop.

The service is TLS (`tls: true`): its cluster names the certificate provider instance `ballast`
that `ballast bootstrap --grpc --tls-*` defines. A client whose bootstrap has none (made without
the TLS files) cannot use it: grpcio refuses the CDS response with its own message. Ballast shows
the client NACKED with that message (`ballast status`, the dashboard's PoP card), records the
NACK once, and sends the cluster no more until it changes (as for Envoy: never
go-control-plane's re-send loop).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from control_plane.cli.main import main
from harness.eventually import eventually
from harness.grpc_fleet import grpc_fleet

PROVIDER_NACK = "unrecognized certificate provider instance name: ballast"


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def _tls(text: str) -> str:
    return text.replace("    port: ", "    tls: true\n    port: ", 1)


def _node(fleet_nodes: list[dict[str, object]], node_id: str) -> dict[str, object]:
    return next(n for n in fleet_nodes if n["node_id"] == node_id)


async def test_a_grpc_clients_nack_shows_in_status_and_does_not_loop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with grpc_fleet(tmp_path, rate=0, pops=("ewr",), probes=False, edit=_tls) as fleet:
        def cds() -> dict[str, object]:
            nodes = [s.as_dict() for s in fleet.service.server.nodes.statuses()]
            types = _node(nodes, "ewr-grpc-1")["types"]
            assert isinstance(types, dict)
            return types.get("CDS") or {}

        await fleet.ask("ewr", "calls 1")  # the channel connects: it asks for its resources
        await eventually(lambda: cds().get("status") == "NACKED", 15, "the client NACKs CDS")
        nacked_at = time.monotonic()
        answer = await fleet.ask("ewr", "calls 3")
        assert answer["errors"] == {"UNAVAILABLE": 3}, answer

        code = await asyncio.to_thread(main, ["status", "--server", fleet.admin_url])
        out = capsys.readouterr().out
        assert code == 0, out
        row = next(line for line in out.splitlines() if line.startswith("ewr-grpc-1 "))
        assert row.split()[2:4] == ["gRPC", "Python"], row
        assert "grpc+" in row and "NACK" in row and row.rstrip().endswith("NACKED"), row
        assert "ewr-grpc-1 NACKED:" in out and PROVIDER_NACK in out, out
        code = await asyncio.to_thread(main, ["status", "ewr-grpc-1", "--server",
                                              fleet.admin_url])
        detail = capsys.readouterr().out
        assert "a proxyless gRPC client" in detail and PROVIDER_NACK in detail, detail

        overview = await asyncio.to_thread(_get, f"{fleet.admin_url}/dashboard/api/overview")
        (card,) = [pop for pop in overview["pops"] if pop["name"] == "ewr"]
        (shown,) = card["nodes"]
        assert shown["envoy_version"].startswith("gRPC Python") and shown["status"] == "NACKED"
        assert shown["last_nack"]["type"] == "CDS"
        assert PROVIDER_NACK in shown["last_nack"]["message"]
        page = await asyncio.to_thread(_get, f"{fleet.admin_url}/dashboard/api/pops/ewr")
        assert "ewr-grpc-1" in json.dumps(page)

        await asyncio.sleep(max(0.0, 3.0 - (time.monotonic() - nacked_at)))  # nothing happens
        assert cds()["sends"] == 1, cds()
        assert cds()["status"] == "NACKED"
        nacks = fleet.records("nack", pop="ewr")
        assert len(nacks) == 1, nacks
        assert PROVIDER_NACK in nacks[0]["rule"] and nacks[0]["detail"]["node"] == "ewr-grpc-1"
