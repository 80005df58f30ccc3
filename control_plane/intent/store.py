"""Where the running intent is kept across restarts: the narrow interface every store implements.

A store reads everything once (`read`, at start-up) and then takes atomic batches (`write`):
each batch is one transaction, durable when `write` returns. Both are coroutines, so a store
that talks to a server (etcd) fits as well as the local SQLite file (`sqlite_store.py`).

What a batch holds: per (PoP, group) the weights in force with the controller's streaks (or the
pair forgotten), the digest of the desired state applied, and records of any other kind of
intent — kind -> key -> a JSON value, None deleting it — which a store keeps without knowing
what they mean (the tier controller's state is kind `tier`, the standby ramp's kind `ramp`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from control_plane.decide.controller import ControllerState
from control_plane.desired.model import GroupWeights

PairKey = tuple[str, str]  # (PoP, origin group)
TIER_KIND = "tier"  # records of the tier controller's state, keyed "<pop>/<group>"
RAMP_KIND = "ramp"  # records of the standby ramp's state, keyed "<pop>/<group>"
# during a rollout: PoP -> the digest of the desired state it serves while not the target (one
# record, key SERVING_KEY)
SERVING_KIND = "serving"
SERVING_KEY = "pops"
# the bytes of each desired-state version some PoP serves or a rollback needs, keyed by digest
VERSION_KIND = "desired_version"
ROLLOUT_KIND = "rollout"  # the rollout's state, key "current"
# a reached PoP's signals over the bake before its wave started (a gate's baseline), key the PoP
ROLLOUT_BEFORE_KIND = "rollout_before"
StoreRecord = tuple[str, str, Any]  # (kind, key, JSON value or None: delete)


class StateCorrupted(Exception):
    """The stored state cannot be trusted; the message names where and what is wrong."""


class PartlyWritten(Exception):
    """A write that raised after part of its batch was stored (etcd: some of the transactions
    a large write is split in landed, then etcd stopped answering). The writer puts back what
    it had (`IntentOwner`: the change's undo), now or before its next write."""


@dataclass(frozen=True)
class GroupState:
    weights: GroupWeights
    controller: ControllerState


@dataclass(frozen=True)
class StoredIntent:
    """The running intent as a store holds it: everything a store holds."""

    groups: dict[PairKey, GroupState] = field(default_factory=dict)
    tier_decisions: dict[str, Any] = field(default_factory=dict)  # the records of kind `tier`
    desired_digest: str | None = None
    ramps: dict[str, Any] = field(default_factory=dict)  # the records of kind `ramp`
    records: dict[str, dict[str, Any]] = field(default_factory=dict)  # every other kind


@dataclass(frozen=True)
class IntentBatch:
    """One atomic write."""

    groups: tuple[tuple[str, str, GroupWeights, ControllerState], ...] = ()
    forget_groups: tuple[PairKey, ...] = ()
    records: tuple[tuple[str, str, Any], ...] = ()  # (kind, key, JSON value or None: delete)
    desired_digest: str | None = None

    def __bool__(self) -> bool:
        return bool(self.groups or self.forget_groups or self.records or self.desired_digest)


class IntentStore(Protocol):
    async def read(self) -> StoredIntent:
        """Everything stored; raises StateCorrupted on anything that does not parse."""
        ...

    async def write(self, batch: IntentBatch) -> None:
        """Apply `batch`; durable when this returns. Atomic where the store allows (SQLite; etcd
        when it fits in one transaction, else in several in a safe order,
        `etcd_store.transactions`, and `PartlyWritten` when it fails after the first)."""
        ...

    def close(self) -> None: ...


def check_weights(weights: Mapping[str, Any]) -> GroupWeights:
    """Weights as saved: origin -> integer >= 0, summing to 100; ValueError otherwise."""
    if (
        not isinstance(weights, Mapping)
        or not weights
        or not all(isinstance(k, str) for k in weights)
        or any(type(v) is not int or v < 0 for v in weights.values())
        or sum(weights.values()) != 100
    ):
        raise ValueError(f"weights must map origins to integers >= 0 summing to 100: {weights!r}")
    return dict(weights)
