"""The running intent in etcd, for several Ballast replicas: one leader writes, every replica reads.

Keys, all under one prefix (default ``/ballast/``):

- ``leader`` — the elected replica's id, attached to its lease. The key's create revision is the
  leader's **term**: it grows with every election, and a write is fenced by comparing it (etcd's
  own election recipe), so a leader whose lease expired — paused, partitioned — can never write
  again: its transaction's compare fails and it stops leading.
- ``intent/groups/<pop>/<group>`` — weights and controller streaks of a (PoP, origin group).
- ``intent/tiers/<pop>/<group>`` — an active tier state.
- ``intent/digest`` — the digest of the desired state the intent was decided for.
- ``decisions/<replica>/<n>`` — the decision records each replica writes, handed to the others:
  every replica appends the others' records to its own log, so ``ballast decisions`` reads the
  same history from any replica. They carry a lease of an hour: etcd is the hand-off, not the
  archive.
- ``replicas/<id>`` — each replica's registration (admin URL, xDS address), on its own lease.
- ``acks/<id>`` — the ACK state of the nodes connected to that replica (`app/config_acks.py`,
  `SharedAcks`), on the same lease as its registration: a replica that dies takes its nodes
  with it when the lease expires.

Reaching etcd (`StoreCredentials`): client TLS (the CA etcd's certificate chains to; a client
certificate and key, whose CN etcd takes as the user with ``--client-cert-auth``) and/or a user
and password (etcd's simple-token authentication). aetcd 1.0 dials plaintext only: `_Client`
adds the TLS channel. The files are read at every (re)connection, so rotated ones are used from
the next one on; the password never leaves this module.

This module is the thin I/O adapter (aetcd over grpc.aio); what the keys hold is decided elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aetcd
import grpc
from aetcd import rpc, watcher

log = logging.getLogger(__name__)

MAX_ENDPOINTS = 16
RECORDS_TTL_S = 3600
MAX_TXN_OPS = 100  # etcd refuses a transaction of more than 128 operations
MAX_CREDENTIAL_FILE = 1 << 20

T = TypeVar("T")


class StoreUnavailable(Exception):
    """etcd did not answer (in time): nothing was written."""


class Deposed(Exception):
    """A fenced write was refused: this replica is not the leader of that term any more."""


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
    """One change seen by a watch: ``value`` is None when the key was deleted."""

    revision: int
    key: str  # relative to the intent prefix, e.g. "groups/ewr/shop"
    value: Any


@dataclass
class IntentWrite:
    """What one intent batch changes under ``intent/``, committed atomically."""

    put: dict[str, Any] = field(default_factory=dict)  # relative key -> JSON value
    delete: list[str] = field(default_factory=list)


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
        """One attempt to become leader: the leader key is created only if absent."""
        client = await self._connected()
        leader = self._key("leader")
        tx = client.transactions
        ok, _ = await self._rpc(client.transaction(
            compare=[tx.version(leader) == 0],
            success=[tx.put(leader, replica_id.encode(), lease=lease_id)],
            failure=[],
        ))
        if not ok:
            return None
        current = await self.leader()
        if current is None or current[0] != replica_id:
            return None
        return Leadership(term=current[1], lease_id=lease_id)

    async def leader(self) -> tuple[str, int] | None:
        """(replica id, term) of the current leader, or None."""
        result = await self._call("get", self._key("leader"))
        if result is None:
            return None
        return result.value.decode(errors="replace"), int(result.create_revision)

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
        """(revision, relative key -> value) of everything under ``intent/``."""
        client = await self._connected()
        result = await self._rpc(client.get_prefix(self._key("intent/")))
        values = {self._relative(kv.key, "intent/"): json.loads(kv.value) for kv in result}
        return int(result.header.revision), values

    async def commit(self, leadership: Leadership, write: IntentWrite) -> None:
        """Apply ``write`` in one transaction fenced by the leader's term.

        Raises Deposed when the leader key is not this term's any more (nothing written)."""
        client = await self._connected()
        tx = client.transactions
        ops: list[Any] = [
            tx.put(self._key("intent/" + key), _dump(value)) for key, value in write.put.items()
        ]
        ops += [tx.delete(self._key("intent/" + key)) for key in write.delete]
        ok, _ = await self._rpc(client.transaction(
            compare=[tx.create(self._key("leader")) == leadership.term],
            success=ops,
            failure=[],
        ))
        if not ok:
            raise Deposed(f"leader key is no longer term {leadership.term}")

    async def publish_records(self, source: str, records: Sequence[Mapping[str, Any]]) -> None:
        """Hand decision records to the other replicas (``decisions/<source>/<n>``, on a lease of
        an hour: etcd is the hand-off, each replica's own log is the archive)."""
        client = await self._connected()
        tx = client.transactions
        try:
            if self._records_lease is None:
                self._records_lease = int((await client.lease(RECORDS_TTL_S)).id)
            for start in range(0, len(records), MAX_TXN_OPS):
                ops = []
                for record in records[start:start + MAX_TXN_OPS]:
                    self._record_counter += 1
                    name = f"decisions/{source}/{self._record_counter:012x}"
                    ops.append(tx.put(self._key(name), _dump(record), lease=self._records_lease))
                await client.transaction(compare=[], success=ops, failure=[])
        except Exception as err:  # any failure to talk to etcd (gRPC, socket, timeout)
            self._records_lease = None
            _honour_cancellation()
            raise await self._failed(err) from err
        _honour_cancellation()

    async def watch_intent(self, start_revision: int) -> AsyncIterator[IntentEvent]:
        """Every change under ``intent/``, ``decisions/`` and ``acks/`` from ``start_revision``
        on, and of the membership (the ``leader`` key, ``replicas/``: value None, only that it
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
                value = None if deleted else json.loads(event.kv.value)
                yield IntentEvent(int(event.kv.mod_revision), key, value)
        except Exception as err:  # any failure to talk to etcd (gRPC, socket, timeout)
            raise await self._failed(err) from err
        finally:
            await self._tidy(watch.cancel())

    # -- replicas --------------------------------------------------------------------------

    async def register(self, replica_id: str, info: Mapping[str, Any], lease_id: int) -> None:
        await self._call("put", self._key(f"replicas/{replica_id}"), _dump(info), lease=lease_id)

    async def replicas(self) -> list[dict[str, Any]]:
        result = await self._call("get_prefix", self._key("replicas/"))
        return [json.loads(kv.value) for kv in result]

    async def share_acks(self, replica_id: str, value: Mapping[str, Any] | None,
                         lease_id: int) -> None:
        """This replica's nodes' ACK state (``acks/<id>``, on its registration's lease), or
        none (None: the key deleted)."""
        key = self._key(f"acks/{replica_id}")
        if value is None:
            await self._call("delete", key)
        else:
            await self._call("put", key, _dump(value), lease=lease_id)

    async def shared_acks(self) -> dict[str, Any]:
        """Replica id -> the ACK state it shares (every live replica's ``acks/<id>``)."""
        result = await self._call("get_prefix", self._key("acks/"))
        return {self._relative(kv.key, "acks/"): json.loads(kv.value) for kv in result}


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


def _dump(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()

