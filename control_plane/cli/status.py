"""`ballast status [NODE]`: every connected Envoy and how in sync it is (istioctl proxy-status).

The table shows, per node, the version sent and ACKed of each type (short hashes) and
SYNCED/STALE/NACKED, then the message of every NACK, then each PoP's desired-state version (and
the latest rollout in a line), then the nodes that send no metrics (naming the fix), then the
PoPs with adaptive tier actions
active (demote, shed), then each TLS origin's certificate (and each certificate the TLS listeners
serve): days to expiry, whether it
verifies. With a NODE id: that node in detail, with its last NACKs, which queue policy it gets
and why, and the tier actions active in its PoP. Reads the admin API of a running
server; exit 1 when it cannot be reached or the node is not connected. Every string of an
answer is escaped for the terminal before it is shown (`security/terminal.py`): a node's id,
version or NACK message cannot move the cursor or forge a line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
from datetime import datetime
from typing import Any

from control_plane.cli.admin_client import (
    AdminClient,
    AdminError,
    add_auth_options,
    add_server_option,
    client_for,
)
from control_plane.cli.rollout import replica_counts
from control_plane.decisions.explain import describe_active
from control_plane.security.terminal import escaped

HELP = "show every connected Envoy node: versions sent and ACKed per type, NACKs, queue policy"
TYPES = ("CDS", "EDS", "LDS", "RDS")
SHORT = 8  # characters of a version hash shown
HEADER = ("NODE", "POP", "ENVOY", "QUEUE", "MODE", "CONNECTED", *TYPES, "STATUS")
QUEUE_POLICIES = {
    "none": "no queue policy sent (Cluster field 62 left out; Envoy queues FIFO)",
    "lifo": "adaptive LIFO for the tiers that ask for it",
    "fifo": "FIFO (tiers that ask for adaptive LIFO fall back to FIFO)",
}

Node = dict[str, Any]
TierActions = dict[str, dict[str, dict[str, Any]]]  # PoP -> group -> actions (/tier-actions)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("node", nargs="?", metavar="NODE", help="show this node id in detail")
    add_server_option(parser, "admin API of the running Ballast")
    add_auth_options(parser)
    parser.add_argument("--json", action="store_true", help="print the server's JSON as is")


def short(version: str | None) -> str:
    return version[:SHORT] if version else "-"


def age(since: float, now: float) -> str:
    seconds = max(0, int(now - since))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600}h"


def type_cell(node: Node, kind: str) -> str:
    """`sent/acked` short versions; one version when they agree; `-` for a type never sent."""
    entry = node["types"].get(kind)
    if entry is None or entry["last_sent"] is None:
        return "-"
    sent, acked = short(entry["last_sent"]), short(entry["last_acked"])
    cell = sent if entry["status"] == "SYNCED" else f"{sent}/{acked}"
    return cell if entry["status"] != "NACKED" else f"{cell} NACK"


def row(node: Node, now: float) -> tuple[str, ...]:
    return (
        node["node_id"],
        node["pop"],
        node["envoy_version"],
        node["capability_key"],
        node["mode"],
        age(node["connected_since"], now) + " ago",
        *(type_cell(node, kind) for kind in TYPES),
        node["status"],
    )


def table(nodes: list[Node], now: float) -> str:
    """One row per node; with replicas, a REPLICA column says which one serves it."""
    replicated = any("replica" in node for node in nodes)
    header = (*HEADER, "REPLICA") if replicated else HEADER
    rows = [header, *((*row(node, now), node.get("replica", "?")) if replicated
                      else row(node, now) for node in nodes)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


def nack_lines(node: Node, now: float) -> list[str]:
    """The last NACK of each type, saying whether the type is still NACKED."""
    lines = []
    for kind in TYPES:
        entry = node["types"].get(kind)
        if entry is None or entry["last_nack"] is None:
            continue
        nack = entry["last_nack"]
        state = "rejected, still NACKED" if entry["status"] == "NACKED" else "rejected earlier"
        lines.append(
            f"{kind} version {short(nack['version'])} {state} ({age(nack['at'], now)} ago): "
            f"{nack['message']}"
        )
    return lines


def queue_policy(node: Node) -> str:
    key, reason = node["capability_key"], node["capability_reason"]
    policy = QUEUE_POLICIES.get(key.removesuffix("+als"), key)  # +als: access logs asked for
    if key.startswith("grpc"):
        policy = "none (a proxyless gRPC client: its gRPC services, no tiers)"
    return f"{policy} — capability key {key}, because {reason}"


def tier_action_lines(active: TierActions) -> list[str]:
    """One line per (PoP, group) with tier actions active, or one saying there are none."""
    rows = [
        (pop, group, actions.get("description") or describe_active(actions))
        for pop, groups in sorted(active.items())
        for group, actions in sorted(groups.items())
    ]
    if not rows:
        return ["tier actions: none active"]
    pop_width = max(len(r[0]) for r in rows)
    group_width = max(len(r[1]) for r in rows)
    return ["tier actions active:", *(
        f"  {pop:<{pop_width}}  {group:<{group_width}}  {words}" for pop, group, words in rows
    )]


def pop_tier_actions(active: TierActions | None, pop: str) -> str:
    if active is None:
        return "unknown (the server did not say)"
    groups = active.get(pop) or {}
    if not groups:
        return "none active"
    return " | ".join(
        f"{group}: {actions.get('description') or describe_active(actions)}"
        for group, actions in sorted(groups.items())
    )


def fetch_tier_actions(client: AdminClient) -> TierActions | None:
    """`/tier-actions`, or None (with a note on stderr) when the server cannot say."""
    try:
        answer: TierActions = escaped(client.get("/tier-actions")["tier_actions"])
    except (AdminError, KeyError, TypeError) as err:
        print(f"ballast status: tier actions unknown: {err}", file=sys.stderr)
        return None
    return answer


def detail(node: Node, now: float, tier_actions: TierActions | None = None) -> str:
    connected = datetime.fromtimestamp(node["connected_since"]).strftime("%Y-%m-%d %H:%M:%S")
    lines = [
        f"node {node['node_id']} (stream {node['stream']}): {node['status']}",
        f"  pop:           {node['pop']}",
        f"  envoy:         {node['envoy_version']}",
        f"  mode:          {node['mode']}",
        f"  connected:     {connected} ({age(node['connected_since'], now)} ago)",
        f"  queue policy:  {queue_policy(node)}",
        f"  tier actions:  {pop_tier_actions(tier_actions, node['pop'])}",
        "",
        "  TYPE  STATUS  SENT      ACKED     SENDS",
    ]
    for kind in TYPES:
        entry = node["types"].get(kind)
        if entry is None:
            lines.append(f"  {kind}   -")
            continue
        lines.append(
            f"  {kind}   {entry['status']:<6}  {short(entry['last_sent']):<8}  "
            f"{short(entry['last_acked']):<8}  {entry['sends']}"
        )
    nacks = nack_lines(node, now)
    if nacks:
        lines += ["", "  last NACKs:", *(f"    {line}" for line in nacks)]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        client = client_for(args)
        if args.node is None:
            answer = client.get("/nodes")
        else:
            answer = client.get(f"/nodes/{urllib.parse.quote(args.node, safe='')}")
    except AdminError as err:
        if err.status == 404 and args.node is not None:
            print(f"ballast status: node {args.node!r} is not connected", file=sys.stderr)
        else:
            print(f"ballast status: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(answer, indent=2))
        return 0
    answer = escaped(answer)
    now = time.time()
    tier_actions = fetch_tier_actions(client)
    if args.node is not None:
        print("\n\n".join(detail(node, now, tier_actions) for node in answer["streams"]))
        return 0
    nodes: list[Node] = answer["nodes"]
    replication = _replication(client)
    if replication is not None:
        nodes, unreachable = nodes_of_replicas(client, replication, nodes)
        print("\n".join(replica_lines(replication, unreachable)))
        print()
    if not nodes:
        print(f"no nodes connected to {client}")
    else:
        print(table(nodes, now))
    nacked = [(node, nack_lines(node, now)) for node in nodes if node["status"] == "NACKED"]
    for node, lines in nacked:
        print(f"\n{node['node_id']} NACKED:")
        for line in lines:
            print(f"  {line}")
    versions = version_lines(client)
    if versions:
        print()
        print("\n".join(versions))
    silent = silent_lines(client)
    if silent:
        print()
        print("\n".join(silent))
    if tier_actions is not None:
        print()
        print("\n".join(tier_action_lines(tier_actions)))
    certificates = fetch_certificates(client)
    if certificates:
        print()
        print("\n".join(certificate_lines(certificates)))
    served = fetch_certificates(client, "served_certificates")
    if served:
        print()
        print("\n".join(served_certificate_lines(served)))
    return 0


def version_lines(client: AdminClient) -> list[str]:
    """Each PoP's desired-state version and its nodes against it (with replicas: every
    replica's nodes, then each one's), then the latest rollout in a line (`ballast rollout
    status` has the rest); nothing when the server does not say."""
    try:
        status = escaped(client.get("/status"))
        versions: dict[str, dict[str, Any]] = status["pop_versions"]
        rollout: dict[str, Any] | None = status.get("rollout")
    except (AdminError, KeyError, TypeError):
        return []
    width = max((len(pop) for pop in versions), default=3)
    lines = ["config versions:"]
    for pop, v in versions.items():
        lines.append(f"  {pop:<{width}}  {v['version'][:16]}  {v['applied']} applied, "
                     f"{v['pending']} pending, {v['nacked']} NACKed")
        lines.extend(f"  {'':<{width}}    {line}" for line in replica_counts(v))
    if rollout is not None:
        lines.append(f"rollout of {rollout['to_version'][:16]}: "
                     f"{rollout['phase'].replace('_', ' ')}, wave {rollout['wave'] + 1} of "
                     f"{len(rollout['waves'])} ({', '.join(rollout['waves'][rollout['wave']])})"
                     " — `ballast rollout status` for the gate")
    return lines


def silent_lines(client: AdminClient) -> list[str]:
    """The connected nodes the metric source hears nothing from, per PoP, and what to change
    (their PoP's weights are held: "fail static: no metrics" or "no evidence")."""
    try:
        silent: list[dict[str, Any]] = client.get("/status")["metrics_silent"]
    except (AdminError, KeyError, TypeError):
        return []
    if not silent:
        return []
    return ["no metrics (the weight controller holds these PoPs):",
            *(f"  {entry['pop']}: {entry['fix']}" for entry in silent)]


def _replication(client: AdminClient) -> dict[str, Any] | None:
    try:
        status = escaped(client.get("/status"))
    except AdminError:
        return None
    return status.get("replication") if isinstance(status, dict) else None


def nodes_of_replicas(
    client: AdminClient, replication: dict[str, Any], own: list[Node]
) -> tuple[list[Node], list[str]]:
    """Every replica's nodes, each tagged with the replica that serves it, and the replicas
    whose admin API did not answer. Replicas are reached on the admin address they registered,
    with this command's scheme, token and certificates."""
    here = replication["replica"]
    nodes = [{**node, "replica": here} for node in own]
    unreachable = []
    scheme = client.base_url.split("://", 1)[0]
    for replica in replication.get("replicas", []):
        name, admin = str(replica.get("id")), replica.get("admin")
        if name == here:
            continue
        if not admin:
            unreachable.append(name)
            continue
        try:
            answer = escaped(client.sibling(f"{scheme}://{admin}").get("/nodes"))
        except AdminError:
            unreachable.append(name)
            continue
        nodes += [{**node, "replica": name} for node in answer.get("nodes", [])]
    return sorted(nodes, key=lambda n: (n["pop"], n["node_id"], n["replica"])), unreachable


def replica_lines(replication: dict[str, Any], unreachable: list[str]) -> list[str]:
    """The replicas, which one leads (and its term), and whether this one reaches etcd."""
    leader = replication.get("leader") or {}
    lines = [f"replicas (intent in {replication.get('store')}):"]
    for replica in replication.get("replicas", []):
        name = str(replica.get("id"))
        role = f"LEADER term {leader.get('term')}" if name == leader.get("replica") else "follower"
        note = "  admin API unreachable" if name in unreachable else ""
        lines.append(f"  {name}  xds {replica.get('xds')}  admin {replica.get('admin')}  "
                     f"{role}{note}")
    if not leader:
        lines.append("  no leader: reconcile paused")
    if replication.get("degraded"):
        lines.append(f"  {replication['replica']}: {replication['degraded']}")
    return lines


def fetch_certificates(client: AdminClient, part: str = "certificates") -> list[dict[str, Any]]:
    """The latest certificate check of each TLS origin (`/status`), or (`served_certificates`)
    the certificates the TLS listeners serve; none when unknown."""
    try:
        answer: list[dict[str, Any]] = escaped(client.get("/status")).get(part) or []
    except (AdminError, AttributeError) as err:
        what = "origin" if part == "certificates" else "served"
        print(f"ballast status: {what} certificates unknown: {err}", file=sys.stderr)
        return []
    return answer


def served_certificate_lines(certificates: list[dict[str, Any]]) -> list[str]:
    """One line per certificate a TLS listener serves: days to expiry, hostnames, PoPs."""
    rows = [(f"{cert['listener']}/{cert['certificate']}", f"{cert['days_to_expiry']:.1f} days",
             ",".join(cert.get("hostnames") or ["(default)"]), ",".join(cert.get("pops", [])),
             "ok" if cert.get("problem") is None else f"EXPIRING: {cert['problem']}")
            for cert in certificates]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return ["served certificates (TLS listeners, over SDS):", *(
        "  " + "  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4]
        for r in rows
    )]


def certificate_lines(certificates: list[dict[str, Any]]) -> list[str]:
    """One line per TLS origin: days to expiry, whether it verifies, what fails."""
    rows = []
    for cert in certificates:
        days = cert.get("days_to_expiry")
        verified = {True: "verifies", False: "DOES NOT VERIFY", None: "verification off"}[
            cert.get("verified")]
        state = "ok" if cert.get("problem") is None else f"FAILING: {cert['problem']}"
        rows.append((f"{cert['group']}/{cert['origin']}",
                     "-" if days is None else f"{days:.1f} days", verified, state))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return ["origin certificates:", *(
        "  " + "  ".join(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)) + "  " + r[3]
        for r in rows
    )]
