"""`ballast plan FILE`: what applying FILE would change, per PoP, before it is applied.

Against a running server (`--server`), the server's running intent (`/intent`) is carried over
to FILE with the rule a reload applies (`intent/carry_over.py`); each PoP of FILE is rendered
with what it holds for the PoP (weights, tier actions, the cache-warming mirrors of its ramps:
`RunningIntent.for_pop`, the same input the server translates) and the capability key its nodes
get, and compared field by field with what the server serves now (`/resources`). With
`--against OLD_FILE` two files are compared offline, both at their starting weights and Envoy
1.40's capabilities. Like `terraform plan -detailed-exitcode`: exit 0 = no changes, 2 =
changes, 1 = an error (bad file or argument, server unreachable).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, NoReturn

from control_plane.admin.capability_keys import capabilities_for_key
from control_plane.cli.admin_client import (
    AdminClient,
    AdminError,
    add_auth_options,
    add_server_option,
    client_for,
)
from control_plane.cli.translate_options import (
    DEFAULT_ENVOY_RELEASE,
    add_filter_option,
    filters_of,
    load_or_report,
    release_capabilities,
)
from control_plane.decide.rollout import plan_waves, renewal
from control_plane.desired import Desired
from control_plane.desired.model import RolloutPolicy
from control_plane.intent.carry_over import carry_over
from control_plane.intent.shown import intent_from_json
from control_plane.security.terminal import escape
from control_plane.translate import PopIntent, render_json, translate_pop
from control_plane.translate.diff import (
    Rendering,
    ResourceChange,
    diff_renderings,
    format_changes,
    summarize,
)
from control_plane.translate.resources import Capabilities

HELP = "show which Envoy resources applying a desired-state file would add, change or remove"
NO_CHANGES, ERROR, CHANGES = 0, 1, 2


class PlanError(Exception):
    """Something that stops the plan; the message is printed and the exit code is 1."""


@dataclass(frozen=True)
class PopPlan:
    pop: str
    basis: str  # what the old side is, e.g. "running: capabilities fifo, ..."
    changes: list[ResourceChange]
    notes: tuple[str, ...] = ()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_filter_option(parser)
    exit_1_on_usage_errors(parser)
    parser.add_argument("file", metavar="FILE", help="the desired-state YAML to plan")
    where = parser.add_mutually_exclusive_group()
    add_server_option(where, "compare with what this running Ballast serves")
    add_auth_options(parser)
    where.add_argument(
        "--against",
        metavar="OLD_FILE",
        help="compare with another desired-state file instead, offline (starting weights)",
    )
    parser.add_argument("--pop", metavar="P", help="only this PoP")


def exit_1_on_usage_errors(parser: argparse.ArgumentParser) -> None:
    """argparse exits 2 on bad arguments, but plan's 2 means "changes": make them exit 1.

    Unknown options are normally left to the top-level parser (exit 2), so they are caught
    here too.
    """

    def error(message: str) -> NoReturn:
        parser.print_usage(sys.stderr)
        parser.exit(ERROR, f"{parser.prog}: error: {message}\n")

    parse_known = parser.parse_known_args

    def parse_known_args(
        args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extra = parse_known(args, namespace)
        if extra:
            error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed, extra

    parser.error = error  # type: ignore[method-assign]
    parser.parse_known_args = parse_known_args  # type: ignore[method-assign]


def run(args: argparse.Namespace) -> int:
    new = load_or_report(args.file, filters_of(args))
    if new is None:
        return ERROR
    try:
        if args.against is not None:
            old = load_or_report(args.against, filters_of(args))
            if old is None:
                return ERROR
            source = args.against
            old_pops: Sequence[str] = old.pop_names
            plans = plan_files(old, new, args.pop)
        else:
            client = client_for(args)
            source = str(client)
            old_pops, plans = plan_server(client, new, args.pop)
    except (PlanError, AdminError) as err:
        print(f"ballast plan: {err}", file=sys.stderr)
        return ERROR
    # a renewal alone (known when the file is compared with another file; the server decides
    # it against the version it serves)
    renewed = renewal(old, new) if args.against is not None else ()
    waves = rollout_plan(new.rollout, new.pop_names, old_pops, plans, renewed)
    print(report(args.file, source, plans, waves))
    return CHANGES if any(plan.changes for plan in plans) else NO_CHANGES


def _pops(pop: str | None, *known: Sequence[str]) -> list[str]:
    pops = sorted({name for names in known for name in names})
    if pop is None:
        return pops
    if pop not in pops:
        raise PlanError(f"--pop {pop}: no such PoP on either side; known: {', '.join(pops)}")
    return [pop]


def plan_files(old: Desired, new: Desired, pop: str | None) -> list[PopPlan]:
    """Two desired states compared at their starting weights, for Envoy 1.40's extensions."""
    caps = release_capabilities(DEFAULT_ENVOY_RELEASE)
    basis = f"starting weights, Envoy {DEFAULT_ENVOY_RELEASE} capabilities ({caps.key})"
    plans = []
    for name in _pops(pop, old.pop_names, new.pop_names):
        before = _render(old, name, caps)
        after = _render(new, name, caps)
        plans.append(PopPlan(name, basis, diff_renderings(before, after)))
    return plans


def plan_against_server(client: AdminClient, new: Desired, pop: str | None) -> list[PopPlan]:
    """`new` rendered with the server's running intent carried over (the rule a reload
    applies) and its capability key, against what it serves."""
    return plan_server(client, new, pop)[1]


def plan_server(client: AdminClient, new: Desired, pop: str | None
                ) -> tuple[list[str], list[PopPlan]]:
    """`plan_against_server`, with the PoPs the server serves."""
    shown = client.get("/intent")
    try:
        running = intent_from_json(shown, new)
        serving = [str(name) for name in shown["pops"]]
    except (KeyError, TypeError, ValueError) as err:
        raise PlanError(f"{client}: cannot read its running intent (/intent): {err}") from err
    carried = carry_over(running, new)
    plans = []
    for name in _pops(pop, serving, new.pop_names):
        if name in serving:
            answer = client.get("/resources", {"pop": name})
            before: Rendering = answer["resources"]
            caps = capabilities_for_key(answer["capabilities"])
            basis = f"running: capabilities {caps.key} ({answer['capabilities_reason']})"
        else:
            before = {}
            caps = release_capabilities(DEFAULT_ENVOY_RELEASE)
            basis = f"new PoP: starting weights, capabilities {caps.key}"
        notes = tuple(
            f"running weights do not fit ({why}); planned with starting weights"
            for (p, _), why in sorted(carried.notes.items())
            if p == name
        )
        after = _render(new, name, caps, carried.intent.for_pop(name))
        plans.append(PopPlan(name, basis, diff_renderings(before, after), notes))
    return serving, plans


def _render(desired: Desired, pop: str, caps: Capabilities, intent: PopIntent | None = None
            ) -> dict[str, dict[str, Any]]:
    """`pop` translated under `intent` (what the running intent holds for it, mirrors
    included: exactly what a reload would serve), rendered."""
    if pop not in desired.pop_names:
        return {}
    return render_json(translate_pop(desired, pop, caps, intent))


def rollout_plan(policy: RolloutPolicy, pops: Sequence[str], old_pops: Sequence[str],
                 plans: Sequence[PopPlan], renewed: Sequence[str] = ()) -> dict[str, Any]:
    """The waves applying the file would go through (`decide/rollout.py`'s `plan_waves`, the
    new file's `rollout:` policy; `renewed`: the certificates it renews when that is all it
    changes, at once under `renewals: immediate`) and what each PoP gets in its wave;
    JSON-ready."""
    immediate = policy.strategy == "immediate" or (
        bool(renewed) and policy.renewals == "immediate")
    waves = plan_waves(replace(policy, strategy="immediate") if immediate else policy, pops,
                       old_pops)
    planned = {plan.pop: plan for plan in plans}
    gates = policy.gates
    return {
        "strategy": policy.strategy,
        "at_once": immediate,
        "renewed": list(renewed),
        "bake_ms": 0 if immediate else policy.bake_ms,
        "gates": None if immediate else {
            "ack_timeout_ms": gates.ack_timeout_ms,
            "max_5xx_increase": gates.max_5xx_increase,
            "max_p95_ratio": gates.max_p95_ratio,
            "min_p95_increase_ms": gates.min_p95_increase_ms,
            "max_shed_increase": gates.max_shed_increase,
            "max_tier_action_onsets": gates.max_tier_action_onsets,
            "min_samples": gates.min_samples,
        },
        "waves": [
            {
                "wave": index + 1,
                "starts_after_ms": 0 if immediate else index * policy.bake_ms,
                "pops": [_pop_gets(pop, pops, old_pops, planned.get(pop)) for pop in wave],
            }
            for index, wave in enumerate(waves)
        ],
        "passes_after_ms": 0 if immediate else len(waves) * policy.bake_ms,
    }


def _pop_gets(pop: str, pops: Sequence[str], old_pops: Sequence[str],
              plan: PopPlan | None) -> dict[str, Any]:
    if pop not in pops:
        gets = "removed: its resources are withdrawn"
    elif old_pops and pop not in old_pops:
        gets = "added: served for the first time"
    else:
        gets = "the new version"
    if plan is None:
        changes = "not planned (--pop)"
    elif plan.changes:
        changes = summarize(plan.changes)
    else:
        changes = "no changes to its resources"
    return {"pop": pop, "gets": gets, "changes": changes}


def rollout_lines(rollout: dict[str, Any]) -> list[str]:
    """`rollout_plan`'s result in words."""
    waves = rollout["waves"]
    if rollout["strategy"] == "immediate":
        head = "Rollout: every PoP at once (rollout strategy immediate: no bake, no gate)"
    elif rollout["at_once"]:
        head = (f"Rollout: every PoP at once (a renewal of certificate(s) "
                f"{', '.join(rollout['renewed'])} alone: rollout.renewals immediate, no bake, "
                "no gate)")
    else:
        gates = rollout["gates"]
        head = (f"Rollout: {len(waves)} wave(s), each baked {_duration(rollout['bake_ms'])}, "
                "then passed by its gate; a failing gate rolls back every PoP that got the "
                "change")
        head += (f"\n  gate: every node ACKs within {_duration(gates['ack_timeout_ms'])}, no "
                 f"NACK, no regression (min {gates['min_samples']} samples): 5xx "
                 f"+{gates['max_5xx_increase']:.1%}, p95 x{gates['max_p95_ratio']:g} and "
                 f"+{gates['min_p95_increase_ms']} ms, shed +{gates['max_shed_increase']:.1%}, "
                 f"tier-action onsets +{gates['max_tier_action_onsets']}")
    lines = head.split("\n")
    for wave in waves:
        when = ("starts at once" if wave["starts_after_ms"] == 0
                else f"starts at the earliest {_duration(wave['starts_after_ms'])} after "
                     "wave 1")
        name = " (canary)" if wave["wave"] == 1 and len(waves) > 1 else ""
        lines.append(f"  wave {wave['wave']}{name}: {when}")
        lines.extend(f"    {pop['pop']}: {pop['gets']} ({pop['changes']})"
                     for pop in wave["pops"])
    if not rollout["at_once"]:
        lines.append(f"  passes at the earliest {_duration(rollout['passes_after_ms'])} "
                     "after wave 1; PoPs not yet in a wave keep the running version")
    return lines


def _duration(millis: int) -> str:
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if millis and millis % size == 0:
            return f"{millis // size}{unit}"
    return f"{millis}ms"


def report(file: str, source: str, plans: list[PopPlan],
           rollout: dict[str, Any] | None = None) -> str:
    """The plan in words: each PoP's changes, the rollout's waves (when anything changes) and
    the summary line last; each line escaped for the terminal (a value the server answered, or
    a file's, cannot move the cursor or break a line)."""
    lines = [f"ballast plan: {file} against {source}", ""]
    changed = [plan for plan in plans if plan.changes]
    for plan in plans:
        if not plan.changes:
            lines.append(f"pop {plan.pop}: no changes ({plan.basis})")
            continue
        lines.append(f"pop {plan.pop}: {summarize(plan.changes)} ({plan.basis})")
        lines.extend(f"  note: {note}" for note in plan.notes)
        lines.extend(format_changes(plan.changes))
    if changed and rollout is not None:
        lines.append("")
        lines.extend(rollout_lines(rollout))
    lines.append("")
    if not changed:
        lines.append(f"No changes: {file} matches {source} in {len(plans)} PoP(s).")
    else:
        every = [change for plan in plans for change in plan.changes]
        lines.append(
            f"Plan: {summarize(every)} in {len(changed)} of {len(plans)} PoP(s) "
            f"({', '.join(plan.pop for plan in changed)})."
        )
    return "\n".join(escape(line) for line in lines)
