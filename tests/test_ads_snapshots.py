"""The output cache (lazy, shared, per-PoP rebuilds through an injected build function), the
intent owner publishing to it, and the debouncing push hub."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace

import pytest

from control_plane.ads.fanout import PushHub
from control_plane.ads.snapshots import SnapshotCache
from control_plane.desired.model import Desired
from control_plane.intent.carry_over import carry_over
from control_plane.intent.owner import IntentOwner
from control_plane.intent.served import served_of
from control_plane.translate import PopIntent, UnknownPop, WeightsError, translate_pop
from control_plane.translate.resources import ENDPOINT_TYPE, Capabilities, PopResources
from control_plane.translate.served import Served, served_pops, translate_served
from control_plane.xds_port.server import intent_and_cache
from harness.ads_desired import desired
from harness.intent_changes import set_desired, set_weights
from harness.models import fleet_desired
from tests.support.fake_clock import FakeClock

FIFO, LIFO = Capabilities(), Capabilities(adaptive_lifo=True)


def make(**overrides: int) -> tuple[IntentOwner, SnapshotCache[Served]]:
    base = {"listener_port": 10000, "primary_port": 8081, "secondary_port": 8082}
    return intent_and_cache(desired(**{**base, **overrides}))


def test_translated_once_per_pop_and_capability_key() -> None:
    _, cache = make()
    assert cache.resources("ewr", FIFO) is cache.resources("ewr", FIFO)
    assert cache.resources("ewr", LIFO) is not cache.resources("ewr", FIFO)
    cache.resources("sjc", FIFO)
    assert cache.translations == 3
    assert cache.resources("ewr", FIFO).notes and not cache.resources("ewr", LIFO).notes


def test_the_build_function_is_injected_and_gets_the_entry_it_replaces() -> None:
    served = desired(listener_port=10000, primary_port=8081, secondary_port=8082)
    calls: list[tuple[str, str, PopResources | None]] = []

    def build(
        source: Desired, pop: str, caps: Capabilities, previous: PopResources | None
    ) -> PopResources:
        calls.append((pop, caps.key, previous))
        return translate_pop(source, pop, caps)

    cache = SnapshotCache(build, lambda source: source.pop_names, served)
    first = cache.resources("ewr", FIFO)
    assert calls == [("ewr", FIFO.key, None)]
    assert cache.update(served, {"ewr"}) == frozenset()  # same content: nothing to announce
    assert calls[-1] == ("ewr", FIFO.key, first)
    with pytest.raises(UnknownPop, match="unknown PoP 'lax'; known: ewr, sjc"):
        cache.resources("lax", FIFO)
    only_sjc = replace(served, pops=served.pops[1:])
    assert cache.update(only_sjc, None) == frozenset({"ewr"})  # ewr gone: changed
    assert not cache.has_pop("ewr") and cache.pops == ("sjc",) and cache.source is only_sjc


def test_a_failing_build_leaves_the_source_and_every_entry() -> None:
    served = desired(listener_port=10000, primary_port=8081, secondary_port=8082)

    def build(
        source: Desired, pop: str, caps: Capabilities, previous: PopResources | None
    ) -> PopResources:
        if source is not served:
            raise RuntimeError("translation broke")
        return translate_pop(source, pop, caps)

    cache = SnapshotCache(build, lambda source: source.pop_names, served)
    ewr = cache.resources("ewr", FIFO)
    with pytest.raises(RuntimeError):
        cache.update(replace(served, digest="other"), None)
    assert cache.resources("ewr", FIFO) is ewr and cache.source is served


async def test_weights_rebuild_only_that_pop() -> None:
    intent, cache = make()
    seen: list[frozenset[str]] = []
    cache.add_listener(seen.append)
    sjc = cache.resources("sjc", FIFO)
    ewr = cache.resources("ewr", FIFO)
    assert intent.weights("ewr", "shop") == {"primary": 95, "secondary": 5}
    assert await set_weights(intent, "ewr", "shop", {"primary": 50, "secondary": 50})
    assert seen == [frozenset({"ewr"})]
    assert cache.resources("sjc", FIFO) is sjc
    assert cache.resources("ewr", FIFO).type_version(ENDPOINT_TYPE) != ewr.type_version(
        ENDPOINT_TYPE
    )
    assert not await set_weights(intent, "ewr", "shop", {"primary": 50, "secondary": 50})
    assert seen == [frozenset({"ewr"})]  # same weights: nothing announced
    assert intent.all_weights()["sjc"]["shop"] == {"primary": 95, "secondary": 5}


@pytest.mark.parametrize(
    ("pop", "group", "weights", "error", "message"),
    [
        ("lax", "shop", {"primary": 100, "secondary": 0}, UnknownPop, "unknown PoP 'lax'"),
        ("ewr", "nope", {"primary": 100}, WeightsError, "unknown origin group 'nope'"),
        ("ewr", "shop", {"primary": 60, "secondary": 60}, WeightsError, "sum to 120"),
    ],
)
async def test_bad_weights_leave_state_intact(
    pop: str, group: str, weights: dict[str, int], error: type[Exception], message: str
) -> None:
    intent, cache = make()
    before = cache.resources("ewr", FIFO)
    with pytest.raises(error, match=message):
        await set_weights(intent, pop, group, weights)
    assert cache.resources("ewr", FIFO) is before
    assert intent.weights("ewr", "shop") == {"primary": 95, "secondary": 5}


async def test_a_new_desired_state_announces_only_changed_pops_and_keeps_weights() -> None:
    intent, cache = make()
    seen: list[frozenset[str]] = []
    cache.add_listener(seen.append)
    cache.resources("ewr", FIFO)
    cache.resources("sjc", FIFO)
    await set_weights(intent, "sjc", "shop", {"primary": 30, "secondary": 70})
    seen.clear()
    # only sjc's listener port moves
    changed = await set_desired(
        intent,
        desired(listener_port=10000, primary_port=8081, secondary_port=8082, sjc_offset=5)
    )
    assert changed == frozenset({"sjc"}) and seen == [changed]
    assert intent.weights("sjc", "shop") == {"primary": 30, "secondary": 70}
    assert await set_desired(intent, intent.desired) == frozenset()


async def test_hub_coalesces_bursts_with_a_max_delay() -> None:
    clock = FakeClock()
    hub = PushHub(quiet=0.05, max_delay=0.21, timer=clock)
    woken: list[str] = []
    hub.subscribe("ewr", lambda: woken.append("ewr"))
    hub.subscribe("sjc", lambda: woken.append("sjc"))
    for _ in range(5):  # a change every 10 ms: one push, 50 ms after the last
        hub.changed({"ewr"})
        await clock.advance(0.01)
    assert woken == []
    await clock.advance(0.1)
    assert woken == ["ewr"] and hub.flushes == 1
    for _ in range(20):  # a change every 20 ms never goes quiet: max_delay forces a push
        hub.changed({"sjc"})
        await clock.advance(0.02)
    assert woken == ["ewr", "sjc"] and hub.flushes == 2  # at 0.21 s; the next burst is open
    await clock.advance(0.05)
    assert woken == ["ewr", "sjc", "sjc"] and hub.flushes == 3


async def test_hub_accepts_changes_from_another_thread() -> None:
    clock = FakeClock()
    hub = PushHub(quiet=0.01, timer=clock)
    woke = asyncio.Event()
    hub.subscribe("ewr", woke.set)
    thread = threading.Thread(target=hub.changed, args=({"ewr"},))
    thread.start()
    thread.join()
    await clock.idle()  # the change reached the loop and scheduled the flush
    assert not woke.is_set()
    await clock.advance(0.01)
    assert woke.is_set() and hub.flushes == 1


async def test_a_desired_state_prepared_off_the_cache_keeps_changes_made_meanwhile() -> None:
    desired = fleet_desired(pops=3, groups=4)
    intent, cache = intent_and_cache(desired)
    caps = Capabilities()
    for pop in desired.pop_names:
        cache.resources(pop, caps)
    new = replace(desired, origin_groups=tuple(
        replace(g, max_origin_concurrency=60) for g in desired.origin_groups))
    before = intent.intent
    prepare = cache.prepare(served_of(carry_over(before, new).intent))  # could run on a thread
    moved = {"o0": 30, "o1": 70}
    assert await set_weights(intent, "p001", "g002", moved)  # the loop keeps pushing meanwhile
    lifo = cache.resources("p002", Capabilities(adaptive_lifo=True))  # a new node meanwhile
    prepared = prepare()
    assert intent.desired is desired and intent.weights("p001", "g002") == moved  # untouched
    heard: list[frozenset[str]] = []
    cache.add_listener(heard.append)
    current = carry_over(intent.intent, new)  # the rule again, over what runs now
    assert cache.commit(prepared, served_of(current.intent)) == frozenset(desired.pop_names)
    assert heard == [frozenset(desired.pop_names)]
    assert cache.source.desired["p000"] is new \
        and cache.source.intent_of("p001").weights["g002"] == moved
    for pop, weights in (("p000", {}), ("p001", {"g002": moved}), ("p002", {})):
        assert cache.resources(pop, caps) == translate_pop(new, pop, caps,
                                                           PopIntent(weights=weights))
    after = cache.resources("p002", Capabilities(adaptive_lifo=True))
    assert after is not lifo
    assert after == translate_pop(new, "p002", Capabilities(adaptive_lifo=True))


async def test_a_commit_hands_over_the_source_and_entries_it_replaced() -> None:
    """To be freed off the event loop (`release`, `ads/off_loop.free_later` in the server)."""
    desired = fleet_desired(pops=2, groups=2)
    owner = IntentOwner(desired)
    released: list[list[object]] = []
    cache = SnapshotCache(translate_served, served_pops, owner.served, release=released.append)
    old = cache.resources("p000", FIFO)
    source = served_of(carry_over(owner.intent, replace(desired, origin_groups=tuple(
        replace(g, max_origin_concurrency=60) for g in desired.origin_groups))).intent)
    before = cache.source
    cache.commit(cache.prepare(source)(), source)
    assert cache.resources("p000", FIFO) is not old
    [(replaced_source, replaced_entries)] = released
    assert replaced_source is before and replaced_entries[("p000", FIFO.key)] is old


async def test_entries_translated_ahead_are_kept_only_while_they_hold() -> None:
    intent, cache = intent_and_cache(fleet_desired(pops=3, groups=2))
    caps = Capabilities()
    warm = cache.prepare_entries(caps)
    await set_weights(intent, "p001", "g000", {"o0": 40, "o1": 60})  # p001 changed meanwhile
    assert cache.commit_entries(warm()) == 2
    assert cache.cached("p000", caps) is not None and cache.cached("p001", caps) is None
    assert cache.resources("p001", caps).of_type(ENDPOINT_TYPE)


async def test_what_the_owner_hands_the_cache_is_the_running_intent_after_every_change() -> None:
    """Each change hands the cache the running intent as it translates it (`Served`), made anew
    only for the PoPs the change touches: after weights, a new desired state and weights again,
    it is what a fresh one holds, and a capability key first asked now is built from it."""
    intent, cache = intent_and_cache(fleet_desired(pops=3, groups=2))
    for pop in intent.desired.pop_names:
        cache.resources(pop, FIFO)
    assert await set_weights(intent, "p001", "g001", {"o0": 30, "o1": 70})
    edited = replace(intent.desired, origin_groups=tuple(
        replace(g, max_origin_concurrency=60) for g in intent.desired.origin_groups))
    assert await set_desired(intent, edited) == frozenset(edited.pop_names)
    assert await set_weights(intent, "p002", "g000", {"o0": 45, "o1": 55})
    assert cache.source is intent.served
    assert intent.served == served_of(intent.intent)
    assert intent.served.intent_of("p001").weights["g001"] == {"o0": 30, "o1": 70}
    for pop in edited.pop_names:
        expected = translate_pop(edited, pop, LIFO, intent.intent.for_pop(pop))
        assert cache.resources(pop, LIFO) == expected, pop
