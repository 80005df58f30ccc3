"""The snapshot cache (lazy, shared, per-PoP rebuilds) and the debouncing push hub."""

from __future__ import annotations

import asyncio
import threading

import pytest

from control_plane.ads.fanout import PushHub
from control_plane.ads.snapshots import SnapshotCache
from control_plane.translate import UnknownPop, WeightsError
from control_plane.translate.resources import ENDPOINT_TYPE, Capabilities
from tests.support.ads_desired import desired

FIFO, LIFO = Capabilities(), Capabilities(adaptive_lifo=True)


def make(**overrides: int) -> SnapshotCache:
    base = {"listener_port": 10000, "primary_port": 8081, "secondary_port": 8082}
    return SnapshotCache(desired(**{**base, **overrides}))


def test_translated_once_per_pop_and_capability_key() -> None:
    cache = make()
    assert cache.resources("ewr", FIFO) is cache.resources("ewr", FIFO)
    assert cache.resources("ewr", LIFO) is not cache.resources("ewr", FIFO)
    cache.resources("sjc", FIFO)
    assert cache.translations == 3
    assert cache.resources("ewr", FIFO).notes and not cache.resources("ewr", LIFO).notes


def test_weights_rebuild_only_that_pop() -> None:
    cache = make()
    seen: list[frozenset[str]] = []
    cache.add_listener(seen.append)
    sjc = cache.resources("sjc", FIFO)
    ewr = cache.resources("ewr", FIFO)
    assert cache.weights("ewr", "shop") == {"primary": 95, "secondary": 5}
    assert cache.update_weights("ewr", "shop", {"primary": 50, "secondary": 50})
    assert seen == [frozenset({"ewr"})]
    assert cache.resources("sjc", FIFO) is sjc
    assert cache.resources("ewr", FIFO).type_version(ENDPOINT_TYPE) != ewr.type_version(
        ENDPOINT_TYPE
    )
    assert not cache.update_weights("ewr", "shop", {"primary": 50, "secondary": 50})
    assert seen == [frozenset({"ewr"})]  # same weights: nothing announced
    assert cache.all_weights()["sjc"]["shop"] == {"primary": 95, "secondary": 5}


@pytest.mark.parametrize(
    ("pop", "group", "weights", "error", "message"),
    [
        ("lax", "shop", {"primary": 100, "secondary": 0}, UnknownPop, "unknown PoP 'lax'"),
        ("ewr", "nope", {"primary": 100}, WeightsError, "unknown origin group 'nope'"),
        ("ewr", "shop", {"primary": 60, "secondary": 60}, WeightsError, "sum to 120"),
    ],
)
def test_bad_weights_leave_state_intact(
    pop: str, group: str, weights: dict[str, int], error: type[Exception], message: str
) -> None:
    cache = make()
    before = cache.resources("ewr", FIFO)
    with pytest.raises(error, match=message):
        cache.update_weights(pop, group, weights)
    assert cache.resources("ewr", FIFO) is before
    assert cache.weights("ewr", "shop") == {"primary": 95, "secondary": 5}


def test_update_desired_announces_only_changed_pops_and_keeps_weights() -> None:
    cache = make()
    seen: list[frozenset[str]] = []
    cache.add_listener(seen.append)
    cache.resources("ewr", FIFO)
    cache.resources("sjc", FIFO)
    cache.update_weights("sjc", "shop", {"primary": 30, "secondary": 70})
    seen.clear()
    # only sjc's listener port moves
    changed = cache.update_desired(
        desired(listener_port=10000, primary_port=8081, secondary_port=8082, sjc_offset=5)
    )
    assert changed == frozenset({"sjc"}) and seen == [changed]
    assert cache.weights("sjc", "shop") == {"primary": 30, "secondary": 70}
    assert cache.update_desired(cache.desired) == frozenset()


async def test_hub_coalesces_bursts_with_a_max_delay() -> None:
    hub = PushHub(quiet=0.05, max_delay=0.2)
    woken: list[str] = []
    hub.subscribe("ewr", lambda: woken.append("ewr"))
    hub.subscribe("sjc", lambda: woken.append("sjc"))
    for _ in range(5):
        hub.changed({"ewr"})
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)
    assert woken == ["ewr"] and hub.flushes == 1
    for _ in range(20):  # a change every 20 ms never goes quiet: max_delay forces a push
        hub.changed({"sjc"})
        await asyncio.sleep(0.02)
    assert "sjc" in woken and hub.flushes >= 2


async def test_hub_accepts_changes_from_another_thread() -> None:
    hub = PushHub(quiet=0.01)
    woke = asyncio.Event()
    hub.subscribe("ewr", woke.set)
    thread = threading.Thread(target=hub.changed, args=({"ewr"},))
    thread.start()
    thread.join()
    await asyncio.wait_for(woke.wait(), 1)
