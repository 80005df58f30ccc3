"""One replica of the replicas benchmark (`bench/replicas.py`): a real `BallastService` on etcd.

`python -m bench.replica_server DESIRED STATE_DIR ETCD_URL REPLICA_ID` serves the desired
state as `ballast serve --store ETCD_URL --replica-id REPLICA_ID` does (the heap frozen, the
leader's lease 5 s, no admin API, no probes, the sink as metric source: with no Envoy
reporting, the leader's reconcile loop holds every weight), prints `{"port": XDS_PORT}`, then
answers one JSON command per stdin line (`bench/command_pipe.py`; times are
`time.monotonic()`, shared with the other processes):

- `status`: whether it leads, its nodes and how many of them hold every type ACKed;
- `push {"pops": [...] | "*", "step": N}` (the leader only): one origin group's weights change
  in those PoPs through the change transaction, as a reconcile tick's do (saved to etcd, from
  where every other replica adopts it); returns when the swap started (`start`) and the EDS
  version each PoP serves now, for nodes of Envoy 1.40's capabilities (`versions`), or
  `deposed` if the replica no longer leads.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from pathlib import Path
from typing import Any

from bench.command_pipe import commands, reply
from bench.fleet_server import PUSHED_GROUP, shifted
from control_plane.intent.etcd_store import Deposed
from control_plane.intent.pair_changes import PairChange, changes_of
from control_plane.lifecycle.service import BallastService, ServiceConfig
from control_plane.translate.resources import ENDPOINT_TYPE, Capabilities


async def push(service: BallastService, pops: list[str], step: int) -> dict[str, Any]:
    intent = service.server.intent
    desired = intent.desired
    marks: dict[str, float] = {}
    async with intent.change() as change:
        change.tick(changes_of(change.base, [
            PairChange((pop, PUSHED_GROUP), shifted(desired, pop, step),
                       intent.controller((pop, PUSHED_GROUP))) for pop in pops]),
            planned_for=change.base.desired)
        await change.prepare()
        marks["start"] = time.monotonic()
    cache = service.server.cache
    return {"start": marks["start"],
            "versions": {pop: cache.resources(pop, Capabilities()).type_version(ENDPOINT_TYPE)
                         for pop in pops}}


def status(service: BallastService) -> dict[str, Any]:
    replication = service.replication
    nodes = service.server.nodes.statuses()
    return {"leading": replication is not None and replication.term is not None,
            "nodes": len(nodes), "synced": sum(1 for node in nodes if node.status == "SYNCED")}


async def main(desired: str, state_dir: str, etcd_url: str, replica_id: str) -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    service = BallastService(ServiceConfig(
        desired_path=Path(desired), state_dir=Path(state_dir), xds_address="127.0.0.1:0",
        admin_address=None, probes=False, store_url=etcd_url, replica_id=replica_id,
        freeze_heap=True))
    await service.start()
    try:
        async for command in commands(service.server.port):
            if command["cmd"] == "status":
                reply(status(service))
            elif command["cmd"] == "push":
                pops = (list(service.server.intent.intent.pop_names) if command["pops"] == "*"
                        else command["pops"])
                try:
                    reply(await push(service, pops, command["step"]))
                except Deposed as err:  # its lease ran out (a loaded machine): no push
                    reply({"deposed": str(err)})
    finally:
        await service.stop(0.5)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
