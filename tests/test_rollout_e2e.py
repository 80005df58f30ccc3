"""Issue 23 end to end: a change of the desired state rolls out wave by wave through real Envoys
in three PoPs (ewr the canary, then sjc, then lax), judged by its gates.

- a good change: each PoP's Envoy gets it only when its wave starts, each wave after the
  previous one baked; `ballast status` shows each PoP's version as it moves;
- a change that makes the canary's origin answer 503: rolled back automatically before sjc or
  lax get it, with a record naming the regressed signal; the same bytes are not applied again;
- a change one Envoy build NACKs (a value only Envoy 1.37 and later know, in the canary PoP
  beside a 1.40 Envoy that ACKs it): rolled back before sjc or lax get it, the node, its build
  and the NACK's message in the record;
- pause, resume, promote, abort and apply --now from the CLI and the admin API, behind the
  admin token like every other route.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from control_plane.cli.main import main
from control_plane.decisions.read import record_time
from control_plane.observe.sink import SinkStore
from harness.envoy_process import EnvoyProcess
from harness.eventually import eventually
from harness.rollout_fleet import POPS, RolloutFleet, admin_post, rollout_fleet
from tests.support.envoy_releases import envoy_binary

pytestmark = pytest.mark.envoy

BAKE_S = 2.0
ROUTES = "/config_dump?resource=dynamic_route_configs"
ENDPOINTS = "/config_dump?include_eds"
LISTENERS = "/config_dump?resource=dynamic_listeners"


def _versions(fleet: RolloutFleet) -> dict[str, str]:
    """PoP -> the version (digest) it serves, as `ballast status` shows it."""
    assert fleet.service is not None
    return {pop: shown["version"] for pop, shown in
            fleet.service.status()["pop_versions"].items()}


async def _synced(fleet: RolloutFleet) -> None:
    assert fleet.service is not None
    acks = fleet.service.server.acks
    await eventually(lambda: all(acks.pop(pop).applied == fleet.nodes(pop) for pop in POPS), 20,
                     "every Envoy synced")
    await eventually(lambda: fleet.origins["primary"].total > 60, 20, "traffic on the primary")
    # what each PoP's Envoy reported before the change: its own baseline for the gates
    source = fleet.service.rollouts.source

    async def reported() -> bool:
        window = await source.window(int(time.time() * 1000), int(BAKE_S * 1000))
        return all(sum(s.requests for s in window.get((pop, "shop"), {}).values()) >= 10
                   for pop in POPS)

    await eventually(reported, 20, "every PoP's Envoy reporting its traffic")


class Watch:
    """What a rollout looks like over time: the versions `ballast status` shows, and when each
    PoP's Envoy first holds `marker` in its config_dump (`path`)."""

    def __init__(self, fleet: RolloutFleet, marker: str, path: str) -> None:
        self.fleet, self.marker, self.path = fleet, marker, path
        self.seen: dict[str, float] = {}
        self.versions: list[dict[str, str]] = []

    async def look(self) -> bool:
        shown = _versions(self.fleet)
        if not self.versions or self.versions[-1] != shown:
            self.versions.append(shown)
        dumps = await asyncio.to_thread(
            lambda: {pop: envoy.admin(self.path) for pop, envoy in self.fleet.envoys.items()})
        for pop, dump in dumps.items():
            if pop not in self.seen and self.marker in dump:
                self.seen[pop] = time.time()
        return len(self.seen) == len(POPS)

    def on(self, version: str) -> list[list[str]]:
        """The PoPs on `version` in each distinct state seen."""
        return [sorted(pop for pop, v in shown.items() if v.startswith(version))
                for shown in self.versions]


async def test_a_good_change_rolls_out_wave_by_wave(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async with rollout_fleet(tmp_path) as fleet:
        await _synced(fleet)
        old = _versions(fleet)
        assert len(set(old.values())) == 1, old
        fleet.write(marker="rollout-marker")
        watch = Watch(fleet, "/rollout-marker", ROUTES)
        await eventually(watch.look, 60, "every PoP's Envoy to get the change", interval=0.1)
        await eventually(lambda: fleet.records("rollout_passed"), 30, "the rollout to pass")
        records = fleet.records()
        kinds = [r["kind"] for r in records if r["kind"].startswith(("rollout", "wave"))]
        assert kinds[:2] == ["rollout_started", "wave_started"], kinds
        assert kinds.count("wave_started") == 3 and kinds.count("wave_passed") == 3, kinds
        waves = [r["detail"]["pops"] for r in records if r["kind"] == "wave_started"]
        assert waves == [["ewr"], ["sjc"], ["lax"]], waves
        # each wave started after the previous one baked (the rollout's own wave start times:
        # a record is written a few ms after the look that decided it), and each PoP's Envoy
        # got the change only once its wave had started (the record's time; the Envoy is asked
        # every 0.1 s)
        assert fleet.service is not None and fleet.service.rollouts.rollout is not None
        decided = fleet.service.rollouts.rollout.wave_starts
        assert len(decided) == 3, decided
        assert all(b - a >= BAKE_S * 1000 for a, b in itertools.pairwise(decided)), decided
        starts = {r["detail"]["pops"][0]: record_time(r).timestamp()
                  for r in records if r["kind"] == "wave_started"}
        seen = watch.seen
        assert seen["ewr"] < seen["sjc"] < seen["lax"], seen
        assert all(seen[pop] >= starts[pop] for pop in POPS), (seen, starts)
        # `ballast status` over time: the canary alone first, then sjc, then every PoP
        new = _versions(fleet)
        assert len(set(new.values())) == 1 and new != old, new
        on_new = watch.on(new["ewr"])
        assert ["ewr"] in on_new and ["ewr", "sjc"] in on_new, watch.versions
        assert on_new.index(["ewr"]) < on_new.index(["ewr", "sjc"]), watch.versions
        assert fleet.statuses[0] == 0, fleet.statuses
        # each wave's gate read its PoPs' shed rate per tier (issue 33: every PopWindow was
        # built without tier data, so the shed gate never ran in the product)
        for passed in fleet.records("wave_passed"):
            readings = passed["detail"]["gate"]["readings"]
            assert any(r["signal"] == "shed" and r["key"] == "shop/critical"
                       for r in readings), readings
        assert fleet.service is not None and fleet.service.admin is not None
        # `ballast status` (the CLI): each PoP's version, the rollout in a line
        capsys.readouterr()
        assert await asyncio.to_thread(main, ["status", "--server", fleet.service.admin.url]
                                       ) == 0
        shown = capsys.readouterr().out
        for pop in POPS:
            assert f"  {pop}  {new[pop][:16]}  1 applied, 0 pending, 0 NACKed" in shown, shown
        assert f"rollout of {new['ewr'][:16]}: passed, wave 3 of 3 (lax)" in shown, shown
        # /metrics: the rollout's phase and wave, each PoP's version
        scrape = f"{fleet.service.admin.url}/metrics"
        metrics = await asyncio.to_thread(
            lambda: urllib.request.urlopen(scrape, timeout=10).read().decode())
        assert 'ballast_rollout_phase{phase="passed"} 1.0' in metrics, metrics
        assert 'ballast_rollout_wave{of="total"} 3.0' in metrics, metrics
        for pop in POPS:
            assert f'ballast_pop_config_version{{pop="{pop}",version="{new[pop][:16]}"}} 1.0' \
                in metrics, metrics


async def test_a_change_that_breaks_the_canary_is_rolled_back(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async with rollout_fleet(tmp_path) as fleet:
        await _synced(fleet)
        old = _versions(fleet)
        broken = fleet.origins["broken"].port
        assert fleet.service is not None
        source = fleet.service.rollouts.source
        failing: list[float] = []  # when the first stats flush with the broken origin's 5xx came

        async def watch_failing() -> None:
            while not failing:
                window = await source.window(int(time.time() * 1000), 1000)
                primary = window.get(("ewr", "shop"), {}).get("primary")
                if primary is not None and primary.errors_5xx:
                    failing.append(time.time())
                await asyncio.sleep(0.05)

        watcher = asyncio.create_task(watch_failing())
        fleet.write(primary_port=broken)
        watch = Watch(fleet, f'"port_value": {broken}', ENDPOINTS)

        async def rolled_back() -> bool:
            await watch.look()
            return bool(fleet.records("rolled_back"))

        await eventually(rolled_back, 60, "the rollback", interval=0.1)
        watcher.cancel()
        rolled = fleet.records("rolled_back")[-1]
        # rolled back within one flush (1 s) and one look (0.2 s) after the first flush that
        # showed the broken origin's failures (a new host series counts from zero; the flush
        # that closes the interval of the ACK is the window's baseline): it took 9.7-10.1 s
        # before (issue 33); the margin is for a loaded machine (the look and the record)
        assert failing, "the sink never showed the broken origin's failures"
        assert record_time(rolled).timestamp() - failing[0] <= 1.0 + 0.2 + 0.6, (
            record_time(rolled).timestamp() - failing[0])
        assert "5xx" in rolled["rule"], rolled["rule"]
        assert "ewr" in rolled["rule"], rolled["rule"]
        assert rolled["detail"]["next"], rolled
        # `ballast explain` tells the story of the rollout, as it concerns the PoP
        capsys.readouterr()
        assert await asyncio.to_thread(main, ["explain", "--state-dir", str(fleet.state_dir),
                                              "--pop", "ewr", "--group", "shop"]) == 0
        explained = capsys.readouterr().out
        assert "config rollout of" in explained and "rolled_back" in explained, explained
        assert "wave_started" in explained and "5xx" in explained, explained
        # sjc and lax never got it: no wave but the canary's started, and their Envoys never
        # sent a request to the broken origin
        waves = [r["detail"]["pops"] for r in fleet.records("wave_started")]
        assert waves == [["ewr"]], waves
        await eventually(lambda: _versions(fleet) == old, 10, "every PoP back on the old version")
        assert list(watch.seen) == ["ewr"], watch.seen
        assert all(on == ["ewr"] for on in watch.on(rolled["config_version"]) if on), \
            watch.versions
        # the same bytes are not applied again (SIGHUP re-reads the file)
        assert fleet.service is not None
        fleet.service.watcher.trigger()
        await eventually(lambda: any("failed its rollout" in p for r in
                                     fleet.records("config_rejected")
                                     for p in r["detail"]["problems"]), 10, "refused again")
        assert _versions(fleet) == old


def _lds(envoy: EnvoyProcess) -> dict[str, int]:
    """The Envoy's LDS update counters (update_success, update_rejected)."""
    stats = envoy.admin("/stats?filter=^listener_manager\\.lds\\.update_(success|rejected)$")
    return {line.split(": ")[0].rsplit(".", 1)[-1]: int(line.split(": ")[1])
            for line in stats.splitlines() if ": " in line}


async def test_a_change_an_older_envoy_nacks_is_rolled_back_with_its_message(
        tmp_path: Path) -> None:
    """The canary PoP ewr runs Envoy 1.40 (ewr-edge-1) and 1.36 (ewr-1.36). The change adds an
    ext_proc filter with `request_body_mode: GRPC`: Ballast's filter gate sends it to both (1.36
    lists ext_proc), 1.40 applies it, 1.36's proto validation refuses the value. The gate fails
    on the NACK although ewr's other node ACKed, and the rollback names the node, its build and
    what Envoy said."""
    async with rollout_fleet(tmp_path, canary_builds={"1.36": envoy_binary("1.36")}) as fleet:
        await _synced(fleet)
        old = _versions(fleet)
        newest, oldest = fleet.envoys["ewr"], fleet.canary_builds["1.36"]
        before = {"1.40": _lds(newest), "1.36": _lds(oldest)}
        fleet.write(newer_filter=True)
        await eventually(lambda: fleet.records("rolled_back"), 30, "the rollback")
        rolled = fleet.records("rolled_back")[-1]
        rule = rolled["rule"]
        assert "pop ewr: node ewr-1.36 (Envoy 1.36.4) NACKed Listener" in rule, rule
        assert "request_body_mode" in rule.lower() and \
            "value must be one of the defined enum values" in rule, rule
        assert [r["signal"] for r in rolled["detail"]["failing"]] == ["nack"], rolled
        # before sjc or lax got it: only the canary's wave started, none passed
        waves = [r["detail"]["pops"] for r in fleet.records("wave_started")]
        assert waves == [["ewr"]], waves
        assert not fleet.records("wave_passed"), fleet.records("wave_passed")
        await eventually(lambda: _versions(fleet) == old, 10, "every PoP back on the old version")
        # ewr's 1.40 took the change and then the rollback (two LDS updates, nothing refused):
        # its ACK did not pass the gate; the 1.36 refused it
        await eventually(lambda: _lds(newest)["update_success"]
                         >= before["1.40"]["update_success"] + 2, 10, "1.40 took both")
        assert _lds(newest)["update_rejected"] == before["1.40"]["update_rejected"]
        assert _lds(oldest)["update_rejected"] > before["1.36"]["update_rejected"]
        for pop in ("sjc", "lax"):
            dump = await asyncio.to_thread(fleet.envoys[pop].admin, LISTENERS)
            assert "ExternalProcessor" not in dump, pop
        # every node of ewr applied the old version again
        assert fleet.service is not None
        await eventually(lambda: fleet.service.server.acks.pop("ewr").applied == 2, 10,
                         "both ewr nodes on the old version")


async def _cli(*args: str) -> int:
    return await asyncio.to_thread(main, ["rollout", *args])


async def test_operators_pause_resume_promote_abort_and_apply_now(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token = "rollout-test-token"
    async with rollout_fleet(tmp_path, admin_token=token) as fleet:
        assert fleet.service is not None and fleet.service.admin is not None
        url = fleet.service.admin.url
        token_file = str(tmp_path / "admin.token")
        auth = ("--server", url, "--token-file", token_file)
        await _synced(fleet)
        old = _versions(fleet)
        fleet.write(marker="first", bake="10m")
        await eventually(lambda: fleet.records("wave_started"), 10, "the canary wave")
        # every action needs the admin API's authentication
        assert (await asyncio.to_thread(admin_post, f"{url}/rollout/pause", None))[0] == 401
        assert await _cli("pause", "--server", url) == 1
        assert await _cli("pause", *auth) == 0
        paused = fleet.records("rollout_paused")[-1]
        assert "token via the admin API" in paused["rule"], paused
        capsys.readouterr()
        assert await _cli("status", *auth) == 0
        shown = capsys.readouterr().out
        assert "paused" in shown and "* wave 1: ewr" in shown, shown
        status, answer = await asyncio.to_thread(admin_post, f"{url}/rollout/pause", token)
        assert status == 409 and "paused already" in str(answer["error"]), answer
        status, answer = await asyncio.to_thread(admin_post, f"{url}/rollout/resume", token)
        assert status == 200 and answer["rollout"]["phase"] == "baking", answer
        assert (await asyncio.to_thread(admin_post, f"{url}/rollout/launch", token))[0] == 404
        # promote: every PoP on the new version now, its waves skipped
        assert await _cli("promote", *auth) == 0
        watch = Watch(fleet, "/first", ROUTES)
        await eventually(watch.look, 20, "every Envoy on the promoted version", interval=0.1)
        promoted = _versions(fleet)
        assert len(set(promoted.values())) == 1 and promoted != old, promoted
        assert fleet.records("rollout_promoted")
        # abort: the canary back on the last version that passed
        fleet.write(marker="second", bake="10m")
        await eventually(lambda: len(fleet.records("wave_started")) == 2, 10, "a new canary")
        await eventually(lambda: _versions(fleet)["ewr"] != promoted["ewr"], 10, "ewr moved")
        status, answer = await asyncio.to_thread(admin_post, f"{url}/rollout/abort", token)
        assert status == 200 and answer["rollout"]["phase"] == "aborted", answer
        assert _versions(fleet) == promoted
        aborted = fleet.records("rollout_aborted")[-1]
        assert "token via the admin API" in aborted["rule"], aborted
        # apply --now: the aborted file, on every PoP at once, recorded as such
        assert await _cli("apply", "--now", *auth) == 0
        watch = Watch(fleet, "/second", ROUTES)
        await eventually(watch.look, 20, "every Envoy on the version applied --now",
                         interval=0.1)
        started = fleet.records("rollout_started")[-1]
        assert started["detail"]["immediate"] is True and "--now" in started["rule"], started
        assert len(set(_versions(fleet).values())) == 1


async def _burst(fleet: RolloutFleet, pop: str, requests: int) -> list[int]:
    """`requests` GETs through `pop`'s listener, a few at a time; their statuses."""
    url = f"http://127.0.0.1:{fleet.ports.listeners[pop]}/api/checkout/cart"
    gate = asyncio.Semaphore(4)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:

        async def one() -> int:
            async with gate, session.get(url) as answer:
                await answer.read()
                return answer.status

        return list(await asyncio.gather(*(one() for _ in range(requests))))


def _flushes(fleet: RolloutFleet, node: str) -> int:
    """Stats flushes the service's sink got from `node` so far."""
    assert fleet.service is not None
    sink = fleet.service._passive
    assert isinstance(sink, SinkStore)
    return sink.flushed(node)


async def test_at_the_shortest_bake_no_wave_passes_on_traffic_served_before_the_change(
        tmp_path: Path) -> None:
    """Issue 33: 'with bake: 1s, wave 1 passed 1.5 s after it started on 5xx 0.0 % (0 of
    25)': the first stats flush after a wave starts carries traffic served on the old config.
    Here ewr's traffic is sent by hand: a burst right before the change (the old config
    answers it well) lands in the first flush after the canary applies it, then nothing for a
    bake and more; then the new config's own traffic, which times out (read_timeout 1ms). At
    the shortest bake (two 1 s flushes) the canary does not pass on the burst: its gate
    waits for the change's own traffic, then fails on it."""
    async with rollout_fleet(tmp_path, traffic=("sjc", "lax")) as fleet:
        assert fleet.service is not None
        acks = fleet.service.server.acks
        await eventually(lambda: all(acks.pop(pop).applied == 1 for pop in POPS), 20,
                         "every Envoy synced")
        source = fleet.service.rollouts.source

        async def reported() -> bool:
            assert set(await _burst(fleet, "ewr", 8)) == {200}  # ewr's own window before
            window = await source.window(int(time.time() * 1000), 3000)
            return all(sum(s.requests for s in window.get((pop, "shop"), {}).values()) >= 10
                       for pop in POPS)

        await eventually(reported, 20, "every PoP's Envoy reporting its traffic")
        flushed = _flushes(fleet, "ewr-edge-1")
        await eventually(lambda: _flushes(fleet, "ewr-edge-1") > flushed, 5,
                         "a flush of ewr's Envoy", interval=0.02)
        assert set(await _burst(fleet, "ewr", 30)) == {200}  # served on the old config
        fleet.write(marker="timeouts", read_timeout="1ms", bake=f"{BAKE_S:g}s")
        await eventually(lambda: fleet.records("wave_started"), 10, "the canary's wave")
        started = record_time(fleet.records("wave_started")[0]).timestamp()
        await eventually(lambda: acks.pop("ewr").applied == 1, 10, "ewr applying it")
        quiet_until = started + BAKE_S + 2.0
        await eventually(lambda: time.time() >= quiet_until or fleet.records("wave_passed"),
                         10, "a bake and two flushes without ewr traffic", interval=0.05)
        passed_early = fleet.records("wave_passed")
        statuses: list[int] = []

        async def rolled_back() -> bool:
            statuses.extend(await _burst(fleet, "ewr", 10))
            return bool(fleet.records("rolled_back"))

        if not passed_early:
            await eventually(rolled_back, 30, "the rollback on the change's own traffic",
                             interval=0.1)
        gates = [r for r in fleet.records("gate_reading") if r["kind"] == "gate_reading"]
    assert not passed_early, "\n".join(
        f"{r['time']} {r['kind']}: {r['rule']}" for r in fleet.records()
        if r["kind"] in ("wave_started", "gate_reading", "wave_passed"))
    assert any("no evidence yet" in r["rule"] or "waits" in r["rule"] for r in gates), \
        [r["rule"] for r in gates]
    # the failures of the new config's own attempts (1 ms read timeouts; a retry on the other
    # origin may still answer the client), or the overflows their retries make (a shed)
    rolled = fleet.records("rolled_back")[-1]
    assert ("5xx" in rolled["rule"] or "shed" in rolled["rule"]) and "ewr" in rolled["rule"], \
        rolled["rule"]
    assert statuses, "the new config's traffic was sent"
    assert not fleet.records("wave_passed"), "\n".join(
        f"{r['time']} {r['kind']}: {r['rule']} {r.get('detail')}" for r in fleet.records()
        if r["kind"] in ("wave_started", "gate_reading", "wave_passed", "rolled_back",
                         "config_applied", "config_rejected"))
