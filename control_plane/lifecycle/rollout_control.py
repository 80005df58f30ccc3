"""The operator's hands on a running service's rollout: what `GET /rollout` shows and what
`POST /rollout/<action>` does (`admin/api.py`'s `RolloutControl`; `ballast rollout` calls them).

`pause`, `resume`, `abort` and `promote` go to the driver (`rollouts.py`), which publishes them
through the change transaction and records them with who asked. `apply` reads the desired-state
file now and hands it to the reload (`reloading.py`) as the file watcher would; with `now` (the
operator's `--now`) it reaches every PoP at once, recorded as such — and when that version is
the one rolling out already, the rollout is promoted.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

from control_plane.decide.rollout import RolloutError
from control_plane.desired import DesiredStateError, read_desired_bytes
from control_plane.lifecycle.status import pop_versions, rollout_status
from control_plane.reload.reloading import DesiredReload
from control_plane.rollout.rollouts import ACTIONS, Rollouts
from control_plane.xds_port.server import BallastServer


class ServiceRollouts:
    """The parts of a service its rollout's face reads and acts through: the server (what
    each PoP serves, its nodes' ACKs), the rollout driver, the reload and the desired-state
    file."""

    def __init__(self, server: BallastServer, rollouts: Rollouts, reload: DesiredReload,
                 desired_path: Path) -> None:
        self._server = server
        self._rollouts = rollouts
        self._reload = reload
        self._desired_path = desired_path

    def shown(self) -> dict[str, Any]:
        return {"rollout": rollout_status(self._rollouts),
                "pop_versions": pop_versions(self._server),
                "target": self._server.intent.desired.digest}

    async def act(self, action: str, by: str, *, now: bool = False) -> dict[str, Any]:
        if action != "apply" and action not in ACTIONS:
            raise KeyError(action)
        follower = self._reload.follower()
        if follower is not None:  # only the leader starts or changes a rollout
            raise RolloutError(f"{follower}: {'apply' if action == 'apply' else 'act'} on the "
                               "leader (`ballast status --json` names it)")
        if action == "apply":
            try:
                data = await asyncio.to_thread(read_desired_bytes, self._desired_path)
            except DesiredStateError as err:
                raise ValueError(f"cannot read the desired state: {err}") from err
            rollout = self._rollouts.rollout
            if now and rollout is not None and rollout.in_progress \
                    and rollout.to_version == hashlib.sha256(data).hexdigest():
                await self._rollouts.act("promote", f"{by} (apply --now)")
                return {"applied": True, **self.shown()}
            applied = await self._reload.apply(
                data, immediate=now, by=f"{by}{' --now' if now else ''}")
            return {"applied": applied, **self.shown()}
        await self._rollouts.act(action, by)
        return self.shown()
