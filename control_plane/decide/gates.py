"""A rollout wave's health gates: what the PoPs serving a new desired-state version show. Pure.

`evaluate` judges the PoPs a rollout has reached (`reached`), on:

- **NACKs**: any node NACKing the new version fails the gate at once, with the node, its Envoy
  build, the replica it is connected to (with replicas) and the message (a config that passed
  `validate` can still be refused by an Envoy).
- **ACKs**: every node of the reached PoPs, whichever replica it is connected to, ACKs the new
  version; one that has not by `ack_timeout` after the wave started fails the gate (before
  that, the gate waits).
- **Regressions**, per signal, the weight controller's signals and evidence rules
  (`decide/evidence.py`): the 5xx rate and the p95 per (PoP, origin group, origin), the shed
  rate per (PoP, group, tier), the tier-action onsets per PoP. The window of a reached PoP
  since the wave started (`after`) is compared with two baselines: the PoPs still on the
  previous version over the same time (`peers`, merged) and the same PoP before the change
  (`before`). Each comparison is `regressed` (worse by more than the threshold, with evidence:
  the wave's rate's Wilson lower bound, the p95's lower bound where the source gives it),
  `ok` (the point estimate is within the threshold) or `inconclusive` (a side lacks
  `min_samples`, or the estimate is over but its bound is not). A reading **fails** when it
  regressed against every baseline with evidence, **passes** when it is ok against at least one
  (an origin incident raises the old PoPs' rates too: the change is blamed only when the wave
  is worse than what it can be compared with), and is **inconclusive** when no baseline
  comparison is conclusive. An inconclusive reading neither passes nor fails.
- A (group, origin) or (group, tier) with no baseline at all (the change brought it, e.g. a
  route to another origin group) is compared with a rate of 0: it fails as the weight
  controller would breach it. The 5xx rate is also read over the whole PoP (key `all`), so a
  change that moves traffic to another group or origin shows even without a per-origin
  baseline.

The gate's verdict: `fail` on a NACK, a missing ACK past the timeout or a failing reading;
else `wait` while no reached PoP has a connected node (nothing serves the version to judge: it
waits, and the rollout pauses after `evidence_timeout` as for no evidence), while ACKs are
missing or a reached PoP with nodes has no passing reading of its whole 5xx rate (key `all`: no
evidence yet, the bake extends; latency and shed readings come from the access logs, which can
be conclusive while the stats flushes that carry the errors are not yet in, so they alone never
pass a wave); else `pass`. A PoP without nodes beside PoPs with nodes serves
nobody: it needs no evidence of its own. Rates are failures over samples, never above 100 %.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from control_plane.decide.evidence import error_counts, latency_samples, wilson_lower
from control_plane.decide.signals import OriginSignals
from control_plane.desired.model import RolloutGates

ReadingVerdict = Literal["pass", "fail", "inconclusive", "wait"]
GateVerdict = Literal["pass", "fail", "wait"]
Comparison = Literal["regressed", "ok", "inconclusive"]
SIGNALS: tuple[str, ...] = ("nack", "ack", "5xx", "p95", "shed", "tier_actions")
ALL_KEY = "all"  # the key of the reading over a whole PoP
SHOWN_READINGS = 20  # readings a gate result keeps for records and the store (failing first)
SHOWN_WHY = 5  # reasons a gate result gives in words (rules of records stay short)
MAX_MESSAGE_CHARS = 500  # of a NACK's message kept in a reading


@dataclass(frozen=True)
class TierShed:
    """One tier of one group in one PoP over a window: its requests and how many of them a
    tier action answered at the edge."""

    requests: int
    shed: int


@dataclass(frozen=True)
class PopWindow:
    """One PoP's signals over one span of time, as the gates compare them."""

    pop: str
    origins: tuple[tuple[str, str, OriginSignals], ...] = ()  # (group, origin, signals)
    tiers: tuple[tuple[str, str, TierShed], ...] = ()  # (group, tier, shed)
    tier_action_onsets: int = 0  # a group's tier actions going from none to active


@dataclass(frozen=True)
class NodeAck:
    """A node of a PoP and the desired-state version (digest) its last ACK applied, if any;
    `replica`: the Ballast replica it is connected to ("" without replicas); `acked_ms`: when
    that ACK arrived, where the replica that holds the node's stream says (None: unknown)."""

    pop: str
    node: str
    acked: str | None
    replica: str = ""
    acked_ms: int | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Nack:
    """A node refusing what it was sent for a desired-state version."""

    pop: str
    node: str
    version: str  # the desired-state version (digest) refused
    envoy: str  # the node's Envoy build, e.g. 1.36.2
    type_url: str
    message: str
    replica: str = ""  # the Ballast replica the node is connected to ("" without replicas)


@dataclass(frozen=True)
class GateInputs:
    """What the shell observed for the gates (`nodes`: the nodes of the reached PoPs connected
    to any replica; `nacks`: NACKs since the rollout started; the windows as in the module
    docstring)."""

    nodes: tuple[NodeAck, ...] = ()
    nacks: tuple[Nack, ...] = ()
    after: tuple[PopWindow, ...] = ()
    peers: tuple[PopWindow, ...] = ()
    before: tuple[PopWindow, ...] = ()


@dataclass(frozen=True)
class Reading:
    """One signal of one reached PoP (or one node), judged."""

    pop: str
    signal: str  # one of SIGNALS
    key: str  # "group/origin", "group/tier", a node id, or "" for the PoP
    verdict: ReadingVerdict
    text: str  # in words, with the numbers
    value: float | None = None
    baselines: tuple[tuple[str, float | None, str], ...] = ()  # (name, value, comparison)

    def to_dict(self) -> dict[str, Any]:
        return {"pop": self.pop, "signal": self.signal, "key": self.key,
                "verdict": self.verdict, "text": self.text, "value": self.value,
                "baselines": [list(b) for b in self.baselines]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Reading:
        verdict = str(data["verdict"])
        if verdict not in ("pass", "fail", "inconclusive", "wait"):
            raise ValueError(f"unknown reading verdict {verdict!r}")
        value = data.get("value")
        return cls(
            pop=str(data["pop"]), signal=str(data["signal"]), key=str(data["key"]),
            verdict=verdict,  # type: ignore[arg-type]
            text=str(data["text"]), value=None if value is None else float(value),
            baselines=tuple((str(name), None if v is None else float(v), str(how))
                            for name, v, how in data.get("baselines", ())),
        )


@dataclass(frozen=True)
class GateResult:
    """The gate's verdict with why (failing readings, or what it waits for), the readings kept
    (failing first, at most SHOWN_READINGS) and how many readings had each verdict."""

    verdict: GateVerdict
    why: tuple[str, ...]
    readings: tuple[Reading, ...] = ()
    counts: tuple[tuple[str, int], ...] = ()  # reading verdict -> how many

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "why": list(self.why),
                "readings": [r.to_dict() for r in self.readings],
                "counts": dict(self.counts)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GateResult:
        verdict = str(data["verdict"])
        if verdict not in ("pass", "fail", "wait"):
            raise ValueError(f"unknown gate verdict {verdict!r}")
        readings = tuple(Reading.from_dict(r) for r in data.get("readings", ()))
        return cls(verdict, tuple(str(w) for w in data.get("why", ())),  # type: ignore[arg-type]
                   readings,
                   tuple((str(k), int(v)) for k, v in dict(data.get("counts", {})).items()))


def evaluate(inputs: GateInputs, reached: Iterable[str], version: str, wave_started_ms: int,
             now_ms: int, gates: RolloutGates) -> GateResult:
    """The gate over the PoPs serving `version` (see the module docstring)."""
    pops = frozenset(reached)
    readings: list[Reading] = []
    readings.extend(_nacks(inputs.nacks, version))
    waited = now_ms - wave_started_ms
    readings.extend(_acks(inputs.nodes, pops, version, waited, gates))
    peers = _index_peers([w for w in inputs.peers if w.pop not in pops], gates.min_samples)
    before = {w.pop: w for w in inputs.before if w.pop in pops}
    for window in inputs.after:
        if window.pop in pops:
            readings.extend(_signals(window, before.get(window.pop), peers, gates))
    with_nodes = {n.pop for n in inputs.nodes if n.pop in pops}
    measured = {r.pop for r in readings
                if r.signal == "5xx" and r.key == ALL_KEY and r.verdict == "pass"}
    unmeasured = sorted(with_nodes - measured)
    failing = [r for r in readings if r.verdict == "fail"]
    waiting = [r for r in readings if r.verdict == "wait"]
    if failing:
        verdict: GateVerdict = "fail"
        why = _bounded([r.text for r in failing], "failing readings")
    elif not with_nodes:
        verdict = "wait"
        why = (f"no node of {', '.join(sorted(pops))} is connected: nothing serves version "
               f"{version[:16]} to judge yet",)
    elif waiting or unmeasured:
        verdict = "wait"
        why = _bounded([r.text for r in waiting] + [
            f"pop {pop}: no evidence yet (its 5xx rate has no reading with "
            f"{gates.min_samples} samples against a baseline)" for pop in unmeasured],
            "reasons to wait")
    else:
        verdict = "pass"
        why = (f"{len(pops)} PoP(s) on the new version: every node ACKed, no NACK, "
               "no regression",)
    order = {"fail": 0, "wait": 1, "inconclusive": 2, "pass": 3}
    shown = tuple(sorted(readings, key=lambda r: order[r.verdict])[:SHOWN_READINGS])
    counts: dict[str, int] = {}
    for reading in readings:
        counts[reading.verdict] = counts.get(reading.verdict, 0) + 1
    return GateResult(verdict, why, shown, tuple(sorted(counts.items())))


def _bounded(texts: Sequence[str], what: str) -> tuple[str, ...]:
    """The first SHOWN_WHY texts, and how many more there were (records stay bounded)."""
    if len(texts) <= SHOWN_WHY:
        return tuple(texts)
    return (*texts[:SHOWN_WHY], f"... and {len(texts) - SHOWN_WHY} more {what}")


def _clipped(message: str) -> str:
    """A NACK's message within MAX_MESSAGE_CHARS: its start (what Envoy refused) and its end
    (why: Envoy echoes the refused config between the two)."""
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    head = MAX_MESSAGE_CHARS // 4
    return (f"{message[:head]} … [{len(message) - MAX_MESSAGE_CHARS:,} characters cut] … "
            f"{message[len(message) - (MAX_MESSAGE_CHARS - head):]}")


def _nacks(nacks: Iterable[Nack], version: str) -> list[Reading]:
    readings = []
    for nack in nacks:
        if nack.version != version:
            continue
        message = _clipped(nack.message)
        readings.append(Reading(
            nack.pop, "nack", nack.node, "fail",
            f"pop {nack.pop}: node {nack.node} ({_build(nack.envoy)}"
            f"{_on(nack.replica)}) NACKed "
            f"{_type_name(nack.type_url)} of version {version[:16]}: "
            f"{message}"))
    return readings


def _build(version: str) -> str:
    """A node's build in a reading's words: `Envoy 1.40.0`, or a gRPC client's as it is
    (`gRPC Python 1.85.3`)."""
    return version if version.startswith("gRPC") else f"Envoy {version or 'unknown'}"


def _on(replica: str) -> str:
    """Where a node is connected, in a reading's words ("" without replicas)."""
    return f", on replica {replica}" if replica else ""


def _type_name(type_url: str) -> str:
    """`type.googleapis.com/envoy.config.cluster.v3.Cluster` -> `Cluster`."""
    return type_url.rsplit("/", 1)[-1].rsplit(".", 1)[-1] or "the config"


def _acks(nodes: Iterable[NodeAck], pops: frozenset[str], version: str, waited_ms: int,
          gates: RolloutGates) -> list[Reading]:
    missing = sorted((n.pop, n.node, n.replica) for n in nodes
                     if n.pop in pops and n.acked != version)
    if not missing:
        return []
    late = waited_ms >= gates.ack_timeout_ms
    verdict: ReadingVerdict = "fail" if late else "wait"
    readings = []
    for pop, node, replica in missing:
        how = (f"not ACKed {gates.ack_timeout_ms / 1000:g} s after the wave started" if late
               else f"not ACKed yet ({waited_ms / 1000:g} s of {gates.ack_timeout_ms / 1000:g} s)")
        where = f" (on replica {replica})" if replica else ""
        readings.append(Reading(pop, "ack", node, verdict,
                                f"pop {pop}: node {node}{where} {how} version {version[:16]}"))
    return readings


@dataclass(frozen=True)
class _Peers:
    """The PoPs still on the previous version, merged once per evaluation: per (group,
    origin) the summed error counts and the median p95 of those with evidence, per (group,
    tier) the summed sheds, over the whole fleet the summed errors and the median onsets."""

    errors: Mapping[tuple[str, str], tuple[int, int]]
    p95: Mapping[tuple[str, str], float | None]
    sheds: Mapping[tuple[str, str], tuple[int, int]]
    all_errors: tuple[int, int] | None  # None: no peer has any origin
    onsets: float | None  # None: no peer PoP


def _index_peers(peers: Sequence[PopWindow], need: int) -> _Peers:
    errors: dict[tuple[str, str], tuple[int, int]] = {}
    latencies: dict[tuple[str, str], list[float]] = {}
    sheds: dict[tuple[str, str], tuple[int, int]] = {}
    for window in peers:
        for group, origin, signals in window.origins:
            failed, total = error_counts(signals, need)
            was = errors.get((group, origin), (0, 0))
            errors[(group, origin)] = (was[0] + failed, was[1] + total)
            p95 = _p95_of(signals, need)
            values = latencies.setdefault((group, origin), [])
            if p95 is not None:
                values.append(p95)
        for group, tier, shed in window.tiers:
            was = sheds.get((group, tier), (0, 0))
            sheds[(group, tier)] = (was[0] + shed.shed, was[1] + shed.requests)
    has_origins = any(w.origins for w in peers)
    return _Peers(
        errors=errors,
        p95={key: statistics.median(values) if values else None
             for key, values in latencies.items()},
        sheds=sheds,
        all_errors=(sum(f for f, _ in errors.values()), sum(t for _, t in errors.values()))
        if has_origins else None,
        onsets=statistics.median(w.tier_action_onsets for w in peers) if peers else None,
    )


def _signals(after: PopWindow, before: PopWindow | None, peers: _Peers,
             gates: RolloutGates) -> list[Reading]:
    readings: list[Reading] = []
    if after.origins:
        readings.append(_five_xx_all(after, before, peers, gates))
    before_origins = {(g, o): s for g, o, s in before.origins} if before else {}
    for group, origin, signals in after.origins:
        key = (group, origin)
        readings.append(_five_xx(after.pop, f"{group}/{origin}", signals,
                                 before_origins.get(key), peers.errors.get(key), gates))
        readings.append(_p95(after.pop, f"{group}/{origin}", signals, before_origins.get(key),
                             key in peers.p95, peers.p95.get(key), gates))
    before_tiers = {(g, t): s for g, t, s in before.tiers} if before else {}
    for group, tier, shed in after.tiers:
        readings.append(_shed(after.pop, f"{group}/{tier}", shed,
                              before_tiers.get((group, tier)), peers.sheds.get((group, tier)),
                              gates))
    readings.append(_onsets(after, before, peers.onsets, gates))
    return readings


def _verdict(comparisons: Sequence[Comparison]) -> ReadingVerdict:
    """Fails when regressed against every conclusive baseline, passes when ok against one."""
    conclusive = [c for c in comparisons if c != "inconclusive"]
    if not conclusive:
        return "inconclusive"
    return "pass" if "ok" in conclusive else "fail"


def _rate_comparison(failed: int, total: int, base_failed: int, base_total: int,
                     max_increase: float, need: int) -> Comparison:
    if total < need or base_total < need:
        return "inconclusive"
    base = base_failed / base_total
    if wilson_lower(failed, total) - base > max_increase:
        return "regressed"
    if failed / total - base <= max_increase:
        return "ok"
    return "inconclusive"


def _rate_reading(pop: str, signal: str, key: str, failed: int, total: int,
                  baselines: Sequence[tuple[str, int, int]], max_increase: float,
                  need: int, what: str) -> Reading:
    failed = min(failed, total)  # counters read at different moments: never above 100 %
    baselines = [(name, min(f, t), t) for name, f, t in baselines]
    if total < need:
        return Reading(pop, signal, key, "inconclusive",
                       f"pop {pop} {key}: {what} {total} samples < min_samples {need}")
    rate = failed / total
    shown = []
    comparisons: list[Comparison] = []
    words = []
    for name, base_failed, base_total in baselines:
        comparison = _rate_comparison(failed, total, base_failed, base_total, max_increase, need)
        base = base_failed / base_total if base_total else None
        comparisons.append(comparison)
        shown.append((name, base, comparison))
        base_words = f"{base:.1%}" if base is not None else "none"
        words.append(f"{name} {base_words} of {base_total} ({comparison})")
    verdict = _verdict(comparisons)
    low = wilson_lower(failed, total)
    text = (f"pop {pop} {key}: {what} {rate:.1%} ({failed} of {total}, lower bound {low:.1%}) "
            f"vs {'; '.join(words) or 'no baseline'}; max increase {max_increase:.1%}")
    return Reading(pop, signal, key, verdict, text, rate, tuple(shown))


def _five_xx(pop: str, key: str, signals: OriginSignals, before: OriginSignals | None,
             peers: tuple[int, int] | None, gates: RolloutGates) -> Reading:
    need = gates.min_samples
    failed, total = error_counts(signals, need)
    baselines = []
    if peers is not None:
        baselines.append(("old PoPs", *peers))
    if before is not None:
        baselines.append(("before", *error_counts(before, need)))
    return _rate_reading(pop, "5xx", key, failed, total, baselines or [_new(need)],
                         gates.max_5xx_increase, need, "5xx")


def _new(need: int) -> tuple[str, int, int]:
    """The baseline of what nothing served before (a group or tier the change brings, e.g. a
    route to another origin group): a rate of 0, so the wave's rate breaches as the weight
    controller's would, by its lower bound."""
    return ("new, nothing before", 0, need)


def _sum_errors(window: PopWindow, need: int) -> tuple[int, int]:
    counts = [error_counts(signals, need) for _, _, signals in window.origins]
    return sum(c[0] for c in counts), sum(c[1] for c in counts)


def _five_xx_all(after: PopWindow, before: PopWindow | None, peers: _Peers,
                 gates: RolloutGates) -> Reading:
    """The PoP's 5xx rate over every group and origin: a change that moves traffic elsewhere
    (another group, another origin) shows here even when no single origin has a baseline."""
    need = gates.min_samples
    failed, total = _sum_errors(after, need)
    baselines = []
    if peers.all_errors is not None:
        baselines.append(("old PoPs", *peers.all_errors))
    if before is not None and before.origins:
        baselines.append(("before", *_sum_errors(before, need)))
    return _rate_reading(after.pop, "5xx", ALL_KEY, failed, total, baselines,
                         gates.max_5xx_increase, need, "5xx")


def _p95_of(signals: OriginSignals, need: int) -> float | None:
    if latency_samples(signals) < need:
        return None
    return signals.p95_ms


def _p95_comparison(p95: float, low: float, base: float | None, gates: RolloutGates
                    ) -> Comparison:
    if base is None:
        return "inconclusive"
    limit = max(base * gates.max_p95_ratio, base + gates.min_p95_increase_ms)
    if low > limit:
        return "regressed"
    if p95 <= limit:
        return "ok"
    return "inconclusive"


def _p95(pop: str, key: str, signals: OriginSignals, before: OriginSignals | None,
         has_peers: bool, peer_p95: float | None, gates: RolloutGates) -> Reading:
    need = gates.min_samples
    p95 = _p95_of(signals, need)
    if p95 is None:
        return Reading(pop, "p95", key, "inconclusive",
                       f"pop {pop} {key}: p95 from {latency_samples(signals)} samples "
                       f"< min_samples {need}")
    low = signals.p95_low_ms if signals.p95_low_ms is not None else p95
    baselines: list[tuple[str, float | None]] = []
    if has_peers:
        baselines.append(("old PoPs", peer_p95))
    if before is not None:
        baselines.append(("before", _p95_of(before, need)))
    comparisons = [_p95_comparison(p95, low, base, gates) for _, base in baselines]
    shown = tuple((name, base, c) for (name, base), c in zip(baselines, comparisons, strict=True))
    words = "; ".join(
        f"{name} {'none' if base is None else f'{base:.0f} ms'} ({c})" for name, base, c in shown)
    text = (f"pop {pop} {key}: p95 {p95:.0f} ms (lower bound {low:.0f} ms) vs "
            f"{words or 'no baseline'}; max x{gates.max_p95_ratio:g} and "
            f"+{gates.min_p95_increase_ms} ms")
    return Reading(pop, "p95", key, _verdict(comparisons), text, p95, shown)


def _shed(pop: str, key: str, shed: TierShed, before: TierShed | None,
          peers: tuple[int, int] | None, gates: RolloutGates) -> Reading:
    baselines = []
    if peers is not None:
        baselines.append(("old PoPs", *peers))
    if before is not None:
        baselines.append(("before", before.shed, before.requests))
    return _rate_reading(pop, "shed", key, shed.shed, shed.requests,
                         baselines or [_new(gates.min_samples)], gates.max_shed_increase,
                         gates.min_samples, "shed")


def _onsets(after: PopWindow, before: PopWindow | None, peers: float | None,
            gates: RolloutGates) -> Reading:
    baselines: list[tuple[str, float]] = []
    if peers is not None:
        baselines.append(("old PoPs", peers))
    if before is not None:
        baselines.append(("before", float(before.tier_action_onsets)))
    count = after.tier_action_onsets
    comparisons: list[Comparison] = [
        "regressed" if count - base > gates.max_tier_action_onsets else "ok"
        for _, base in baselines]
    shown = tuple((name, base, c) for (name, base), c in zip(baselines, comparisons, strict=True))
    words = "; ".join(f"{name} {base:g} ({c})" for name, base, c in shown)
    text = (f"pop {after.pop}: {count} tier-action onset(s) vs {words or 'no baseline'}; "
            f"max increase {gates.max_tier_action_onsets}")
    return Reading(after.pop, "tier_actions", "", _verdict(comparisons), text, float(count),
                   shown)
