"""The thin grpc.aio adapter: AggregatedDiscoveryService streams around the sans-I/O core.

Each stream: read the first request, admit its node (`admission.py`: its id, its PoP, the
peer's claim to them; then its capabilities, `node.extensions`), then serve two inputs — the
node's requests (read and handled one at a time by the stream's task) and wake-ups from the
push hub (each push a short task of its own) — feeding them to `SotwStream`/`DeltaStream` and
writing what comes out. Unknown PoPs and malformed requests end the stream with
INVALID_ARGUMENT and a message saying why; nothing is sent to such a node. What happens on a
stream is told to the embedder through `Callbacks` (`callbacks.py`).

Bounds (`limits.py`): requests over a size bound end the stream; a stream holds at most one
request read but not handled — a client that does not read its responses blocks our writes,
so we stop reading it and gRPC flow control pushes back on its sends; NACK messages are
truncated before anyone sees them, and a repeated NACK of the same (type, version) is logged
once and counted (`NodeEntry.nacked`); what is kept per stream (fallback bookkeeping, NACK
counts) lives in its `NodeEntry` and goes with it.

Budgets and deadlines (`budget.py`, `limits.py`): each client identity (`identify`) holds at
most so many streams, connections and bytes in requests being handled and responses being
written; over one, the newest stream is refused with RESOURCE_EXHAUSTED. A stream must send its
first request within `first_request_s`; a write that makes no progress for `write_stall_s` (a
client granting no flow-control window) ends the stream. Any ending interrupts a blocked write,
and frees the stream's initial-sync slot at once. A stream that passed its node checks is
vouched for (`vouch`): its connection is in use until it ends, and the connection sweeper
(`sweeper.py`) closes the connections no such stream uses.

With `verify_peer` (mTLS on), the client certificate's identity must name the PoP and node id
the first request claims, else the stream ends with PERMISSION_DENIED (`on_stream_refused`).
One stream's life: `_admit` (the node checks), `_open` (registry, slot, superseding),
`_read_requests` (the read loop, each request held in its identity's budget), `_close`.
Private keys: SDS Secrets go only where `key_gate` lets them (an mTLS port has no gate; a
plaintext one refuses every stream unless the operator allowed loopback peers): an SDS request
on any other stream is never answered and reported once (`on_secrets_refused`).
One live stream per node id: a newer stream of the same id closes the older one (ABORTED,
`on_stream_superseded`), so the registry never holds one id twice; a proxyless gRPC client has
one per channel target (`live_key`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
import traceback
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Literal

import grpc
from envoy.config.core.v3.base_pb2 import Node
from envoy.service.discovery.v3 import ads_pb2_grpc
from envoy.service.discovery.v3.discovery_pb2 import (
    DeltaDiscoveryRequest,
    DeltaDiscoveryResponse,
    DiscoveryRequest,
    DiscoveryResponse,
)

from control_plane.ads.admission import (
    CLAIMED_CHARS,
    KeyGate,
    NodeRejected,
    VerifyPeer,
    canonical_capabilities,
    check_node_id,
    envoy_version,
    live_key,
    pop_of,
)
from control_plane.ads.budget import Identify, Ledger, Refusal, peer_identity
from control_plane.ads.callbacks import Callbacks
from control_plane.ads.delta import DeltaStream
from control_plane.ads.encoding import ResponseEncoder, encode_delta, encode_sotw, pass_bytes
from control_plane.ads.fanout import PushHub
from control_plane.ads.limits import DEFAULT_LIMITS, AdsLimits, clip, connection_cap
from control_plane.ads.nodes import NodeEntry, NodeRegistry
from control_plane.ads.protocol import Ack, ProtocolError, StreamOutput, short_name
from control_plane.ads.snapshots import SnapshotCache
from control_plane.ads.sotw import SotwStream
from control_plane.security.peer import Vouch
from control_plane.translate.capabilities import NodeCapabilities, read_node_capabilities
from control_plane.translate.resources import (
    CLUSTER_TYPE,
    SECRET_TYPE,
    STARTUP_TYPES,
    PopResources,
)

__all__ = ["AdsServicer", "encode_delta", "encode_sotw", "server_options"]

log = logging.getLogger(__name__)

ADS_SERVICE = "envoy.service.discovery.v3.AggregatedDiscoveryService"


# the task grpc.aio runs each call in (it awaits the call's handler task, then releases the call)
_CALL_TASK = "_schedule_rpc_coro"
CALLS_END_S = 1.0  # how long a stopped server's calls may take to end


async def calls_ended(timeout: float = CALLS_END_S) -> None:
    """Until the calls of the stopped gRPC servers of this loop have ended (at most `timeout`).
    `grpc.aio.Server.stop` returns while the tasks of calls it cancelled still finish (a unary
    call that came as it stopped, e.g. an Envoy's OTLP metrics export); a process that then
    ends its loop cancels them, and grpc logs each as "Exception not handled by
    _handle_exceptions" with a CancelledError (the soak counted these as errors). Measured: 3 of
    6 stops with exports in flight logged it; 0 of 6 once the calls could end."""
    calls = [task for task in asyncio.all_tasks()
             if getattr(task.get_coro(), "__qualname__", "") == _CALL_TASK]
    if calls:
        await asyncio.wait(calls, timeout=timeout)


def server_options(limits: AdsLimits = DEFAULT_LIMITS) -> tuple[tuple[str, int], ...]:
    """grpc.aio server options: keepalive tolerance, the per-connection bounds and the cap on
    connections (`connection_cap`: gRPC closes a connection over it as soon as it accepts it)."""
    return (
        ("grpc.max_allowed_incoming_connections", connection_cap(limits)),
        # the port is this process's alone: no other process (of the same user) can bind it
        # and take a share of its connections, and the sweeper sees every connection of it
        ("grpc.so_reuseport", 0),
        # Envoy's xDS cluster may ping every few seconds (the edge bootstrap: HTTP/2
        # keepalive 30 s); without these a gRPC server answers pings with GOAWAY
        # too_many_pings (docs/architecture.md, "gRPC and the fan-out floor").
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 1000),
        ("grpc.http2.max_ping_strikes", 0),
        ("grpc.max_receive_message_length", limits.request_bytes),
        ("grpc.max_concurrent_streams", limits.streams_per_connection),
        ("grpc.server_handshake_timeout_ms", limits.handshake_ms),
        ("grpc.max_connection_idle_ms", limits.connection_idle_ms),
    )


def _nothing() -> None:
    pass


class _Signal:
    """How a stream ends: gRPC status and details, or the exception a push raised (raised
    again in the stream's own task, where gRPC handles it)."""

    __slots__ = ("details", "error", "status")

    def __init__(
        self, status: grpc.StatusCode, details: str = "", error: Exception | None = None
    ) -> None:
        self.status, self.details, self.error = status, details, error


_CLOSE = _Signal(grpc.StatusCode.UNAVAILABLE, "ballast is shutting down")
_EOF = _Signal(grpc.StatusCode.OK)  # the client ended the stream (or it broke)
_SUPERSEDED = _Signal(
    grpc.StatusCode.ABORTED, "a newer stream with the same node id replaced this one"
)


class _Interrupted(Exception):
    """A write was interrupted because the stream is ending (its `ending` says why)."""


async def _end_with_status(context: grpc.aio.ServicerContext[Any, Any], signal: _Signal) -> None:
    """End the call with `signal`'s status. After an interrupted write the status waits behind
    the unsent message (HTTP/2 trailers follow the data), so the call, still counted in its
    identity's budget, lasts until the client reads or closes its connection; when it closes,
    the status cannot be sent (ExecuteBatchError, an InternalError), which is the end of the
    call, not a failure: it ends quietly, as a call the client cancelled does."""
    try:
        await context.abort(signal.status, signal.details)
    except grpc.aio.InternalError:
        raise asyncio.CancelledError from None


async def _without_cycles(serving: Coroutine[Any, Any, None]) -> None:
    """Serve a call; what raises out of it leaves no reference cycle behind. A call ended with a
    status (`context.abort`) would: gRPC keeps the AbortError on the call's state, the error's
    traceback holds the frames it passed through, and their locals hold the call's context,
    which holds that state. Only the cycle collector frees such a cycle, and never once the
    heap was frozen while the call was open (`lifecycle/heap.py`: a reload's end freezes every open
    stream): measured, 26 objects a stream, a stream's requests with them. So the frames are
    cleared (their locals dropped) before the error goes on to gRPC; the handlers that call
    this keep nothing of the call either."""
    try:
        await serving
    except BaseException as err:
        _clear_frames(err)  # in a frame of its own: this one keeps no error in its locals
        raise


def _clear_frames(err: BaseException) -> None:
    """Drop the locals of every frame `err`'s traceback holds, and those of the errors it was
    raised in the handling of (a frame still running keeps its own)."""
    error: BaseException | None = err
    for _ in range(16):
        if error is None:
            return
        traceback.clear_frames(error.__traceback__)
        error = error.__cause__ or error.__context__


def _initial_sync_done(entry: NodeEntry) -> bool:
    """Every type of a node's start-up (CDS, EDS, LDS, RDS) answered and ACKed or NACKed."""
    return all(
        (record := entry.types.get(type_url)) is not None and record.outcome != "STALE"
        for type_url in STARTUP_TYPES
    )


class _Stream:
    """One open stream, as the servicer serves it: what it answers (the protocol core and the
    node's registry entry), whose turn it is to write, and its initial-sync slot.

    The stream's own task reads a request and handles it (computes the output, writes its
    responses) before it reads the next, so a stream whose writes are blocked (a client not
    reading) stops being read. A push runs in a short task of its own, started when the PoP
    changes. The two take turns (FIFO) to compute and write outputs, so responses go out in the
    order their nonces were given. An ending from outside (shutdown, a newer stream of the
    same id, the PoP gone) interrupts the stream's task if it is waiting for a request.
    Nothing else lives per stream: a reader task, a queue, events, a lock and closures per
    stream held ~6 KB (a sixth of a connected node's memory) and cost a task switch per
    request."""

    __slots__ = (
        "_waiting",
        "admission_cap",
        "admitted",
        "advertised",
        "busy",
        "context",
        "core",
        "ending",
        "entry",
        "identity",
        "keys_refused",
        "live_key",
        "push",
        "push_due",
        "reading",
        "servicer",
        "task",
        "writer",
    )

    def __init__(
        self,
        servicer: AdsServicer,
        context: grpc.aio.ServicerContext[Any, Any],
        core: SotwStream | DeltaStream,
        entry: NodeEntry,
        advertised: NodeCapabilities,
        identity: str | None,
    ) -> None:
        self.servicer, self.context, self.core = servicer, context, core
        self.entry, self.advertised, self.identity = entry, advertised, identity
        task = asyncio.current_task()
        assert task is not None, "a stream is served by a task"
        self.task: asyncio.Task[Any] = task
        self._waiting: list[asyncio.Future[None]] | None = None  # tasks waiting for a turn
        self.busy = False  # a task is computing or writing a output
        self.reading = False  # the stream's task waits for the next request
        self.push_due = False  # a push task was started and has not begun its output yet
        self.push: asyncio.Task[None] | None = None  # the latest push task
        self.ending: _Signal | None = None  # how the stream ends, once known
        self.admitted = False  # holds an initial-sync slot
        self.admission_cap: asyncio.TimerHandle | None = None
        self.writer: asyncio.Task[Any] | None = None  # the task blocked in a write, if any
        # why private keys may not go to this stream (None: they may); its SDS requests are
        # then never answered, and the first one is reported
        self.keys_refused: str | None = None
        self.live_key = entry.node_id  # what a newer stream must share to replace it

    def wake(self) -> None:
        """The stream's PoP changed: one push is due, however many wake-ups came."""
        if not self.push_due and self.ending is None:
            self.push_due = True
            self.push = self.servicer.start_push(self)

    def end(self, signal: _Signal) -> None:
        """The stream ends (the first reason given wins): a stream waiting for a request stops
        waiting, a write in progress (a client not reading) is interrupted, and the stream's
        initial-sync slot goes to the next stream at once."""
        if self.ending is None:
            self.ending = signal
            self.servicer.end_admission(self)
            if self.reading:
                self.task.cancel()
            if self.writer is not None:
                self.writer.cancel()

    def stalled(self) -> None:
        self.end(_Signal(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"a response write made no progress for {self.servicer.limits.write_stall_s:g} s "
            "(the client does not read)"))

    async def turn(self) -> None:
        """Wait until no other output is being computed or written (tasks take turns, FIFO)."""
        if not self.busy:
            self.busy = True
            return
        waiter = asyncio.get_running_loop().create_future()
        if self._waiting is None:
            self._waiting = []
        self._waiting.append(waiter)
        try:
            await waiter  # `done()` hands the turn over: `busy` stays set
        except asyncio.CancelledError:
            if waiter in self._waiting:
                self._waiting.remove(waiter)
            elif not waiter.cancelled():
                self.done()  # handed the turn, cancelled before taking it: pass it on
            raise

    def done(self) -> None:
        """The output is written: the next waiting task (if any) takes its turn."""
        waiting = self._waiting
        while waiting:
            waiter = waiting.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                return
        self._waiting = None
        self.busy = False


class AdsServicer(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    def __init__(
        self,
        cache: SnapshotCache,
        hub: PushHub,
        nodes: NodeRegistry,
        *,
        callbacks: Callbacks | None = None,
        limits: AdsLimits = DEFAULT_LIMITS,
        verify_peer: VerifyPeer | None = None,
        identify: Identify | None = None,
        key_gate: KeyGate | None = None,
        vouch: Vouch | None = None,
    ) -> None:
        """`identify`: a stream's client identity for the budgets (`budget.py`); by default
        the peer's IP address (loopback peers: the process totals only). `vouch`: told of each
        stream whose first request passed the node checks (a valid stream: its connection is
        in use until the release it returns is called, as the stream ends; `sweeper.py`)."""
        self.cache = cache
        self._vouch = vouch
        self._identify = identify if identify is not None else peer_identity
        self.ledger = Ledger(limits)
        self._verify_peer = verify_peer
        self._key_gate = key_gate
        self.hub = hub
        self.nodes = nodes
        self.callbacks = callbacks if callbacks is not None else Callbacks()
        self.limits = limits
        self._streams: set[_Stream] = set()
        self._pushing: set[asyncio.Task[None]] = set()  # push tasks not done yet
        # node id -> its one live stream (registry entry, servicer side)
        self._live: dict[str, tuple[NodeEntry, _Stream]] = {}
        self._closing = False
        self._admission = asyncio.Semaphore(limits.initial_syncs)
        self.syncing = 0  # streams holding an initial-sync slot now (tests, benchmarks)
        self.sends = 0  # responses written, all streams (tests, metrics)
        # responses go out as wire bytes: the part every stream shares serialized once
        self.encoder = ResponseEncoder()

    def add_to(self, server: grpc.aio.Server) -> None:
        """Register on a caller-owned server (which may carry other services too).

        Like `ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server`, except that the
        response serializer passes bytes through: `_apply` writes pre-encoded responses."""
        handlers = {
            "StreamAggregatedResources": grpc.stream_stream_rpc_method_handler(
                self.StreamAggregatedResources,
                request_deserializer=DiscoveryRequest.FromString,
                response_serializer=pass_bytes,
            ),
            "DeltaAggregatedResources": grpc.stream_stream_rpc_method_handler(
                self.DeltaAggregatedResources,
                request_deserializer=DeltaDiscoveryRequest.FromString,
                response_serializer=pass_bytes,
            ),
        }
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(ADS_SERVICE, handlers),)
        )
        server.add_registered_method_handlers(ADS_SERVICE, handlers)

    def close_streams(self) -> None:
        """Shutdown: every open stream ends with UNAVAILABLE; new streams are refused."""
        self._closing = True
        for open_stream in self._streams:
            open_stream.end(_CLOSE)

    async def StreamAggregatedResources(
        self,
        request_iterator: AsyncIterator[DiscoveryRequest],
        context: grpc.aio.ServicerContext[DiscoveryRequest, DiscoveryResponse],
    ) -> None:
        serving = self._serve(context, "sotw", SotwStream(self.limits))
        del request_iterator, context  # see `_without_cycles`
        await _without_cycles(serving)

    async def DeltaAggregatedResources(
        self,
        request_iterator: AsyncIterator[DeltaDiscoveryRequest],
        context: grpc.aio.ServicerContext[DeltaDiscoveryRequest, DeltaDiscoveryResponse],
    ) -> None:
        serving = self._serve(context, "delta", DeltaStream(self.limits))
        del request_iterator, context  # see `_without_cycles`
        await _without_cycles(serving)

    # -- one stream ----------------------------------------------------------------------------

    async def _serve(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        mode: Literal["sotw", "delta"],
        stream: SotwStream | DeltaStream,
    ) -> None:
        if self._closing:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "ballast is shutting down")
        identity, connection = self._identify(context), context.peer()
        refusal = self.ledger.open(identity, connection)
        if refusal is not None:
            self._over_budget(identity, refusal)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal.reason)
        try:
            ending = await self._serve_counted(context, mode, stream, identity)
            del stream  # what the stream kept goes before a status that may have to wait
            if ending is not None:
                await _end_with_status(context, ending)
        finally:
            self.ledger.close(identity, connection)

    async def _serve_counted(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        mode: Literal["sotw", "delta"],
        stream: SotwStream | DeltaStream,
        identity: str | None,
    ) -> _Signal | None:
        """How the stream must end (a status to send), if not OK; the request held meanwhile
        is released before."""
        try:
            first = await asyncio.wait_for(context.read(), self.limits.first_request_s)
        except TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                f"no first request within {self.limits.first_request_s:g} s")
        if first is grpc.aio.EOF:
            return None
        held = first.ByteSize()  # the first request, held until its output is done
        refusal = self.ledger.hold(identity, held)
        if refusal is not None:
            self._over_budget(identity, refusal)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal.reason)
        try:
            return await self._serve_stream(context, mode, stream, identity, first)
        finally:
            if held:
                self.ledger.release(identity, held)

    async def _serve_stream(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        mode: Literal["sotw", "delta"],
        stream: SotwStream | DeltaStream,
        identity: str | None,
        first: Any,
    ) -> _Signal | None:
        node = first.node
        pop = sys.intern(await self._admit(context, node))
        advertised = canonical_capabilities(read_node_capabilities(node))
        node_id = node.id
        version = sys.intern(envoy_version(node, self.limits.text_chars))
        del node  # a real Envoy's first request lists ~500 extensions: not kept
        # a valid stream from here on: its connection is in use until `release`
        release = await self._vouch(context) if self._vouch is not None else _nothing
        # waits unread for an initial-sync slot; in the registry (and /nodes) once admitted
        try:
            await self._admission.acquire()
        except BaseException:
            release()
            raise
        state = self._open(context, mode, stream, identity, first,
                           (pop, node_id, version, advertised))
        signal = _EOF  # how the stream ended (unless told otherwise: the client went away)
        try:
            # headers first, on their own (not flow-controlled): a first write blocked by a
            # client that grants no window can then be interrupted and the stream still ended
            # with a status (gRPC sends initial metadata with the first write otherwise, and
            # a status after an interrupted one fails: TOO_MANY_OPERATIONS)
            await context.send_initial_metadata(())
            await state.turn()
            try:
                ending = await self._answer(state, first)
            finally:
                state.done()
            del first
            if ending is not None:
                state.end(ending)
            await self._read_requests(state)
            if state.ending is not None:
                signal = state.ending
                await state.turn()  # an ending waits for the output being written (a push)
                state.done()
        except _Interrupted:
            assert state.ending is not None
            signal = state.ending
        finally:
            release()
            self._close(state, signal)
        if signal.error is not None:
            raise signal.error  # in gRPC's task, as if the stream's task had pushed
        return signal if signal.status is not grpc.StatusCode.OK else None

    async def _admit(self, context: grpc.aio.ServicerContext[Any, Any], node: Node) -> str:
        """The PoP the first request's node claims, once the node checks passed
        (`admission.py`); else the call ends: INVALID_ARGUMENT, or PERMISSION_DENIED where the
        peer may not claim that node."""
        try:
            check_node_id(node, self.limits)
            pop = pop_of(node)
            if self._verify_peer is not None:
                why = self._verify_peer(context, pop, node.id)
                if why is not None:
                    claimed = clip(node.id, CLAIMED_CHARS)
                    log.warning("refusing ADS stream of node %r: %s", claimed, why)
                    self._notify(self.callbacks.on_stream_refused, claimed,
                                 clip(pop, CLAIMED_CHARS), why)
                    await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)
            if not self.cache.has_pop(pop):
                known = ", ".join(self.cache.pops)
                shown = clip(pop, self.limits.text_chars)
                raise NodeRejected(
                    f"node {node.id!r} names unknown PoP {shown!r}; known: {known}"
                )
        except NodeRejected as err:
            log.warning("rejecting ADS stream: %s", err)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        return pop

    def _open(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        mode: Literal["sotw", "delta"],
        stream: SotwStream | DeltaStream,
        identity: str | None,
        first: Any,
        node: tuple[str, str, str, NodeCapabilities],
    ) -> _Stream:
        """An admitted stream, holding its initial-sync slot: in the registry, the live stream
        of its node id (an older one superseded), woken by its PoP's changes."""
        pop, node_id, version, advertised = node
        self.syncing += 1
        caps = self.cache.effective_capabilities(pop, advertised.capabilities, advertised.reason)
        entry = self.nodes.connect(
            node_id=node_id,
            pop=pop,
            mode=mode,
            envoy_version=version,
            capability_key=caps.capabilities.key,
            capability_reason=caps.reason,
        )
        del caps
        state = _Stream(self, context, stream, entry, advertised, identity)
        state.live_key = live_key(node_id, advertised.capabilities.grpc is not None, first)
        if self._key_gate is not None:
            state.keys_refused = self._key_gate(context)
        state.admitted = True
        state.admission_cap = asyncio.get_running_loop().call_later(
            self.limits.initial_sync_s, self.end_admission, state
        )
        self._streams.add(state)
        self._supersede(entry, state)
        self.hub.subscribe(pop, state.wake)
        self._notify(self.callbacks.on_stream_open, entry)
        log.info("node %r connected (%s, PoP %s, %s)", node_id, mode, pop, entry.capability_key)
        return state

    async def _read_requests(self, state: _Stream) -> None:
        """Read and answer the node's requests, one at a time, each held in its identity's
        budget while it is handled, until the stream ends (`state.ending`) or the client ends
        it."""
        context, identity = state.context, state.identity
        while state.ending is None:
            state.reading = True
            try:
                request = await context.read()
            except asyncio.CancelledError:
                if state.ending is None:
                    raise  # gRPC ends the call (the client went away)
                state.task.uncancel()  # end() interrupted the wait
                return
            except (grpc.aio.AioRpcError, grpc.aio.UsageError, ConnectionError):
                return
            finally:
                state.reading = False
            if request is grpc.aio.EOF:
                return
            size = request.ByteSize()
            refusal = self.ledger.hold(identity, size)
            if refusal is not None:
                self._over_budget(identity, refusal)
                state.end(_Signal(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal.reason))
                return
            try:
                await state.turn()
                try:
                    ending = await self._answer(state, request)
                finally:
                    state.done()
            finally:
                self.ledger.release(identity, size)
            del request
            if ending is not None:
                state.end(ending)

    def _close(self, state: _Stream, signal: _Signal) -> None:
        """The stream is over: its slot, push and subscription go, the registry and the live
        streams forget it, and the embedder is told how it ended."""
        entry = state.entry
        self.end_admission(state)
        if state.push is not None:
            state.push.cancel()
        self.hub.unsubscribe(entry.pop, state.wake)
        self._streams.discard(state)
        self.nodes.disconnect(entry)
        live = self._live.get(state.live_key)
        if live is not None and live[0] is entry:
            del self._live[state.live_key]
        self._notify(self.callbacks.on_stream_closed, entry, signal.status.name, signal.details)
        log.info("node %r disconnected (%s)", entry.node_id, signal.details or signal.status.name)

    def _over_budget(self, identity: str | None, refusal: Refusal) -> None:
        """A stream refused (or ended) over a budget: logged and told at the 1st, 10th, 100th,
        ... refusal of its identity."""
        if not refusal.report:
            return
        who = clip(identity, CLAIMED_CHARS) if identity is not None else "(process totals)"
        reason = f"{refusal.reason} ({refusal.count:,} refused so far)"
        log.warning("refusing ADS stream of %s: %s", who, reason)
        self._notify(self.callbacks.on_stream_refused, who, "", reason)

    def start_push(self, state: _Stream) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._push(state))
        self._pushing.add(task)  # kept referenced until done
        task.add_done_callback(self._pushing.discard)
        return task

    async def _push(self, state: _Stream) -> None:
        """One push: the newest snapshot of the stream's PoP, once it is this task's turn."""
        await state.turn()
        try:
            state.push_due = False  # a change from now on needs another push
            if state.ending is None:
                ending = await self._answer(state, None)
                if ending is not None:
                    state.end(ending)
        except _Interrupted:
            pass  # the stream is ending; its own task says how
        except Exception as err:  # e.g. a write to a call the client ended
            state.end(_Signal(grpc.StatusCode.OK, error=err))
        finally:
            state.done()

    async def _answer(self, state: _Stream, request: Any) -> _Signal | None:
        """Handle one request (or, with None, a push) and write the responses; how the stream
        must end, if it must."""
        entry = state.entry
        if not self.cache.has_pop(entry.pop):
            return _Signal(grpc.StatusCode.FAILED_PRECONDITION,
                           f"PoP {entry.pop!r} is no longer in the desired state")
        if request is not None and state.keys_refused is not None \
                and request.type_url == SECRET_TYPE:
            self._refuse_keys(state, request)
            return None
        snapshot = self._snapshot(entry, state.advertised)
        if request is None:
            output = state.core.on_resources(snapshot)
        else:
            self._notify(self.callbacks.on_request, entry, request)
            try:
                output = state.core.on_request(request, snapshot)
            except ProtocolError as err:
                log.warning("node %r: bad request: %s", entry.node_id, err)
                return _Signal(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        await self._apply(state, output)
        entry.answered_from = snapshot  # what the node has been answered from (all of it written)
        if state.admitted and output.events and _initial_sync_done(entry):
            self.end_admission(state)
        return None

    def _refuse_keys(self, state: _Stream, request: Any) -> None:
        """An SDS request on a stream keys may not go to: never answered (the listeners that
        need the secrets stay warming), reported once per stream."""
        entry, why = state.entry, state.keys_refused
        if entry.secrets_refused is not None or why is None:
            return
        entry.secrets_refused = why
        names = list(request.resource_names if isinstance(request, DiscoveryRequest)
                     else request.resource_names_subscribe)[:8]
        log.warning("node %r: SDS request for %s not answered: %s", entry.node_id,
                    ", ".join(names) or "secrets", why)
        self._notify(self.callbacks.on_secrets_refused, entry, names, why)

    def end_admission(self, state: _Stream) -> None:
        """The stream's initial exchange is done (or took too long, or the stream ended): its
        initial-sync slot goes to the next stream waiting."""
        if state.admission_cap is not None:
            state.admission_cap.cancel()
            state.admission_cap = None
        if state.admitted:
            state.admitted = False
            self.syncing -= 1
            self._admission.release()

    def _supersede(self, entry: NodeEntry, state: _Stream) -> None:
        """`entry` is now the node id's live stream; an older one is closed and leaves the
        registry at once, so status never lists the id twice."""
        older = self._live.get(state.live_key)
        self._live[state.live_key] = (entry, state)
        if older is None:
            return
        old_entry, old_state = older
        self.nodes.disconnect(old_entry)
        old_state.end(_SUPERSEDED)
        log.warning("node %r: stream %d replaced by newer stream %d", entry.node_id,
                    old_entry.stream, entry.stream)
        self._notify(self.callbacks.on_stream_superseded, old_entry, entry)

    def _snapshot(self, entry: NodeEntry, advertised: NodeCapabilities) -> PopResources:
        caps = self.cache.effective_capabilities(
            entry.pop, advertised.capabilities, advertised.reason
        )
        entry.capability_key = caps.capabilities.key
        entry.capability_reason = caps.reason
        snapshot = self.cache.resources(entry.pop, caps.capabilities)
        if snapshot.notes:
            version = snapshot.type_version(CLUSTER_TYPE)
            if version != entry.fallback_version:  # once per stream and CDS version
                entry.fallback_version = version
                if log.isEnabledFor(logging.INFO):  # a line per stream, not one per cluster
                    log.info("node %r: capability fallback: %s", entry.node_id,
                             "; ".join(snapshot.notes))
                self._notify(self.callbacks.on_capability_fallback, entry,
                             caps.capabilities.key, version, snapshot.notes)
        return snapshot

    async def _apply(self, state: _Stream, output: StreamOutput) -> None:
        entry = state.entry
        for event in output.events:
            if isinstance(event, Ack):
                entry.acked(event.type_url, event.version)
                self._notify(self.callbacks.on_ack, entry, event)
            else:
                limit = self.limits.message_chars
                nack = dataclasses.replace(
                    event, message=clip(event.message, limit, tail=limit // 2)
                )
                if entry.nacked(nack.type_url, nack.version, nack.message) == 1:
                    log.warning("node %r NACKed %s version %s: %r", entry.node_id,
                                short_name(nack.type_url), nack.version, nack.message)
                self._notify(self.callbacks.on_nack, entry, nack)
        for response in output.responses:
            if state.ending is not None:
                raise _Interrupted
            data = self.encoder.encode(response)
            await self._write(state, data)
            entry.sent(response.type_url, response.version)
            self.sends += 1
            self._notify(self.callbacks.on_response, entry, response, len(data))

    async def _write(self, state: _Stream, data: bytes) -> None:
        """One response written, held in the identity's budget meanwhile; a write that makes no
        progress within `write_stall_s`, or that the stream's ending interrupts, raises
        `_Interrupted` (the stream ends as `state.ending` says)."""
        refusal = self.ledger.hold(state.identity, len(data))
        if refusal is not None:
            self._over_budget(state.identity, refusal)
            state.end(_Signal(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal.reason))
            raise _Interrupted
        task = asyncio.current_task()
        assert task is not None
        stall = asyncio.get_running_loop().call_later(self.limits.write_stall_s, state.stalled)
        state.writer = task
        try:
            await state.context.write(data)
        except grpc.aio.InternalError:  # the client closed while the write was blocked
            state.end(_EOF)
            raise _Interrupted from None
        except asyncio.CancelledError:
            if state.ending is None or state.writer is not task:
                raise  # not ours: gRPC ends the call, or shutdown
            task.uncancel()
            raise _Interrupted from None
        finally:
            state.writer = None
            stall.cancel()
            self.ledger.release(state.identity, len(data))

    @staticmethod
    def _notify(callback: Callable[..., None], *args: Any) -> None:
        try:
            callback(*args)
        except Exception:
            log.exception("callback %s failed", callback.__name__)

