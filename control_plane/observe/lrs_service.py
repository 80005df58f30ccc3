"""The load-report server: `envoy.service.load_stats.v3.LoadReportingService` on the xDS port.

One stream per client (an Envoy with `cluster_manager.load_stats_config`, a proxyless gRPC
client): its first message names the node, whose `locality.zone` (else `metadata.pop`) is its
PoP; Ballast answers once with what it wants — every cluster (`send_all_clusters`; what the
desired state does not name is dropped, `load_reports.py`), every `interval_ms`, per endpoint
when `endpoint_granularity` — and the client reports on that rhythm until the stream ends.

Bounded like every other input (`docs/security.md`): a stream counts against its client
identity's budget (`budget`: the ADS server's ledger, so an identity's ADS and load-report
streams share one allowance of streams, connections and bytes held; over it the stream is
refused with RESOURCE_EXHAUSTED), its first message must come within `first_request_s`, a node
id over `node_id_chars` or an unknown PoP ends it with INVALID_ARGUMENT, and so does a report
over a bound (`check_report`) or one that does not parse. With mTLS, the node (id, zone) must
be the client certificate's (`verify_peer`), as on the ADS and metrics streams, so a client
reports only for its own PoP. A stream whose node passed is a valid stream of its connection
(`vouch`, the connection sweeper's: `ads/sweeper.py`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import grpc
from envoy.config.core.v3.base_pb2 import Node
from envoy.service.load_stats.v3.lrs_pb2 import LoadStatsRequest, LoadStatsResponse
from google.protobuf.message import DecodeError

from control_plane.observe.load_reports import BadReport, LoadReports, check_report
from control_plane.observe.source import wall_ms
from control_plane.security.peer import NodePeerCheck, Vouch
from control_plane.translate.proto_values import duration_ms

log = logging.getLogger(__name__)

SERVICE = "envoy.service.load_stats.v3.LoadReportingService"
DEFAULT_INTERVAL_MS = 2_000
MIN_INTERVAL_MS = 1_000  # gRPC and Envoy report at most about once a second
NODE_ID_CHARS = 1_024
FIRST_REQUEST_S = 10.0


class Refused(Protocol):
    reason: str

    @property
    def report(self) -> bool: ...


class StreamBudget(Protocol):
    """What a client identity may hold (the ADS server's `Ledger`)."""

    def open(self, identity: str | None, connection: str) -> Refused | None: ...

    def close(self, identity: str | None, connection: str) -> None: ...

    def hold(self, identity: str | None, size: int) -> Refused | None: ...

    def release(self, identity: str | None, size: int) -> None: ...


Identify = Callable[[grpc.aio.ServicerContext[Any, Any]], str | None]


def node_pop(node: Node) -> str:
    """The PoP a node names: its locality zone, else `metadata.pop` ("" when neither)."""
    if node.locality.zone:
        return node.locality.zone
    field = node.metadata.fields.get("pop")
    return field.string_value if field is not None else ""


class LoadReportingServicer:
    def __init__(
        self,
        store: LoadReports,
        known_pop: Callable[[str], bool],
        *,
        clock: Callable[[], int] = wall_ms,
        interval_ms: int = DEFAULT_INTERVAL_MS,
        endpoint_granularity: bool = False,
        verify_peer: NodePeerCheck | None = None,
        budget: StreamBudget | None = None,
        identify: Identify | None = None,
        first_request_s: float = FIRST_REQUEST_S,
        vouch: Vouch | None = None,
    ) -> None:
        self.store = store
        self.known_pop = known_pop
        self.clock = clock
        self.interval_ms = max(MIN_INTERVAL_MS, interval_ms)
        self.endpoint_granularity = endpoint_granularity
        self._verify_peer = verify_peer
        self._budget = budget
        self._identify = identify
        self.first_request_s = first_request_s
        self._vouch = vouch
        self.refused = 0  # streams refused or ended for a bound or a check

    def _answer(self) -> bytes:
        return LoadStatsResponse(
            send_all_clusters=True,
            load_reporting_interval=duration_ms(self.interval_ms),
            report_endpoint_granularity=self.endpoint_granularity,
        ).SerializeToString()

    async def stream_load_stats(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        identity = self._identify(context) if self._identify is not None else None
        connection = context.peer() or ""
        if self._budget is not None:
            refusal = self._budget.open(identity, connection)
            if refusal is not None:
                await self._refuse(context, grpc.StatusCode.RESOURCE_EXHAUSTED, refusal.reason,
                                   refusal.report)
        stream_id: int | None = None
        release: Callable[[], None] | None = None
        try:
            iterator = requests.__aiter__()
            try:
                first = await asyncio.wait_for(iterator.__anext__(), self.first_request_s)
            except TimeoutError:
                await self._refuse(context, grpc.StatusCode.DEADLINE_EXCEEDED,
                                   f"no first load report within {self.first_request_s:g} s")
            except StopAsyncIteration:
                return
            request = await self._parse(context, identity, first)
            pop = await self._check(context, request.node)
            if self._vouch is not None:  # a valid stream of its connection from here on
                release = await self._vouch(context)
            stream_id = self.store.open_stream(request.node.id, pop)
            self.store.ingest(stream_id, request, self.clock())
            yield self._answer()
            async for raw in iterator:
                report = await self._parse(context, identity, raw)
                self.store.ingest(stream_id, report, self.clock())
        finally:
            if release is not None:
                release()
            if stream_id is not None:
                self.store.close_stream(stream_id)
            if self._budget is not None:
                self._budget.close(identity, connection)

    async def _parse(self, context: grpc.aio.ServicerContext[Any, Any], identity: str | None,
                     raw: bytes) -> LoadStatsRequest:
        """One report, parsed and checked within the identity's byte budget."""
        if self._budget is not None:
            refusal = self._budget.hold(identity, len(raw))
            if refusal is not None:
                await self._refuse(context, grpc.StatusCode.RESOURCE_EXHAUSTED, refusal.reason,
                                   refusal.report)
        try:
            request = LoadStatsRequest.FromString(raw)
            check_report(request)
        except DecodeError as err:
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT,
                               f"undecodable LoadStatsRequest: {err}")
        except BadReport as err:
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(err))
        finally:
            if self._budget is not None:
                self._budget.release(identity, len(raw))
        return request

    async def _check(self, context: grpc.aio.ServicerContext[Any, Any], node: Node) -> str:
        """The stream's node checked (id, PoP, certificate): its PoP."""
        if not node.id or len(node.id) > NODE_ID_CHARS:
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT,
                               f"the first load report must name the node (an id of 1 to "
                               f"{NODE_ID_CHARS} characters)")
        pop = node_pop(node)
        if self._verify_peer is not None:
            why = self._verify_peer(context, pop, node.id)
            if why is not None:
                await self._refuse(context, grpc.StatusCode.PERMISSION_DENIED, why)
        if not self.known_pop(pop):
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT,
                               f"node {node.id[:64]!r} names unknown PoP {pop[:64]!r} (set "
                               "node.locality.zone to a PoP of the desired state)")
        return pop

    async def _refuse(self, context: grpc.aio.ServicerContext[Any, Any], code: grpc.StatusCode,
                      why: str, report: bool = True) -> None:
        self.refused += 1
        if report:
            log.warning("load reports from %s refused: %s", context.peer(), why)
        await context.abort(code, why)


def add_load_reporting_service(server: grpc.aio.Server, servicer: LoadReportingServicer) -> None:
    """Host the load-report server on `server` (the ADS server)."""
    handler = grpc.method_handlers_generic_handler(SERVICE, {
        "StreamLoadStats": grpc.stream_stream_rpc_method_handler(
            servicer.stream_load_stats, request_deserializer=None, response_serializer=None),
    })
    server.add_generic_rpc_handlers((handler,))
