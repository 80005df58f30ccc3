"""A record tells what was pushed: over random ticks of the real reconcile loop (real decision log,
real snapshot cache, real SQLite store), the last record of every (PoP, group) in a tick carries
exactly the weights the output cache serves after it, and a pair without a record in a tick serves
the weights it served before. A controller proposal the standby ramp changed is shown inside the
controller's record (`detail.proposed`, `detail.changed_by`) and replays to that proposal."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from control_plane.ads.snapshots import SnapshotCache
from control_plane.decide.controller import proposed_weights, replay_record
from control_plane.decide.ramp import replay_ramp_record
from control_plane.decide.signals import OriginSignals
from control_plane.decisions.log import DecisionLog
from control_plane.decisions.read import iter_records
from control_plane.decisions.recorder import DecisionRecorder
from control_plane.intent.sqlite_store import StateStore
from control_plane.observe.source import Signals
from control_plane.reconcile.reconcile import Reconciler
from control_plane.translate.resources import ENDPOINT_TYPE, Capabilities
from control_plane.xds_port.server import intent_and_cache
from harness.models import example_desired

T0 = 1_800_000_000_000
TICK = 20_000
PAIRS = (("ewr", "shop"), ("sjc", "shop"))
ORIGINS = ("primary", "secondary")
# (5xx per 1000, p95 ms): healthy, borderline, sick, dead-ish
SHAPES = ((0, 120.0), (30, 500.0), (200, 1200.0), (700, 2500.0))

Window = dict[tuple[str, str], dict[str, int]]  # pair -> origin -> shape index


class ScriptedSource:
    def __init__(self) -> None:
        self.window_shapes: Window = {}

    async def window(self, now_ms: int, window_ms: int) -> Signals:
        return {
            pair: {
                origin: OriginSignals(1000, SHAPES[shape][0], 0, 40.0, SHAPES[shape][1], 0.0, 0,
                                      None, now_ms)
                for origin, shape in shapes.items()
            }
            for pair, shapes in self.window_shapes.items()
        }


def served(cache: SnapshotCache, pop: str) -> dict[str, int]:
    """The origin weights the cache serves `pop` (every tier cluster of `shop` agrees)."""
    resources = cache.resources(pop, Capabilities())
    splits = set()
    for name, resource in resources.of_type(ENDPOINT_TYPE).items():
        if "mirror" in name:  # a ramp's cache-warming mirror: one origin, no split
            continue
        splits.add(tuple(sorted((locality.locality.zone, locality.load_balancing_weight.value)
                                for locality in resource.message.endpoints)))
    (split,) = splits
    return dict(split)


windows = st.lists(
    st.fixed_dictionaries({pair: st.fixed_dictionaries({o: st.integers(0, 3) for o in ORIGINS})
                           for pair in PAIRS}),
    min_size=4, max_size=30,
)


async def _run(folder: Path, script: list[Window]) -> list[dict]:
    store = StateStore(folder)
    log = DecisionLog(folder)
    intent, cache = intent_and_cache(example_desired(), store=store,
                                     recorder=DecisionRecorder(log))
    source = ScriptedSource()
    reconciler = Reconciler(intent, source, seed=3)
    seen = 0
    before = {pop: served(cache, pop) for pop, _ in PAIRS}
    for tick, shapes in enumerate(script):
        source.window_shapes = shapes
        await reconciler.tick(T0 + tick * TICK)
        records = list(iter_records(folder))
        new, seen = records[seen:], len(records)
        for pop, group in PAIRS:
            mine = [r for r in new if (r["pop"], r["group"]) == (pop, group)
                    and r.get("weights_after")]
            now_served = served(cache, pop)
            if mine:
                assert mine[-1]["weights_after"] == now_served, (mine, now_served)
                for record in mine:  # no record of the tick shows weights that were not pushed
                    assert record["weights_after"] in (now_served, before[pop]), record
            else:
                assert now_served == before[pop]
            before[pop] = now_served
    log.close()
    store.close()
    return list(iter_records(folder))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(windows)
def test_the_last_record_of_a_pair_in_a_tick_is_what_the_cache_serves(script: list[Window]
                                                                       ) -> None:
    with tempfile.TemporaryDirectory() as folder:
        records = asyncio.run(_run(Path(folder), script))
    policy = example_desired().group("shop").failover
    ramp = example_desired().group("shop").standby_ramp
    for record in records:
        if record["kind"] in ("weight_shift", "return", "threshold_breach"):
            assert replay_record(policy, record).weights_after == proposed_weights(record)
        if record["kind"].startswith("ramp_"):
            assert replay_ramp_record(ramp, policy, record).weights_after == \
                record["weights_after"]


def test_a_ramp_capped_shift_is_one_record_of_what_was_pushed(tmp_path: Path) -> None:
    """The cold standby: the controller proposes 95 -> 80 for the primary, the ramp caps the
    standby at 10 %: the weight_shift record says 95 -> 90 (its weights and the start of its
    rule) and shows the proposal inside."""
    script: list[Window] = [{pair: {"primary": 3, "secondary": 0} for pair in PAIRS}] * 2
    records = asyncio.run(_run(tmp_path, script))
    shift = next(r for r in records if r["kind"] == "weight_shift" and r["pop"] == "ewr")
    assert shift["weights_after"] == {"primary": 90, "secondary": 10}
    assert shift["detail"]["proposed"]["primary"] < 90
    assert shift["detail"]["changed_by"].startswith("ramp_start: secondary is cold")
    # its words say what was pushed first, and that the proposal was not
    assert shift["rule"].startswith("pushed primary 95→90, secondary 5→10 (ramp_start changed "
                                    "the controller's proposal primary "), shift["rule"]
    assert "which was not pushed); the controller's step: " in shift["rule"]
