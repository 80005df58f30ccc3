"""`ballast serve FILE`: the control plane — ADS, metrics sink, reconcile loop, admin API."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import re
import resource
import sys
from pathlib import Path

from control_plane.admin.connections import DEFAULT_ADMIN_LIMITS, AdminLimits
from control_plane.ads.limits import DEFAULT_LIMITS, DESCRIPTOR_RESERVE, AdsLimits
from control_plane.cli.translate_options import add_filter_option, filters_of
from control_plane.decisions.rate_limit import DEFAULT_BURST_BYTES, DEFAULT_BYTES_PER_S, RateLimit
from control_plane.desired import DesiredStateError
from control_plane.intent.etcd_store import StoreCredentials, StoreUnavailable, parse_store_url
from control_plane.intent.sqlite_store import StateCorrupted
from control_plane.intent.state_dir import state_dir
from control_plane.intent.state_dir_lock import StateDirBusy
from control_plane.lifecycle.accept_errors import QuietAcceptErrors
from control_plane.lifecycle.service import BallastService, ServiceConfig
from control_plane.observe.lrs_service import DEFAULT_INTERVAL_MS
from control_plane.security.tls import TlsFiles
from control_plane.xds_port.load_reports import METRIC_SOURCES

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


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"wants a whole number >= 1, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="desired-state YAML (watched: edits apply live)")
    add_filter_option(parser)
    _add_ports_and_state(parser)
    _add_signals(parser)
    _add_records(parser)
    _add_ads_budgets(parser)
    _add_tls(parser)
    _add_admin(parser)
    _add_replicas(parser)
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"], help="default info")


def _add_ports_and_state(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--xds-address", default="127.0.0.1:18000", metavar="HOST:PORT",
                        help="where Envoys connect for ADS and the metrics sink "
                        "(default 127.0.0.1:18000)")
    parser.add_argument("--admin-address", default="127.0.0.1:18001", metavar="HOST:PORT",
                        help="admin HTTP API and /metrics (default 127.0.0.1:18001)")
    parser.add_argument("--state-dir", default=None,
                        help="weights, streaks and the decision log "
                        "(default $BALLAST_STATE_DIR or var/ballast)")


def _add_signals(parser: argparse.ArgumentParser) -> None:
    """What the controllers read, and how often they decide."""
    parser.add_argument("--metrics-source", choices=METRIC_SOURCES, default="sink",
                        help="what the controllers read: Envoy's stats sinks (default), a "
                        "Prometheus server, the load reports (LRS) of Envoys and gRPC clients, "
                        "or sink+lrs / prometheus+lrs (load reports fill in the pairs the "
                        "first has nothing of: gRPC services)")
    parser.add_argument("--lrs-interval", type=_milliseconds, default=DEFAULT_INTERVAL_MS,
                        metavar="DURATION", help="how often clients send load reports "
                        f"(default {DEFAULT_INTERVAL_MS / 1000:g}s, at least 1s)")
    parser.add_argument("--lrs-endpoint-granularity", action="store_true",
                        help="ask for load reports per endpoint too (Envoy sends them; gRPC "
                        "reports per locality only)")
    parser.add_argument("--prometheus-url", default=None, metavar="URL",
                        help="Prometheus base URL, with --metrics-source prometheus")
    parser.add_argument("--no-probes", action="store_true",
                        help="no active probes of origins (passive signals only)")
    parser.add_argument("--probe-interval", type=_milliseconds, default=None, metavar="DURATION",
                        help="override every group's health_check interval")
    parser.add_argument("--reconcile-interval", type=_milliseconds, default=None,
                        metavar="DURATION", help="override every group's failover interval")
    parser.add_argument("--seed", type=int, default=0, help="seed of the per-PoP jitter")


def _add_records(parser: argparse.ArgumentParser) -> None:
    """The state and decision log a start finds, and how fast clients may add records."""
    parser.add_argument("--accept-empty-state", action="store_true",
                        help="start from default weights even though state.db is empty while "
                        "the decision log shows earlier use (refused otherwise)")
    parser.add_argument("--routine-records-burst", type=_positive_int, default=DEFAULT_BURST_BYTES,
                        metavar="BYTES", help="decision-log bytes clients may cause at once "
                        f"(node events, NACKs; default {DEFAULT_BURST_BYTES})")
    parser.add_argument("--routine-records-rate", type=_positive_int, default=DEFAULT_BYTES_PER_S,
                        metavar="BYTES", help="decision-log bytes per second clients may cause "
                        f"after the burst (default {DEFAULT_BYTES_PER_S}); decisions are never "
                        "limited")


def _add_ads_budgets(parser: argparse.ArgumentParser) -> None:
    budgets = parser.add_argument_group(
        "what ADS clients may make the server hold (docs/security.md): per client identity "
        "(its certificate's with mTLS, else its IP address; loopback peers of a plaintext port "
        "count to the totals only) and for the process; over a budget the newest stream is "
        "refused with RESOURCE_EXHAUSTED")
    d = DEFAULT_LIMITS
    budgets.add_argument("--xds-streams-per-identity", type=_positive_int, metavar="N",
                         default=d.streams_per_identity,
                         help=f"concurrent ADS streams (default {d.streams_per_identity})")
    budgets.add_argument("--xds-connections-per-identity", type=_positive_int, metavar="N",
                         default=d.connections_per_identity,
                         help="connections with ADS streams (default "
                         f"{d.connections_per_identity})")
    budgets.add_argument("--xds-bytes-per-identity", type=_positive_int, metavar="BYTES",
                         default=d.held_bytes_per_identity,
                         help="bytes in requests not yet handled and responses being written "
                         f"(default {d.held_bytes_per_identity})")
    budgets.add_argument("--xds-streams-total", type=_positive_int, metavar="N",
                         default=d.streams_total,
                         help=f"ADS streams, all clients (default {d.streams_total})")
    budgets.add_argument("--xds-bytes-total", type=_positive_int, metavar="BYTES",
                         default=d.held_bytes_total,
                         help=f"held bytes, all clients (default {d.held_bytes_total})")
    budgets.add_argument("--xds-connections-total", type=_positive_int, metavar="N",
                         default=d.connections_total or None,
                         help="connections the xDS port holds at once; gRPC closes any more as "
                         "it accepts them (default: the descriptor limit, raised to the hard "
                         f"limit at start, less {DESCRIPTOR_RESERVE} kept for the admin API, the "
                         "store and the rest of the process)")
    budgets.add_argument("--xds-unproven-per-address", type=_positive_int, metavar="N",
                         default=d.unproven_per_address,
                         help="connections one peer address holds without a valid stream; more "
                         "are closed and the address blocked for a while (loopback exempt; "
                         f"default {d.unproven_per_address})")
    budgets.add_argument("--xds-proven-per-identity", type=_positive_int, metavar="N",
                         default=d.proven_per_identity,
                         help="connections one client identity holds with valid streams (ADS, "
                         "sinks, load reports); a stream on one more is refused (an Envoy needs "
                         "one, and one per worker thread for access logs; loopback exempt; "
                         f"default {d.proven_per_identity})")
    budgets.add_argument("--xds-idle-timeout", type=_milliseconds, metavar="DURATION",
                         default=d.connection_idle_ms,
                         help="a connection without a valid stream for this long is closed, "
                         "whatever other streams it opens (default "
                         f"{d.connection_idle_ms / 1000:g}s)")
    budgets.add_argument("--xds-first-request-timeout", type=_milliseconds, metavar="DURATION",
                         default=int(d.first_request_s * 1000),
                         help="a stream's first request (default "
                         f"{d.first_request_s:g}s)")
    budgets.add_argument("--xds-write-timeout", type=_milliseconds, metavar="DURATION",
                         default=int(d.write_stall_s * 1000),
                         help="a response write that makes no progress ends its stream "
                         f"(default {d.write_stall_s:g}s)")


def _add_tls(parser: argparse.ArgumentParser) -> None:
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


def _add_admin(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--admin-token-file", type=Path, metavar="FILE",
                        help="require this bearer token (one word, >= 16 characters; re-read "
                        "when the file changes) for every admin route but /healthz and "
                        "/readyz. Without it the admin API is open and may only bind loopback")
    parser.add_argument("--admin-scrape-token-file", type=Path, metavar="FILE",
                        help="a second, read-only token that opens GET /metrics and nothing "
                        "else: the one to give Prometheus (ballast certs --admin-token writes "
                        "DIR/scrape.token)")
    parser.add_argument("--admin-host", action="append", default=[], metavar="NAME",
                        help="a DNS name the admin API is reached by (repeatable): requests "
                        "whose Host is not an IP address, localhost or such a name get 421 "
                        "(DNS rebinding)")
    admin_limits = DEFAULT_ADMIN_LIMITS
    parser.add_argument("--admin-connections", type=_positive_int, metavar="N",
                        default=admin_limits.max_connections,
                        help="admin connections held at once (default "
                        f"{admin_limits.max_connections}, at most a quarter of the descriptor "
                        "limit); at the cap a new one closes the oldest idle one")
    parser.add_argument("--admin-header-timeout", type=_milliseconds, metavar="DURATION",
                        default=int(admin_limits.header_timeout_s * 1000),
                        help="a new admin connection's first request head (and TLS handshake) "
                        f"(default {admin_limits.header_timeout_s:g}s)")
    parser.add_argument("--admin-idle-timeout", type=_milliseconds, metavar="DURATION",
                        default=int(admin_limits.idle_timeout_s * 1000),
                        help="an admin connection between requests "
                        f"(default {admin_limits.idle_timeout_s:g}s)")
    parser.add_argument("--admin-tls", action="store_true",
                        help="serve the admin API over HTTPS with the --tls-* files; client "
                        "certificates naming an admin identity (ballast certs --admin NAME) are "
                        "accepted like the token")


def _add_replicas(parser: argparse.ArgumentParser) -> None:
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
    replicas.add_argument("--store-ca", type=Path, metavar="FILE",
                          help="etcd's CA (PEM): talk to etcd over TLS")
    replicas.add_argument("--store-cert", type=Path, metavar="FILE",
                          help="client certificate for etcd (PEM; with etcd's "
                          "--client-cert-auth its CN is the etcd user); with --store-key")
    replicas.add_argument("--store-key", type=Path, metavar="FILE", help="its private key (PEM)")
    replicas.add_argument("--store-user", metavar="NAME",
                          help="etcd user (password authentication), with --store-password-file")
    replicas.add_argument("--store-password-file", type=Path, metavar="FILE",
                          help="file holding that user's password (read at each connection)")


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
    return _store_credentials(args).problem()


def _store_credentials(args: argparse.Namespace) -> StoreCredentials:
    return StoreCredentials(ca=args.store_ca, cert=args.store_cert, key=args.store_key,
                            user=args.store_user, password_file=args.store_password_file)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.metrics_source.startswith("prometheus") and not args.prometheus_url:
        print("ballast serve: --metrics-source prometheus needs --prometheus-url",
              file=sys.stderr)
        return 2
    if args.store is not None:
        problem = _replica_problem(args)
        if problem:
            print(f"ballast serve: {problem}", file=sys.stderr)
            return 2
    elif any(v is not None for v in (args.store_ca, args.store_cert, args.store_key,
                                      args.store_user, args.store_password_file)):
        print("ballast serve: the --store-* credentials need --store", file=sys.stderr)
        return 2
    tls_given = [args.tls_cert, args.tls_key, args.client_ca]
    if any(tls_given) and not all(tls_given):
        print("ballast serve: mTLS needs --tls-cert, --tls-key and --client-ca together",
              file=sys.stderr)
        return 2
    _raise_descriptor_limit()
    config = ServiceConfig(
        desired_path=Path(args.file),
        state_dir=state_dir(args.state_dir),
        xds_address=args.xds_address,
        admin_address=args.admin_address,
        metrics_source=args.metrics_source,
        lrs_interval_ms=args.lrs_interval,
        lrs_endpoint_granularity=args.lrs_endpoint_granularity,
        prometheus_url=args.prometheus_url,
        probes=not args.no_probes,
        probe_interval_ms=args.probe_interval,
        reconcile_interval_ms=args.reconcile_interval,
        seed=args.seed,
        routine_records=RateLimit(args.routine_records_burst, args.routine_records_rate),
        ads_limits=_ads_limits(args),
        accept_empty_state=args.accept_empty_state,
        tls=TlsFiles(args.tls_cert, args.tls_key, args.client_ca) if all(tls_given) else None,
        admin_token_file=args.admin_token_file,
        admin_scrape_token_file=args.admin_scrape_token_file,
        admin_tls=args.admin_tls,
        admin_limits=AdminLimits(header_timeout_s=args.admin_header_timeout / 1000,
                                 idle_timeout_s=args.admin_idle_timeout / 1000,
                                 max_connections=args.admin_connections),
        admin_host_names=tuple(args.admin_host),
        allow_plaintext_secrets=args.allow_plaintext_secrets,
        allowed_filters=filters_of(args),
        store_url=args.store,
        store_credentials=_store_credentials(args) if args.store is not None else None,
        replica_id=args.replica_id,
        leader_ttl_s=max(2, round(args.leader_ttl / 1000)),
        freeze_heap=True,  # this process is the server: long-lived objects out of full GCs
    )
    return asyncio.run(_serve(BallastService(config)))


def _raise_descriptor_limit() -> None:
    """The soft descriptor limit up to the hard one (commonly 1,024 of 524,288): connections
    on both ports, the state store and the desired file share it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _ads_limits(args: argparse.Namespace) -> AdsLimits:
    return dataclasses.replace(
        DEFAULT_LIMITS,
        streams_per_identity=args.xds_streams_per_identity,
        connections_per_identity=args.xds_connections_per_identity,
        held_bytes_per_identity=args.xds_bytes_per_identity,
        streams_total=args.xds_streams_total,
        held_bytes_total=args.xds_bytes_total,
        first_request_s=args.xds_first_request_timeout / 1000,
        write_stall_s=args.xds_write_timeout / 1000,
        connections_total=args.xds_connections_total or 0,
        unproven_per_address=args.xds_unproven_per_address,
        proven_per_identity=args.xds_proven_per_identity,
        connection_idle_ms=args.xds_idle_timeout,
    )


async def _serve(service: BallastService) -> int:
    QuietAcceptErrors().install(asyncio.get_running_loop())
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
