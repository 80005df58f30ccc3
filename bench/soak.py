"""Soak: `ballast serve` for hours under what a fleet does to it, sampled every minute.

`python -m bench.soak --hours 2 [--out DIR]` (`--minutes 10` in `make bench`). One process runs
everything around one real `ballast serve` (`python -m control_plane serve`, as an operator
runs it: state directory, decision log, SQLite, admin API, probes, the Envoys' stats as metric
source):

- 1,000 simulated nodes (`harness/lean_node.py`) over 100 PoPs, 10 to a connection, and two
  real Envoys (PoPs p000 and p001) with 20 requests/s each through origin group g000; every
  origin of the 20 groups is a real demo origin on loopback (their health checks answer);
- **nodes churn**: every `CHURN_S` seconds `CHURN_NODES` nodes close their stream and connect
  again (a node every second);
- **a hot reload every 5 minutes** (the file rewritten, `rollout: immediate`: g019's
  concurrency alternates, so every PoP's clusters change and every node gets CDS and EDS);
- **a regional incident every 15 minutes**: g000's first origin answers 60 % 503s through p000
  for `INCIDENT_S`, then heals (the weight controller shifts p000 away and back);
- **a rollout every 30 minutes**: a new version in waves (canary p000, then every PoP, bake 1
  minute); the PoPs of simulated nodes have no traffic, so the last wave waits for evidence
  until `evidence_timeout` pauses it, and the operator promotes it (`POST /rollout/promote`).
  Reloads due while a rollout is under way wait for it;
- **every minute** the server's RSS, descriptors and threads (`/proc`), its event loop's lag
  (the longest `/healthz` answer of the minute, asked every 0.25 s from a thread), the decision
  log's size (every file) and the store's (`state.db` with its WAL).

It ends with a report (`report.md` and `soak.png` in DIR, with a copy of the stopped server's
`state.db` in DIR/state) and fails (exit 1) when a sample grows
without bound (`trend`: the line fitted to the last half rises by more than 5 % of the first
half's level — RSS, descriptors, threads, loop lag, store — or the decision log grows faster
over the last half than over the first) or when the server logged an error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc

from bench.common import ROOT
from control_plane.decisions.read import iter_records
from control_plane.translate.bootstrap import ads_bootstrap
from harness.demo_origin import DemoOrigin, Fault
from harness.envoy_process import EnvoyProcess, free_port, stop_group
from harness.eventually import eventually_blocking
from harness.lean_node import STREAM_ERRORS, Bodies, LeanNode
from harness.traffic import steady_traffic, stop_tasks
from harness.xds_client import local_channel

POPS, GROUPS, NODES, PER_CONNECTION = 100, 20, 1000, 10
ENVOY_POPS = ("p000", "p001")
RPS = 20
CHURN_S, CHURN_NODES = 10.0, 10
SAMPLE_S = 60.0
PROBE_S = 0.25
RELOAD_EVERY_S, RELOAD_FIRST_S = 300.0, 60.0
INCIDENT_EVERY_S, INCIDENT_FIRST_S, INCIDENT_S = 900.0, 480.0, 180.0
ROLLOUT_EVERY_S, ROLLOUT_FIRST_S = 1800.0, 120.0
FLAT = 0.05  # the rise over the last half a flat sample may have, of the first half's level
# ... and at least this much (noise of a small level: a descriptor, a thread, 10 ms of lag)
FLAT_AT_LEAST = {"rss_mb": 2.0, "fds": 3.0, "threads": 1.0, "loop_lag_ms": 20.0,
                 "store_kb": 64.0}
GROWS = ("log_kb",)  # grows by design (appended, rotated at its bound): must not speed up
RECONCILE_RECORDS = ("weight_shift", "return")
UNDER_WAY = ("baking", "paused")  # a rollout's phases while it goes on


def desired_yaml(origins: dict[str, tuple[int, int]], listener_port: int, version: int,
                 rollout: str) -> str:
    """100 PoPs, 20 groups of two loopback origins; g000's virtual host takes every Host (the
    Envoys' traffic); g019's concurrency is 120 + `version` % 2 (what a reload changes)."""
    pops = [f"p{p:03d}" for p in range(POPS)]
    lines = ["pops:"]
    lines += [f"  {name}: {{listen_address: 127.0.0.1, port_offset: {p}}}"
              for p, name in enumerate(pops)]
    lines.append("origin_groups:")
    for g in range(GROUPS):
        name = f"g{g:03d}"
        first, second = origins[name]
        order = {pop: "[o0, o1]" if p % 2 == 0 else "[o1, o0]" for p, pop in enumerate(pops)}
        lines += [
            f"  {name}:",
            f"    max_origin_concurrency: {120 + version % 2 if g == GROUPS - 1 else 120}",
            "    origins:",
            f"      o0: {{address: 127.0.0.1, port: {first}}}",
            f"      o1: {{address: 127.0.0.1, port: {second}}}",
            "    preference: {" + ", ".join(f"{k}: {v}" for k, v in order.items()) + "}",
        ]
    lines += ["listeners:", "  - name: edge", f"    port: {listener_port}", "    virtual_hosts:"]
    hosts = [ANY_HOST, *(f"g{g:03d}.example" for g in range(1, GROUPS))]
    lines += [f"      - {{name: g{g:03d}, domains: [{host}], origin_group: g{g:03d}}}"
              for g, host in enumerate(hosts)]
    lines.append(f"rollout: {rollout}")
    return "\n".join(lines) + "\n"


ANY_HOST = '"*"'
IMMEDIATE = "{strategy: immediate}"
WAVES = ("{strategy: waves, canary: [p000], waves: [100%], bake: 1m, "
         "gates: {evidence_timeout: 1m, ack_timeout: 1m}}")


@dataclass
class Sample:
    minute: float  # since the start
    rss_mb: float
    fds: int
    threads: int
    loop_lag_ms: float  # the longest /healthz answer of the last minute
    loop_lag_p50_ms: float
    log_kb: float
    store_kb: float
    nodes: int  # simulated nodes synced


@dataclass
class Trend:
    """How a sample moved: the lines fitted to each half (per hour), the first half's level,
    the rise of the last half's line over its span, and whether that is within bounds."""

    name: str
    level: float
    first_slope: float
    last_slope: float
    last_rise: float
    bound: float
    ok: bool


def _slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (x, y) points (0 for fewer than two distinct x)."""
    if len(points) < 2:
        return 0.0
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        return 0.0
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread


def trend(name: str, points: Sequence[tuple[float, float]]) -> Trend:
    """`points` (hours, value) split in halves. A flat sample's last-half line may rise by
    `FLAT` of the first half's level (at least `FLAT_AT_LEAST[name]`); one that grows by design
    (`GROWS`) may not grow faster over the last half than over the first (+ `FLAT`)."""
    half = len(points) // 2
    first, last = points[:half], points[half:]
    level = statistics.fmean(y for _, y in first) if first else 0.0
    first_slope, last_slope = _slope(first), _slope(last)
    span = last[-1][0] - last[0][0] if len(last) > 1 else 0.0
    rise = last_slope * span
    if name in GROWS:
        bound = max(first_slope, 0.0) * (1 + FLAT) * span + FLAT * level
    else:
        bound = max(FLAT * abs(level), FLAT_AT_LEAST.get(name, 0.0))
    return Trend(name, level, first_slope, last_slope, rise, bound, rise <= bound)


def errors_logged(log: Path) -> list[str]:
    """The server's log lines at ERROR or CRITICAL, and tracebacks."""
    found = []
    for line in log.read_text(errors="replace").splitlines():
        if " ERROR " in line or " CRITICAL " in line or line.startswith("Traceback"):
            found.append(line[:300])
    return found


class LagProbe:
    """`/healthz` every `PROBE_S` from a thread; each answer's time, taken per sample."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.answers: list[float] = []
        self.failures = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                with urllib.request.urlopen(self.url, timeout=30) as answer:
                    answer.read()
            except OSError:
                self.failures += 1
            with self._lock:
                self.answers.append(time.perf_counter() - started)
            self._stop.wait(PROBE_S)

    def take(self) -> list[float]:
        with self._lock:
            taken, self.answers = self.answers, []
        return taken

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Events:
    reloads: int = 0
    reloads_waited: int = 0  # due while a rollout was under way
    incidents: int = 0
    rollouts: int = 0
    promoted: int = 0
    churned: int = 0
    requests: Counter[int] = field(default_factory=Counter)


class Soak:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.state = folder / "state"
        self.desired = folder / "desired.yaml"
        self.log = folder / "ballast.log"
        self.xds, self.admin = free_port(), free_port()
        self.listener = free_port()
        while any(_busy(self.listener + p) for p in range(len(ENVOY_POPS))):
            self.listener = free_port()
        self.origins: dict[str, DemoOrigin] = {}
        self.ports: dict[str, tuple[int, int]] = {}
        self.version = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.envoys: dict[str, EnvoyProcess] = {}
        self.bodies = Bodies()
        self.nodes: dict[int, LeanNode] = {}
        self.channels: dict[int, grpc.aio.Channel] = {}
        self.events = Events()
        self.samples: list[Sample] = []
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []
        self.connecting: set[asyncio.Task[None]] = set()  # churned nodes on their way back
        self.started = 0.0

    # -- set-up ----------------------------------------------------------------------------

    async def start(self) -> None:
        taken = {self.xds, self.admin, *(self.listener + p for p in range(len(ENVOY_POPS)))}
        for g in range(GROUPS):
            name = f"g{g:03d}"
            first, second = _free(taken), _free(taken)
            self.ports[name] = (first, second)
            self.origins[f"{name}/o0"] = await DemoOrigin(f"{name}-o0", first).start()
            self.origins[f"{name}/o1"] = await DemoOrigin(f"{name}-o1", second).start()
        self._write(IMMEDIATE)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "control_plane", "serve", str(self.desired),
                 "--xds-address", f"127.0.0.1:{self.xds}",
                 "--admin-address", f"127.0.0.1:{self.admin}",
                 "--state-dir", str(self.state), "--log-level", "warning"],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "GRPC_ENABLE_FORK_SUPPORT": "false"})
        await asyncio.to_thread(eventually_blocking, lambda: self._get("/readyz")[0] == 200,
                                60, "ballast serve ready", interval=0.2)
        for p, pop in enumerate(ENVOY_POPS):
            admin = free_port()
            self.envoys[pop] = EnvoyProcess(
                ads_bootstrap(node_id=f"{pop}-edge", pop=pop, xds_port=self.xds,
                              admin_port=admin, metrics_sink=True, needed_stats_only=True),
                admin, log_path=self.folder / f"envoy-{pop}.log").start()
            await asyncio.to_thread(self.envoys[pop].wait_ready, 30)
            self.tasks.append(asyncio.create_task(steady_traffic(
                f"http://127.0.0.1:{self.listener + p}", ("/", "/api/checkout"), RPS,
                self.stop, self._answered)))
        gate = asyncio.Semaphore(100)

        async def connect(index: int) -> None:
            async with gate:
                await self._connect(index)

        await asyncio.gather(*(connect(i) for i in range(NODES)))
        self.probe = LagProbe(f"http://127.0.0.1:{self.admin}/healthz")
        self.started = time.monotonic()

    def _answered(self, status: int) -> None:
        self.events.requests[status] += 1

    def _write(self, rollout: str) -> None:
        """The desired file, atomically (the server's watcher reads it within half a second)."""
        fresh = self.desired.with_suffix(".new")
        fresh.write_text(desired_yaml(self.ports, self.listener, self.version, rollout))
        fresh.replace(self.desired)

    def _get(self, path: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin}{path}",
                                        timeout=10) as answer:
                return answer.status, json.loads(answer.read() or b"null")
        except (OSError, ValueError):
            return 0, None

    def _post(self, path: str) -> int:
        request = urllib.request.Request(f"http://127.0.0.1:{self.admin}{path}", method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as err:
            return int(err.code)
        except OSError:
            return 0

    async def _connect(self, index: int) -> None:
        channel = self.channels.get(index // PER_CONNECTION)
        if channel is None:
            channel = self.channels[index // PER_CONNECTION] = local_channel(
                f"127.0.0.1:{self.xds}")
        node = self.nodes[index] = LeanNode(f"soak-{index}", f"p{index % POPS:03d}",
                                            self.bodies)
        with contextlib.suppress(*STREAM_ERRORS):
            await node.start(channel, 60)

    # -- the run ---------------------------------------------------------------------------

    async def run(self, seconds: float) -> None:
        self.tasks += [asyncio.create_task(loop()) for loop in (
            self._churn, self._sampler, self._reloads, self._incidents, self._rollouts)]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)
        self.stop.set()

    async def _at(self, first: float, every: float) -> bool:
        """Sleep until the next of first, first + every, ...; False once the run ends."""
        elapsed = time.monotonic() - self.started
        due = first if elapsed <= first else first + every * (1 + (elapsed - first) // every)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), due - elapsed)
        return not self.stop.is_set()

    async def _churn(self) -> None:
        while await self._at(CHURN_S, CHURN_S):
            for index in random.sample(range(NODES), CHURN_NODES):
                await self.nodes[index].close()
                self.events.churned += 1
                connecting = asyncio.create_task(self._connect(index))
                self.connecting.add(connecting)
                connecting.add_done_callback(self.connecting.discard)

    async def _sampler(self) -> None:
        self._sample()
        while await self._at(SAMPLE_S, SAMPLE_S):
            await asyncio.to_thread(self._sample)

    def _sample(self) -> None:
        assert self.proc is not None
        pid = self.proc.pid
        status = dict(line.split(":", 1) for line in
                      Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
        answers = self.probe.take() or [0.0]
        self.samples.append(Sample(
            minute=(time.monotonic() - self.started) / 60,
            rss_mb=int(status["VmRSS"].split()[0]) / 1024,
            fds=len(os.listdir(f"/proc/{pid}/fd")),
            threads=int(status["Threads"]),
            loop_lag_ms=max(answers) * 1e3,
            loop_lag_p50_ms=statistics.median(answers) * 1e3,
            log_kb=sum(p.stat().st_size for p in self.state.glob("decisions*.jsonl")) / 1024,
            store_kb=sum(p.stat().st_size for p in self.state.glob("state.db*")) / 1024,
            nodes=sum(node.synced() and node.error is None for node in self.nodes.values()),
        ))

    async def _rollout_phase(self) -> str:
        """The latest rollout's phase ("" without one)."""
        _, shown = await asyncio.to_thread(self._get, "/rollout")
        return str(((shown or {}).get("rollout") or {}).get("phase") or "")

    async def _reloads(self) -> None:
        while await self._at(RELOAD_FIRST_S, RELOAD_EVERY_S):
            while await self._rollout_phase() in UNDER_WAY and not self.stop.is_set():
                self.events.reloads_waited += 1
                await asyncio.sleep(5)
            self.version += 1
            self._write(IMMEDIATE)
            self.events.reloads += 1

    async def _incidents(self) -> None:
        first = self.origins["g000/o0"]
        while await self._at(INCIDENT_FIRST_S, INCIDENT_EVERY_S):
            first.set_fault(Fault(error_rate=0.6, pops=("p000",)))
            self.events.incidents += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), INCIDENT_S)
            first.set_fault(Fault())

    async def _rollouts(self) -> None:
        while await self._at(ROLLOUT_FIRST_S, ROLLOUT_EVERY_S):
            self.version += 1
            self._write(WAVES)
            self.events.rollouts += 1
            await asyncio.sleep(2)
            while (phase := await self._rollout_phase()) in UNDER_WAY \
                    and not self.stop.is_set():
                if phase == "paused" and await asyncio.to_thread(
                        self._post, "/rollout/promote") == 200:
                    self.events.promoted += 1
                await asyncio.sleep(5)

    async def close(self) -> None:
        self.stop.set()
        if hasattr(self, "probe"):
            self.probe.stop()
        await stop_tasks(self.stop, [*self.tasks, *self.connecting])
        for node in self.nodes.values():
            await node.close()
        for channel in self.channels.values():
            await channel.close()
        for envoy in self.envoys.values():
            envoy.stop()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(self.proc.wait, 30)
            except subprocess.TimeoutExpired:
                stop_group(self.proc, 5)
        for origin in self.origins.values():
            await origin.stop()


def _free(taken: set[int]) -> int:
    port = free_port()
    while port in taken:
        port = free_port()
    taken.add(port)
    return port


def _busy(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


# -- report ----------------------------------------------------------------------------------

CHECKED = ("rss_mb", "fds", "threads", "loop_lag_ms", "log_kb", "store_kb")
LABELS = {"rss_mb": "RSS (MB)", "fds": "descriptors", "threads": "threads",
          "loop_lag_ms": "loop lag: longest /healthz of the minute (ms)",
          "log_kb": "decision log (KB)", "store_kb": "store: state.db + WAL (KB)"}


def analyse(samples: Sequence[Sample]) -> list[Trend]:
    return [trend(name, [(s.minute / 60, float(getattr(s, name))) for s in samples])
            for name in CHECKED]


def plot(samples: Sequence[Sample], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(3, 2, figsize=(11, 9), dpi=72, sharex=True)
    minutes = [s.minute for s in samples]
    for axis, name in zip(axes.flat, CHECKED, strict=True):
        axis.plot(minutes, [getattr(s, name) for s in samples], marker=".")
        if name == "loop_lag_ms":
            axis.plot(minutes, [s.loop_lag_p50_ms for s in samples], label="median")
            axis.legend(["longest", "median"])
        axis.set_title(LABELS[name], fontsize=10)
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
    for axis in axes[-1]:
        axis.set_xlabel("minutes")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def report(soak: Soak, trends: list[Trend], errors: list[str], seconds: float,
           loads: list[float], command: str) -> str:
    records: Counter[str] = Counter()
    sizes: Counter[str] = Counter()  # bytes of the log per record kind
    rollbacks: list[str] = []
    for record in iter_records(soak.state):
        records[record["kind"]] += 1
        sizes[record["kind"]] += len(json.dumps(record, separators=(",", ":")))
        if record["kind"] == "rolled_back":
            rollbacks.append(str(record.get("rule"))[:400])
    events = soak.events
    served = sum(events.requests.values())
    good = sum(n for status, n in events.requests.items() if 200 <= status < 300)
    traffic = f"{served:,}, {good / served:.2%} answered 2xx" if served else "none"
    lines = [
        f"# Soak: {seconds / 3600:.2g} h of `ballast serve` under a churning fleet",
        "",
        f"`{command}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average "
        f"{min(loads):.1f}-{max(loads):.1f}, median {statistics.median(loads):.1f}, sampled "
        "every minute on this machine's 2 cores shared with other work). "
        f"{'PASSED' if all(t.ok for t in trends) and not errors else 'FAILED'}.",
        "",
        f"{NODES:,} simulated nodes over {POPS} PoPs x {GROUPS} groups and two Envoys "
        f"({', '.join(ENVOY_POPS)}, {RPS} requests/s each). What happened: {events.churned:,} "
        f"node reconnections, {events.reloads} hot reloads ({events.reloads_waited} looks at a "
        f"rollout under way first), {events.incidents} incidents, {events.rollouts} rollouts "
        f"({events.promoted} promoted by the operator once the last wave waited for evidence); "
        f"records: {records.get('config_applied', 0)} config_applied, "
        f"{records.get('rollout_started', 0)} rollout_started, "
        f"{records.get('rollout_passed', 0)} rollout_passed, "
        f"{records.get('rollout_promoted', 0)} rollout_promoted, "
        f"{sum(records.get(k, 0) for k in RECONCILE_RECORDS)} weight shifts and returns, "
        f"{records.get('rolled_back', 0)} rolled_back. Requests through the Envoys: "
        f"{traffic}.",
        "",
        "| sample | first half: level | slope, first half (/h) | slope, last half (/h) | "
        "rise over the last half | bound | |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for t in trends:
        lines.append(f"| {LABELS[t.name]} | {t.level:,.1f} | {t.first_slope:+,.2f} | "
                     f"{t.last_slope:+,.2f} | {t.last_rise:+,.2f} | {t.bound:,.2f} | "
                     f"{'flat' if t.ok and t.name not in GROWS else 'ok' if t.ok else 'GROWS'} "
                     "|")
    lines += ["", "Bounds: a flat sample's line over the last half may rise by 5 % of the "
              "first half's level (at least: 2 MB, 3 descriptors, 1 thread, 20 ms, 64 KB); the "
              "decision log grows by design (records appended; rotated at 10 MB, 5 files "
              "kept) and may not grow faster over the last half than over the first.", "",
              "What the decision log holds (its kinds by size, the largest first): " + ", ".join(
                  f"{kind} {size / 1024:,.0f} KB ({records[kind]:,})"
                  for kind, size in sizes.most_common(8)) + ".", "",
              f"Rollbacks: {len(rollbacks)}", *(f"    {rule}" for rule in rollbacks), "",
              f"Errors in the server's log: {len(errors)}"]
    lines += [f"    {line}" for line in errors[:20]]
    lines += ["", "![samples](soak.png)", "", "| minute | RSS MB | fds | threads | lag max ms | "
              "lag p50 ms | log KB | store KB | nodes synced |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {s.minute:.0f} | {s.rss_mb:.1f} | {s.fds} | {s.threads} | "
              f"{s.loop_lag_ms:.0f} | {s.loop_lag_p50_ms:.1f} | {s.log_kb:,.0f} | "
              f"{s.store_kb:,.0f} | {s.nodes} |" for s in soak.samples]
    return "\n".join(lines) + "\n"


async def soak(seconds: float, out: Path, command: str) -> bool:
    out.mkdir(parents=True, exist_ok=True)
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="ballast-soak-") as folder:
        run = Soak(Path(folder))
        try:
            await run.start()
            print(f"soak: serving, {NODES} nodes and {len(ENVOY_POPS)} Envoys connected; "
                  f"{seconds / 60:.0f} minutes", flush=True)

            async def note_load() -> None:
                while not run.stop.is_set():
                    loads.append(os.getloadavg()[0])
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(run.stop.wait(), SAMPLE_S)

            run.tasks.append(asyncio.create_task(note_load()))
            await run.run(seconds)
        finally:
            await run.close()
            if run.log.exists():
                (out / "ballast.log").write_text(run.log.read_text(errors="replace")[-200_000:])
            kept = out / "state"  # the store as the stopped server left it, to look into
            shutil.rmtree(kept, ignore_errors=True)
            kept.mkdir()
            for part in run.state.glob("state.db*"):
                shutil.copy2(part, kept / part.name)
        trends = analyse(run.samples)
        errors = errors_logged(run.log)
        plot(run.samples, out / "soak.png")
        (out / "report.md").write_text(report(run, trends, errors, seconds, loads, command))
        (out / "samples.json").write_text(json.dumps(
            {"samples": [asdict(s) for s in run.samples], "loadavg": loads,
             "trends": [asdict(t) for t in trends], "errors": errors}, indent=1) + "\n")
    print((out / "report.md").read_text().split("\n![samples]")[0])
    return all(t.ok for t in trends) and not errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--hours", type=float)
    length.add_argument("--minutes", type=float)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "soak",
                        help="where the report goes (default bench/results/soak)")
    args = parser.parse_args(argv)
    seconds = 60 * (args.minutes if args.minutes is not None else 60 * (args.hours or 2))
    command = "python -m bench.soak " + " ".join(sys.argv[1:] if argv is None else argv)
    return 0 if asyncio.run(soak(seconds, args.out, command)) else 1


if __name__ == "__main__":
    sys.exit(main())
