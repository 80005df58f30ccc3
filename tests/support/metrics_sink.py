"""Ballast's metrics_service sink on a real grpc.aio server (a free loopback port), for the tests
whose Envoys stream their stats to it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc

from control_plane.observe.sink import SinkStore, add_metrics_service
from harness.envoy_process import free_port


@asynccontextmanager
async def running_sink() -> AsyncIterator[tuple[SinkStore, int]]:
    """The store the sink fills and the port it listens on; the server stops on exit."""
    store = SinkStore()
    server = grpc.aio.server()
    add_metrics_service(server, store)
    port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
    await server.start()
    try:
        yield store, port
    finally:
        await server.stop(None)
