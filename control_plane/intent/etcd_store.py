"""The running intent in etcd, for several Ballast replicas: one leader writes, every replica reads.

Keys, all under one prefix (default ``/ballast/``):

- ``leader`` — the elected replica's id, attached to its lease. The key's create revision is the
  leader's **term**: it grows with every election, and a write is fenced by comparing it (etcd's
  own election recipe), so a leader whose lease expired — paused, partitioned — can never write
  again: its transaction's compare fails and it steps down.
- ``intent/groups/<pop>/<group>`` — weights and controller streaks of a (PoP, origin group).
- ``intent/tiers/<pop>/<group>`` — an active tier state.
- ``intent/digest`` — the digest of the desired state the intent was decided for.
- ``records/<term:016x>/<n:08x>`` — decision records written in the same transaction as the intent
  change they explain; every replica appends them to its own log, so ``ballast decisions`` reads
  the same history from any replica. They carry the records lease (an hour): etcd is the
  hand-off, not the archive.
- ``replicas/<id>`` — each replica's registration (admin URL, xDS address), on its own lease.

This module is the thin I/O adapter (aetcd over grpc.aio); what the keys hold is decided elsewhere.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aetcd
import aetcd.exceptions

log = logging.getLogger(__name__)

MAX_ENDPOINTS = 16
RECORDS_TTL_S = 3600


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
    """What one reconcile decision changes, committed atomically with its records."""

    put: dict[str, Any] = field(default_factory=dict)  # relative key -> JSON value
    delete: list[str] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.put or self.delete or self.records)


class EtcdStore:
    """One connection to an etcd cluster (endpoints tried in order) under ``prefix``."""

    def __init__(
        self,
        endpoints: Sequence[tuple[str, int]],
        *,
        prefix: str = "/ballast/",
        timeout_s: float = 2.0,
    ) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoints")
        self.endpoints = list(endpoints)
        self.prefix = prefix if prefix.endswith("/") else prefix + "/"
        self.timeout_s = timeout_s
        self._client: aetcd.Client | None = None
        self._endpoint = 0
        self._records_lease: tuple[int, int] | None = None  # (term, lease id)
        self._record_counter = 0

    # -- connection ------------------------------------------------------------------------

    def _key(self, relative: str) -> bytes:
        return (self.prefix + relative).encode()

    def _relative(self, key: bytes, under: str) -> str:
        return key.decode()[len(self.prefix + under):]

    async def _connected(self) -> aetcd.Client:
        if self._client is None:
            host, port = self.endpoints[self._endpoint]
            self._client = aetcd.Client(host=host, port=port, timeout=self.timeout_s)
            await self._client.connect()
        return self._client

    async def _failed(self, err: BaseException) -> StoreUnavailable:
        """Drop the connection and move to the next endpoint; the error to raise."""
        client, self._client = self._client, None
        self._endpoint = (self._endpoint + 1) % len(self.endpoints)
        if client is not None:
            try:
                await client.close()
            except Exception as close_err:  # a broken channel may fail to close: nothing to keep
                log.debug("closing etcd client: %s", close_err)
        return StoreUnavailable(f"etcd unavailable: {type(err).__name__}: {err}")

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        try:
            client = await self._connected()
            return await getattr(client, name)(*args, **kwargs)
        except (aetcd.exceptions.ClientError, OSError, TimeoutError) as err:
            raise await self._failed(err) from err

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
        try:
            ok, _ = await client.transaction(
                compare=[tx.version(leader) == 0],
                success=[tx.put(leader, replica_id.encode(), lease=lease_id)],
                failure=[],
            )
        except (aetcd.exceptions.ClientError, OSError, TimeoutError) as err:
            raise await self._failed(err) from err
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
        except (aetcd.exceptions.ClientError, OSError) as err:
            raise await self._failed(err) from err
        finally:
            await watch.cancel()

    # -- intent ----------------------------------------------------------------------------

    async def load(self) -> tuple[int, dict[str, Any]]:
        """(revision, relative key -> value) of everything under ``intent/``."""
        client = await self._connected()
        try:
            result = await client.get_prefix(self._key("intent/"))
        except (aetcd.exceptions.ClientError, OSError, TimeoutError) as err:
            raise await self._failed(err) from err
        values = {self._relative(kv.key, "intent/"): json.loads(kv.value) for kv in result}
        return int(result.header.revision), values

    async def commit(self, leadership: Leadership, write: IntentWrite) -> int:
        """Apply ``write`` in one transaction fenced by the leader's term; the revision.

        Raises Deposed when the leader key is not this term's any more (nothing written)."""
        client = await self._connected()
        tx = client.transactions
        leader = self._key("leader")
        try:
            records_lease = await self._records_lease_for(leadership.term)
            ops: list[Any] = [
                tx.put(self._key("intent/" + key), _dump(value)) for key, value in write.put.items()
            ]
            ops += [tx.delete(self._key("intent/" + key)) for key in write.delete]
            for record in write.records:
                self._record_counter += 1
                name = f"records/{leadership.term:016x}/{self._record_counter:08x}"
                ops.append(tx.put(self._key(name), _dump(record), lease=records_lease))
            ok, responses = await client.transaction(
                compare=[tx.create(leader) == leadership.term], success=ops, failure=[]
            )
        except (aetcd.exceptions.ClientError, OSError, TimeoutError) as err:
            raise await self._failed(err) from err
        if not ok:
            raise Deposed(f"leader key is no longer term {leadership.term}")
        return _revision_of(responses)

    async def _records_lease_for(self, term: int) -> int:
        if self._records_lease is None or self._records_lease[0] != term:
            lease = await (await self._connected()).lease(RECORDS_TTL_S)
            self._records_lease = (term, int(lease.id))
            self._record_counter = 0
        return self._records_lease[1]

    async def watch_intent(self, start_revision: int) -> AsyncIterator[IntentEvent]:
        """Every change under ``intent/`` and ``records/`` from ``start_revision`` on."""
        client = await self._connected()
        try:
            watch = await client.watch_prefix(self.prefix.encode(), start_revision=start_revision)
        except (aetcd.exceptions.ClientError, OSError, TimeoutError) as err:
            raise await self._failed(err) from err
        try:
            async for event in watch:
                key = event.kv.key.decode(errors="replace")[len(self.prefix):]
                if not key.startswith(("intent/", "records/")):
                    continue
                deleted = event.kind == aetcd.rtypes.EventKind.DELETE
                value = None if deleted else json.loads(event.kv.value)
                yield IntentEvent(int(event.kv.mod_revision), key, value)
        except (aetcd.exceptions.ClientError, OSError) as err:
            raise await self._failed(err) from err
        finally:
            await watch.cancel()

    # -- replicas --------------------------------------------------------------------------

    async def register(self, replica_id: str, info: Mapping[str, Any], lease_id: int) -> None:
        await self._call("put", self._key(f"replicas/{replica_id}"), _dump(info), lease=lease_id)

    async def replicas(self) -> list[dict[str, Any]]:
        result = await self._call("get_prefix", self._key("replicas/"))
        return [json.loads(kv.value) for kv in result]


def _dump(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _revision_of(responses: Iterable[Any]) -> int:
    """The store revision a transaction's writes landed at (0 when it wrote nothing)."""
    revision = 0
    for response in responses or ():
        kind = response.WhichOneof("response")
        revision = max(revision, int(getattr(response, kind).header.revision))
    return revision
