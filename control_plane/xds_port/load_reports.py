"""The load-report server wired into a running Ballast: hosted on the xDS port, bounded by the
ADS server's per-identity budgets, feeding the metric source the operator chose.

`--metrics-source` names the passive source the controllers read: `sink` (Envoy's stats sinks),
`prometheus`, `lrs` (load reports alone), or `sink+lrs` / `prometheus+lrs` (the first, with load
reports filling in the pairs it has nothing of: `observe/fill_in.py`). The load-report server is
hosted whatever the choice (proxyless gRPC clients always report, as their clusters ask), so its
reporters show up and a source can be switched on a restart.
"""

from __future__ import annotations

from typing import Literal

from control_plane.desired.model import Desired
from control_plane.observe.fill_in import FilledIn, PassiveSource
from control_plane.observe.load_reports import LoadReports
from control_plane.observe.lrs_service import LoadReportingServicer, add_load_reporting_service
from control_plane.security.peer import check_node_peer
from control_plane.xds_port.server import BallastServer

MetricSourceKind = Literal["sink", "prometheus", "lrs", "sink+lrs", "prometheus+lrs"]
METRIC_SOURCES: tuple[str, ...] = ("sink", "prometheus", "lrs", "sink+lrs", "prometheus+lrs")


def host_load_reports(
    server: BallastServer, desired: Desired, *, interval_ms: int, endpoint_granularity: bool,
) -> LoadReports:
    """The load-report store, its server registered on `server`'s port (call before start);
    with mTLS a client reports for its own node only, as on the ADS streams."""
    store = LoadReports(desired)
    bound = server.tls is not None
    servicer = LoadReportingServicer(
        store, server.cache.has_pop, interval_ms=interval_ms,
        endpoint_granularity=endpoint_granularity,
        verify_peer=check_node_peer if bound else None,
        budget=server.ads.ledger,
        identify=server.identify,
        first_request_s=server.limits.first_request_s,
        vouch=server.connections.vouch,
    )
    server.add_service(lambda grpc_server: add_load_reporting_service(grpc_server, servicer))
    return store


def passive_source(kind: str, first: PassiveSource | None, reports: LoadReports
                   ) -> PassiveSource:
    """The passive source `kind` names, from the sink or Prometheus (`first`) and the load
    reports."""
    if kind == "lrs":
        return reports
    assert first is not None, f"metric source {kind!r} needs the sink or Prometheus"
    return FilledIn(first, reports) if kind.endswith("+lrs") else first
