"""One active probe of a gRPC origin: the standard health service's `Check` (grpc.health.v1).

A gRPC service's origins speak HTTP/2 with gRPC framing only, so Ballast asks them what a gRPC
load balancer would: `grpc.health.v1.Health/Check` for the service's `health_check.service`
("" = the whole server) on a fresh plaintext channel (one connection per probe, as the HTTP
probes open one per GET), with the health check's connect and read timeouts together as the
call's deadline. It passes on SERVING; any other answer, status or error fails it. The request
and the answer are tiny protobuf messages written and read here by hand: the health proto is
not among the project's dependencies.
"""

from __future__ import annotations

import grpc

from control_plane.desired.model import HealthCheck

CHECK = "/grpc.health.v1.Health/Check"
SERVING = 1  # HealthCheckResponse.ServingStatus


def check_request(service: str) -> bytes:
    """HealthCheckRequest{service}: field 1, a string (empty: no field at all)."""
    data = service.encode()
    return b"\x0a" + _varint(len(data)) + data if data else b""


def serving_status(reply: bytes) -> int:
    """HealthCheckResponse.status (field 1, varint; absent: 0, UNKNOWN)."""
    index = 0
    while index < len(reply):
        key, index = _read_varint(reply, index)
        if key == 0x08:
            value, _ = _read_varint(reply, index)
            return value
        if key & 7 == 0:
            _, index = _read_varint(reply, index)
        elif key & 7 == 2:
            length, index = _read_varint(reply, index)
            index += length
        else:
            return 0
    return 0


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _read_varint(data: bytes, index: int) -> tuple[int, int]:
    value, shift = 0, 0
    while index < len(data):
        byte = data[index]
        index += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, index
        shift += 7
    return value, index


async def grpc_health_check(address: str, service: str, check: HealthCheck) -> tuple[bool, str]:
    """(passed, why not) of one `Check` of the origin at `address` (host:port)."""
    timeout_s = (check.connect_timeout_ms + check.read_timeout_ms) / 1000
    async with grpc.aio.insecure_channel(
            address, options=(("grpc.use_local_subchannel_pool", 1),)) as channel:
        call = channel.unary_unary(CHECK, request_serializer=None, response_deserializer=None)
        try:
            reply = await call(check_request(service), timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            return False, f"{err.code().name}: {err.details() or ''}"
    status = serving_status(reply)
    return status == SERVING, "" if status == SERVING else f"health status {status}"
