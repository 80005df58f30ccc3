"""The running intent in etcd, for several Ballast replicas: one leader writes, every replica reads.

Keys, all under one prefix (default ``/ballast/``):

- ``leader`` — the elected replica's id, attached to its lease. The key's create revision is the
  leader's **term**: it grows with every election, and a write is fenced by comparing it (etcd's
  own election recipe), so a leader whose lease expired — paused, partitioned — can never write
  again: its transaction's compare fails and it stops leading. A leader key counts only when it
  is on a lease and names a replica registered on that same lease (`leader`): another writer's
  ``put /ballast/leader evil`` is nobody; one without a lease (which no replica writes, and
  which would never expire) is deleted by the next campaign, so an election follows.
- ``intent/groups/<pop>/<group>`` — weights and controller streaks of a (PoP, origin group).
- ``intent/tiers/<pop>/<group>`` — an active tier state.
- ``intent/digest`` — the digest of the desired state the intent was decided for.
- ``intent/writing`` — there while a write split in several transactions is under way (below).
- ``decisions/<replica>/<n>`` — the decision records each replica writes, handed to the others:
  every replica appends the others' records to its own log, so ``ballast decisions`` reads the
  same history from any replica. They carry a lease of an hour: etcd is the hand-off, not the
  archive.
- ``replicas/<id>`` — each replica's registration (admin URL, xDS address), on its own lease.
- ``acks/<id>`` — the ACK state of the nodes connected to that replica (`acks/shared_acks.py`,
  `SharedAcks`), on the same lease as its registration: a replica that dies takes its nodes
  with it when the lease expires.

An intent write is one transaction fenced by the leader's term when it fits in one etcd request
(at most `MAX_TXN_OPS` operations and `MAX_REQUEST_BYTES`: etcd's `--max-txn-ops` 128 and
`--max-request-bytes` 1.5 MiB by default). A larger one — a tick moving every pair of a large
fleet, a rollout saving two desired-state versions of up to 1 MiB, the baselines of a wave of
100+ PoPs — is split (`transactions`) into several, each fenced, applied in an order whose every
prefix reads back as a consistent intent: the values first, then the keys a reader starts from
(`IntentWrite.last`: the digest, the rollout, which PoP serves which version) in one
transaction, the other deletes last. A crash between two leaves some values written (a
version's bytes, a PoP's baseline, some pairs' weights) beside the rollout and versions of
before, or deletes of what nothing names any more not yet done. One value larger than a request
is refused (`TooLarge`) before anything is written. So that no follower adopts part of a write,
a split write puts ``intent/writing`` in a transaction of its own first, and every write deletes
it in its last (`marked`): a follower adopts nothing while it is there (`replicas/replication.py`).
One that broke off leaves it until the same leader puts back what landed (`IntentOwner`) or a
new leader, elected, clears it (`ReplicatedStore.settle`).

Reaching etcd (`StoreCredentials`): client TLS (the CA etcd's certificate chains to; a client
certificate and key, whose CN etcd takes as the user with ``--client-cert-auth``) and/or a user
and password (etcd's simple-token authentication). aetcd 1.0 dials plaintext only: `_Client`
adds the TLS channel. The files are read at every (re)connection, so rotated ones are used from
the next one on; the password never leaves this module.

Every value read under ``intent/`` is decoded here (`decoded`): one that is not JSON is an
`Unreadable` carrying why, never an exception, so one bad value stops neither a start-up nor the
watch; what each key must hold is checked by its reader (`replicated_store.checked`).

This module is the thin I/O adapter (aetcd over grpc.aio); what the keys hold is decided elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aetcd
import grpc
from aetcd import rpc, transactions, watcher

from control_plane.intent.store import PartlyWritten

log = logging.getLogger(__name__)

MAX_REGISTRATION_BYTES = 64 * 1024  # a replica's info under ``replicas/<id>``

MAX_ENDPOINTS = 16
RECORDS_TTL_S = 3600
WRITING = "writing"  # ``intent/writing``: a split write is under way
MAX_TXN_OPS = 100  # etcd refuses a transaction of more than 128 operations
# etcd refuses a request of more than 1.5 MiB (1,572,864 bytes); the rest is room for the
# transaction's own framing (the fence, each operation's ~10 bytes)
MAX_REQUEST_BYTES = 1_500_000
MAX_CREDENTIAL_FILE = 1 << 20

T = TypeVar("T")


@dataclass(frozen=True)
class Unreadable:
    """A value under ``intent/`` that is not JSON: why, to quarantine it (never adopted)."""

    why: str


def decoded(raw: bytes) -> Any:
    """A stored intent value: its JSON, or `Unreadable` saying why it is not JSON."""
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        why = str(err) if len(str(err)) <= 120 else str(err)[:120] + "…"
        return Unreadable(f"not JSON ({len(raw):,} bytes): {why}")


class _LeaseOf(transactions.BaseCompare):  # aetcd has no compare on a key's lease
    def build_compare(self, compare: Any) -> None:
        compare.target = rpc.Compare.LEASE
        compare.lease = self.value


class StoreUnavailable(Exception):
    """etcd did not answer (in time): nothing was written."""


class UnavailableMidWrite(StoreUnavailable, PartlyWritten):
    """etcd stopped answering after some of a split write's transactions landed."""


class Deposed(Exception):
    """A fenced write was refused: this replica is not the leader of that term any more."""


class TooLarge(ValueError):
    """An intent value larger than one etcd request: nothing was written."""


def parse_store_url(url: str) -> list[tuple[str, int]]:
    """``etcd://HOST:PORT[,HOST:PORT...]`` -> endpoints; ValueError with the reason otherwise."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme != "etcd":
        raise ValueError(f"store URL must look like etcd://HOST:PORT[,HOST:PORT], got {url!r}")
    endpoints: list[tuple[str, int]] = []
    for part in rest.rstrip("/").split(","):
        host, colon, port = part.strip().rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"store URL {url!r}: {part!r} is not HOST:PORT")
        endpoints.append((host.strip("[]"), int(port)))
    if len(endpoints) > MAX_ENDPOINTS:
        raise ValueError(f"store URL {url!r}: at most {MAX_ENDPOINTS} endpoints")
    return endpoints


@dataclass(frozen=True)
class StoreCredentials:
    """How a replica proves itself to etcd (every field optional; see the module docstring)."""

    ca: Path | None = None  # etcd's CA: the connection is TLS when given
    cert: Path | None = None  # client certificate (PEM); with --client-cert-auth its CN is the user
    key: Path | None = None  # its private key (PEM)
    user: str | None = None  # etcd user, with password_file
    password_file: Path | None = None

    def problem(self) -> str:
        """Why these cannot be used together ("" when they can)."""
        if (self.cert is None) != (self.key is None):
            return "--store-cert and --store-key go together"
        if self.cert is not None and self.ca is None:
            return "--store-cert needs --store-ca (a client certificate is only sent over TLS)"
        if (self.user is None) != (self.password_file is None):
            return "--store-user and --store-password-file go together"
        if self.user is not None and not 0 < len(self.user) <= 128:
            return "--store-user must be 1-128 characters"
        return ""

    def channel(self) -> grpc.ChannelCredentials | None:
        """TLS channel credentials from the files as they are now, or None for plaintext."""
        if self.ca is None:
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=_read_credential(self.ca, "--store-ca"),
            private_key=_read_credential(self.key, "--store-key") if self.key else None,
            certificate_chain=_read_credential(self.cert, "--store-cert") if self.cert else None,
        )

    def password(self) -> str | None:
        if self.password_file is None:
            return None
        text = _read_credential(self.password_file, "--store-password-file").decode().strip()
        if not text:
            raise ValueError(f"--store-password-file {self.password_file}: empty")
        return text


def _read_credential(path: Path, option: str) -> bytes:
    with path.open("rb") as f:
        data = f.read(MAX_CREDENTIAL_FILE + 1)
    if len(data) > MAX_CREDENTIAL_FILE:
        raise ValueError(f"{option} {path}: larger than {MAX_CREDENTIAL_FILE} bytes")
    return data


class _Client(aetcd.Client):
    """aetcd's client over a TLS channel when `credentials` has a CA (aetcd 1.0 only dials
    plaintext); user and password authenticate as aetcd does, by etcd's token."""

    def __init__(self, host: str, port: int, timeout: float,
                 credentials: StoreCredentials) -> None:
        super().__init__(host=host, port=port, timeout=timeout)  # type: ignore[arg-type]
        self._credentials = credentials

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        target = f"{self._host}:{self._port}"
        secure = self._credentials.channel()
        self.channel = (grpc.aio.secure_channel(target, secure) if secure is not None
                        else grpc.aio.insecure_channel(target))
        password = self._credentials.password()
        if password is not None:
            self.auth_stub = rpc.AuthStub(self.channel)
            reply = await self.auth_stub.Authenticate(
                rpc.AuthenticateRequest(name=self._credentials.user, password=password),
                timeout=self._timeout)
            self.metadata = (("token", reply.token),)
        self.kvstub = rpc.KVStub(self.channel)
        self.clusterstub = rpc.ClusterStub(self.channel)
        self.leasestub = rpc.LeaseStub(self.channel)
        self.maintenancestub = rpc.MaintenanceStub(self.channel)
        self._watcher = watcher.Watcher(rpc.WatchStub(self.channel), timeout=self._timeout,
                                        metadata=self.metadata)
        self._connected.set()


@dataclass(frozen=True)
class Leadership:
    """This replica leads term ``term`` while its lease ``lease_id`` lives."""

    term: int
    lease_id: int


@dataclass(frozen=True)
class IntentEvent:
    """One change seen by a watch: ``value`` is None when the key was deleted; under ``acks/``
    the stored bytes (another replica's, parsed by their reader), else the parsed JSON."""

    revision: int
    key: str  # relative to the intent prefix, e.g. "groups/ewr/shop"
    value: Any


@dataclass
class IntentWrite:
    """What one intent batch changes under ``intent/``: one transaction, or several in a safe
    order when it does not fit in one (see the module docstring)."""

    put: dict[str, Any] = field(default_factory=dict)  # relative key -> JSON value
    delete: list[str] = field(default_factory=list)
    last: frozenset[str] = frozenset()  # keys a reader starts from: put/deleted together


Operation = tuple[str, bytes | None]  # relative key, the value to put (None: delete)


def transactions(write: IntentWrite) -> list[list[Operation]]:
    """The transactions `write` is committed in: one when it fits in an etcd request, else the
    puts of keys not in `last`, then the puts and deletes of those in `last` (one transaction),
    then the other deletes, each transaction within `MAX_TXN_OPS` and `MAX_REQUEST_BYTES`.
    TooLarge when one value does not fit in a request, or the `last` keys not in one."""
    puts: list[Operation] = [(key, _dump(value)) for key, value in write.put.items()]
    for key, data in puts:
        if _size((key, data)) > MAX_REQUEST_BYTES:
            raise TooLarge(f"intent/{key} is {len(data or b''):,} bytes of JSON; one etcd "
                           f"request carries at most {MAX_REQUEST_BYTES:,}: nothing was written")
    deletes: list[Operation] = [(key, None) for key in write.delete]
    every = [*puts, *deletes]
    if len(every) <= MAX_TXN_OPS and sum(map(_size, every)) <= MAX_REQUEST_BYTES:
        return [every] if every else []
    last = [op for op in every if op[0] in write.last]
    if len(last) > MAX_TXN_OPS or sum(map(_size, last)) > MAX_REQUEST_BYTES:
        raise TooLarge(f"intent/{', '.join(key for key, _ in last)}: {sum(map(_size, last)):,} "
                       f"bytes together, more than one etcd request carries "
                       f"({MAX_REQUEST_BYTES:,}): nothing was written")
    chunks = _packed([op for op in puts if op[0] not in write.last], [])
    if chunks and len(chunks[-1]) + len(last) <= MAX_TXN_OPS and sum(
            map(_size, chunks[-1] + last)) <= MAX_REQUEST_BYTES:
        chunks[-1].extend(last)
    elif last:
        chunks.append(last)
    return _packed([op for op in deletes if op[0] not in write.last], chunks)


def marked(split: list[list[Operation]]) -> list[list[Operation]]:
    """`split` (`transactions`) with the marker of a write under way: put first, in a
    transaction of its own, when there are several; deleted in the last transaction of every
    write (an empty one too: a mark a broken write left goes with the next write)."""
    done = [[(WRITING, _dump({"transactions": len(split)}))]] if len(split) > 1 else []
    done += [list(chunk) for chunk in split]
    clear: Operation = (WRITING, None)
    if done and len(done[-1]) < MAX_TXN_OPS and sum(map(_size, done[-1] + [clear])
                                                    ) <= MAX_REQUEST_BYTES:
        done[-1].append(clear)
    else:
        done.append([clear])
    return done


def _packed(ops: list[Operation], chunks: list[list[Operation]]) -> list[list[Operation]]:
    """`ops` appended in order to `chunks` (the last one filled up first), a new one started
    whenever the next operation would not fit."""
    size = sum(map(_size, chunks[-1])) if chunks else 0
    for op in ops:
        if not chunks or len(chunks[-1]) >= MAX_TXN_OPS or size + _size(op) > MAX_REQUEST_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(op)
        size += _size(op)
    return chunks


def _size(op: Operation) -> int:
    """What one operation takes of an etcd request (its full key under a prefix of up to 256
    bytes, its value)."""
    key, value = op
    return 256 + len(key.encode()) + (0 if value is None else len(value))


class EtcdStore:
    """One connection to an etcd cluster (endpoints tried in order) under ``prefix``."""

    def __init__(
        self,
        endpoints: Sequence[tuple[str, int]],
        *,
        prefix: str = "/ballast/",
        timeout_s: float = 2.0,
        credentials: StoreCredentials | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoints")
        self.endpoints = list(endpoints)
        self.credentials = credentials or StoreCredentials()
        self.prefix = prefix if prefix.endswith("/") else prefix + "/"
        self.timeout_s = timeout_s
        self._client: aetcd.Client | None = None
        self._endpoint = 0
        self._records_lease: int | None = None
        self._record_counter = 0
        self._closing: set[asyncio.Task[None]] = set()

    # -- connection ------------------------------------------------------------------------

    def _key(self, relative: str) -> bytes:
        return (self.prefix + relative).encode()

    def _relative(self, key: bytes, under: str) -> str:
        return key.decode()[len(self.prefix + under):]

    async def _connected(self) -> aetcd.Client:
        if self._client is None:
            host, port = self.endpoints[self._endpoint]
            client = _Client(host, port, self.timeout_s, self.credentials)
            try:
                await client.connect()  # authenticates (a call) when a user is given
            except Exception as err:  # refused credentials, unreadable files, etcd away
                await self._tidy(client.close())
                _honour_cancellation()
                raise await self._failed(err) from err
            self._client = client
            _honour_cancellation()
        return self._client

    async def _failed(self, err: BaseException) -> StoreUnavailable:
        """Drop the connection and move to the next endpoint; the error to raise. The dropped
        client is closed a little later: other calls still on it (a watch, a lease refresh)
        end by their own timeouts first instead of being cut mid-call."""
        client, self._client = self._client, None
        self._endpoint = (self._endpoint + 1) % len(self.endpoints)
        if client is not None:
            task = asyncio.create_task(self._close_later(client))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        return StoreUnavailable(f"etcd unavailable: {type(err).__name__}: {err}")

    async def _close_later(self, client: aetcd.Client) -> None:
        await asyncio.sleep(2 * self.timeout_s)
        await self._tidy(client.close())

    async def close(self) -> None:
        for task in list(self._closing):
            task.cancel()
        if self._client is not None:
            client, self._client = self._client, None
            await self._tidy(client.close())

    async def _tidy(self, cleanup: Awaitable[Any]) -> None:
        """Closing a channel or cancelling a watch talks to etcd too: with etcd gone (stopped,
        partitioned) it would wait forever, so it gets the call timeout and its errors are
        dropped (there is nothing left to keep)."""
        try:
            await asyncio.wait_for(cleanup, self.timeout_s)
        except (TimeoutError, Exception) as err:
            log.debug("etcd clean-up: %s", err)

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        client = await self._connected()
        return await self._rpc(getattr(client, name)(*args, **kwargs))

    async def _rpc(self, call: Awaitable[T]) -> T:
        """The answer of one call to etcd; StoreUnavailable when it fails, CancelledError when
        the task awaiting it was cancelled meanwhile (even if the call swallowed it)."""
        try:
            answer = await call
        except Exception as err:  # any failure to talk to etcd (gRPC, socket, timeout)
            _honour_cancellation()  # the call ended because we cancelled it: not etcd's fault
            raise await self._failed(err) from err
        _honour_cancellation()
        return answer

    # -- leadership ------------------------------------------------------------------------

    async def grant_lease(self, ttl_s: int) -> int:
        lease = await self._call("lease", ttl_s)
        return int(lease.id)

    async def refresh_lease(self, lease_id: int) -> float:
        """Remaining TTL in seconds after the refresh; 0 means the lease is gone."""
        reply = await self._call("refresh_lease", lease_id)
        return float(getattr(reply, "TTL", 0) or 0)

    async def revoke_lease(self, lease_id: int) -> None:
        await self._call("revoke_lease", lease_id)

    async def campaign(self, replica_id: str, lease_id: int) -> Leadership | None:
        """One attempt to become leader: the leader key is created only if absent. One on no
        lease is no replica's (another writer's `put`): it is deleted, if unchanged since read,
        and the next attempt (its deletion wakes the watch) campaigns for an empty key."""
        client = await self._connected()
        leader = self._key("leader")
        tx = client.transactions
        ok, _ = await self._rpc(client.transaction(
            compare=[tx.version(leader) == 0],
            success=[tx.put(leader, replica_id.encode(), lease=lease_id)],
            failure=[],
        ))
        held = await self._call("get", leader)
        if not ok:
            if held is not None and not held.lease:
                log.warning("the leader key holds %r on no lease: no replica wrote it; deleted "
                            "so that a replica is elected", _shown(held.value))
                await self._rpc(client.transaction(
                    compare=[tx.mod(leader) == int(held.mod_revision), _LeaseOf(leader) == 0],
                    success=[tx.delete(leader)], failure=[]))
            return None
        if held is None or held.lease != lease_id or held.value != replica_id.encode():
            return None
        return Leadership(term=int(held.create_revision), lease_id=lease_id)

    async def holds(self, replica_id: str, lead: Leadership) -> bool:
        """Whether the leader key is still `replica_id`'s of term `lead.term`, on its lease."""
        held = await self._call("get", self._key("leader"))
        return (held is not None and held.lease == lead.lease_id
                and int(held.create_revision) == lead.term
                and held.value == replica_id.encode())

    async def leader(self) -> tuple[str, int] | None:
        """(replica id, term) of the current leader, or None: also when the leader key is on no
        lease, or names no replica registered on the lease it is on (another writer's)."""
        held = await self._call("get", self._key("leader"))
        if held is None or not held.lease:
            return None
        replica = held.value.decode(errors="replace")
        registered = await self._call("get", self._key(f"replicas/{replica}"))
        if registered is None or registered.lease != held.lease:
            return None
        return replica, int(held.create_revision)

    async def watch_leader(self) -> AsyncIterator[None]:
        """Yields each time the leader key changes (a new term, or vacancy)."""
        watch = await self._call("watch", self._key("leader"))
        try:
            async for _ in watch:
                yield None
        except Exception as err:  # any failure to talk to etcd (gRPC, socket, timeout)
            raise await self._failed(err) from err
        finally:
            await self._tidy(watch.cancel())

    # -- intent ----------------------------------------------------------------------------

    async def load(self) -> tuple[int, dict[str, Any]]:
        """(revision, relative key -> value) of everything under ``intent/`` (a value that is
        not JSON as `Unreadable`)."""
        client = await self._connected()
        result = await self._rpc(client.get_prefix(self._key("intent/")))
        values = {self._relative(kv.key, "intent/"): decoded(kv.value) for kv in result}
        return int(result.header.revision), values

    async def commit(self, leadership: Leadership, write: IntentWrite) -> None:
        """Apply ``write`` in transactions fenced by the leader's term (one when it fits:
        `transactions`).

        Raises Deposed when the leader key is not this term's any more (nothing more written),
        TooLarge when a value does not fit in an etcd request (nothing written), StoreUnavailable
        when etcd does not answer (`UnavailableMidWrite` once a transaction of it landed)."""
        split = marked(transactions(write))
        client = await self._connected()
        for done, chunk in enumerate(split):
            try:
                ok, _ = await self._transaction(client, leadership, chunk)
            except StoreUnavailable as err:
                if done == 0:
                    raise
                raise UnavailableMidWrite(f"{err} (after {done} of the write's {len(split)} "
                                          f"transactions)") from err
            if not ok:
                raise Deposed(f"leader key is no longer term {leadership.term}")

    async def _transaction(self, client: Any, leadership: Leadership,
                           chunk: list[Operation]) -> tuple[bool, Any]:
        """One fenced transaction of an intent write: (whether the term still held, etcd's
        answer)."""
        tx = client.transactions
        return await self._rpc(client.transaction(
            compare=[tx.create(self._key("leader")) == leadership.term],
            success=[tx.delete(self._key("intent/" + key)) if value is None
                     else tx.put(self._key("intent/" + key), value) for key, value in chunk],
            failure=[],
        ))

    async def publish_records(self, source: str, records: Sequence[Mapping[str, Any]]) -> None:
        """Hand decision records to the other replicas (``decisions/<source>/<n>``, on a lease of
        an hour: etcd is the hand-off, each replica's own log is the archive)."""
        client = await self._connected()
        tx = client.transactions
        try:
            if self._records_lease is None:
                self._records_lease = int((await client.lease(RECORDS_TTL_S)).id)
            named: list[Operation] = []
            for record in records:
                self._record_counter += 1
                named.append((f"decisions/{source}/{self._record_counter:012x}", _dump(record)))
            for chunk in _packed(named, []):
                await client.transaction(compare=[], success=[
                    tx.put(self._key(name), data, lease=self._records_lease)
                    for name, data in chunk], failure=[])
        except Exception as err:  # any failure to talk to etcd (gRPC, socket, timeout)
            self._records_lease = None
            _honour_cancellation()
            raise await self._failed(err) from err
        _honour_cancellation()

    async def watch_intent(self, start_revision: int) -> AsyncIterator[IntentEvent]:
        """Every change under ``intent/``, ``decisions/`` and ``acks/`` from ``start_revision``
        on (an ``acks/`` value as stored, one that is not JSON as `Unreadable`: `IntentEvent`),
        and of the membership (the ``leader`` key, ``replicas/``: value None, only that it
        changed)."""
        client = await self._connected()
        watch = await self._rpc(client.watch_prefix(self.prefix.encode(),
                                                    start_revision=start_revision))
        try:
            async for event in watch:
                key = event.kv.key.decode(errors="replace")[len(self.prefix):]
                if key == "leader" or key.startswith("replicas/"):  # membership: that it changed
                    yield IntentEvent(int(event.kv.mod_revision), key, None)
                    continue
                if not key.startswith(("intent/", "decisions/", "acks/")):
                    continue
                deleted = event.kind == aetcd.rtypes.EventKind.DELETE
                if deleted:
                    value = None
                elif key.startswith("acks/"):  # a peer's, read bounded by `SharedAcks.parse`
                    value = bytes(event.kv.value)
                else:
                    value = decoded(event.kv.value)
                yield IntentEvent(int(event.kv.mod_revision), key, value)
        except Exception as err:  # any failure to talk to etcd (gRPC, socket, timeout)
            raise await self._failed(err) from err
        finally:
            await self._tidy(watch.cancel())

    # -- replicas --------------------------------------------------------------------------

    async def register(self, replica_id: str, info: Mapping[str, Any], lease_id: int) -> None:
        await self._call("put", self._key(f"replicas/{replica_id}"), _dump(info), lease=lease_id)

    async def replicas(self) -> list[dict[str, Any]]:
        """Every registered replica's info, its id the key's (a value that is not a JSON
        object of at most `MAX_REGISTRATION_BYTES` is another writer's: the id alone)."""
        result = await self._call("get_prefix", self._key("replicas/"))
        return [_registration(self._relative(kv.key, "replicas/"), bytes(kv.value))
                for kv in result]

    async def share_acks(self, replica_id: str, value: Mapping[str, Any] | None,
                         lease_id: int) -> None:
        """This replica's nodes' ACK state (``acks/<id>``, on its registration's lease), or
        none (None: the key deleted)."""
        key = self._key(f"acks/{replica_id}")
        if value is None:
            await self._call("delete", key)
        else:
            await self._call("put", key, _dump(value), lease=lease_id)

    async def shared_acks(self) -> dict[str, bytes]:
        """Replica id -> the ACK state it shares (every live replica's ``acks/<id>``), as
        stored: another replica's value is outside input, parsed by its reader
        (`SharedAcks.parse`)."""
        result = await self._call("get_prefix", self._key("acks/"))
        return {self._relative(kv.key, "acks/"): bytes(kv.value) for kv in result}


def _honour_cancellation() -> None:
    """Raise CancelledError if the current task is being cancelled. grpc.aio can swallow a
    cancellation: the task awaiting a call awaits grpc's own task, which catches the
    CancelledError and ends the call instead, so the caller gets an answer (or a gRPC error) and
    never sees it. A loop that stops only by cancellation (the leader election, the mirror) then
    goes on for ever, and whoever stops it (`Replication.stop`, `ballast serve`'s shutdown) waits
    for it for ever."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _registration(replica_id: str, raw: bytes) -> dict[str, Any]:
    info: Any = None
    if len(raw) <= MAX_REGISTRATION_BYTES:
        with contextlib.suppress(ValueError, RecursionError):
            info = json.loads(raw)
    if not isinstance(info, dict):
        log.warning("replica %r registered a value that is not one (%d bytes)",
                    replica_id[:64], len(raw))
        info = {}
    return {**info, "id": replica_id}


def _shown(raw: bytes) -> str:
    text = raw.decode(errors="replace")
    return text if len(text) <= 64 else text[:64] + "…"


def _dump(value: Any) -> bytes:
    """JSON in UTF-8 (not \\u-escaped: a desired-state file's text keeps its size)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()

