"""`ballast serve FILE`: the control plane — ADS, metrics sink, reconcile loop, admin API."""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import sys
from pathlib import Path

from control_plane.app.service import BallastService, ServiceConfig
from control_plane.decisions.budget import DEFAULT_BURST_BYTES, DEFAULT_BYTES_PER_S, BudgetConfig
from control_plane.desired import DesiredStateError
from control_plane.intent.etcd_store import StoreUnavailable, parse_store_url
from control_plane.intent.sqlite_store import StateCorrupted
from control_plane.intent.state_dir import state_dir
from control_plane.intent.state_dir_lock import StateDirBusy
from control_plane.security.tls import TlsFiles

REPLICA_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
HELP = "serve the desired state to Envoys over ADS and reconcile origin weights"
SHUTDOWN_GRACE = 1.0


def _milliseconds(text: str) -> int:
    try:
        value = float(text.removesuffix("ms").removesuffix("s"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 500ms, 2s)") from None
    millis = value if text.endswith("ms") else value * 1000
    if millis <= 0:
        raise argparse.ArgumentTypeError(f"duration must be positive: {text!r}")
    return int(millis)


def _bytes(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"wants a whole number of bytes >= 1, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="desired-state YAML (watched: edits apply live)")
    parser.add_argument("--xds-address", default="127.0.0.1:18000", metavar="HOST:PORT",
                        help="where Envoys connect for ADS and the metrics sink "
                        "(default 127.0.0.1:18000)")
    parser.add_argument("--admin-address", default="127.0.0.1:18001", metavar="HOST:PORT",
                        help="admin HTTP API and /metrics (default 127.0.0.1:18001)")
    parser.add_argument("--state-dir", default=None,
                        help="weights, streaks and the decision log "
                        "(default $BALLAST_STATE_DIR or var/ballast)")
    parser.add_argument("--metrics-source", choices=["sink", "prometheus"], default="sink",
                        help="Envoy's metrics_service sink (default) or a Prometheus server")
    parser.add_argument("--prometheus-url", default=None, metavar="URL",
                        help="Prometheus base URL, with --metrics-source prometheus")
    parser.add_argument("--no-probes", action="store_true",
                        help="no active probes of origins (passive signals only)")
    parser.add_argument("--probe-interval", type=_milliseconds, default=None, metavar="DURATION",
                        help="override every group's health_check interval")
    parser.add_argument("--reconcile-interval", type=_milliseconds, default=None,
                        metavar="DURATION", help="override every group's failover interval")
    parser.add_argument("--seed", type=int, default=0, help="seed of the per-PoP jitter")
    parser.add_argument("--accept-empty-state", action="store_true",
                        help="start from default weights even though state.db is empty while "
                        "the decision log shows earlier use (refused otherwise)")
    parser.add_argument("--routine-records-burst", type=_bytes, default=DEFAULT_BURST_BYTES,
                        metavar="BYTES", help="decision-log bytes clients may cause at once "
                        f"(node events, NACKs; default {DEFAULT_BURST_BYTES})")
    parser.add_argument("--routine-records-rate", type=_bytes, default=DEFAULT_BYTES_PER_S,
                        metavar="BYTES", help="decision-log bytes per second clients may cause "
                        f"after the burst (default {DEFAULT_BYTES_PER_S}); decisions are never "
                        "limited")
    tls = parser.add_argument_group(
        "mTLS on the xDS/sink port (all three, or none for plaintext); files are re-read when "
        "they change, for rotation (`ballast certs` makes a set)")
    tls.add_argument("--tls-cert", type=Path, metavar="FILE", help="server certificate (PEM)")
    tls.add_argument("--tls-key", type=Path, metavar="FILE", help="its private key (PEM)")
    tls.add_argument("--client-ca", type=Path, metavar="FILE",
                     help="CA that node certificates must chain to; client certificates are "
                     "required and their identity must match node id and PoP")
    tls.add_argument("--allow-plaintext-secrets", action="store_true",
                     help="without mTLS, still send TLS listeners' certificates and private "
                     "keys (SDS) to Envoys connecting from loopback (this machine); never to "
                     "any other peer")
    parser.add_argument("--admin-token-file", type=Path, metavar="FILE",
                        help="require this bearer token (one word, >= 16 characters; re-read "
                        "when the file changes) for every admin route but /healthz and "
                        "/readyz. Without it the admin API is open and may only bind loopback")
    parser.add_argument("--admin-tls", action="store_true",
                        help="serve the admin API over HTTPS with the --tls-* files; client "
                        "certificates naming an admin identity (ballast certs --admin NAME) are "
                        "accepted like the token")
    replicas = parser.add_argument_group(
        "replicas: several `ballast serve` on one etcd; one leader reconciles, every replica "
        "serves the same intent (needs --metrics-source prometheus: the leader must see every "
        "Envoy's signals, whichever replica it streams to)")
    replicas.add_argument("--store", metavar="etcd://HOST:PORT[,HOST:PORT]",
                          help="keep the running intent in etcd instead of state.db")
    replicas.add_argument("--replica-id", metavar="NAME",
                          help="this replica's name (default: its --xds-address)")
    replicas.add_argument("--leader-ttl", type=_milliseconds, default=5000, metavar="DURATION",
                          help="the leader's lease: a follower takes over within it "
                          "(default 5s, at least 2s)")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"], help="default info")


def _replica_problem(args: argparse.Namespace) -> str:
    """Why the replica options cannot work together ("" when they can)."""
    try:
        parse_store_url(args.store)
    except ValueError as err:
        return f"--store: {err}"
    if args.metrics_source != "prometheus":
        return ("--store etcd:// needs --metrics-source prometheus: each Envoy streams its "
                "sink to one replica, and the leader must decide on every Envoy's signals")
    if args.leader_ttl < 2000:
        return "--leader-ttl must be at least 2s"
    if args.replica_id is not None and not REPLICA_ID.match(args.replica_id):
        return f"--replica-id {args.replica_id[:80]!r}: 1-64 of letters, digits, '.', '_', '-'"
    return ""


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.metrics_source == "prometheus" and not args.prometheus_url:
        print("ballast serve: --metrics-source prometheus needs --prometheus-url",
              file=sys.stderr)
        return 2
    if args.store is not None:
        problem = _replica_problem(args)
        if problem:
            print(f"ballast serve: {problem}", file=sys.stderr)
            return 2
    tls_given = [args.tls_cert, args.tls_key, args.client_ca]
    if any(tls_given) and not all(tls_given):
        print("ballast serve: mTLS needs --tls-cert, --tls-key and --client-ca together",
              file=sys.stderr)
        return 2
    config = ServiceConfig(
        desired_path=Path(args.file),
        state_dir=state_dir(args.state_dir),
        xds_address=args.xds_address,
        admin_address=args.admin_address,
        metrics_source=args.metrics_source,
        prometheus_url=args.prometheus_url,
        probes=not args.no_probes,
        probe_interval_ms=args.probe_interval,
        reconcile_interval_ms=args.reconcile_interval,
        seed=args.seed,
        routine_records=BudgetConfig(args.routine_records_burst, args.routine_records_rate),
        accept_empty_state=args.accept_empty_state,
        tls=TlsFiles(args.tls_cert, args.tls_key, args.client_ca) if all(tls_given) else None,
        admin_token_file=args.admin_token_file,
        admin_tls=args.admin_tls,
        allow_plaintext_secrets=args.allow_plaintext_secrets,
        store_url=args.store,
        replica_id=args.replica_id,
        leader_ttl_s=max(2, round(args.leader_ttl / 1000)),
        freeze_heap=True,  # this process is the server: long-lived objects out of full GCs
    )
    return asyncio.run(_serve(BallastService(config)))


async def _serve(service: BallastService) -> int:
    try:
        await service.start()
    except DesiredStateError as err:
        print(err, file=sys.stderr)
        return 1
    except (StateCorrupted, StateDirBusy, StoreUnavailable) as err:
        print(f"ballast serve: {err}", file=sys.stderr)
        return 1
    except (OSError, RuntimeError, ValueError) as err:
        print(f"ballast serve: cannot start: {err}", file=sys.stderr)
        return 1
    stop = asyncio.Event()
    service.install_signal_handlers(stop)
    admin = f", admin on port {service.admin.port}" if service.admin is not None else ""
    mode = "mTLS" if service.server.tls is not None else "plaintext"
    print(
        f"ballast: serving xDS ({mode}) on port {service.server.port}{admin}; "
        f"state in {service.config.state_dir}",
        file=sys.stderr,
        flush=True,
    )
    await stop.wait()
    logging.getLogger(__name__).info("shutting down: closing streams")
    await service.stop(SHUTDOWN_GRACE)
    return 0
