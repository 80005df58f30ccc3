"""Metric sources: what the fleet reports, as rolling windows of per-origin signals.

- `source.MetricSource`: the one interface (`await window(now_ms, window_ms)`).
- `sink`: the embedded default, Envoy's metrics_service sink hosted on Ballast's gRPC server.
- `prometheus`: PromQL against a Prometheus scraping Envoy's /stats/prometheus.
- `probes`: active GETs from Ballast to every origin; `combine` merges them into either source.
- `window`, `envoy_stats`: the pure parts (counter resets, quantiles, stat names).
"""
