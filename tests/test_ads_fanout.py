"""The push hub wakes a change's streams in slices, one per turn of the event loop, sized from
what the turns cost: so other work runs between them (a 10,000-node change once held the loop
for seconds). The cost of a turn comes from a fake clock here: each wake-up "costs" what the
test says."""

from __future__ import annotations

import asyncio
import types

import pytest

from control_plane.ads import fanout
from control_plane.ads.fanout import FIRST_SLICE, MIN_SLICE, PushHub


class CostClock:
    """`perf_counter` for the hub: moves only when a wake-up spends `per_wake` seconds."""

    def __init__(self, per_wake: float) -> None:
        self.now = 0.0
        self.per_wake = per_wake

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> CostClock:
    clock = CostClock(per_wake=0.001)
    monkeypatch.setattr(fanout, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    return clock


class Stream:
    """A subscriber: notes the hub's turn it was woken in; a wake-up costs `per_wake`."""

    def __init__(self, hub: PushHub, clock: CostClock, turns: list[int]) -> None:
        self.hub, self.clock, self.turns = hub, clock, turns
        self.woken = 0

    def wake(self) -> None:
        self.woken += 1
        self.turns.append(self.hub.turns)
        self.clock.now += self.clock.per_wake


def streams(hub: PushHub, clock: CostClock, pop: str, count: int, turns: list[int]
            ) -> list[Stream]:
    made = [Stream(hub, clock, turns) for _ in range(count)]
    for stream in made:
        hub.subscribe(pop, stream.wake)
    return made


async def test_a_change_wakes_its_streams_a_slice_per_loop_turn(clock: CostClock) -> None:
    hub = PushHub(quiet=0.0, turn_s=0.01)
    turns: list[int] = []
    streams(hub, clock, "ewr", 300, turns)
    between: list[int] = []  # wake-ups done whenever another task got the loop

    async def other_work() -> None:
        while len(turns) < 300:
            between.append(len(turns))
            await asyncio.sleep(0)

    other = asyncio.create_task(other_work())
    await asyncio.sleep(0)
    hub.changed({"ewr"})
    hub.flush()
    await other
    per_turn = [turns.count(turn) for turn in sorted(set(turns))]
    # the first slice is FIRST_SLICE; after it 1 ms a wake-up, a 10 ms turn: 10 a turn
    assert per_turn == [FIRST_SLICE, *[10] * 23, 300 - FIRST_SLICE - 230]
    assert len(set(between)) >= len(per_turn)  # the other task ran between every two slices
    assert hub.waking() == 0


async def test_costly_pushes_still_wake_a_few_streams_a_turn(clock: CostClock) -> None:
    clock.per_wake = 0.1
    hub = PushHub(quiet=0.0, turn_s=0.01)
    turns: list[int] = []
    streams(hub, clock, "ewr", FIRST_SLICE + 2 * MIN_SLICE, turns)
    hub.changed({"ewr"})
    hub.flush()
    for _ in range(10):
        await asyncio.sleep(0)
    assert [turns.count(turn) for turn in sorted(set(turns))] == [FIRST_SLICE, MIN_SLICE,
                                                                   MIN_SLICE]


async def test_a_stream_gone_before_its_turn_is_skipped_and_one_due_twice_is_woken_once(
        clock: CostClock) -> None:
    hub = PushHub(quiet=0.0, turn_s=0.01)
    turns: list[int] = []
    ewr = streams(hub, clock, "ewr", FIRST_SLICE + 20, turns)
    streams(hub, clock, "sjc", 5, turns)
    hub.changed({"ewr", "sjc"})
    hub.flush()  # ewr first: FIRST_SLICE of its streams now, the rest later
    assert len(turns) == FIRST_SLICE and hub.waking() == 25
    gone = next(stream for stream in ewr if not stream.woken)
    hub.unsubscribe("ewr", gone.wake)  # gone before its turn
    hub.changed({"ewr"})
    hub.flush()  # ewr again: the streams still due are not queued twice
    assert hub.waking() == 25 + FIRST_SLICE  # (the one gone is skipped when its turn comes)
    for _ in range(20):
        await asyncio.sleep(0)
    assert hub.waking() == 0 and gone.woken == 0
    assert sorted(stream.woken for stream in ewr) == [0, *[1] * 19, *[2] * FIRST_SLICE]
