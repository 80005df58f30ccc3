"""Envoy bootstraps: the ADS bootstrap edge proxies start from (template in `envoy/`)."""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

import yaml

TEMPLATES = Path(__file__).resolve().parents[2] / "envoy"
XDS_CLUSTER = "ballast_xds"


def ads_bootstrap(
    *,
    node_id: str,
    pop: str,
    xds_host: str = "127.0.0.1",
    xds_port: int = 18000,
    admin_port: int = 9901,
    delta: bool = False,
    node_cluster: str = "ballast-edge",
    stats_flush_interval_ms: int = 5000,
    metrics_sink: bool = False,
    template: str = "edge",
) -> dict[str, Any]:
    """A bootstrap for one Envoy of `pop`, streaming config (and, if asked, stats) to Ballast."""
    text = (TEMPLATES / f"{template}.yaml").read_text()
    filled = string.Template(text).substitute(
        node_id=_yaml_str(node_id),
        node_cluster=_yaml_str(node_cluster),
        pop=_yaml_str(pop),
        admin_port=int(admin_port),
        api_type="DELTA_GRPC" if delta else "GRPC",
        xds_host=_yaml_str(xds_host),
        xds_port=int(xds_port),
        stats_flush_interval=f"{stats_flush_interval_ms / 1000:g}s",
    )
    bootstrap: dict[str, Any] = yaml.safe_load(filled)
    if metrics_sink:
        bootstrap["stats_sinks"] = [
            {
                "name": "envoy.stat_sinks.metrics_service",
                "typed_config": {
                    "@type": "type.googleapis.com/"
                    "envoy.config.metrics.v3.MetricsServiceConfig",
                    "transport_api_version": "V3",
                    "emit_tags_as_labels": True,
                    # Histograms only (no Summary copy): halves the histogram payload.
                    "histogram_emit_mode": "HISTOGRAM",
                    "grpc_service": {"envoy_grpc": {"cluster_name": XDS_CLUSTER}},
                },
            }
        ]
    return bootstrap


def _yaml_str(value: str) -> str:
    """Quote a value for the YAML template (json quoting is valid YAML)."""
    return json.dumps(str(value))
