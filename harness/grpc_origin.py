"""A plain gRPC server standing for one origin of a gRPC service: counts the calls it answers.

No xDS on the server side: it is what a proxyless client's endpoints point at. One unary method,
`/ballast.demo.Echo/Call` (raw bytes in and out), answers the origin's name; the standard health
service (`grpc.health.v1.Health/Check`) answers SERVING unless told otherwise, which is what
Ballast's active probes of a gRPC service ask. Calls are counted per PoP (the `x-ballast-pop`
metadata the test client sends), and a fault can fail a deterministic share of them, limited to
some PoPs: a regional problem between one PoP and this origin (as `demo_origin.Fault`).
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

SERVICE = "ballast.demo.Echo"
METHOD = f"/{SERVICE}/Call"
HEALTH_SERVICE = "grpc.health.v1.Health"
SERVING = b"\x08\x01"  # HealthCheckResponse{status: SERVING}
NOT_SERVING = b"\x08\x02"
POP_METADATA = "x-ballast-pop"


@dataclass(frozen=True)
class GrpcFault:
    error_rate: float = 0.0  # share of calls failed with `code`
    code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE
    pops: tuple[str, ...] = ()  # only calls from these PoPs; () = all
    fail_health: bool = False  # the health service answers NOT_SERVING
    latency_ms: int = 0


def _raw(handler: Any) -> grpc.RpcMethodHandler:
    return grpc.unary_unary_rpc_method_handler(handler, request_deserializer=None,
                                               response_serializer=None)


class GrpcOrigin:
    def __init__(self, name: str, port: int, host: str = "127.0.0.1",
                 credentials: grpc.ServerCredentials | None = None) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.credentials = credentials
        self.fault = GrpcFault()
        self.calls: Counter[str] = Counter()  # answered (ok or failed), per PoP
        self.errors: Counter[str] = Counter()  # failed by the fault, per PoP
        self.health_checks = 0
        self.in_flight = 0
        self._faulted = 0
        self._server: grpc.aio.Server | None = None

    def set_fault(self, fault: GrpcFault) -> None:
        self.fault = fault
        self._faulted = 0

    def total(self, pops: Sequence[str] = ()) -> int:
        return sum(n for pop, n in self.calls.items() if not pops or pop in pops)

    def _should_fail(self, pop: str) -> bool:
        fault = self.fault
        if fault.pops and pop not in fault.pops:
            return False
        before = math.floor(self._faulted * fault.error_rate)
        self._faulted += 1
        return math.floor(self._faulted * fault.error_rate) > before

    async def _call(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        pop = dict(context.invocation_metadata() or ()).get(POP_METADATA, "")
        self.in_flight += 1
        try:
            if self.fault.latency_ms and (not self.fault.pops or pop in self.fault.pops):
                await asyncio.sleep(self.fault.latency_ms / 1000)
            self.calls[pop] += 1
            if self._should_fail(pop):
                self.errors[pop] += 1
                await context.abort(self.fault.code, f"injected by {self.name}")
            return self.name.encode()
        finally:
            self.in_flight -= 1

    async def _check(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        self.health_checks += 1
        return NOT_SERVING if self.fault.fail_health else SERVING

    async def start(self) -> GrpcOrigin:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((
            grpc.method_handlers_generic_handler(SERVICE, {"Call": _raw(self._call)}),
            grpc.method_handlers_generic_handler(HEALTH_SERVICE, {"Check": _raw(self._check)}),
        ))
        address = f"{self.host}:{self.port}"
        bound = (server.add_insecure_port(address) if self.credentials is None
                 else server.add_secure_port(address, self.credentials))
        if bound == 0:
            raise OSError(f"gRPC origin {self.name} cannot listen on {address}")
        await server.start()
        self._server = server
        return self

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
            self._server = None
