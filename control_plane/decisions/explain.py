"""Why the weights of one (PoP, group) are what they are now, in plain words, from its records.

The story starts after the last time the group was calm at its home split (a ``steady`` or a
completed ``return`` record) and lists every decision since, with the numbers the controller logged;
runs of holds are folded into one "held since" line; flap damping, when the latest controller
record remembers an origin that flapped (its penalty, whether returns to it are suppressed and how
many healthy windows one needs). It ends with what would move the weights next.

Then the standby ramp, when the group has one in its log (``ramp_*`` records): which standby
ramps, at which stage of the schedule, the last ramp decision in words and what comes next.

Then the tier actions of the group in that PoP (``tier_action`` records, written only when they go
on or off): which are active now and since when, the decision that switched them on with its
numbers (the trigger tier's pending peak against ``trigger_pending``, held for how long) and what
lifts them, or that none are active and when the last ones ended. Then utilization shedding
(``tier_shed``), lending (``tier_lend``), preemption (``tier_preempt``) and queues bounded in
time (``tier_queue``): what is in force and the record that put it there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from control_plane.decide.rollout import ROLLOUT_KINDS
from control_plane.decisions.read import Record, record_time

MAX_CHAIN = 20
TIER_KIND = "tier_action"
TIER_KINDS = frozenset({TIER_KIND, "tier_shed", "tier_lend", "tier_preempt", "tier_queue"})
# each slot part's label and the detail field that is non-empty while it is in force
_SLOT_PARTS = (("tier_shed", "utilization shedding", "shedding"), ("tier_lend", "lending", "lent"),
               ("tier_preempt", "preemption", "took"),
               ("tier_queue", "queues bounded in time", "queue_limits"))
_FOR = re.compile(r"\(≥ (\d[\d.]* s)\)")  # the `for` threshold in an "on" rule


def _clock(record: Record) -> str:
    return record_time(record).strftime("%H:%M:%S")


def _weights(weights: dict[str, int]) -> str:
    return ", ".join(f"{name} {value}" for name, value in weights.items())


def _calm(record: Record) -> bool:
    inputs = record.get("inputs") or {}
    home = inputs.get("home")
    return record.get("kind") in ("steady", "return") and record.get("weights_after") == home


def _moves(before: dict[str, int], after: dict[str, int]) -> str:
    return ", ".join(
        f"{name} {before.get(name)}→{after.get(name)}"
        for name in dict.fromkeys([*before, *after])
        if before.get(name) != after.get(name)
    )


def _line(record: Record) -> str:
    text = record.get("rule") or record.get("detail") or ""
    moves = _moves(record.get("weights_before") or {}, record.get("weights_after") or {})
    if moves:
        return f"{_clock(record)} {record['kind']}: {moves} ({text})"
    return f"{_clock(record)} {record['kind']}: {text}"


def _chain(episode: list[Record]) -> list[str]:
    """One line per decision; a run of holds (one `hold` record, closed by `hold_ended` with its
    tick count, or several `hold` records from older logs) folds into one line."""
    lines: list[str] = []
    index = 0
    while index < len(episode):
        record = episode[index]
        if record["kind"] == "steady_ended":  # the calm before the episode, nothing to explain
            index += 1
            continue
        if record["kind"] not in ("hold", "hold_ended"):
            lines.append(_line(record))
            index += 1
            continue
        end = index
        while end + 1 < len(episode) and episode[end + 1]["kind"] in ("hold", "hold_ended"):
            end += 1
        run = episode[index:end + 1]
        closed = run[-1]["kind"] == "hold_ended"
        ticks = sum(_ticks(r) for r in run if r["kind"] == "hold") + sum(
            _ticks(r) - 1 for r in run if r["kind"] == "hold_ended")
        last = run[-1]
        rule = (last.get("detail") or {}).get("last_rule") if closed else last.get("rule")
        count = f" ({ticks} ticks, last at {_clock(last)})" if ticks > 1 else ""
        if end == len(episode) - 1 and not closed:
            lines.append(f"held since {_clock(record)}: {rule}{count}")
        else:
            lines.append(f"{_clock(record)} held{count}: {rule}")
        index = end + 1
    return lines


def _ticks(record: Record) -> int:
    """Ticks a record stands for: a `hold_ended` record counts its run (whose first tick is the
    `hold` record before it), any other record one."""
    detail = record.get("detail")
    if record["kind"] == "hold_ended" and isinstance(detail, dict):
        ticks = detail.get("ticks")
        if type(ticks) is int and ticks >= 1:
            return ticks
    return 1


def _scores(record: Record) -> str | None:
    scores: dict[str, Any] = (record.get("inputs") or {}).get("scores") or {}
    if not scores:
        return None
    return "; ".join(
        f"{name} {score['composite']:.2f} (lowest: {score['limiting']})"
        for name, score in scores.items()
    )


def _seconds(ms: int | float) -> str:
    return f"{ms / 1000:g} s"


def describe_active(actions: Mapping[str, Any], since: str | None = None) -> str:
    """Active tier actions (``TierActions.to_dict()`` form) per tier, in plain words:
    ``normal: 50% demoted to background (answered at the edge: background is shed);
    background: shed to its floor of 6 slots (503 beyond)``."""
    suffix = f" since {since}" if since else ""
    parts = []
    demote, to = actions.get("demote_tier"), actions.get("demote_to")
    share = actions.get("demote_share")
    shed = actions.get("shed_tier")
    utilization = list(actions.get("shed_tiers") or ())
    shed_all = {*([shed] if shed else []), *utilization}
    if demote and to and share:
        edge = f" (answered at the edge: {to} is shed)" if to in shed_all else ""
        parts.append(f"{demote}: {share}% demoted to {to}{edge}{suffix}")
    status = actions.get("shed_status") or {}
    limits = dict(actions.get("limits") or {})
    for tier, why in [*([(shed, "shed")] if shed else []),
                      *((t, "shed for utilization") for t in utilization)]:
        floor = limits.get(tier)
        kept = f" to its floor of {floor} slot(s)" if floor is not None else " to its floor"
        parts.append(f"{tier}: {why}{kept} ({status.get(tier, 503)} beyond){suffix}")
    others = {t: n for t, n in limits.items() if t not in shed_all}
    if others:
        parts.append("limits: " + ", ".join(f"{t} {n}" for t, n in others.items()))
    queues = {t: n for t, n in (actions.get("pending_limits") or {}).items()
              if t not in shed_all}
    if queues:
        parts.append("queue bounded in time: " + ", ".join(
            f"{t} at most {n} pending" for t, n in queues.items()))
    return "; ".join(parts) or f"no action configured{suffix}"


def _switched_on(record: Record) -> str:
    """The numbers of the record that switched tier actions on (its rule when they are missing)."""
    inputs = record.get("inputs") or {}
    tier = inputs.get("trigger_tier")
    reading = (inputs.get("readings") or {}).get(tier) or inputs.get("pending") or {}
    now_ms = inputs.get("now_ms")
    if inputs.get("trigger") == "wait":
        q = inputs.get("trigger_wait_quantile", "p95")
        wait = reading.get("wait") or {}
        value, limit = wait.get(f"{q}_ms"), inputs.get("trigger_wait_ms")
        seen = f"{tier} wait {q} {value:g} ms > {limit} ms (trigger_wait)" \
            if value is not None and limit is not None else None
    else:
        peak, limit = reading.get("pending_max"), inputs.get("trigger_pending")
        seen = f"{tier} pending max {peak:g} > {limit} (trigger_pending)" \
            if peak is not None and limit is not None else None
    if tier is None or seen is None or now_ms is None:
        return str(record.get("rule") or "")
    since_ms = (inputs.get("state_before") or {}).get("trigger_since_ms")
    held = max(0, now_ms - (now_ms if since_ms is None else since_ms))
    started = (record_time(record) - timedelta(milliseconds=held)).strftime("%H:%M:%S")
    needed = _FOR.search(str(record.get("rule") or ""))
    threshold = f" (for: {needed.group(1)})" if needed else ""
    return f"{seen} at every tick for {_seconds(held)} since {started}{threshold}"


def explain_tiers(records: Iterable[Record], pop: str, group: str) -> list[str]:
    """The tier-action part of ``explain``: what is active now, why, and what lifts it."""
    records = list(records)
    return [*_explain_reprioritization(records, pop, group),
            *_explain_shedding_and_lending(records, pop, group)]


def _explain_shedding_and_lending(records: list[Record], pop: str, group: str) -> list[str]:
    out = []
    for kind, label, field in _SLOT_PARTS:
        mine = [r for r in records
                if r.get("kind") == kind and r.get("pop") == pop and r.get("group") == group]
        if not mine:
            continue
        last = mine[-1]
        detail = last.get("detail") if isinstance(last.get("detail"), dict) else {}
        on = bool(detail.get(field))
        state = "in force" if on else "off"
        out.append(f"{label}: {state} since {_clock(last)} ({kind}, seq {last['seq']}): "
                   f"{last.get('rule') or ''}")
    return out


def _explain_reprioritization(records: list[Record], pop: str, group: str) -> list[str]:
    mine = [r for r in records
            if r.get("kind") == TIER_KIND and r.get("pop") == pop and r.get("group") == group]
    if not mine:
        return ["tier actions: no tier actions active (none switched on in the log)"]
    last = mine[-1]
    detail = last.get("detail")
    if not isinstance(detail, dict) or not detail.get("active"):
        return [f"tier actions: no tier actions active; the last ended at {_clock(last)} "
                f"(seq {last['seq']}): {last.get('rule') or ''}"]
    actions: Mapping[str, Any] = detail.get("actions") or {}
    inputs = last.get("inputs") or {}
    tier = inputs.get("trigger_tier")
    if inputs.get("trigger") == "wait":
        q, limit = inputs.get("trigger_wait_quantile", "p95"), inputs.get("trigger_wait_ms")
        above = f"{tier} wait {q} > {limit} ms"
    else:
        limit = inputs.get("trigger_pending")
        above = f"{tier} pending max > {limit}"
    if not tier or limit is None:
        above = "the trigger"
    recover = actions.get("retry_after_s")
    quiet = f"{recover} s (recover_after)" if recover is not None else "recover_after"
    return [
        f"tier actions: {describe_active(actions, _clock(last))}",
        f"  switched on at {_clock(last)} ({TIER_KIND}, seq {last['seq']}): {_switched_on(last)}",
        f"  off: once {quiet} pass without {above}, or when tier actions are disabled in the "
        "desired state",
    ]


def explain_ramp(records: Iterable[Record]) -> list[str]:
    """The standby-ramp part of ``explain``: which standby ramps now, at which stage, and why."""
    ramps = [r for r in records if str(r.get("kind", "")).startswith("ramp_")]
    if not ramps:
        return []
    last = ramps[-1]
    detail = last.get("detail") if isinstance(last.get("detail"), dict) else {}
    state = detail.get("state") or {}
    active = sorted((state.get("ramps") or {}).items())
    ceilings = detail.get("ceilings") or {}
    if not active:
        return [f"standby ramp: none active; last {last['kind']} at {_clock(last)} "
                f"(seq {last['seq']}): {last.get('rule') or ''}"]
    started = {}
    for record in ramps:
        for name, _ in (((record.get("detail") or {}).get("state") or {}).get("ramps")
                        or {}).items():
            if record["kind"] == "ramp_start":
                started[name] = _clock(record)
    parts = [
        f"{name} at stage {index + 1}" + (f", at most {ceilings[name]} %" if name in ceilings
                                          else "")
        + (f", since {started[name]}" if name in started else "")
        for name, index in active
    ]
    return [
        f"standby ramp: {'; '.join(parts)}",
        f"  last ramp decision at {_clock(last)} ({last['kind']}, seq {last['seq']}): "
        f"{last.get('rule') or ''}",
        f"  next: {detail.get('next') or ''}",
    ]


def explain_damping(records: Iterable[Record]) -> list[str]:
    """The flap-damping part of ``explain``, from the latest controller record (the records
    whose ``detail.state`` is the controller's)."""
    latest = None
    for record in records:
        detail = record.get("detail")
        if isinstance(detail, dict) and "unhealthy_windows" in (detail.get("state") or {}):
            latest = record
    if latest is None or not latest["detail"].get("damping"):
        return []
    parts = []
    for name, flap in latest["detail"]["damping"].items():
        if flap.get("suppressed"):
            parts.append(f"{name} penalty {flap['penalty']:g}, suppressed: a return to it needs "
                         f"{flap['return_windows']} healthy windows")
        else:
            parts.append(f"{name} penalty {flap['penalty']:g}, below the suppress level: a "
                         f"return needs {flap['return_windows']} healthy windows")
    return [f"flap damping (as of {_clock(latest)}, seq {latest['seq']}): {'; '.join(parts)}"]


def explain_rollout(records: Iterable[Record], pop: str) -> list[str]:
    """The latest rollout of a desired-state version as it concerns `pop`: how it started,
    `pop`'s wave, the gate readings, and how it ended (passed, rolled back with why, aborted,
    promoted, superseded) — every operator action with who asked."""
    rollout = [r for r in records if r.get("kind") in ROLLOUT_KINDS]
    starts = [i for i, r in enumerate(rollout) if r["kind"] == "rollout_started"]
    if not starts:
        return []
    latest = rollout[starts[-1]:]
    out = [f"config rollout of {latest[0].get('config_version')} (latest):"]
    for record in latest:
        detail = record.get("detail")
        pops = detail.get("pops", []) if isinstance(detail, dict) else []
        if record["kind"] != "wave_started" or pop in pops:
            out.append(f"  {_clock(record)} {record['kind']}: {record.get('rule', '')}")
    return out


def explain(records: Iterable[Record], pop: str, group: str) -> str:
    """A few lines for on-call: current weights, the chain of decisions, what moves them next;
    then the tier actions (``explain_tiers``)."""
    every = [r for r in records if r.get("pop") == pop and r.get("group") == group]
    if not every:
        return f"no decisions for pop {pop}, group {group}"
    mine = [r for r in every if r.get("kind") not in TIER_KINDS]
    out = _explain_weights(mine, pop, group) if mine else [
        f"pop {pop}, group {group}: no weights decided yet"
    ]
    out.extend(explain_ramp(mine))
    out.extend(explain_tiers(every, pop, group))
    return "\n".join(out)


def _explain_weights(mine: list[Record], pop: str, group: str) -> list[str]:
    with_weights = [r for r in mine if r.get("weights_after")]
    out: list[str] = []
    if with_weights:
        now = with_weights[-1]
        for record in reversed(with_weights):
            if record["weights_after"] != with_weights[-1]["weights_after"]:
                break
            now = record
        out.append(
            f"pop {pop}, group {group}: weights now {_weights(with_weights[-1]['weights_after'])} "
            f"(since {record_time(now).strftime('%Y-%m-%d %H:%M:%S')} UTC, seq {now['seq']})"
        )
    else:
        out.append(f"pop {pop}, group {group}: no weights decided yet")
    episode: list[Record] = []
    calm_since: Record | None = None
    for record in mine:
        if _calm(record):
            episode = []
            if calm_since is None:
                calm_since = record
        else:
            episode.append(record)
            calm_since = None
    if not episode and calm_since is not None:
        out.append(f"calm: at the preferred split since {_clock(calm_since)} "
                   f"({calm_since['kind']}, seq {calm_since['seq']})")
    else:
        shown = _chain(episode)
        out.append("how they got here:")
        if len(shown) > MAX_CHAIN:
            out.append(f"  … {len(shown) - MAX_CHAIN} earlier entries (see `ballast decisions`)")
            shown = shown[-MAX_CHAIN:]
        out.extend(f"  {line}" for line in shown)
    out.extend(explain_damping(mine))
    latest = mine[-1]
    scores = _scores(latest)
    if scores:
        out.append(f"latest scores: {scores}")
    detail = latest.get("detail")
    if isinstance(detail, dict) and detail.get("next"):
        out.append(f"next: {detail['next']}")
    return out
