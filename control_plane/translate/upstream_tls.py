"""The UpstreamTlsContext of a TLS origin: SNI, and a verified certificate unless turned off.

Verification (the tiers source: "Keep Origin SSL Verification ... enabled even for internal origins,
and pin your origin certs"; the failover source: "Enforce strict checks on both origins"):
- the chain must end at a CA of `ca_file` (a PEM bundle on the Envoy host; the system bundle by
  default);
- a subject alt name must equal the origin's expected name (`verify_name`, else the SNI, else the
  address); a DNS name is matched as Envoy does, wildcard certificates included; an IP address
  is matched against IP SANs;
- when pins are given, the certificate's SPKI hash or its whole hash must be one of them (Envoy
  requires one of `verify_certificate_spki` / `verify_certificate_hash` to match when either is
  set).
An origin with `insecure_skip_verify: true` gets SNI only: Envoy then accepts any certificate.
"""

from __future__ import annotations

import ipaddress

from envoy.config.core.v3.base_pb2 import DataSource
from envoy.extensions.transport_sockets.tls.v3.common_pb2 import (
    CertificateValidationContext,
    SubjectAltNameMatcher,
)
from envoy.extensions.transport_sockets.tls.v3.tls_pb2 import (
    CommonTlsContext,
    UpstreamTlsContext,
)
from envoy.type.matcher.v3.string_pb2 import StringMatcher

from control_plane.desired.model import Origin


def upstream_tls(origin: Origin) -> UpstreamTlsContext:
    context = UpstreamTlsContext(sni=origin.server_name)
    if origin.verify:
        context.common_tls_context.CopyFrom(
            CommonTlsContext(validation_context=validation_context(origin))
        )
    return context


def validation_context(origin: Origin) -> CertificateValidationContext:
    return CertificateValidationContext(
        trusted_ca=DataSource(filename=origin.ca_file),
        match_typed_subject_alt_names=[_san_matcher(origin.expected_name)],
        verify_certificate_spki=list(origin.spki_pins),
        verify_certificate_hash=list(origin.cert_pins),
    )


def _san_matcher(name: str) -> SubjectAltNameMatcher:
    kind = SubjectAltNameMatcher.IP_ADDRESS if _is_ip(name) else SubjectAltNameMatcher.DNS
    return SubjectAltNameMatcher(san_type=kind, matcher=StringMatcher(exact=name))


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True
