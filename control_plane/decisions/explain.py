"""Why the weights of one (PoP, group) are what they are now, in plain words, from its records.

The story starts after the last time the group was calm at its home split (a ``steady`` or a
completed ``return`` record) and lists every decision since, with the numbers the controller logged;
runs of holds are folded into one "held since" line. It ends with what would move the weights next.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from control_plane.decisions.read import Record, record_time

MAX_CHAIN = 20


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
    lines: list[str] = []
    index = 0
    while index < len(episode):
        record = episode[index]
        if record["kind"] != "hold":
            lines.append(_line(record))
            index += 1
            continue
        end = index
        while end + 1 < len(episode) and episode[end + 1]["kind"] == "hold":
            end += 1
        last = episode[end]
        ticks = end - index + 1
        count = f" ({ticks} ticks, last at {_clock(last)})" if ticks > 1 else ""
        if end == len(episode) - 1:
            lines.append(f"held since {_clock(record)}: {last.get('rule')}{count}")
        else:
            lines.append(f"{_clock(record)} held{count}: {last.get('rule')}")
        index = end + 1
    return lines


def _scores(record: Record) -> str | None:
    scores: dict[str, Any] = (record.get("inputs") or {}).get("scores") or {}
    if not scores:
        return None
    return "; ".join(
        f"{name} {score['composite']:.2f} (lowest: {score['limiting']})"
        for name, score in scores.items()
    )


def explain(records: Iterable[Record], pop: str, group: str) -> str:
    """A few lines for on-call: current weights, the chain of decisions, what moves them next."""
    mine = [r for r in records if r.get("pop") == pop and r.get("group") == group]
    if not mine:
        return f"no decisions for pop {pop}, group {group}"
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
    latest = mine[-1]
    scores = _scores(latest)
    if scores:
        out.append(f"latest scores: {scores}")
    detail = latest.get("detail")
    if isinstance(detail, dict) and detail.get("next"):
        out.append(f"next: {detail['next']}")
    return "\n".join(out)
