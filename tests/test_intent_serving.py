"""PoPs serving different desired states at once (issue 23's rollouts): the running intent's
`serving`, the one translation entry point, the carry-over rule, the change transaction that
moves PoPs between versions (saved, undone, re-building only the PoPs that move), the rollout
driver's restore from what the store held, and a node's ACK of its PoP's current output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from control_plane.ads.nodes import NodeRegistry
from control_plane.decide.controller import ControllerState
from control_plane.decide.gates import PopWindow, TierShed
from control_plane.decide.rollout import start
from control_plane.decide.signals import OriginSignals
from control_plane.decisions.log import DecisionLog
from control_plane.decisions.read import iter_records
from control_plane.decisions.recorder import DecisionRecorder
from control_plane.desired import parse_desired
from control_plane.desired.model import Desired
from control_plane.intent.carry_over import carry_over
from control_plane.intent.rollout_state import (
    ROLLOUT_KEY,
    Version,
    restored,
    serving_of,
    window_from_json,
    window_json,
)
from control_plane.intent.running import RunningIntent
from control_plane.intent.served import translate_intent
from control_plane.intent.sqlite_store import StateStore
from control_plane.intent.store import (
    ROLLOUT_BEFORE_KIND,
    ROLLOUT_KIND,
    SERVING_KEY,
    SERVING_KIND,
    VERSION_KIND,
    StateCorrupted,
)
from control_plane.observe.source import Signals
from control_plane.reconcile.reconcile import Reconciler
from control_plane.translate import render_json
from control_plane.translate.resources import Capabilities
from control_plane.xds_port.server import intent_and_cache

CAPS = Capabilities()
T0 = 1_800_000_000_000

YAML = """\
pops:
  ewr: {{listen_address: 127.0.0.1, port_offset: 0}}
  sjc: {{listen_address: 127.0.0.1, port_offset: 1}}
  lax: {{listen_address: 127.0.0.1, port_offset: 2}}
origin_groups:
  shop:
    origins:
      primary: {{address: 127.0.0.1, port: 8001}}
      secondary: {{address: 127.0.0.1, port: {secondary}}}
{third}    preference:
      ewr: [primary, secondary{third_pref}]
      sjc: [primary, secondary{third_pref}]
      lax: [primary, secondary{third_pref}]
rollout: {{canary: [ewr], waves: [50%, 100%], bake: 1m}}
listeners:
  - name: edge
    port: 10000
    virtual_hosts:
      - {{name: shop, domains: ["*"], origin_group: shop}}
"""


def version(secondary: int = 8002, third: bool = False) -> Version:
    text = YAML.format(secondary=secondary,
                       third="      third: {address: 127.0.0.1, port: 8003}\n" if third else "",
                       third_pref=", third" if third else "")
    data = text.encode()
    return Version(parse_desired(data, "desired.yaml"), data)


def rendered(intent: RunningIntent, pop: str) -> str:
    return render_json(translate_intent(intent, pop, CAPS))


def test_a_pop_on_an_older_version_is_translated_from_it_byte_for_byte() -> None:
    old, new = version().desired, version(secondary=9002).desired
    mixed = RunningIntent(new, serving={"sjc": old, "lax": old})
    assert rendered(mixed, "ewr") == rendered(RunningIntent(new), "ewr")
    for pop in ("sjc", "lax"):
        assert rendered(mixed, pop) == rendered(RunningIntent(old), pop)
        assert rendered(mixed, pop) != rendered(RunningIntent(new), pop)
    assert mixed.versions() == {"ewr": new.digest, "sjc": old.digest, "lax": old.digest}
    assert mixed.pops_on(old) == ["sjc", "lax"]


def test_carry_over_judges_each_pair_by_the_version_its_pop_serves() -> None:
    old, new = version().desired, version(third=True).desired
    weights = {"primary": 60, "secondary": 40}
    running = RunningIntent(old, weights={("ewr", "shop"): weights, ("sjc", "shop"): weights},
                            controllers={("sjc", "shop"): ControllerState()})
    # ewr moves to the version with a third origin (the weights no longer fit), sjc stays
    carried = carry_over(running, new, {"sjc": old, "lax": old})
    assert carried.intent.weights == {("sjc", "shop"): weights}
    assert ("ewr", "shop") in carried.notes
    assert carried.intent.weights_of("ewr", "shop") == new.group("shop").home_weights("ewr")
    assert carried.intent.serving == {"sjc": old, "lax": old}
    # a PoP listed on the target itself is on the target
    assert carry_over(running, new, {"ewr": new}).intent.serving == {}


async def test_a_wave_moves_only_its_pops_and_saves_who_serves_what(tmp_path: Path) -> None:
    old, new = version().desired, version(secondary=9002).desired
    store = StateStore(tmp_path)
    owner, cache = intent_and_cache(old, store=store)
    before = {pop: cache.resources(pop, CAPS) for pop in old.pop_names}
    async with owner.change() as change:
        change.desired(new, serving={"sjc": old, "lax": old})
        assert await change.prepare() == frozenset({"ewr"})
    assert change.pushed == frozenset({"ewr"})
    assert cache.resources("sjc", CAPS) is before["sjc"]  # the same snapshot: nothing pushed
    assert cache.resources("lax", CAPS) is before["lax"]
    assert cache.resources("ewr", CAPS) is not before["ewr"]
    stored = store.load()
    assert stored.desired_digest == new.digest
    assert stored.records[SERVING_KIND] == {SERVING_KEY: {"sjc": old.digest, "lax": old.digest}}
    # the next wave: sjc joins; the rollout's own records go in the same write
    async with owner.change() as change:
        change.desired(new, serving={"lax": old})
        change.keep([(ROLLOUT_KIND, ROLLOUT_KEY, {"wave": 1})], [(ROLLOUT_KIND, ROLLOUT_KEY, None)])
    assert change.pushed == frozenset({"sjc"})
    stored = store.load()
    assert stored.records[SERVING_KIND] == {SERVING_KEY: {"lax": old.digest}}
    assert stored.records[ROLLOUT_KIND] == {ROLLOUT_KEY: {"wave": 1}}
    # a rollback: every PoP on the old version, nothing left in `serving`
    async with owner.change() as change:
        change.desired(old, serving={})
    assert change.pushed == frozenset({"ewr", "sjc"})
    assert SERVING_KIND not in store.load().records
    for pop in old.pop_names:
        assert render_json(cache.resources(pop, CAPS)) == render_json(before[pop])
    store.close()


async def test_a_failed_swap_puts_back_who_served_what(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    old, new = version().desired, version(secondary=9002).desired
    store = StateStore(tmp_path)
    owner, cache = intent_and_cache(old, store=store)
    async with owner.change() as change:
        change.desired(new, serving={"sjc": old, "lax": old})

    def broken(*args: object, **kwargs: object) -> frozenset[str]:
        raise RuntimeError("swap broke")

    monkeypatch.setattr(cache, "commit", broken)
    with pytest.raises(Exception, match="swap broke"):
        async with owner.change() as change:
            change.desired(new, serving={"lax": old})
            change.keep([(ROLLOUT_KIND, ROLLOUT_KEY, {"wave": 1})],
                        [(ROLLOUT_KIND, ROLLOUT_KEY, None)])
    stored = store.load()
    assert stored.records[SERVING_KIND] == {SERVING_KEY: {"sjc": old.digest, "lax": old.digest}}
    assert ROLLOUT_KIND not in stored.records
    assert owner.intent.serving == {"sjc": old, "lax": old}
    store.close()


def _parse(data: bytes, source: str) -> Desired:
    return parse_desired(data, source)


def test_a_saved_rollout_is_restored_with_its_versions() -> None:
    old, new = version(), version(secondary=9002)
    rollout, _ = start(new.desired.rollout, old.digest, new.digest, new.desired.pop_names,
                       old.desired.pop_names, 1000)
    records = {ROLLOUT_KIND: {ROLLOUT_KEY: {"rollout": rollout.to_dict(), "failed": {}}},
               VERSION_KIND: {old.digest: old.stored(), new.digest: new.stored()},
               SERVING_KIND: {SERVING_KEY: {"sjc": old.digest, "lax": old.digest}}}
    # the file holds a third version (edited while the server was down): the rollout resumes
    # and the watcher applies the file afterwards
    file = version(secondary=7002)
    held = restored(records, {file.digest: file}, _parse, "state.db")
    assert held is not None
    assert held.target.digest == new.digest
    assert {pop: d.digest for pop, d in held.serving.items()} == {"sjc": old.digest,
                                                                  "lax": old.digest}
    assert held.serving == serving_of(rollout, held.versions)
    assert held.before == {}
    # the canary's window before its wave, saved with the rollout, comes back as it was
    window = PopWindow("ewr", (("shop", "primary", OriginSignals(
        100, 2, 0, 10.0, 40.0, 0.0, 0, None, 1000, latency_samples=100, p95_low_ms=35.0)),),
        (("shop", "background", TierShed(50, 5)),), 0)
    with_before = {**records, ROLLOUT_BEFORE_KIND: {"ewr": window_json(window)}}
    held = restored(with_before, {file.digest: file}, _parse, "state.db")
    assert held is not None and held.before == {"ewr": window}
    assert window_from_json("ewr", json.loads(json.dumps(window_json(window)))) == window
    bad = {**records, ROLLOUT_BEFORE_KIND: {"ewr": {"origins": [["shop", "primary", {"x": 1}]],
                                                     "tiers": [], "tier_action_onsets": 0}}}
    with pytest.raises(StateCorrupted, match="baseline"):
        restored(bad, {file.digest: file}, _parse, "state.db")
    assert restored({}, {old.digest: old}, _parse, "state.db") is None
    unknown = {**records, SERVING_KIND: {SERVING_KEY: {"sjc": "f" * 64}}}
    with pytest.raises(StateCorrupted, match="serving"):
        restored(unknown, {file.digest: file}, _parse, "state.db")
    broken = {**records, VERSION_KIND: {new.digest: new.stored()}}
    with pytest.raises(StateCorrupted, match="not stored"):
        restored(broken, {file.digest: file}, _parse, "state.db")
    swapped = {**records, VERSION_KIND: {old.digest: new.stored(), new.digest: new.stored()}}
    with pytest.raises(StateCorrupted, match="digest"):
        restored(swapped, {file.digest: file}, _parse, "state.db")


def test_a_node_has_applied_its_pops_output_only_when_it_acked_all_of_it() -> None:
    desired = version().desired
    _, cache = intent_and_cache(desired)
    current = cache.resources("ewr", CAPS)
    entry = NodeRegistry().connect(node_id="n1", pop="ewr", mode="sotw", envoy_version="1.40.0",
                                   capability_key=CAPS.key, capability_reason="test")
    assert not entry.applied(current)
    entry.answered_from = current
    entry.sent("type.googleapis.com/envoy.config.cluster.v3.Cluster", "v1")
    assert not entry.applied(current)  # sent, not yet ACKed
    entry.acked("type.googleapis.com/envoy.config.cluster.v3.Cluster", "v1")
    assert entry.applied(current)
    assert not entry.applied(None)
    entry.nacked("type.googleapis.com/envoy.config.cluster.v3.Cluster", "v1", "bad")
    assert not entry.applied(current)


class SjcPrimaryFails:
    """sjc's primary answers 30 % errors; every other origin is healthy."""

    async def window(self, now_ms: int, window_ms: int) -> Signals:
        def origin(errors: int) -> OriginSignals:
            return OriginSignals(1000, errors, 0, 20.0, 60.0, 0.0, 0, 1.0, now_ms)

        return {(pop, "shop"): {"primary": origin(300 if pop == "sjc" else 0),
                                "secondary": origin(0), "third": origin(0)}
                for pop in ("ewr", "sjc", "lax")}


async def test_weights_keep_moving_in_a_pop_on_the_old_version(tmp_path: Path) -> None:
    """A tick during a rollout: sjc, still on the old version (two origins), shifts away from
    its failing primary under that version's policy; ewr, on the new one (a third origin),
    holds; each record names the version its PoP serves."""
    old, new = version().desired, version(third=True).desired
    log = DecisionLog(tmp_path)
    owner, _ = intent_and_cache(new, recorder=DecisionRecorder(log),
                                serving={"sjc": old, "lax": old})
    reconciler = Reconciler(owner, SjcPrimaryFails(), seed=3)
    for tick in range(6):
        await reconciler.tick(T0 + tick * 20_000)
    log.close()
    assert set(owner.weights("sjc", "shop")) == {"primary", "secondary"}
    assert owner.weights("sjc", "shop")["primary"] < old.group("shop").home_weights(
        "sjc")["primary"]
    assert owner.weights("ewr", "shop") == new.group("shop").home_weights("ewr")
    shifts = [r for r in iter_records(tmp_path) if r["kind"] == "weight_shift"]
    assert shifts and {r["pop"] for r in shifts} == {"sjc"}
    assert {r["config_version"] for r in shifts} == {old.digest[:16]}
    assert owner.intent.serving == {"sjc": old, "lax": old}  # ticks move no PoP


def test_each_pops_host_stats_map_through_the_version_it_serves() -> None:
    from control_plane.observe.endpoints import served_endpoints
    from control_plane.observe.prometheus import assemble

    old, new = version(third=True).desired, version(secondary=9002).desired
    served = served_endpoints(new, {"sjc": old, "lax": old})
    # sjc and lax still route to `third` and to `secondary` at its old port
    for pop in ("sjc", "lax"):
        assert served.of(pop)[("shop.critical", "127.0.0.1:8003")] == ("shop", "third")
        assert served.of(pop)[("shop.critical", "127.0.0.1:8002")] == ("shop", "secondary")
        assert ("shop.critical", "127.0.0.1:9002") not in served.of(pop)
    assert served.of("ewr")[("shop.critical", "127.0.0.1:9002")] == ("shop", "secondary")
    assert ("shop.critical", "127.0.0.1:8003") not in served.of("ewr")
    assert served.of("a-pop-added-later") is served.of("ewr")  # the target's
    assert served.tier_clusters("sjc") == served.tier_clusters("ewr")

    def row(pop: str, address: str, value: float) -> dict:
        labels = {"ballast_pop": pop, "envoy_cluster_name": "shop.critical",
                  "envoy_endpoint_address": address}
        return {"metric": labels, "value": [0, str(value)]}

    host = {"host_requests": [row("sjc", "127.0.0.1:8003", 20), row("ewr", "127.0.0.1:8003", 20)],
            "host_errors": [row("sjc", "127.0.0.1:8003", 5), row("ewr", "127.0.0.1:8003", 5)],
            "host_observed_at": [row("sjc", "127.0.0.1:8003", 6),
                                 row("ewr", "127.0.0.1:8003", 6)]}
    signals = assemble(host, served)
    assert signals[("sjc", "shop")]["third"].errors_5xx == 5  # judged on the PoP's own version
    assert "third" not in signals.get(("ewr", "shop"), {})  # ewr's version has no such origin


def test_origins_of_every_served_version_are_probed_the_target_first() -> None:
    from control_plane.observe.probes import probe_targets

    old, new = version(third=True).desired, version(secondary=9002).desired
    during = {(t.group, t.origin): t.port for t in probe_targets(new, {"sjc": old})}
    assert during == {("shop", "primary"): 8001, ("shop", "secondary"): 9002,
                      ("shop", "third"): 8003}
    after = {(t.group, t.origin) for t in probe_targets(new, {})}
    assert after == {("shop", "primary"), ("shop", "secondary")}


async def test_the_service_follows_each_wave_with_its_probes(tmp_path: Path) -> None:
    """The sources' maps and the probes follow what is served, wave by wave: a PoP still on the
    previous version keeps its origin probed until no PoP serves it (a real service, its
    reload and the operator's abort)."""
    from tests.support.example_service import example_service

    async with example_service(tmp_path, probes=True) as (service, text):
        assert service.prober is not None

        def probed() -> set[str]:
            assert service.prober is not None
            return {t.origin for t in service.prober.targets}

        assert probed() == {"primary", "secondary"}
        renamed = text.replace("secondary: {address: 127.0.0.1, port: 8082, tls: false}",
                               "standby: {address: 127.0.0.1, port: 8083, tls: false}")
        renamed = renamed.replace("[primary, secondary]", "[primary, standby]")
        assert await service.reload.apply(renamed.encode())  # the canary wave (ewr) only
        running = service.server.intent.intent
        assert running.serving and "sjc" in running.serving
        assert probed() == {"primary", "secondary", "standby"}
        await service.rollouts.act("abort", "test")
        assert not service.server.intent.intent.serving
        assert probed() == {"primary", "secondary"}
