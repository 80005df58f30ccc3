"""A real Ballast (grpc.aio xDS on a free port) with its admin API and metrics, for the admin and
CLI tests; plus a background event loop so blocking CLI code can talk to it, and a simulated node
that goes through Envoy's start-up order."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from prometheus_client.parser import text_string_to_metric_families

from control_plane.admin.api import AdminApi
from control_plane.admin.dashboard import Dashboard
from control_plane.admin.decision_feed import DecisionFeed
from control_plane.decisions.read import FileSource
from control_plane.desired import Desired
from control_plane.own_metrics.registry import BallastMetrics
from control_plane.translate.resources import CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE
from control_plane.xds_port.server import BallastServer
from harness.background_loop import BackgroundLoop
from harness.eventually import eventually
from harness.xds_client import Reject, XdsClient, local_channel, make_node


@dataclass
class AdminStack:
    ballast: BallastServer
    api: AdminApi
    metrics: BallastMetrics
    state_dir: Path
    ready: bool = True
    started_at: float = field(default_factory=time.time)

    @property
    def url(self) -> str:
        return self.api.url

    def summary(self) -> dict[str, Any]:
        return {
            "desired": {"source": "<test>", "digest": "test-digest"},
            "started_at": self.started_at,
            "restored_state": False,
            "xds_address": f"127.0.0.1:{self.ballast.port}",
        }

    async def stop(self) -> None:
        await self.api.stop()
        await self.ballast.stop(0.2)


async def start_stack(
    desired: Desired, state_dir: Path, *, feed: DecisionFeed | None = None
) -> AdminStack:
    """Ballast on 127.0.0.1:0 with metrics wired into its ADS servicer; admin API on :0.

    With `feed`, the admin API serves the dashboard, its live stream fed by `feed`."""
    metrics = BallastMetrics()
    ballast = BallastServer(desired, xds_address="127.0.0.1:0", metrics=metrics)
    await ballast.start()
    holder: list[AdminStack] = []
    api = AdminApi(
        nodes=ballast.nodes,
        intent=ballast.intent,
        cache=ballast.cache,
        decisions=FileSource(state_dir),
        metrics=metrics,
        ready=lambda: holder[0].ready,
        status=lambda: holder[0].summary(),
        dashboard=None if feed is None else Dashboard(
            nodes=ballast.nodes, intent=ballast.intent, feed=feed, state_dir=state_dir,
            clock=lambda: datetime.now(UTC),
        ),
    )
    stack = AdminStack(ballast, api, metrics, state_dir)
    holder.append(stack)
    await api.start("127.0.0.1", 0)
    return stack


@contextmanager
def serving(desired: Desired, state_dir: Path) -> Iterator[tuple[BackgroundLoop, AdminStack]]:
    """`start_stack` on a background loop, for blocking test code (the CLI); stopped on exit."""
    bg = BackgroundLoop()
    stack = bg.run(start_stack(desired, state_dir))
    try:
        yield bg, stack
    finally:
        bg.run(stack.stop())
        bg.close()


async def connect_node(
    stack: AdminStack,
    node_id: str,
    pop: str,
    *,
    delta: bool = False,
    reject: Reject | None = None,
) -> tuple[XdsClient, grpc.aio.Channel]:
    """A simulated node: CDS, EDS for every cluster, LDS, RDS; returns once it has all four."""
    channel = local_channel(f"127.0.0.1:{stack.ballast.port}")
    client = await XdsClient(channel, make_node(node_id, pop), delta=delta, reject=reject).start()
    await client.subscribe(CLUSTER_TYPE)
    await client.wait_for(lambda c: bool(c.responses(CLUSTER_TYPE)))
    clusters = sorted(name for r in client.responses(CLUSTER_TYPE) for name in r.names)
    await client.subscribe(ENDPOINT_TYPE, clusters)
    await client.subscribe(LISTENER_TYPE)
    await client.wait_for(lambda c: bool(c.responses(LISTENER_TYPE)))
    await client.subscribe(ROUTE_TYPE, ["edge"])
    await client.wait_for(
        lambda c: bool(c.responses(ROUTE_TYPE)) and bool(c.responses(ENDPOINT_TYPE))
    )
    await _server_has_answers(stack, node_id)
    return client, channel


async def _server_has_answers(stack: AdminStack, node_id: str, timeout: float = 5.0) -> None:
    """The client has every response before the server has read its last ACK/NACK: wait for
    the server's registry to have an answer to every type it sent (no type STALE)."""

    def answered() -> bool:
        streams = stack.ballast.nodes.by_node(node_id)
        return bool(streams) and all(s.status != "STALE" for s in streams)

    await eventually(answered, timeout, f"the server sees {node_id}'s answers", interval=0.02)


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(exposition: str) -> Samples:
    """Prometheus text -> {(sample name, labels): value}."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }


def sample(parsed: Samples, name: str, **labels: str) -> float | None:
    return parsed.get((name, frozenset(labels.items())))
