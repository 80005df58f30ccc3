"""`ballast explain`: why the weights of one (PoP, origin group) are what they are now, and which
tier actions (demote, shed) are active there, what switched them on and what lifts them; then
the latest rollout of a desired-state version as it concerns the PoP (its wave, the gates, how
it ended and why). Records are escaped for the terminal before they are told
(`security/terminal.py`): a node's text in them cannot move the cursor or forge a line."""

from __future__ import annotations

import argparse
import sys

from control_plane.cli.admin_client import AdminError
from control_plane.cli.decisions import NOT_FOUND, add_state_dir, source_for
from control_plane.decide.rollout import ROLLOUT_KINDS
from control_plane.decisions.explain import explain, explain_rollout
from control_plane.decisions.read import Query
from control_plane.security.terminal import escaped

HELP = (
    "explain in plain words why a PoP's weights for an origin group are what they are now, "
    "and which tier actions are active"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_state_dir(parser)
    parser.add_argument("--pop", required=True, help="the PoP")
    parser.add_argument("--group", required=True, help="the origin group")


def run(args: argparse.Namespace) -> int:
    source = source_for(args)
    try:
        records = escaped(source.query(Query(pop=args.pop, group=args.group)))
    except AdminError as err:
        print(f"ballast explain: {err}", file=sys.stderr)
        return 1
    if not records:  # every (PoP, group) served has records from its first tick on
        print(f"ballast explain: not found: no record names pop {args.pop!r}, group "
              f"{args.group!r} in {source}", file=sys.stderr)
        return NOT_FOUND
    print(explain(records, args.pop, args.group))
    try:  # the latest rollout of the desired state, as it concerns the PoP
        rollout = explain_rollout(escaped(source.query(Query(kinds=frozenset(ROLLOUT_KINDS)))),
                                  args.pop)
    except AdminError as err:
        print(f"ballast explain: {err}", file=sys.stderr)
        return 1
    if rollout:
        print("\n".join(rollout))
    return 0
