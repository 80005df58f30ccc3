"""`ballast prometheus-config DIR`: the central Prometheus's configuration for a Ballast fleet.

Writes DIR/prometheus.yml and DIR/ballast-alerts.yaml (the alerting rules on Ballast's own
metrics, shipped with the package). Two jobs:

- `envoy`: every edge Envoy's stats listener (`ballast bootstrap --stats-listener`), path
  `/stats/prometheus`, each target labelled `ballast_pop` with its PoP. The edge bootstrap tags
  every stat with `ballast_pop` already; `honor_labels` keeps the Envoy's own, and the target
  label fills in for Envoys whose bootstrap does not set it. The leader reads its signals here
  (`ballast serve --metrics-source prometheus`).
- `ballast`: every replica's `/metrics` over HTTPS (`--admin-tls`), with the scrape token
  (read-only: `/metrics` and nothing else; `ballast certs --admin-token` writes it as
  `scrape.token`, replicas take it with `--admin-scrape-token-file`) and the CA that signed the
  replicas' certificate; the alert rules are on these series.

With `--alertmanager` the rules' alerts go to those Alertmanagers (`alerting:`); without, they
only show in Prometheus, and the command says so. File paths in the configuration are absolute
(Prometheus would take a relative one from the configuration's own directory). A file already
in DIR with other contents is left alone unless --force (`files_out`).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from control_plane.cli.bootstrap import BootstrapArgumentError, parse_host_port
from control_plane.cli.files_out import OutFile, write_files

HELP = "write the scrape configuration and alert rules of a central Prometheus"
POP = re.compile(r"^[A-Za-z0-9_-]+$")
RULES = "ballast-alerts.yaml"
INTERVAL = re.compile(r"^[0-9]+(ms|s|m)$")


def _edge(text: str) -> tuple[str, str]:
    pop, eq, address = text.partition("=")
    if not eq or not POP.match(pop):
        raise argparse.ArgumentTypeError(f"{text!r}: expected POP=HOST:PORT, e.g. "
                                         "ewr=10.0.1.7:9902")
    return pop, _address(address)


def _address(text: str) -> str:
    try:
        host, port = parse_host_port(text, "address")
    except BootstrapArgumentError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _interval(text: str) -> str:
    if not INTERVAL.match(text):
        raise argparse.ArgumentTypeError(f"{text!r}: a Prometheus duration, e.g. 5s")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", type=Path, help="where to write prometheus.yml and " + RULES)
    parser.add_argument("--edge", action="append", type=_edge, default=[],
                        metavar="POP=HOST:PORT", help="an edge Envoy's stats listener; repeat")
    parser.add_argument("--ballast", action="append", type=_address, default=[],
                        metavar="HOST:PORT", help="a replica's admin address (HTTPS); repeat")
    parser.add_argument("--ca", type=Path, metavar="FILE",
                        help="CA of the replicas' certificate, as Prometheus will open it")
    parser.add_argument("--token-file", type=Path, metavar="FILE",
                        help="the scrape token file (ballast certs --admin-token: "
                        "scrape.token), as Prometheus will open it; not the admin token, which "
                        "can act on rollouts")
    parser.add_argument("--scrape-interval", type=_interval, default="5s",
                        help="how often Envoys and replicas are scraped (default 5s; the "
                        "leader's signals are at most this old)")
    parser.add_argument("--alertmanager", action="append", type=_address, default=[],
                        metavar="HOST:PORT", help="an Alertmanager the alerts go to; repeat")
    parser.add_argument("--force", action="store_true",
                        help="replace prometheus.yml or the rules file when they differ")


def prometheus_config(edges: list[tuple[str, str]], replicas: list[str], *, ca: Path | None,
                      token_file: Path | None, rules: Path, interval: str,
                      alertmanagers: Sequence[str] = ()) -> dict[str, Any]:
    by_pop: dict[str, list[str]] = {}
    for pop, address in edges:
        by_pop.setdefault(pop, []).append(address)
    jobs: list[dict[str, Any]] = [{
        "job_name": "envoy",
        "metrics_path": "/stats/prometheus",
        "honor_labels": True,
        "static_configs": [{"targets": targets, "labels": {"ballast_pop": pop}}
                           for pop, targets in sorted(by_pop.items())],
    }]
    if replicas:
        ballast: dict[str, Any] = {"job_name": "ballast", "scheme": "https",
                                   "static_configs": [{"targets": replicas}]}
        if ca is not None:
            ballast["tls_config"] = {"ca_file": str(ca)}
        if token_file is not None:
            ballast["authorization"] = {"type": "Bearer", "credentials_file": str(token_file)}
        jobs.append(ballast)
    config: dict[str, Any] = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(rules)],
        "scrape_configs": jobs,
    }
    if alertmanagers:
        targets = [{"targets": list(alertmanagers)}]
        config["alerting"] = {"alertmanagers": [{"static_configs": targets}]}
    return config


def run(args: argparse.Namespace) -> int:
    if not args.edge and not args.ballast:
        print("ballast prometheus-config: give --edge and/or --ballast targets", file=sys.stderr)
        return 2
    rules = args.dir.absolute() / RULES
    config = prometheus_config(
        args.edge, args.ballast, ca=args.ca and args.ca.absolute(),
        token_file=args.token_file and args.token_file.absolute(), rules=rules,
        interval=args.scrape_interval, alertmanagers=args.alertmanager)
    text = resources.files("control_plane.own_metrics").joinpath(RULES).read_bytes()
    done = write_files("ballast prometheus-config", [
        OutFile(rules, text),
        OutFile(args.dir.absolute() / "prometheus.yml",
                ("# written by `ballast prometheus-config`\n"
                 + yaml.safe_dump(config, sort_keys=False)).encode()),
    ], force=args.force)
    if done == 0 and not args.alertmanager:
        print("ballast prometheus-config: no --alertmanager: the alert rules fire in "
              "Prometheus but notify nobody", file=sys.stderr)
    return done
