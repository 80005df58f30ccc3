"""The desired-state YAML the ADS tests serve: PoPs ewr/sjc, group `shop`, listener `edge`."""

from __future__ import annotations

from pathlib import Path

from control_plane.desired import Desired, parse_desired


def desired_yaml(
    *,
    listener_port: int,
    primary_port: int,
    secondary_port: int,
    max_origin_concurrency: int = 120,
    sjc_offset: int = 1,
    media_port: int = 0,
) -> str:
    """ewr listens on `listener_port`, sjc on `listener_port + sjc_offset`; both prefer primary.

    With `media_port`, a second origin group `media` (one origin) serves host `media.test`.
    """
    media_group = media_host = ""
    if media_port:
        media_group = f"""
  media:
    origins:
      cdn: {{address: 127.0.0.1, port: {media_port}}}
    preference: {{ewr: [cdn], sjc: [cdn]}}"""
        media_host = """
      - {name: media, domains: [media.test], origin_group: media}"""
    return f"""\
pops:
  ewr: {{listen_address: 127.0.0.1, port_offset: 0}}
  sjc: {{listen_address: 127.0.0.1, port_offset: {sjc_offset}}}
origin_groups:
  shop:
    max_origin_concurrency: {max_origin_concurrency}
    origins:
      primary: {{address: 127.0.0.1, port: {primary_port}}}
      secondary: {{address: 127.0.0.1, port: {secondary_port}}}
    preference: {{ewr: [primary, secondary], sjc: [primary, secondary]}}{media_group}
classification:
  default_tier: critical
  rules:
    - {{name: checkout, path_prefix: /api/checkout, tier: critical}}
    - {{name: prefetch, headers: [{{name: purpose, exact: prefetch}}], tier: background}}
    - {{name: bots, headers: [{{name: user-agent, contains: bot}}], tier: background}}
listeners:
  - name: edge
    port: {listener_port}
    virtual_hosts:
      - {{name: shop, domains: ["*"], origin_group: shop}}{media_host}
"""


def desired(**kwargs: int) -> Desired:
    return parse_desired(desired_yaml(**kwargs), "<ads-test>")


def write_desired(path: Path, **kwargs: int) -> Path:
    path.write_text(desired_yaml(**kwargs))
    return path
