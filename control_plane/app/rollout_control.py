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
from typing import TYPE_CHECKING, Any

from control_plane.app.rollouts import ACTIONS
from control_plane.app.status import pop_versions, rollout_status
from control_plane.decide.rollout import RolloutError
from control_plane.desired import DesiredStateError, read_desired_bytes

if TYPE_CHECKING:
    from control_plane.app.service import BallastService


class ServiceRollouts:
    def __init__(self, service: BallastService) -> None:
        self._service = service

    def shown(self) -> dict[str, Any]:
        service = self._service
        return {"rollout": rollout_status(service), "pop_versions": pop_versions(service),
                "target": service.server.intent.desired.digest}

    async def act(self, action: str, by: str, *, now: bool = False) -> dict[str, Any]:
        service = self._service
        if action != "apply" and action not in ACTIONS:
            raise KeyError(action)
        follower = service.reload.follower()
        if follower is not None:  # only the leader starts or changes a rollout
            raise RolloutError(f"{follower}: {'apply' if action == 'apply' else 'act'} on the "
                               "leader (`ballast status --json` names it)")
        if action == "apply":
            try:
                data = await asyncio.to_thread(read_desired_bytes, service.config.desired_path)
            except DesiredStateError as err:
                raise ValueError(f"cannot read the desired state: {err}") from err
            rollout = service.rollouts.rollout
            if now and rollout is not None and rollout.in_progress \
                    and rollout.to_version == hashlib.sha256(data).hexdigest():
                await service.rollouts.act("promote", f"{by} (apply --now)")
                return {"applied": True, **self.shown()}
            applied = await service.reload.apply(
                data, immediate=now, by=f"{by}{' --now' if now else ''}")
            return {"applied": applied, **self.shown()}
        await service.rollouts.act(action, by)
        return self.shown()
