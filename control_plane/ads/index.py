"""What every stream of a PoP would otherwise compute again: per-snapshot views and diffs.

A snapshot (`PopResources`) never changes once translated, and the nodes of a PoP mostly
subscribe to the same things (CDS/LDS wildcard, EDS every cluster, RDS every route). So the
per-stream protocol cores (`sotw.py`, `delta.py`) work on shared, immutable `ResourceSet`s:

- `index(snapshot, type_url)` — one `TypeIndex` per (snapshot, type), kept with the snapshot
  (`PopResources.derived`);
- `TypeIndex.view(wildcard, names)` — the resources a subscription gets, in response order,
  with their name -> version map and the type version (`items_version`), built once per
  (snapshot, type, subscription) and handed to every stream with that subscription;
- `ResourceSet.diff_from(old)` — what changed from `old` (what a node holds, or was last sent)
  to this set: changed resources, names gone, names a delta stream announces as removed, and
  the sets the node holds after an update and/or removal. Computed once per pair of sets and
  kept (weakly keyed by `old`) with the newer set.

A stream then only compares identities and version strings when nothing changed, and touches
only the changed names when something did. Everything here is a pure function of its inputs;
`tests/test_ads_index*.py` check it against the direct computation.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from functools import cached_property

from control_plane.translate.resources import PopResources, Resource, content_version

_INDEXES = "ads.index"  # PopResources.derived key: type_url -> TypeIndex
# distinct named subscriptions kept per (snapshot, type), and the names their keys hold in all;
# beyond that views are built per call (still correct, just not shared), and so are views of
# subscriptions naming mostly what does not exist: names are client-supplied, so what is kept
# stays proportional to the snapshot, never to what clients send
MAX_VIEWS = 1024
MAX_VIEW_NAMES = 65_536
SLACK_NAMES = 16  # names of resources not there (yet) that a kept view may hold


def items_version(items: Mapping[str, str]) -> str:
    """Version of a set of (name, version); equals `PopResources.type_version` for a full type."""
    return content_version(repr(sorted(items.items())).encode())


class ResourceSet:
    """An immutable set of resources (name -> Resource, in response order), shared by streams.

    `wildcard`/`scope` say which subscription it is the view of (None for sets that are no
    view, e.g. what a node holds after a make-before-break push); they decide which vanished
    names a delta stream announces as removed.
    """

    def __init__(
        self,
        items: Mapping[str, Resource],
        *,
        wildcard: bool = False,
        scope: frozenset[str] | None = None,
    ) -> None:
        self.items: Mapping[str, Resource] = items
        self.resources: tuple[Resource, ...] = tuple(items.values())
        self.wildcard = wildcard
        self.scope = scope
        self._diffs: weakref.WeakKeyDictionary[ResourceSet, Diff] = weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, resources: Iterable[Resource]) -> ResourceSet:
        return cls({r.name: r for r in resources})

    def __len__(self) -> int:
        return len(self.items)

    def __repr__(self) -> str:
        return f"ResourceSet({len(self.items)} resources, version {self.version})"

    @cached_property
    def versions(self) -> dict[str, str]:
        return {name: r.version for name, r in self.items.items()}

    @cached_property
    def version(self) -> str:
        return items_version(self.versions)

    def same_items(self, versions: Mapping[str, str]) -> bool:
        """Whether `versions` (name -> version) is exactly this set's."""
        return len(versions) == len(self.items) and all(
            versions.get(name) == r.version for name, r in self.items.items()
        )

    def diff_from(self, old: ResourceSet) -> Diff:
        """From `old` to this set; computed once per pair, then shared."""
        diff = self._diffs.get(old)
        if diff is None:
            diff = self._diffs[old] = Diff(old, self)
        return diff


EMPTY = ResourceSet({})


class Diff:
    """From `old` (what a node holds or was sent) to `new` (what it should get now)."""

    def __init__(self, old: ResourceSet, new: ResourceSet) -> None:
        # kept with `new`, keyed weakly by `old`: refer to neither strongly (no cycle, no leak)
        self._old = weakref.ref(old)
        self._new_ref = weakref.ref(new)
        old_items = old.items
        self.changed: tuple[Resource, ...] = tuple(
            r for name, r in new.items.items()
            if (held := old_items.get(name)) is None or held.version != r.version
        )
        self.changed_names = frozenset(r.name for r in self.changed)
        # names `old` has and `new` has not, in `old`'s order
        self.gone: tuple[str, ...] = tuple(n for n in old_items if n not in new.items)
        # what a delta stream announces as removed: gone names in the subscription's scope
        scope = new.scope
        self.removed: tuple[str, ...] = tuple(
            sorted(n for n in self.gone if new.wildcard or (scope is not None and n in scope))
        )

    def _old_set(self) -> ResourceSet:
        old = self._old()
        assert old is not None, "a diff is only used while both its sets are alive"
        return old

    @property
    def _new(self) -> ResourceSet:
        new = self._new_ref()
        assert new is not None, "a diff is only used while both its sets are alive"
        return new

    # What these answer is `old`, `new` or a set built here; only a built set is cached. A
    # cached `old` would keep the weak key of `new._diffs` alive (its value refers to it), and
    # through the old set's own diffs every earlier set: each push and reload kept the previous
    # views of every PoP, resources and all (~8 MB a reload at 100 PoPs x 20 groups, the soak,
    # docs/benchmarks.md §7); a cached `new` is a cycle, which a frozen heap never frees.

    @property
    def kept(self) -> ResourceSet:
        """`old`'s resources that are gone, first, then `new`: make before break (SotW), and
        what a node holds after receiving the updates but not yet the removals (delta)."""
        return self._kept if self.gone else self._new

    @cached_property
    def _kept(self) -> ResourceSet:
        old = self._old_set()
        items = {name: old.items[name] for name in self.gone}
        items.update(self._new.items)
        return ResourceSet(items)

    @property
    def after_updates_and_removals(self) -> ResourceSet:
        """What a delta node holds after the changed resources went out and `removed` too."""
        return self._new if len(self.removed) == len(self.gone) else self._updated_not_gone

    @cached_property
    def _updated_not_gone(self) -> ResourceSet:
        old = self._old_set()
        removed = set(self.removed)
        items = {name: old.items[name] for name in self.gone if name not in removed}
        items.update(self._new.items)
        return ResourceSet(items)

    @property
    def after_removals(self) -> ResourceSet:
        """What a delta node holds after only the removals went out."""
        if not self.removed:
            return self._old_set()
        if not self.changed and len(self.removed) == len(self.gone):
            return self._new
        return self._old_less_removed

    @cached_property
    def _old_less_removed(self) -> ResourceSet:
        removed = set(self.removed)
        return ResourceSet({n: r for n, r in self._old_set().items.items() if n not in removed})

    def after(self, *, updates: bool, removals: bool) -> ResourceSet:
        if updates and removals:
            return self.after_updates_and_removals
        if updates:
            return self.kept
        if removals:
            return self.after_removals
        return self._old_set()


class TypeIndex:
    """One type of one snapshot: its resources and the views of it subscriptions get."""

    def __init__(self, items: Mapping[str, Resource]) -> None:
        self.items = items
        self._all: ResourceSet | None = None
        self._views: dict[frozenset[str], ResourceSet] = {}
        self._view_names = 0  # names held by the keys of `_views`

    def subscriptions(self) -> list[tuple[bool, frozenset[str], ResourceSet]]:
        """(wildcard, names, view) of every view kept: a copy, safe while the loop adds."""
        views = [(False, names, view) for names, view in list(self._views.items())]
        return views if self._all is None else [(True, frozenset(), self._all), *views]

    def view(self, wildcard: bool, names: frozenset[str]) -> ResourceSet:
        """What a subscription gets: everything (wildcard, in snapshot order) or the existing
        resources among `names`, sorted by name. The same object for equal subscriptions."""
        if wildcard:
            if self._all is None:
                self._all = ResourceSet(dict(self.items), wildcard=True)
            return self._all
        view = self._views.get(names)
        if view is None:
            items = self.items
            view = ResourceSet(
                {name: items[name] for name in sorted(names) if name in items}, scope=names
            )
            if (
                len(self._views) < MAX_VIEWS
                and len(names) <= 2 * len(view.items) + SLACK_NAMES
                and self._view_names + len(names) <= MAX_VIEW_NAMES
            ):
                self._views[names] = view
                self._view_names += len(names)
        return view


def warm_like(new: PopResources, old: PopResources) -> None:
    """Compute now, for `new` (a snapshot no stream has yet), what the streams holding `old`
    will ask of it when it is pushed: its type versions, its indexes with the views of the
    subscriptions `old`'s indexes hold, their versions and the diffs from `old`'s views.

    The output cache calls this where it prepares a new output (a worker thread, before the
    swap), so the push after the swap finds these computed and only compares and writes: at
    one node per PoP nothing of a new snapshot is shared, and computing it on the loop for
    every PoP at once held the loop for the whole push (docs/benchmarks.md). `old` may be
    served meanwhile: of it only what exists is read, nothing is added.
    """
    for type_url in new.by_type:
        new.type_version(type_url)
    old_indexes: dict[str, TypeIndex] | None = old.derived_if_built(_INDEXES)
    for type_url, old_index in list((old_indexes or {}).items()):
        new_index = index(new, type_url)
        for wildcard, names, old_view in old_index.subscriptions():
            view = new_index.view(wildcard, names)
            diff = view.diff_from(old_view)
            for updates, removals in ((True, True), (True, False), (False, True)):
                _ = diff.after(updates=updates, removals=removals).version


def index(snapshot: PopResources, type_url: str) -> TypeIndex:
    """The `TypeIndex` of one type of `snapshot`: built once, kept with the snapshot."""
    indexes: dict[str, TypeIndex] = snapshot.derived(_INDEXES, _no_indexes)
    found = indexes.get(type_url)
    if found is None:
        found = indexes[type_url] = TypeIndex(snapshot.of_type(type_url))
    return found


def _no_indexes(_: PopResources) -> dict[str, TypeIndex]:
    return {}
