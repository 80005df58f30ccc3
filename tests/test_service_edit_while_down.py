"""Issue 37: a desired-state file edited while Ballast was stopped is a new change after the
restart — rolled out per its `rollout:`, superseding a stored rollout, recorded as made while
Ballast was down — and a file reverted while it was stopped puts every PoP back on it.

Ballast in-process, stopped and started again on the same state directory and xDS port; real
Envoys in three PoPs (ewr the canary, then sjc, then lax), demo origins, steady traffic. What
each Envoy holds is read from its own config_dump (a version's route marker), what Ballast
decided from its decision log.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from control_plane.lifecycle.service import EDITED_WHILE_DOWN, BallastService, ServiceConfig
from harness.eventually import eventually
from harness.rollout_fleet import POPS, RolloutFleet, origins_and_envoys

pytestmark = pytest.mark.envoy

ROUTES = "/config_dump?resource=dynamic_route_configs"


def _service(fleet: RolloutFleet) -> BallastService:
    return BallastService(ServiceConfig(
        desired_path=fleet.path, state_dir=fleet.state_dir,
        xds_address=f"127.0.0.1:{fleet.ports.xds}", admin_address=None, probes=False,
        reload_poll_s=0.1, rollout_poll_ms=200))


def _markers(fleet: RolloutFleet, *markers: str) -> dict[str, tuple[str, ...]]:
    """PoP -> the markers (route names) its Envoy holds, of those given."""
    held = {pop: envoy.admin(ROUTES) for pop, envoy in fleet.envoys.items()}
    return {pop: tuple(m for m in markers if f"/{m}" in text) for pop, text in held.items()}


def _versions(service: BallastService) -> dict[str, str]:
    return service.server.intent.intent.versions()


def _since(fleet: RolloutFleet, seq: int, *kinds: str) -> list[dict[str, Any]]:
    return [r for r in fleet.records(*kinds) if r["seq"] > seq]


async def _synced(fleet: RolloutFleet, service: BallastService) -> None:
    """Every Envoy ACKed what its PoP serves."""
    await eventually(lambda: all(service.server.acks.pop(pop).applied == 1 for pop in POPS), 20,
                     "every Envoy synced")


async def _started(fleet: RolloutFleet) -> BallastService:
    """Ballast started, every Envoy ready and synced to it, traffic through every PoP."""
    service = _service(fleet)
    await service.start()
    try:
        for envoy in fleet.envoys.values():
            await asyncio.to_thread(envoy.wait_ready, 20)
        fleet.start_traffic()
        await _synced(fleet, service)
    except BaseException:
        await service.stop(0.5)
        raise
    return service


async def _restart(fleet: RolloutFleet, service: BallastService, **version: Any
                   ) -> tuple[BallastService, int]:
    """`service` stopped, the file written (`version`) while it is down, a new one started;
    the new one and the last record's seq before the start."""
    await service.stop(0.5)
    fleet.write(**version)
    seq = max((r["seq"] for r in fleet.records()), default=0)
    restarted = _service(fleet)
    await restarted.start()
    return restarted, seq


async def test_stop_edit_start_rolls_the_edit_out(tmp_path: Path) -> None:
    """Twice: with no rollout stored (the version served before the stop is the baseline the
    edit rolls out from), then with the edit's rollout baking (the next edit supersedes it)."""
    async with origins_and_envoys(tmp_path) as fleet:
        service = await _started(fleet)
        try:
            v1 = service.server.intent.desired.digest
            assert service.rollouts.rollout is None

            # 1. stop, edit (v2, a long bake), start: v2 rolls out from v1, the canary first
            service, seq = await _restart(fleet, service, marker="v2", bake="60s")
            rollout = service.rollouts.rollout
            assert rollout is not None and rollout.phase == "baking" and rollout.wave == 0
            assert rollout.from_version == v1, rollout
            v2 = rollout.to_version
            assert _versions(service) == {"ewr": v2, "sjc": v1, "lax": v1}
            applied = _since(fleet, seq, "config_applied")
            assert [r["detail"]["by"] for r in applied] == [EDITED_WHILE_DOWN], applied
            assert EDITED_WHILE_DOWN in applied[0]["rule"]
            started = _since(fleet, seq, "rollout_started")
            assert len(started) == 1 and EDITED_WHILE_DOWN in started[0]["rule"], started
            kinds = [r["kind"] for r in _since(fleet, seq)]
            assert kinds.index("config_applied") < kinds.index("startup"), kinds
            await eventually(lambda: _markers(fleet, "v2") == {"ewr": ("v2",), "sjc": (),
                                                               "lax": ()},
                             20, "the canary on v2, the others on v1", in_thread=True)

            # 2. stop with v2 baking in the canary, edit (v3), start: v3 supersedes v2
            service, seq = await _restart(fleet, service, marker="v3", bake="60s")
            rollout = service.rollouts.rollout
            assert rollout is not None and rollout.phase == "baking" and rollout.wave == 0
            v3 = rollout.to_version
            assert v3 not in (v1, v2) and rollout.from_version == v1, rollout
            assert _versions(service) == {"ewr": v3, "sjc": v1, "lax": v1}
            superseded = _since(fleet, seq, "rollout_superseded")
            assert len(superseded) == 1 and superseded[0]["detail"]["superseded_by"] == v3
            assert [r["detail"]["by"] for r in _since(fleet, seq, "config_applied")] == [
                EDITED_WHILE_DOWN]
            await eventually(lambda: _markers(fleet, "v2", "v3") == {
                "ewr": ("v3",), "sjc": (), "lax": ()}, 20, "the canary on v3 (not v2)",
                in_thread=True)
            # the rollout goes on from here as any other (its gates: tests/test_rollout_*.py;
            # just after a restart they may wait for evidence: once in 38 runs here, two Envoys'
            # stats streams delivered no request counts for 33 s): promoted, every PoP on v3
            await service.rollouts.act("promote", "test")
            await eventually(lambda: _markers(fleet, "v2", "v3") == {pop: ("v3",) for pop in POPS},
                             20, "every PoP on v3", in_thread=True)
            assert [r["detail"]["pops"] for r in _since(fleet, seq, "wave_started")] == [["ewr"]]
        finally:
            await service.stop(0.5)
    assert fleet.statuses[0] == 0, fleet.statuses


async def test_a_file_reverted_while_down_puts_every_pop_back(tmp_path: Path) -> None:
    """v2 bakes in the canary; Ballast stops; the file goes back to v1 (the last version that
    passed); after the start every PoP serves v1 — the canary leaves v2 — and no wave goes on
    toward the others with bytes no file holds."""
    async with origins_and_envoys(tmp_path) as fleet:
        service = await _started(fleet)
        try:
            v1 = service.server.intent.desired.digest
            fleet.write(marker="v2", bake="60s")
            await eventually(lambda: _markers(fleet, "v2")["ewr"], 20, "the canary on v2",
                             in_thread=True)
            v2 = _versions(service)["ewr"]
            assert v2 != v1

            service, seq = await _restart(fleet, service)  # the file as it was: v1
            rollout = service.rollouts.rollout
            assert rollout is not None and rollout.phase == "passed", rollout
            assert rollout.to_version == v1 and rollout.from_version == v1, rollout
            assert _versions(service) == {pop: v1 for pop in POPS}
            superseded = _since(fleet, seq, "rollout_superseded")
            assert len(superseded) == 1 and superseded[0]["config_version"] == v2[:16]
            assert "ewr leave" in superseded[0]["rule"], superseded
            passed = _since(fleet, seq, "rollout_passed")
            assert len(passed) == 1 and "the last version that passed" in passed[0]["rule"]
            await eventually(lambda: _markers(fleet, "v2") == {pop: () for pop in POPS}, 20,
                             "the canary back on v1", in_thread=True)
            await _synced(fleet, service)
            await service.rollouts.look()  # a look after the restart moves nothing
            assert _versions(service) == {pop: v1 for pop in POPS}
            assert not _since(fleet, seq, "wave_started", "config_rejected")
        finally:
            await service.stop(0.5)
    assert fleet.statuses[0] == 0, fleet.statuses
