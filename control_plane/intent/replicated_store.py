"""The running intent kept in etcd for several replicas: the `IntentStore` of `--store etcd://`.

Only the leader writes, and each write is one etcd transaction fenced by its term (see
`etcd_store.py`); a replica that is not (or no longer) the leader gets `Deposed` and nothing is
written. Every replica reads the same keys back — at start-up (`read`) and continuously from a
watch (`IntentMirror`), so all replicas hold the same intent and every Envoy of a PoP gets the
same versions whichever replica it talks to.

Layout under ``<prefix>intent/`` (values are JSON):
``groups/<pop>/<group>`` ``{"weights": ..., "controller": ...}``; ``kinds/<kind>/<key>`` any
record of another kind of intent (the tier controller's and the standby ramp's states are kinds
``tier`` and ``ramp``, keys ``<pop>/<group>``); ``digest`` the desired-state digest decided
under. The mapping both ways is pure (`batch_to_write`, `stored_intent_of`). A write too large
for one etcd transaction is split (`etcd_store.transactions`): the keys a reader starts from —
the digest, the rollout's state, which PoP serves which version (`LAST_KINDS`) — go last and
together, after the values they name (desired-state versions, baselines, pairs).

Every value read is checked for what its key holds (`checked`): one that is not JSON, or not
the shape of its key's kind (weights, a controller's, a tier's or a ramp's state, a rollout, a
desired-state version, which PoP serves which), is **quarantined**: left out of the intent as if
absent, on every replica alike, and reported with its key (`Quarantine`: the replication records
it and shows it in `/status`) until it is rewritten or deleted. So one bad value written by
another hand stops no replica's start-up and no follower's adoption.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from control_plane.decide.controller import ControllerState
from control_plane.decide.ramp import RampState
from control_plane.decide.rollout import Rollout
from control_plane.decide.tiers import TierState
from control_plane.intent.etcd_store import (
    WRITING,
    Deposed,
    EtcdStore,
    IntentWrite,
    Leadership,
    Unreadable,
)
from control_plane.intent.store import (
    RAMP_KIND,
    ROLLOUT_BEFORE_KIND,
    ROLLOUT_KIND,
    SERVING_KIND,
    TIER_KIND,
    VERSION_KIND,
    GroupState,
    IntentBatch,
    StateCorrupted,
    StoredIntent,
    check_weights,
)

GROUPS = "groups/"
KINDS = "kinds/"
DIGEST = "digest"
LAST_KINDS = (ROLLOUT_KIND, SERVING_KIND)  # records that name other records (versions)


def batch_to_write(batch: IntentBatch) -> IntentWrite:
    """The etcd puts and deletes of one intent batch, each key once (etcd refuses a transaction
    naming a key twice). Within a batch, as in the SQLite store: pairs are saved, then forgotten,
    then records put or deleted in their order; the last word on a key wins."""
    final: dict[str, Any] = {}  # key -> value, None: delete
    for pop, group, weights, controller in batch.groups:
        final[f"{GROUPS}{pop}/{group}"] = {
            "weights": check_weights(weights),
            "controller": controller.to_dict(),
        }
    for pop, group in batch.forget_groups:
        final[f"{GROUPS}{pop}/{group}"] = None
    for kind, key, value in batch.records:
        final[f"{KINDS}{kind}/{key}"] = value
    if batch.desired_digest is not None:
        final[DIGEST] = batch.desired_digest
    named = tuple(f"{KINDS}{kind}/" for kind in LAST_KINDS)
    return IntentWrite(
        put={key: value for key, value in final.items() if value is not None},
        delete=[key for key, value in final.items() if value is None],
        last=frozenset(key for key in final if key == DIGEST or key.startswith(named)),
    )


Quarantine = Callable[[Mapping[str, str]], None]  # told every key left out now, and why


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"{type(value).__name__}, not an object")
    return value


def _version(value: Any) -> None:
    held = _object(value)
    if not isinstance(held.get("yaml"), str) or not isinstance(held.get("source"), str):
        raise ValueError("a desired-state version needs the strings yaml and source")


def _serving(value: Any) -> None:
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in _object(value).items()):
        raise ValueError("not PoP -> version digest")


def _rollout(value: Any) -> None:
    Rollout.from_dict(_object(value)["rollout"])
    _object(_object(value).get("failed", {}))


# what a record of each kind must parse as (kinds not listed: any JSON, a newer replica's)
KIND_CHECKS: dict[str, Callable[[Any], object]] = {
    TIER_KIND: TierState.from_dict, RAMP_KIND: RampState.from_dict, ROLLOUT_KIND: _rollout,
    VERSION_KIND: _version, SERVING_KIND: _serving, ROLLOUT_BEFORE_KIND: _object,
}
MAX_WHY_CHARS = 300


def checked(values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The intent keys whose values are what their key holds, and the others: key -> why."""
    good: dict[str, Any] = {}
    bad: dict[str, str] = {}
    for key, value in values.items():
        why = value.why if isinstance(value, Unreadable) else None
        try:
            if why is None:
                stored_intent_of({key: value}, where="")  # the key's own shape
                kind = key[len(KINDS):].partition("/")[0] if key.startswith(KINDS) else ""
                KIND_CHECKS.get(kind, lambda _: None)(value)
        except StateCorrupted as exc:  # "<where>: intent/<key>: <why>"
            why = str(exc.__cause__ or exc)
        except (KeyError, TypeError, ValueError, RecursionError) as exc:
            why = f"{type(exc).__name__}: {exc}"
        if why is None:
            good[key] = value
        else:
            bad[key] = why if len(why) <= MAX_WHY_CHARS else why[:MAX_WHY_CHARS] + "…"
    return good, bad


def stored_intent_of(values: Mapping[str, Any], *, where: str) -> StoredIntent:
    """What the intent keys hold, checked; StateCorrupted (naming `where` and the key) otherwise."""
    groups: dict[tuple[str, str], GroupState] = {}
    records: dict[str, dict[str, Any]] = {}
    digest: str | None = None
    for key, value in sorted(values.items()):
        try:
            if key.startswith(GROUPS):
                pop, _, group = key[len(GROUPS):].partition("/")
                if not pop or not group or not isinstance(value, dict):
                    raise ValueError("not a (PoP, group) entry")
                groups[(pop, group)] = GroupState(
                    check_weights(value.get("weights", {})),
                    ControllerState.from_dict(value.get("controller")),
                )
            elif key.startswith(KINDS):
                kind, _, name = key[len(KINDS):].partition("/")
                if not kind or not name:
                    raise ValueError("not a <kind>/<key> record")
                records.setdefault(kind, {})[name] = value
            elif key == WRITING:  # a write under way (`etcd_store.marked`): no intent
                continue
            elif key == DIGEST:
                if not isinstance(value, str):
                    raise ValueError("digest is not a string")
                digest = value
            else:
                raise ValueError("unknown intent key")
        except (TypeError, ValueError) as exc:
            raise StateCorrupted(f"{where}: intent/{key}: {exc}") from exc
    tiers = records.pop(TIER_KIND, {})
    ramps = records.pop(RAMP_KIND, {})
    return StoredIntent(groups, tiers, digest, ramps, records)


class ReplicatedStore:
    """`IntentStore` on etcd: reads for everyone, fenced writes for the leader only."""

    def __init__(self, etcd: EtcdStore, leadership: Callable[[], Leadership | None],
                 quarantine: Quarantine = lambda bad: None) -> None:
        self.etcd = etcd
        self._leadership = leadership
        self._quarantine = quarantine
        self.revision = 0  # the store revision the last `read` saw
        self.where = f"etcd://{','.join(f'{h}:{p}' for h, p in etcd.endpoints)}{etcd.prefix}"

    async def read(self) -> StoredIntent:
        self.revision, values = await self.etcd.load()
        return self.intent_of(values)

    def intent_of(self, values: Mapping[str, Any]) -> StoredIntent:
        """What `values` (relative key -> decoded value) hold, bad values quarantined."""
        good, bad = checked(values)
        self._quarantine(bad)
        return stored_intent_of(good, where=self.where)

    async def write(self, batch: IntentBatch) -> None:
        if not batch:
            return
        lead = self._leadership()
        if lead is None:
            raise Deposed("this replica is not the leader: intent is written by the leader only")
        await self.etcd.commit(lead, batch_to_write(batch))

    async def settle(self) -> None:
        """A new leader clears the mark of a write its predecessor broke off (what landed of it
        is the intent now: the new leader adopted it), so the followers adopt again."""
        lead = self._leadership()
        if lead is None:
            raise Deposed("this replica is not the leader: intent is written by the leader only")
        await self.etcd.commit(lead, IntentWrite())

    def close(self) -> None:
        """The etcd connection belongs to the service, which closes it."""
