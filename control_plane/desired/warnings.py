"""What a valid desired state may still do wrong on purpose: warnings `ballast validate` prints.

A warning never stops a file from loading; it tells the operator that a key they wrote weakens
the edge. Today: origins whose certificate Envoy does not verify (`insecure_skip_verify: true`),
which lets anyone between the edge and the origin read and change the traffic.
"""

from __future__ import annotations

from control_plane.desired.model import Desired


def desired_warnings(desired: Desired) -> list[str]:
    """`path: why` for each risky setting, in file order of groups and origins."""
    return [
        f"origin_groups.{group.name}.origins.{origin.name}.insecure_skip_verify: TLS "
        "verification is OFF for this origin: Envoy accepts any certificate, so anyone on the "
        "path can impersonate the origin or read and change its traffic; Ballast's certificate "
        "probe still reports the expiry but never fails the origin for it"
        for group in desired.origin_groups
        for origin in group.origins
        if origin.tls and not origin.verify
    ]
