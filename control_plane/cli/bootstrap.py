"""`ballast bootstrap --pop NAME --node-id ID`: print a ready Envoy bootstrap fed by Ballast
(`--grpc`: a proxyless gRPC client's, `translate/grpc_bootstrap.py`).

ADS over gRPC (or delta with --delta) to Ballast at --xds, node locality zone = the PoP, admin on
127.0.0.1. Templates live in `envoy/` (edge, sidecar). With --tls-cert/--tls-key/--tls-ca the
connection to Ballast is mTLS (the node's certificate from `ballast certs`), the certificate and
the CA read through file-based SDS: the command also writes those two SDS files (--tls-sds-file,
default next to the certificate; the CA's beside it as NAME.ca.sds.json), and Envoy re-reads
them when a file is renamed into their directory. When the certificate's directory is a symbolic
link, the SDS files go beside the link and its parent is watched: replacing the link (one
rename) hands Envoy a new certificate, key and CA together (deploy/README.md, "Rotate
certificates").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import replace
from pathlib import Path

import yaml

from control_plane.translate.bootstrap import (
    XdsClientTls,
    ads_bootstrap,
    xds_client_sds,
    xds_server_ca_sds,
)
from control_plane.translate.bootstrap_templates import TEMPLATES
from control_plane.translate.capabilities import ENVOY_RELEASES, NEWEST_RELEASE
from control_plane.translate.grpc_bootstrap import grpc_bootstrap

HELP = ("print an Envoy bootstrap that streams its config from Ballast (ADS), or with --grpc "
        "a proxyless gRPC client's (GRPC_XDS_BOOTSTRAP)")
# Envoy-only options, refused with --grpc (their defaults: not given)
ENVOY_ONLY = ("delta", "metrics_sink", "all_stats", "stats_listener", "max_connections",
              "load_reports", "tls_sds_file")
NAME = re.compile(r"^[A-Za-z0-9_-]+$")


MAX_XDS_ADDRESSES = 16


class BootstrapArgumentError(ValueError):
    pass


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pop", required=True, metavar="NAME", help="the Envoy's PoP")
    parser.add_argument("--node-id", required=True, metavar="ID", help="Envoy node id")
    parser.add_argument(
        "--xds", action="append", metavar="HOST:PORT",
        help="Ballast's ADS address (default 127.0.0.1:18000); repeat it for replicas: the "
        "first is preferred, the others take over while it is down (TCP health check)",
    )
    parser.add_argument(
        "--admin-port", default="9901", metavar="N", help="Envoy admin port on 127.0.0.1"
    )
    parser.add_argument("--grpc", action="store_true",
                        help="a proxyless gRPC client's bootstrap (JSON, for GRPC_XDS_BOOTSTRAP): "
                        "xDS to Ballast (its replicas as fallback), the PoP as locality zone; "
                        "with --tls-* mTLS to Ballast (gRFC A65) and to TLS services' origins "
                        "(certificate provider 'ballast', gRFC A29)")
    parser.add_argument("--delta", action="store_true", help="use delta (incremental) ADS")
    parser.add_argument("--load-reports", action="store_true",
                        help="send load reports (LRS) to Ballast: per-locality requests, "
                        "errors and requests in flight (ballast serve --metrics-source lrs)")
    parser.add_argument(
        "--metrics-sink",
        action="store_true",
        help="stream stats to Ballast (metrics_service + OpenTelemetry sinks), keeping only the "
        "stats Ballast reads and the operator basics",
    )
    parser.add_argument(
        "--all-stats",
        action="store_true",
        help="with --metrics-sink: keep every Envoy stat (larger flushes)",
    )
    parser.add_argument(
        "--template",
        default="edge",
        choices=sorted(TEMPLATES),
        help="bootstrap template (default edge)",
    )
    parser.add_argument(
        "--envoy-version",
        default=NEWEST_RELEASE,
        choices=list(ENVOY_RELEASES),
        metavar="X.Y",
        help=f"the Envoy release that loads it ({', '.join(ENVOY_RELEASES)}; "
        f"default {NEWEST_RELEASE})",
    )
    parser.add_argument(
        "--stats-listener", metavar="HOST:PORT",
        help="add a listener serving only GET /stats/prometheus (from the admin, which stays on "
        "127.0.0.1) for a central Prometheus; every other path gets a 404",
    )
    parser.add_argument(
        "--max-connections", type=int, default=None, metavar="N",
        help="downstream connections Envoy accepts at once, overload manager "
        "(default 50000 for edge, 1024 for sidecar)",
    )
    parser.add_argument("--format", default="yaml", choices=["yaml", "json"], help="output")
    tls = parser.add_argument_group(
        "mTLS to Ballast (all three, or none for plaintext); paths as Envoy will open them")
    tls.add_argument("--tls-cert", metavar="FILE", help="the node's certificate (PEM)")
    tls.add_argument("--tls-key", metavar="FILE", help="the node's private key (PEM)")
    tls.add_argument("--tls-ca", metavar="FILE", help="the CA Ballast's certificate chains to")
    tls.add_argument("--tls-sds-file", metavar="FILE",
                     help="where to write the file-based SDS file Envoy reads its certificate "
                     "through (watched: certificates renewed in place are used without a "
                     "restart); default: next to --tls-cert (next to its directory when that "
                     "is a symbolic link), as NAME.sds.json; the CA's is NAME.ca.sds.json")


def run(args: argparse.Namespace) -> int:
    try:
        addresses = args.xds or ["127.0.0.1:18000"]
        if len(addresses) > MAX_XDS_ADDRESSES:
            raise BootstrapArgumentError(f"--xds: at most {MAX_XDS_ADDRESSES} replicas")
        host, port = parse_host_port(addresses[0])
        replicas = [parse_host_port(text) for text in addresses[1:]]
        admin_port = parse_port("--admin-port", args.admin_port, allow_zero=True)
        if not NAME.match(args.pop):
            raise BootstrapArgumentError(
                f"--pop {args.pop!r}: use letters, digits, '-' and '_' (it is the stats zone)"
            )
        if not args.node_id.strip():
            raise BootstrapArgumentError("--node-id must not be empty")
        if args.grpc:
            envoy_only = [f"--{name.replace('_', '-')}" for name in ENVOY_ONLY
                          if getattr(args, name) not in (None, False)]
            if envoy_only:
                raise BootstrapArgumentError(f"{', '.join(envoy_only)}: Envoy options, not "
                                             "for --grpc")
            tls = client_tls(args.tls_cert, args.tls_key, args.tls_ca)
            print(json.dumps(grpc_bootstrap(
                node_id=args.node_id, pop=args.pop, servers=[(host, port), *replicas],
                tls=None if tls is None else replace(tls, sds_file=None)), indent=2))
            return 0
        tls = client_tls(args.tls_cert, args.tls_key, args.tls_ca, args.tls_sds_file)
        stats = None
        if args.stats_listener is not None:
            stats = parse_host_port(args.stats_listener, "--stats-listener")
            if stats[1] == admin_port:
                raise BootstrapArgumentError("--stats-listener: its port is the admin's")
        if args.max_connections is not None and not 1 <= args.max_connections <= 10_000_000:
            raise BootstrapArgumentError("--max-connections must be 1..10000000")
    except BootstrapArgumentError as err:
        print(f"ballast bootstrap: {err}", file=sys.stderr)
        return 2
    if tls is not None and tls.sds_file is not None and tls.ca_sds_file is not None:
        for path, content, what in (
                (tls.sds_file, xds_client_sds(tls), "Envoy's xDS client certificate"),
                (tls.ca_sds_file, xds_server_ca_sds(tls), "the CA of Ballast's certificate")):
            try:
                write_atomically(Path(path), json.dumps(content, indent=2))
            except OSError as err:
                print(f"ballast bootstrap: cannot write {path}: {err}", file=sys.stderr)
                return 1
            print(f"ballast bootstrap: wrote {path} ({what}, file-based SDS)", file=sys.stderr)
    bootstrap = ads_bootstrap(
        node_id=args.node_id,
        pop=args.pop,
        xds_host=host,
        xds_port=port,
        admin_port=admin_port,
        delta=args.delta,
        metrics_sink=args.metrics_sink,
        needed_stats_only=args.metrics_sink and not args.all_stats,
        template=args.template,
        envoy_release=args.envoy_version,
        tls=tls,
        xds_replicas=replicas,
        max_connections=args.max_connections,
        stats_listener=stats,
        load_reports=args.load_reports,
    )
    if args.format == "json":
        print(json.dumps(bootstrap, indent=2))
    else:
        print(yaml.safe_dump(bootstrap, sort_keys=False), end="")
    return 0


def client_tls(cert: str | None, key: str | None, ca: str | None,
               sds_file: str | None = None) -> XdsClientTls | None:
    """The node's mTLS files; its certificate and the CA through file-based SDS at `sds_file`
    (default: `<cert without suffix>.sds.json`, beside the certificate's directory when that is
    a symbolic link)."""
    given = [name for name, value in (("--tls-cert", cert), ("--tls-key", key),
                                      ("--tls-ca", ca)) if value]
    if not given:
        return None
    if len(given) < 3 or cert is None or key is None or ca is None:
        raise BootstrapArgumentError(
            f"mTLS needs --tls-cert, --tls-key and --tls-ca together (given: {', '.join(given)})")
    if Path(cert).parent.absolute() != Path(key).parent.absolute():
        raise BootstrapArgumentError("--tls-cert and --tls-key must be in one directory (Envoy "
                                     "watches it to re-read them together)")
    cert_path = Path(cert).absolute()
    watch = watched_directory(cert_path)
    sds = Path(sds_file).absolute() if sds_file else watch / f"{cert_path.stem}.sds.json"
    return XdsClientTls(cert=str(cert_path), key=str(Path(key).absolute()),
                        ca=str(Path(ca).absolute()), sds_file=str(sds), watch_dir=str(watch),
                        ca_watch_dir=str(watched_directory(Path(ca).absolute())))


def watched_directory(path: Path) -> Path:
    """Where a rename means Envoy should read `path` again: its directory, or the directory
    holding that directory when it is a symbolic link (a link replaced is a rename there)."""
    return path.parent.parent if path.parent.is_symlink() else path.parent


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def parse_host_port(text: str, option: str = "--xds") -> tuple[str, int]:
    """`host:port` or `[v6]:port`."""
    host, colon, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not colon or not host:
        raise BootstrapArgumentError(f"{option} {text!r}: expected HOST:PORT, e.g. 127.0.0.1:18000")
    return host, parse_port(option, port, allow_zero=False)


def parse_port(option: str, text: str, *, allow_zero: bool) -> int:
    lowest = 0 if allow_zero else 1
    if not text.isdigit() or not lowest <= int(text) <= 65535:
        raise BootstrapArgumentError(f"{option}: port {text!r} must be {lowest}..65535")
    return int(text)
