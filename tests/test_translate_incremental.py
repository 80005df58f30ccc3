"""Incremental translation: a change re-builds only the resources whose inputs it touched, and the
result is byte-identical to the full translation (the reference)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from control_plane.desired.model import Desired, GroupWeights, Mirror, TierActions
from control_plane.translate.pop import PopIntent, built_resources, translate_pop
from control_plane.translate.resources import (
    CLUSTER_TYPE,
    ENDPOINT_TYPE,
    ROUTE_TYPE,
    RUNTIME_TYPE,
    Capabilities,
    PopResources,
)
from control_plane.xds_port.server import intent_and_cache
from harness.intent_changes import set_weights
from harness.models import fleet_desired

FIFO, LIFO = Capabilities(), Capabilities(adaptive_lifo=True)


def wire(resources: PopResources) -> dict[str, dict[str, tuple[str, bytes]]]:
    return {
        type_url: {name: (r.version, r.payload) for name, r in items.items()}
        for type_url, items in resources.by_type.items()
    }


def test_a_weight_change_in_a_50_group_pop_translates_only_that_groups_load_assignments() -> None:
    desired = fleet_desired(pops=3, groups=50)
    first = translate_pop(desired, "p001", FIFO)
    # tier clusters and their CLAs, per group one standby's mirror cluster and its CLA, listener,
    # routes, the runtime layer
    assert len(built_resources(first)) == 50 * 3 * 2 + 50 * 2 + 3
    shifted = {"g017": {"o0": 20, "o1": 80}}
    second = translate_pop(desired, "p001", FIFO, PopIntent(weights=shifted), previous=first)
    assert sorted(built_resources(second)) == [
        (ENDPOINT_TYPE, f"g017.{tier}") for tier in ("background", "critical", "normal")
    ]
    assert wire(second) == wire(translate_pop(desired, "p001", FIFO, PopIntent(weights=shifted)))
    untouched = second.of_type(ENDPOINT_TYPE)["g018.critical"]
    assert untouched is first.of_type(ENDPOINT_TYPE)["g018.critical"]  # same object, not a copy


def test_a_tier_action_translates_only_the_routes_and_the_runtime_layer() -> None:
    desired = fleet_desired(pops=2, groups=50)
    first = translate_pop(desired, "p000", FIFO)
    second = translate_pop(desired, "p000", FIFO, PopIntent(tier_actions={"g003": TierActions()}),
                           previous=first)
    changed = ((RUNTIME_TYPE, "ballast_tiers"), (ROUTE_TYPE, "edge"))
    assert sorted(built_resources(second)) == sorted(changed)
    third = translate_pop(desired, "p000", FIFO, previous=second)
    assert sorted(built_resources(third)) == sorted(changed)
    assert wire(third) == wire(first)


def test_a_desired_edit_translates_only_the_resources_it_touched() -> None:
    desired = fleet_desired(pops=2, groups=50)
    first = translate_pop(desired, "p000", FIFO)
    groups = list(desired.origin_groups)
    # the breakers of its 3 tier clusters and its mirror cluster (sized like the least tier)
    groups[7] = replace(groups[7], max_origin_concurrency=60)
    # a freshly read file: every model object new, only group 7 different
    edited = replace(fleet_desired(pops=2, groups=50), origin_groups=tuple(
        replace(g) if i != 7 else groups[7] for i, g in enumerate(groups)))
    second = translate_pop(edited, "p000", FIFO, previous=first)
    assert sorted(built_resources(second)) == sorted(
        [(CLUSTER_TYPE, f"g007.{t}") for t in ("critical", "normal", "background", "mirror-o1")]
        + [(ENDPOINT_TYPE, f"g007.{t}") for t in ("critical", "normal", "background",
                                                   "mirror-o1")]
        + [(ROUTE_TYPE, "edge")]
    )
    assert wire(second) == wire(translate_pop(edited, "p000", FIFO))


def test_capabilities_rebuild_only_clusters_and_keep_their_notes() -> None:
    desired = fleet_desired(pops=2, groups=4)
    first = translate_pop(desired, "p000", LIFO)
    fifo = translate_pop(desired, "p000", FIFO, previous=first)
    assert {t for t, _ in built_resources(fifo)} == {CLUSTER_TYPE}
    again = translate_pop(desired, "p000", FIFO, previous=fifo)
    assert built_resources(again) == ()
    assert again.notes == fifo.notes == translate_pop(desired, "p000", FIFO).notes
    assert again.notes  # the default tiers ask for adaptive LIFO: every FIFO fallback is said


# -- the property: any sequence of changes, incremental == full ------------------------------

POPS, GROUPS = 3, 4
BASE = fleet_desired(pops=POPS, groups=GROUPS)


def _edit(desired: Desired, what: int, group: int, amount: int) -> Desired:
    groups = list(desired.origin_groups)
    g = groups[group]
    if what == 0:
        groups[group] = replace(g, max_origin_concurrency=40 + amount)
    elif what == 1:
        origin = replace(g.origins[0], port=8000 + amount)
        groups[group] = replace(g, origins=(origin, *g.origins[1:]))
    elif what == 2:
        tier = replace(g.tiers[amount % len(g.tiers)], queue_timeout_ms=100 + amount)
        groups[group] = replace(g, tiers=tuple(
            tier if t.name == tier.name else t for t in g.tiers))
    elif what == 3:
        return replace(desired, classification=desired.classification[: amount % 4])
    elif what == 4:
        (item,) = desired.listeners
        return replace(desired, listeners=(replace(item, port=10000 + amount),))
    elif what == 5:
        return replace(desired, default_tier=("critical", "normal", "background")[amount % 3])
    elif what == 7:
        sources = ((), ("10.0.0.0/8",), ("10.0.0.0/8", "192.168.0.0/16"))[amount % 3]
        return replace(desired, trusted_priority_sources=sources)
    else:
        preference = dict(g.preference)
        preference["p000"] = tuple(reversed(preference["p000"]))
        groups[group] = replace(g, preference=preference)
    return replace(desired, origin_groups=tuple(groups))


change = st.one_of(
    st.tuples(st.just("weights"), st.integers(0, GROUPS - 1), st.integers(0, 100)),
    st.tuples(st.just("actions"), st.integers(0, GROUPS - 1), st.integers(0, 2)),
    st.tuples(st.just("caps"), st.booleans(), st.just(0)),
    st.tuples(st.just("mirror"), st.integers(0, GROUPS - 1), st.integers(0, 2)),
    st.tuples(st.just("hedge"), st.integers(0, GROUPS - 1), st.integers(0, 2)),
    st.tuples(st.just("edit"), st.integers(0, 7), st.tuples(st.integers(0, GROUPS - 1),
                                                             st.integers(0, 50))),
    st.tuples(st.just("reread"), st.just(0), st.just(0)),
)


@settings(max_examples=60, deadline=None)
@given(pop=st.sampled_from(BASE.pop_names), changes=st.lists(change, max_size=8))
def test_incremental_translation_is_byte_identical_to_the_full_one(
    pop: str, changes: list[tuple[str, object, object]]
) -> None:
    desired, caps = BASE, FIFO
    weights: dict[str, GroupWeights] = {}
    actions: dict[str, TierActions] = {}
    mirrors: dict[str, Mirror] = {}
    hedges: dict[str, int] = {}
    previous = translate_pop(desired, pop, caps, PopIntent(weights=weights, tier_actions=actions))
    for kind, a, b in changes:
        if kind == "weights":
            assert isinstance(a, int) and isinstance(b, int)
            weights[f"g{a:03d}"] = {"o0": b, "o1": 100 - b}
        elif kind == "actions":
            assert isinstance(a, int)
            name = f"g{a:03d}"
            if b == 0:
                actions.pop(name, None)
            else:
                actions[name] = TierActions(demote_share=25 * int(str(b)))
        elif kind == "caps":
            caps = LIFO if a else FIFO
        elif kind == "mirror":  # a standby's mirror starts (two percents) or stops
            name = f"g{a:03d}"
            standby = desired.group(name).preference[pop][1:]
            if b == 0 or not standby:
                mirrors.pop(name, None)
            else:
                mirrors[name] = Mirror(standby, 5.0 * int(str(b)))
        elif kind == "hedge":  # a hedge guard starts (two shares) or stops
            name = f"g{a:03d}"
            if b == 0:
                hedges.pop(name, None)
            else:
                hedges[name] = 50_000 * int(str(b))
        elif kind == "edit":
            assert isinstance(a, int) and isinstance(b, tuple)
            desired = _edit(desired, a, *b)
        else:  # the same file read again: equal, but every object new
            desired = replace(desired, origin_groups=tuple(replace(g) for g in
                                                           desired.origin_groups))
        mirrors = {name: m for name, m in mirrors.items()
                   if set(m.origins) <= set(desired.group(name).preference[pop][1:])}
        held = PopIntent(weights=weights, tier_actions=actions, mirrors=mirrors,
                         hedges=hedges)
        incremental = translate_pop(desired, pop, caps, held, previous=previous)
        full = translate_pop(desired, pop, caps, held)
        assert wire(incremental) == wire(full)
        assert incremental.notes == full.notes
        assert [list(items) for items in incremental.by_type.values()] == [
            list(items) for items in full.by_type.values()]  # same order too
        previous = incremental


async def test_the_snapshot_cache_translates_a_weight_change_incrementally() -> None:
    intent, cache = intent_and_cache(fleet_desired(pops=3, groups=50))
    before = cache.resources("p002", FIFO)
    assert await set_weights(intent, "p002", "g040", {"o0": 50, "o1": 50})
    after = cache.resources("p002", FIFO)
    assert sorted(built_resources(after)) == [
        (ENDPOINT_TYPE, f"g040.{tier}") for tier in ("background", "critical", "normal")]
    assert after.of_type(CLUSTER_TYPE)["g040.critical"] is before.of_type(CLUSTER_TYPE)[
        "g040.critical"]
    unchanged = cache.resources("p001", FIFO)
    assert not await set_weights(intent, "p001", "g040", intent.weights("p001", "g040"))
    assert cache.resources("p001", FIFO) is unchanged  # nothing changed: the same snapshot
