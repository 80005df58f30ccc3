"""A `Replication` run on its own, as the service's manager runs it: its loops spawned, and at
the stop, once they ended, its leave (records flushed, its nodes unshared, the term given up)."""

from __future__ import annotations

from control_plane.lifecycle.manager import Manager
from control_plane.replicas.replication import Replication


async def start_replica(replication: Replication) -> Manager:
    manager = Manager()
    manager.hold_async(replication.leave)
    for loop in replication.loops():
        manager.spawn(loop)
    return manager
