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


def fleet_yaml(*, pops: int, groups: int, listener_port: int = 10000,
               max_origin_concurrency: int = 120, rollout: str | None = None) -> str:
    """`pops` PoPs (p000…) and `groups` origin groups (g000…) of two origins, one virtual host
    per group: the YAML twin of `harness.models.fleet_desired`, for scale tests. `rollout`:
    the rollout strategy written (`immediate`: a reload reaches every PoP at once)."""
    pop_names = [f"p{p:03d}" for p in range(pops)]
    lines = ["pops:"]
    lines += [f"  {name}: {{listen_address: 127.0.0.1, port_offset: {p}}}"
              for p, name in enumerate(pop_names)]
    lines.append("origin_groups:")
    for g in range(groups):
        order = {name: ("[o0, o1]" if p % 2 == 0 else "[o1, o0]")
                 for p, name in enumerate(pop_names)}
        lines += [
            f"  g{g:03d}:",
            f"    max_origin_concurrency: {max_origin_concurrency}",
            "    origins:",
            f"      o0: {{address: 10.{g // 250}.{g % 250}.1, port: 8080}}",
            f"      o1: {{address: 10.{g // 250}.{g % 250}.2, port: 8080}}",
            "    preference: {" + ", ".join(f"{k}: {v}" for k, v in order.items()) + "}",
        ]
    if rollout is not None:
        lines.append(f"rollout: {{strategy: {rollout}}}")
    lines += ["listeners:", "  - name: edge", f"    port: {listener_port}", "    virtual_hosts:"]
    lines += [f"      - {{name: g{g:03d}, domains: [g{g:03d}.example], origin_group: g{g:03d}}}"
              for g in range(groups)]
    return "\n".join(lines) + "\n"
