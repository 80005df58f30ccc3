"""Ballast's own Prometheus metrics (one registry per server), served by the admin API."""
