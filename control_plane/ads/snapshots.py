"""The output cache: resources per (PoP, capability key), built once and shared by every node.

The cache knows nothing of gRPC or streams, and nothing of how resources are made. It holds an
opaque *source* (Ballast's running intent) and the embedder's `build(source, pop, caps,
previous)`; `previous` is the entry being replaced, so an incremental builder re-builds only
the resources whose inputs changed. An entry is built lazily the first time a (PoP, capability
key) is asked for and kept (payloads serialized once) until an `update` names its PoP. An update
re-builds only the named PoPs, compares the new resources with the old ones and tells its
listeners which PoPs really changed; an entry that did not change stays the same object, and if
any build raises the cache keeps its source and every entry.

Work that grows with the whole fleet runs off the event loop: `prepare(source, pops)` returns a
call that builds the cached entries of `pops` (default: every PoP) for a new source touching
nothing of the cache (a worker thread may run it while the loop keeps serving and updating);
`commit` swaps it in and re-builds, from the source it is given, the PoPs that changed
meanwhile. `prepare_entries`/`commit_entries` do
the same for building PoPs ahead of their first node.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from control_plane.ads.index import warm_like
from control_plane.translate import UnknownPop
from control_plane.translate.resources import Capabilities, PopResources

log = logging.getLogger(__name__)

S = TypeVar("S")
S_contra = TypeVar("S_contra", contravariant=True)


class Build(Protocol[S_contra]):
    """How an entry is made from the source; `previous` is the entry it replaces, if any."""

    def __call__(
        self, source: S_contra, pop: str, caps: Capabilities, previous: PopResources | None
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
class Prepared(Generic[S]):
    """Every cached entry built for a new source off the cache (`SnapshotCache.prepare`)."""

    source: S
    entries: dict[tuple[str, str], PopResources]
    changed: frozenset[str]
    base: int  # the cache's change count when its state was read
    built: int  # entries built
    pops: frozenset[str] | None  # the PoPs built (None: every PoP)


@dataclass(frozen=True)
class WarmEntries:
    """Entries built ahead of their first node (`SnapshotCache.prepare_entries`)."""

    entries: dict[tuple[str, str], PopResources]
    base: int


class SnapshotCache(Generic[S]):
    def __init__(
        self,
        build: Build[S],
        pops_of: Callable[[S], Sequence[str]],
        source: S,
        narrow: Callable[[S, Capabilities], Capabilities] | None = None,
        release: Callable[[list[object]], None] | None = None,
    ) -> None:
        """`narrow(source, caps)`: the part of a node's capabilities that matters under
        `source` (so nodes that differ only in what the source does not use share entries).
        `release(replaced)`: the source and entries a `commit` replaced are handed over (to be
        freed off the event loop) instead of dropped."""
        self._build_fn = build
        self._pops_of = pops_of
        self._narrow = narrow
        self._source = source
        self._entries: dict[tuple[str, str], PopResources] = {}
        self._cap_keys: set[str] = set()  # every capability key an entry was made for
        self._changes = 0  # counts changes; `_touched[pop]`: the count at the PoP's last one
        self._touched: dict[str, int] = {}
        self._listeners: list[ChangeListener] = []
        self._release = release
        self.translations = 0  # how many times an entry was built (tests, metrics)

    # -- reading ---------------------------------------------------------------------------

    @property
    def source(self) -> S:
        return self._source

    @property
    def changes(self) -> int:
        """How many times the cache's source or entries changed (grows only)."""
        return self._changes

    @property
    def pops(self) -> tuple[str, ...]:
        return tuple(self._pops_of(self._source))

    def has_pop(self, pop: str) -> bool:
        return pop in self._pops_of(self._source)

    def effective_capabilities(
        self, pop: str, advertised: Capabilities, why: str = "node.extensions"
    ) -> EffectiveCapabilities:
        """What a node's resources are translated for: what it advertised, as far as the
        source uses it (`narrow`)."""
        if self._narrow is not None:
            advertised = self._narrow(self._source, advertised)
        return EffectiveCapabilities(advertised, why)

    def resources(self, pop: str, caps: Capabilities) -> PopResources:
        """The PoP's resources for nodes with `caps`; built once, then shared."""
        key = (pop, caps.key)
        entry = self._entries.get(key)
        if entry is None:
            self._check_pop(pop)
            entry = self._build(self._source, pop, caps)
            self._entries[key] = entry
            self._cap_keys.add(caps.key)
            self._touch(pop)
        return entry

    def cached(self, pop: str, caps: Capabilities) -> PopResources | None:
        """The PoP's resources for `caps` if they were built already (never builds)."""
        return self._entries.get((pop, caps.key))

    def prepared_entry(self, prepared: Prepared[S], pop: str, caps: Capabilities
                       ) -> PopResources | None:
        """What `pop`'s nodes with `caps` get once `prepared` is committed, where it built
        that (never builds)."""
        return prepared.entries.get((pop, caps.key))

    def entry(self, pop: str, capability_key: str) -> PopResources | None:
        """The PoP's current resources for nodes of `capability_key`, if built (never builds)."""
        return self._entries.get((pop, capability_key))

    # -- changing --------------------------------------------------------------------------

    def add_listener(self, listener: ChangeListener) -> None:
        """`listener(pops)` is called with the PoPs whose resources changed."""
        self._listeners.append(listener)

    def update(self, source: S, pops: Collection[str] | None) -> frozenset[str]:
        """Take `source` and re-build the entries of `pops` (None: every PoP built so far);
        returns (and announces) the PoPs whose resources changed. PoPs the source no longer
        has count as changed. If a build raises, the cache keeps its source and entries."""
        wanted = {pop for pop, _ in self._entries} if pops is None else set(pops)
        saved = self._source
        self._source = source
        try:
            changed = self._rebuild(wanted)
        except BaseException:
            self._source = saved
            raise
        if pops is None:  # every PoP's input may have changed, built or not (commit_entries)
            self._touch(*self._pops_of(saved), *self._pops_of(source))
        return changed

    def prepare(
        self, source: S, pops: Collection[str] | None = None
    ) -> Callable[[], Prepared[S]]:
        """Read the cache's entries now; the returned call builds those of `pops` (None: all)
        for `source` and touches nothing of the cache, so it may run on a worker thread while
        the event loop keeps serving (and updating). `commit` applies it."""
        entries = dict(self._entries)
        base = self._changes
        build = self._build_fn
        known = set(self._pops_of(source))
        wanted = None if pops is None else frozenset(pops)

        def prepare() -> Prepared[S]:
            fresh: dict[tuple[str, str], PopResources] = {}
            changed: set[str] = set()
            built = 0
            for (pop, cap_key), old in entries.items():
                if pop not in known:
                    changed.add(pop)
                    continue
                if wanted is not None and pop not in wanted:
                    fresh[(pop, cap_key)] = old
                    continue
                new = build(source, pop, old.capabilities, old)
                built += 1
                if same_content(new, old):
                    fresh[(pop, cap_key)] = old
                else:
                    warm_like(new, old)  # what the push asks of it, computed here, not on the loop
                    fresh[(pop, cap_key)] = new
                    changed.add(pop)
            return Prepared(source, fresh, frozenset(changed), base, built, wanted)

        return prepare

    def changed(self, prepared: Prepared[S]) -> frozenset[str]:
        """The PoPs whose entries `prepared` changes (as `commit` would find them, unless
        entries changed after `prepare` read the cache)."""
        return prepared.changed

    def commit(self, prepared: Prepared[S], source: S) -> frozenset[str]:
        """Swap in what `prepare` made, with `source` as the cache's source (the prepared one
        with whatever changed since applied to it). PoPs whose entries changed after `prepare`
        read the cache are re-built now (incrementally) from `source`; returns (and
        announces) every PoP whose resources changed."""
        pops = set(self._pops_of(source))
        entries = dict(prepared.entries)
        late = {pop for pop, at in self._touched.items() if at > prepared.base and pop in pops}
        for pop in late:
            entries.update({key: entry for key, entry in self._entries.items()
                            if key[0] == pop and key not in entries})
        saved = (self._source, self._entries)
        self._source, self._entries = source, entries
        try:
            late_changed = self._rebuild(late, announce=False)
        except BaseException:
            self._source, self._entries = saved
            raise
        self._touch(*(pops if prepared.pops is None else prepared.pops & pops))
        self.translations += prepared.built
        changed = prepared.changed | late_changed
        if self._release is not None:
            self._release(list(saved))
        if changed:
            self._announce(changed)
        return changed

    def prepare_entries(
        self, caps: Capabilities, pops: Iterable[str] | None = None
    ) -> Callable[[], WarmEntries]:
        """Like `prepare`, for building `pops` (default: all) for `caps` ahead of their first
        node (start-up, off the event loop); `commit_entries` keeps them."""
        source = self._source
        wanted = [pop for pop in (self._pops_of(source) if pops is None else pops)
                  if (pop, caps.key) not in self._entries]
        base = self._changes
        build = self._build_fn

        def prepare() -> WarmEntries:
            built = {(pop, caps.key): build(source, pop, caps, None) for pop in wanted}
            return WarmEntries(built, base)

        return prepare

    def commit_entries(self, warm: WarmEntries) -> int:
        """Keep the prepared entries that still hold (PoP untouched since: every change of a
        PoP's input touches it; no entry made meanwhile); returns how many were kept."""
        kept = 0
        for key, entry in warm.entries.items():
            if key not in self._entries and self._touched.get(key[0], -1) <= warm.base:
                self._entries[key] = entry
                self._cap_keys.add(key[1])
                kept += 1
        return kept

    # -- internals -------------------------------------------------------------------------

    def _build(
        self, source: S, pop: str, caps: Capabilities, previous: PopResources | None = None
    ) -> PopResources:
        self.translations += 1
        return self._build_fn(source, pop, caps, previous)

    def _rebuild(self, pops: set[str], *, announce: bool = True) -> frozenset[str]:
        """Re-build the cached entries of `pops` from the source; swap only if all work."""
        known = set(self._pops_of(self._source))
        fresh: dict[tuple[str, str], PopResources] = {}
        changed: set[str] = set()
        mine = [  # by key, not by scanning every entry: a weight change costs one PoP's work
            ((pop, cap_key), self._entries[(pop, cap_key)])
            for pop in pops for cap_key in self._cap_keys if (pop, cap_key) in self._entries
        ]
        for (pop, cap_key), old in mine:
            if pop not in known:
                changed.add(pop)
                continue
            new = self._build(self._source, pop, old.capabilities, old)
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
        """Remember that these PoPs' inputs or entries changed now (see `commit`)."""
        self._changes += 1
        for pop in pops:
            self._touched[pop] = self._changes

    def _announce(self, pops: frozenset[str]) -> None:
        log.debug("snapshots changed for PoPs %s", ", ".join(sorted(pops)))
        for listener in self._listeners:
            listener(pops)

    def _check_pop(self, pop: str) -> None:
        if not self.has_pop(pop):
            raise UnknownPop(f"unknown PoP {pop!r}; known: {', '.join(self.pops)}")
