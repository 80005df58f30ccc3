"""Per-PoP snapshots: translated resources per (PoP, capability key), shared by every node.

The cache knows nothing of gRPC or streams. It holds the desired state, the current origin
weights and the tier actions active per (PoP, group), translates lazily the first time a (PoP,
capability key) is asked for, and keeps the result (payloads serialized once) until the desired
state, a weight or tier action of that PoP or a capability override changes. Every update
re-translates only the affected PoPs, incrementally (the translator gets the entry it replaces
and re-builds only the resources whose inputs changed), compares the new resources with the old
ones and tells its listener which PoPs really changed; an entry that did not change stays the
same object.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from control_plane.desired.model import Desired, GroupWeights, OriginGroup, TierActions
from control_plane.translate import UnknownPop, translate_pop
from control_plane.translate.resources import Capabilities, PopResources
from control_plane.translate.routes import check_tier_actions
from control_plane.translate.weights import WeightsError, check_group_weights

log = logging.getLogger(__name__)

class Translator(Protocol):
    """`translate_pop`'s shape: `previous` is the entry being replaced, whose unchanged resources
    an incremental translator takes over."""

    def __call__(
        self, desired: Desired, pop: str, weights: Mapping[str, GroupWeights], caps: Capabilities,
        tier_actions: Mapping[str, TierActions], *, previous: PopResources | None = None,
    ) -> PopResources: ...

ChangeListener = Callable[[frozenset[str]], None]


@dataclass(frozen=True)
class EffectiveCapabilities:
    """The capabilities a node's resources are translated for, and why."""

    capabilities: Capabilities
    reason: str


def same_content(new: PopResources, old: PopResources) -> bool:
    """Equal (type, name, version) everywhere and equal notes: nothing to push. Resources an
    incremental translation took over are the same objects, so mostly identities are compared."""
    if new.notes != old.notes or new.by_type.keys() != old.by_type.keys():
        return False
    for type_url, items in new.by_type.items():
        before = old.by_type[type_url]
        if items is before:
            continue
        if items.keys() != before.keys():
            return False
        for name, item in items.items():
            other = before[name]
            if item is not other and item.version != other.version:
                return False
    return True


@dataclass(frozen=True)
class PreparedDesired:
    """A new desired state translated off the cache (`SnapshotCache.prepare_desired`)."""

    desired: Desired
    weights: dict[str, dict[str, GroupWeights]]  # what still fits the new desired state
    tier_actions: dict[str, dict[str, TierActions]]
    entries: dict[tuple[str, str], PopResources]
    changed: frozenset[str]
    base: int  # the cache's change count when its state was read
    translated: int  # entries translated


@dataclass(frozen=True)
class WarmEntries:
    """Entries translated ahead of their first node (`SnapshotCache.prepare_entries`)."""

    desired: Desired
    entries: dict[tuple[str, str], PopResources]
    base: int


class SnapshotCache:
    def __init__(self, desired: Desired, *, translator: Translator = translate_pop) -> None:
        self._desired = desired
        self._translate = translator
        self._weights: dict[str, dict[str, GroupWeights]] = {}
        self._tier_actions: dict[str, dict[str, TierActions]] = {}  # pop -> group -> actions
        self._overrides: dict[str, Capabilities] = {}
        self._entries: dict[tuple[str, str], PopResources] = {}
        self._cap_keys: set[str] = set()  # every capability key an entry was made for
        self._changes = 0  # counts changes; `_touched[pop]`: the count at the PoP's last one
        self._touched: dict[str, int] = {}
        self._listeners: list[ChangeListener] = []
        self.translations = 0  # how many times translate ran (tests, metrics)

    # -- reading ---------------------------------------------------------------------------

    @property
    def desired(self) -> Desired:
        return self._desired

    def has_pop(self, pop: str) -> bool:
        return pop in self._desired.pop_names

    def effective_capabilities(
        self, pop: str, advertised: Capabilities, why: str = "node.extensions"
    ) -> EffectiveCapabilities:
        """A PoP override (set by an operator or a test) wins over what the node advertised."""
        override = self._overrides.get(pop)
        if override is not None:
            return EffectiveCapabilities(override, f"override for PoP {pop}")
        return EffectiveCapabilities(advertised, why)

    def resources(self, pop: str, caps: Capabilities) -> PopResources:
        """The PoP's resources for nodes with `caps`; translated once, then shared."""
        key = (pop, caps.key)
        entry = self._entries.get(key)
        if entry is None:
            if not self.has_pop(pop):
                raise UnknownPop(
                    f"unknown PoP {pop!r}; known: {', '.join(self._desired.pop_names)}"
                )
            entry = self._build(self._desired, pop, caps)
            self._entries[key] = entry
            self._cap_keys.add(caps.key)
            self._touch(pop)
        return entry

    def cached(self, pop: str, caps: Capabilities) -> PopResources | None:
        """The PoP's resources for `caps` if they were translated already (never translates)."""
        return self._entries.get((pop, caps.key))

    def weights(self, pop: str, group: str) -> GroupWeights:
        """Current weights of (PoP, origin group): pushed ones, else the starting weights."""
        self._check_pop(pop)
        pushed = self._weights.get(pop, {}).get(group)
        if pushed is not None:
            return dict(pushed)
        return self._group(group).home_weights(pop)

    def tier_actions(self, pop: str, group: str) -> TierActions | None:
        """The tier actions active for (PoP, group); None when none are."""
        self._check_pop(pop)
        return self._tier_actions.get(pop, {}).get(group)

    def pushed_weights(self) -> dict[str, dict[str, GroupWeights]]:
        """Only the weights set by `update_weights` (every other pair is at its home weights):
        for faces of a large fleet that look for pairs away from home."""
        return {
            pop: {g: dict(w) for g, w in groups.items()} for pop, groups in self._weights.items()
        }

    def all_tier_actions(self) -> dict[str, dict[str, TierActions]]:
        """PoP -> group -> active tier actions, only where some are active."""
        return {pop: dict(groups) for pop, groups in self._tier_actions.items() if groups}

    def all_weights(self) -> dict[str, dict[str, GroupWeights]]:
        return {
            pop: {g.name: self.weights(pop, g.name) for g in self._desired.origin_groups}
            for pop in self._desired.pop_names
        }

    # -- changing --------------------------------------------------------------------------

    def add_listener(self, listener: ChangeListener) -> None:
        """`listener(pops)` is called with the PoPs whose resources changed."""
        self._listeners.append(listener)

    def update_weights(self, pop: str, group: str, weights: Mapping[str, int]) -> bool:
        """Set one (PoP, group)'s weights; True if the PoP's resources changed.

        Raises `UnknownPop` / `WeightsError` (state untouched) for weights that do not fit.
        """
        self._check_pop(pop)
        check_group_weights(self._group(group), weights)
        before = self._weights.get(pop, {}).get(group)
        self._weights.setdefault(pop, {})[group] = dict(weights)
        try:
            changed = self._rebuild(self._desired, {pop})
        except Exception:
            self._restore_weights(pop, group, before)
            raise
        return bool(changed)

    def set_tier_actions(self, pop: str, group: str, actions: TierActions | None) -> bool:
        """Set (or with None, lift) one (PoP, group)'s active tier actions; True if the PoP's
        resources changed (only its routes can). Only that PoP is re-translated.

        Raises `UnknownPop` / `WeightsError` / ValueError (state untouched) when they do not fit.
        """
        self._check_pop(pop)
        if actions is not None:
            check_tier_actions(self._group(group), actions)
        before = self._tier_actions.get(pop, {}).get(group)
        if before == actions:
            return False
        self._set_actions(pop, group, actions)
        try:
            changed = self._rebuild(self._desired, {pop})
        except Exception:
            self._set_actions(pop, group, before)
            raise
        return bool(changed)

    def _set_actions(self, pop: str, group: str, actions: TierActions | None) -> None:
        groups = self._tier_actions.setdefault(pop, {})
        if actions is None:
            groups.pop(group, None)
        else:
            groups[group] = actions

    def update_desired(self, desired: Desired) -> frozenset[str]:
        """Swap in a new desired state; returns (and announces) the PoPs whose config changed.

        Weights that no longer fit (origin group or origins gone) fall back to the starting
        weights, tier actions naming a tier the group no longer has are dropped (the next
        reconcile tick sets them again from the new policy); PoPs that disappeared count as
        changed so their streams can be told. The same as `commit_desired(prepare_desired(d)())`,
        all on the caller's thread.
        """
        return self.commit_desired(self.prepare_desired(desired)())

    def prepare_desired(self, desired: Desired) -> Callable[[], PreparedDesired]:
        """Read the cache's state now; the returned call does the translation work of
        `update_desired` and touches nothing of the cache, so it may run on a worker thread
        while the event loop keeps serving (and changing weights). `commit_desired` applies it."""
        weights = {pop: dict(groups) for pop, groups in self._weights.items()}
        actions = {pop: dict(groups) for pop, groups in self._tier_actions.items()}
        entries = dict(self._entries)
        base = self._changes
        translate = self._translate

        def prepare() -> PreparedDesired:
            kept = _fitting_weights(desired, weights)
            kept_actions = _fitting_actions(desired, actions)
            fresh: dict[tuple[str, str], PopResources] = {}
            changed: set[str] = set()
            for (pop, cap_key), old in entries.items():
                if pop not in desired.pop_names:
                    changed.add(pop)
                    continue
                new = translate(desired, pop, kept.get(pop, {}), old.capabilities,
                                kept_actions.get(pop, {}), previous=old)
                if same_content(new, old):
                    fresh[(pop, cap_key)] = old
                else:
                    fresh[(pop, cap_key)] = new
                    changed.add(pop)
            return PreparedDesired(desired, kept, kept_actions, fresh, frozenset(changed), base,
                                   len(entries))

        return prepare

    def commit_desired(self, prepared: PreparedDesired) -> frozenset[str]:
        """Swap in what `prepare_desired` made. PoPs whose weights, tier actions or entries
        changed after it read the cache are re-translated now (incrementally) from their
        current values; returns (and announces) every PoP whose config changed."""
        desired = prepared.desired
        weights = {pop: dict(groups) for pop, groups in prepared.weights.items()}
        actions = {pop: dict(groups) for pop, groups in prepared.tier_actions.items()}
        entries = dict(prepared.entries)
        late = {pop for pop, at in self._touched.items()
                if at > prepared.base and pop in desired.pop_names}
        for pop in late:
            weights[pop] = _fitting_weights(desired, {pop: self._weights.get(pop, {})}).get(
                pop, {})
            actions[pop] = _fitting_actions(desired, {pop: self._tier_actions.get(pop, {})}).get(
                pop, {})
            entries.update({key: entry for key, entry in self._entries.items()
                            if key[0] == pop and key not in entries})
        saved = (self._desired, self._weights, self._tier_actions, self._entries)
        self._desired, self._weights, self._tier_actions, self._entries = (
            desired, weights, actions, entries)
        try:
            late_changed = self._rebuild(desired, late, announce=False)
        except Exception:
            self._desired, self._weights, self._tier_actions, self._entries = saved
            raise
        self._touch(*desired.pop_names)
        self.translations += prepared.translated
        changed = prepared.changed | late_changed
        if changed:
            self._announce(changed)
        return changed

    def prepare_entries(
        self, caps: Capabilities, pops: Iterable[str] | None = None
    ) -> Callable[[], WarmEntries]:
        """Like `prepare_desired`, for translating `pops` (default: all) for `caps` ahead of
        their first node (start-up, off the event loop); `commit_entries` keeps them."""
        desired = self._desired
        wanted = [pop for pop in (desired.pop_names if pops is None else pops)
                  if (pop, caps.key) not in self._entries]
        weights = {pop: dict(self._weights.get(pop, {})) for pop in wanted}
        actions = {pop: dict(self._tier_actions.get(pop, {})) for pop in wanted}
        base = self._changes
        translate = self._translate

        def prepare() -> WarmEntries:
            built = {(pop, caps.key): translate(desired, pop, weights[pop], caps, actions[pop])
                     for pop in wanted}
            return WarmEntries(desired, built, base)

        return prepare

    def commit_entries(self, warm: WarmEntries) -> int:
        """Keep the prepared entries that still hold (same desired state, PoP untouched since,
        no entry made meanwhile); returns how many were kept."""
        if warm.desired is not self._desired:
            return 0
        kept = 0
        for key, entry in warm.entries.items():
            if key not in self._entries and self._touched.get(key[0], -1) <= warm.base:
                self._entries[key] = entry
                self._cap_keys.add(key[1])
                kept += 1
        return kept

    def override_capabilities(self, pop: str, caps: Capabilities | None) -> None:
        """Force `caps` onto every node of `pop` (None: back to what nodes advertise)."""
        self._check_pop(pop)
        if caps is None:
            self._overrides.pop(pop, None)
        else:
            self._overrides[pop] = caps
        self._announce(frozenset({pop}))

    # -- internals -------------------------------------------------------------------------

    def _build(
        self, desired: Desired, pop: str, caps: Capabilities, previous: PopResources | None = None
    ) -> PopResources:
        weights = self._weights.get(pop, {})
        self.translations += 1
        return self._translate(desired, pop, weights, caps, self._tier_actions.get(pop, {}),
                               previous=previous)

    def _rebuild(
        self, desired: Desired, pops: set[str], *, announce: bool = True
    ) -> frozenset[str]:
        """Re-translate the cached entries of `pops` against `desired`; swap only if all work."""
        fresh: dict[tuple[str, str], PopResources] = {}
        changed: set[str] = set()
        mine = [  # by key, not by scanning every entry: a weight change costs one PoP's work
            ((pop, cap_key), self._entries[(pop, cap_key)])
            for pop in pops for cap_key in self._cap_keys if (pop, cap_key) in self._entries
        ]
        for (pop, cap_key), old in mine:
            if pop not in desired.pop_names:
                changed.add(pop)
                continue
            new = self._build(desired, pop, old.capabilities, previous=old)
            if not same_content(new, old):
                changed.add(pop)
                fresh[(pop, cap_key)] = new
            else:  # equal: keep the snapshot every stream already indexed
                fresh[(pop, cap_key)] = old
        for key, _ in mine:
            del self._entries[key]
        self._entries.update(fresh)
        result = frozenset(changed)
        self._touch(*pops)
        if result and announce:
            self._announce(result)
        return result

    def _touch(self, *pops: str) -> None:
        """Remember that these PoPs' inputs or entries changed now (see `commit_desired`)."""
        self._changes += 1
        for pop in pops:
            self._touched[pop] = self._changes

    def _announce(self, pops: frozenset[str]) -> None:
        log.debug("snapshots changed for PoPs %s", ", ".join(sorted(pops)))
        for listener in self._listeners:
            listener(pops)

    def _restore_weights(self, pop: str, group: str, before: GroupWeights | None) -> None:
        if before is None:
            self._weights[pop].pop(group, None)
        else:
            self._weights[pop][group] = before

    def _check_pop(self, pop: str) -> None:
        if not self.has_pop(pop):
            raise UnknownPop(f"unknown PoP {pop!r}; known: {', '.join(self._desired.pop_names)}")

    def _group(self, name: str) -> OriginGroup:
        for group in self._desired.origin_groups:
            if group.name == name:
                return group
        known = ", ".join(g.name for g in self._desired.origin_groups)
        raise WeightsError(f"unknown origin group {name!r}; known: {known}")


def _fitting_weights(
    desired: Desired, weights: Mapping[str, Mapping[str, GroupWeights]]
) -> dict[str, dict[str, GroupWeights]]:
    groups = {group.name: group for group in desired.origin_groups}
    pops = set(desired.pop_names)
    kept: dict[str, dict[str, GroupWeights]] = {}
    for pop, by_group in weights.items():
        if pop not in pops:
            continue
        for name, group_weights in by_group.items():
            group = groups.get(name)
            if group is None:
                continue
            try:
                check_group_weights(group, group_weights)
            except WeightsError:
                continue
            kept.setdefault(pop, {})[name] = group_weights
    return kept


def _fitting_actions(
    desired: Desired, actions: Mapping[str, Mapping[str, TierActions]]
) -> dict[str, dict[str, TierActions]]:
    groups = {group.name: group for group in desired.origin_groups}
    pops = set(desired.pop_names)
    kept: dict[str, dict[str, TierActions]] = {}
    for pop, by_group in actions.items():
        if pop not in pops:
            continue
        for name, group_actions in by_group.items():
            group = groups.get(name)
            if group is None:
                continue
            try:
                check_tier_actions(group, group_actions)
            except ValueError:
                continue
            kept.setdefault(pop, {})[name] = group_actions
    return kept
