"""`ballast init DIR`: the deploy kit the wheel carries, written out for a host.

The kit (package data, `control_plane/kit/` and the alert rules of `own_metrics/`) is what
deploy/README.md's runbook installs from, so a host needs the wheel and nothing of the
repository: the systemd units (one control plane, a replica of three, an edge Envoy, the etcd
snapshot service and its timer with its script), an example desired state and Prometheus's
alerting rules on Ballast's own metrics. Files already in DIR with other contents are left
alone unless --force (`files_out`); run it again after an upgrade to get the new version's
kit.
"""

from __future__ import annotations

import argparse
from importlib import resources
from pathlib import Path

from control_plane.cli.files_out import OutFile, write_files

HELP = "write the deploy kit (systemd units, an example desired state, alert rules) to DIR"
RULES = "ballast-alerts.yaml"
# what each file of the kit is, for the listing `ballast init` prints
KIT = {
    "ballast.service": "systemd unit: one control plane (no replicas)",
    "ballast-replica.service": "systemd unit: a replica of three, intent in etcd",
    "envoy.service": "systemd unit: an edge Envoy (bootstrap from `ballast bootstrap`)",
    "ballast-etcd-snapshot.service": "systemd unit: one etcd snapshot, copied off the host",
    "ballast-etcd-snapshot.timer": "systemd timer: that snapshot hourly",
    "etcd-snapshot.sh": "the snapshot service's script",
    "desired.yaml": "an example desired state (docs/desired-state.md)",
    RULES: "Prometheus alerting rules on Ballast's own metrics",
}
EXECUTABLE = {"etcd-snapshot.sh"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", type=Path, help="where to write the kit (made if missing)")
    parser.add_argument("--force", action="store_true",
                        help="replace files in DIR that differ from the kit's")


def kit_files(into: Path) -> list[OutFile]:
    """The kit's files as they would be written into `into`."""
    kit = resources.files("control_plane").joinpath("kit")
    rules = resources.files("control_plane.own_metrics").joinpath(RULES)
    files = []
    for name in KIT:
        source = rules if name == RULES else kit.joinpath(name)
        files.append(OutFile(into / name, source.read_bytes(),
                             0o755 if name in EXECUTABLE else 0o644))
    return files


def run(args: argparse.Namespace) -> int:
    done = write_files("ballast init", kit_files(args.dir), force=args.force)
    if done == 0:
        width = max(len(name) for name in KIT)
        print(f"\nthe kit in {args.dir}:")
        for name, what in KIT.items():
            print(f"  {name:<{width}}  {what}")
        print("deploy/README.md (Ballast's repository) is the runbook that installs them")
    return done
