"""`ballast rollout status | pause | resume | abort | promote | apply [--now]`: the rollout of a
desired-state change on a running server, through its admin API (the same authentication as
every other route).

`status` shows the latest rollout — its phase, the waves (the one baking marked), the last gate
reading — and each PoP's version with its nodes' ACKs (with replicas: of every replica's nodes,
then each replica's own). `pause` holds the next wave (a failing
gate still rolls back), `resume` bakes the current wave again from now, `abort` rolls every PoP
back to the last version that passed, `promote` puts every PoP on the new version now. `apply`
reads the server's desired-state file now (as its watcher would); `--now` sends it to every PoP
at once (an emergency; recorded as such). Exit 1 when the server cannot be reached or the
action does not apply. What the server answers is escaped for the terminal before it is shown
(a NACK's message in a gate reading is a node's text).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from control_plane.cli.admin_client import (
    AdminError,
    add_auth_options,
    add_server_option,
    client_for,
)
from control_plane.security.terminal import escaped

HELP = "a desired-state change's rollout: status, pause, resume, abort, promote, apply --now"
ACTIONS = ("status", "pause", "resume", "abort", "promote", "apply")
SHORT = 16  # hex digits of a version shown


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=ACTIONS, help="what to do (status: show it)")
    parser.add_argument("--now", action="store_true",
                        help="with apply: every PoP at once, no waves, no gates")
    add_server_option(parser, "admin API of the running Ballast")
    add_auth_options(parser)
    parser.add_argument("--json", action="store_true", help="print the server's JSON as is")


def lines(shown: dict[str, Any]) -> list[str]:
    """The rollout and each PoP's version, in words."""
    out: list[str] = []
    rollout = shown.get("rollout")
    if rollout is None:
        out.append("no rollout since the state was new: every PoP serves "
                   f"{shown['target'][:SHORT]}")
    else:
        out.append(f"rollout of {rollout['to_version'][:SHORT]} from "
                   f"{rollout['from_version'][:SHORT]}: {rollout['phase'].replace('_', ' ')}"
                   + (" (immediate)" if rollout.get("immediate") else ""))
        if rollout.get("reason"):
            out.append(f"  {rollout['reason']}")
        for wave in rollout["timeline"]:
            mark = "*" if wave["state"] in ("baking", "paused") else " "
            out.append(f" {mark} wave {wave['wave']}: {', '.join(wave['pops'])} "
                       f"({wave['state'].replace('_', ' ')})")
        gate = rollout.get("gate")
        if gate is not None:
            out.append(f"  gate: {gate['verdict']}")
            out.extend(f"    {why}" for why in gate["why"])
        for digest, why in rollout.get("failed_versions", {}).items():
            out.append(f"  failed version {digest[:SHORT]}: {why}")
    out.append("")
    width = max((len(pop) for pop in shown["pop_versions"]), default=3)
    out.append(f"{'POP'.ljust(width)}  VERSION           APPLIED  PENDING  NACKED")
    for pop, acks in shown["pop_versions"].items():
        out.append(f"{pop.ljust(width)}  {acks['version'][:SHORT]}  {acks['applied']:>7}  "
                   f"{acks['pending']:>7}  {acks['nacked']:>6}")
        out.extend(f"{''.ljust(width)}    {line}" for line in replica_counts(acks))
    return out


def replica_counts(acks: dict[str, Any]) -> list[str]:
    """With replicas: a PoP's nodes on each one (a replica serving the PoP another version
    says which), one line each; none alone."""
    lines = []
    for replica, held in acks.get("replicas", {}).items():
        other = "" if held["version"] == acks["version"] else \
            f" (it serves {held['version'][:SHORT]})"
        lines.append(f"on replica {replica}: {held['applied']} applied, {held['pending']} "
                     f"pending, {held['nacked']} NACKed{other}")
    return lines


def run(args: argparse.Namespace) -> int:
    if args.now and args.action != "apply":
        print("ballast rollout: --now goes with apply", file=sys.stderr)
        return 2
    try:
        client = client_for(args)
        if args.action == "status":
            shown = client.get("/rollout")
        else:
            shown = client.post(f"/rollout/{args.action}", {"now": "1" if args.now else "0"})
    except AdminError as err:
        print(f"ballast rollout {args.action}: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(shown, indent=2))
        return 0
    if args.action == "apply" and not shown.get("applied"):
        print("nothing applied: the file is the version served, or it was rejected "
              "(`ballast decisions --kind config_rejected` says why)")
    print("\n".join(lines(escaped(shown))))
    return 0
