"""Issue 5: hot reload with last-good state, against real Envoys.

A valid edit applies without a restart and is pushed only to the PoPs it affects; each invalid
edit (syntax error, bad range, unknown reference, truncated file) is rejected with the same
file:line messages as `ballast validate`, and the Envoys' config does not change.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.eventually import eventually
from harness.fleet import Fleet, running_fleet

pytestmark = pytest.mark.envoy


def _sends(fleet: Fleet, node: str) -> dict[str, int]:
    """Responses sent to a node so far, per type (from the node registry)."""
    status = fleet.service.server.nodes.by_node(node)[0].as_dict()
    return {kind: t["sends"] for kind, t in status["types"].items()}


def _dynamic_versions(fleet: Fleet, pop: str) -> str:
    """Everything versioned in the Envoy's config_dump (clusters, listeners, routes, EDS)."""
    dump = fleet.envoys[pop].admin_json("/config_dump?include_eds")
    versions = []
    for config in dump["configs"]:
        for key, entries in config.items():
            if key.startswith("dynamic") and isinstance(entries, list):
                versions.extend(json.dumps(e.get("version_info")) for e in entries)
                versions.extend(
                    json.dumps(e.get("active_state", {}).get("version_info")) for e in entries
                )
    return "|".join(sorted(versions))


async def test_valid_edit_applies_to_affected_pops_only(tmp_path: Path) -> None:
    async with running_fleet(tmp_path, rps=5) as fleet:
        await eventually(lambda: _sends(fleet, "sjc-edge-1").get("RDS", 0) > 0, 10, "sync")
        ewr_before = _sends(fleet, "ewr-edge-1")
        sjc_listener_before = fleet.listener_ports["sjc"]
        path = tmp_path / "desired.yaml"
        offset = sjc_listener_before - fleet.listener_ports["ewr"]
        new_offset = offset + 1
        text = path.read_text()
        path.write_text(
            text.replace(f"port_offset: {offset}}}", f"port_offset: {new_offset}}}")
        )
        await eventually(
            lambda: bool(fleet.records("config_applied")[1:]), 10, "config_applied"
        )
        applied = fleet.records("config_applied")[-1]
        assert applied["detail"]["pushed_pops"] == ["sjc"], applied
        assert "pop sjc: 0 to add, 1 to change, 0 to remove" in applied["rule"], applied["rule"]
        assert any("port_value" in line for line in applied["detail"]["diff"]), applied
        await eventually(
            lambda: f'"port_value": {sjc_listener_before + 1}'
            in json.dumps(fleet.envoys["sjc"].admin_json("/config_dump")),
            10,
            "sjc listener to move",
        )
        assert _sends(fleet, "ewr-edge-1") == ewr_before, "ewr must not be pushed"


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda t: t.replace("listeners:", "listeners: [", 1), "desired.yaml:"),
        (lambda t: t.replace("interval: 1s\n", "interval: 1s\n  max_step: 40\n", 1),
         "failover.max_step"),
        (lambda t: t.replace("origin_group: shop", "origin_group: shoop"), "shoop"),
        (lambda t: t[: len(t) // 2], "desired.yaml"),
    ],
    ids=["syntax", "range", "unknown-reference", "truncated"],
)
async def test_invalid_edits_are_rejected_and_envoys_keep_their_config(
    tmp_path: Path, edit: object, expected: str
) -> None:
    async with running_fleet(tmp_path, rps=5) as fleet:
        await eventually(lambda: _sends(fleet, "ewr-edge-1").get("RDS", 0) > 0, 10, "sync")
        before = {pop: _dynamic_versions(fleet, pop) for pop in ("ewr", "sjc")}
        digest = fleet.service.server.intent.desired.digest
        path = tmp_path / "desired.yaml"
        assert callable(edit)
        path.write_text(edit(path.read_text()))
        await eventually(lambda: bool(fleet.records("config_rejected")), 10, "rejection")
        rejected = fleet.records("config_rejected")[-1]
        problems = "\n".join(rejected["detail"]["problems"])
        assert expected in problems, problems
        assert str(path) in problems, "same file:line messages as `ballast validate`"
        assert fleet.service.server.intent.desired.digest == digest
        assert {pop: _dynamic_versions(fleet, pop) for pop in ("ewr", "sjc")} == before
        assert len(fleet.records("config_applied")) == 1  # only the start-up load
