"""What a valid desired state may still do wrong on purpose: warnings `ballast validate` prints.

A warning never stops a file from loading; it tells the operator that a key they wrote weakens
the edge. Today: origins whose certificate Envoy does not verify (`insecure_skip_verify: true`),
which lets anyone between the edge and the origin read and change the traffic; and served
certificates (TLS listeners) close to expiry.
"""

from __future__ import annotations

from control_plane.desired.model import Desired
from control_plane.desired.served_certs import days_left


def desired_warnings(desired: Desired) -> list[str]:
    """`path: why` for each risky setting, in file order of groups and origins, then each
    served certificate that expired within its listener's `expiry_warning_days` when the file
    was loaded (`Desired.loaded_at_s`)."""
    return _origin_warnings(desired) + _expiry_warnings(desired)


def _expiry_warnings(desired: Desired) -> list[str]:
    now = desired.loaded_at_s
    return [
        f"listeners.{listener.name}.tls.certificates.{cert.name}: {cert.cert_file} expires in "
        f"{days_left(cert, now):.1f} days (warning at {listener.tls.expiry_warning_days}); "
        "renew it (the new files are picked up without a restart)"
        for listener in desired.listeners if listener.tls is not None
        for cert in listener.tls.certificates
        if days_left(cert, now) < listener.tls.expiry_warning_days
    ]


def _origin_warnings(desired: Desired) -> list[str]:
    return [
        f"origin_groups.{group.name}.origins.{origin.name}.insecure_skip_verify: TLS "
        "verification is OFF for this origin: Envoy accepts any certificate, so anyone on the "
        "path can impersonate the origin or read and change its traffic; Ballast's certificate "
        "probe still reports the expiry but never fails the origin for it"
        for group in desired.origin_groups
        for origin in group.origins
        if origin.tls and not origin.verify
    ]
