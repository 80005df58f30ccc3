"""What an origin's certificate says, judged as Envoy will judge it (pure, no I/O).

The probe (`probes.py`) fetches the leaf certificate an origin presents and lets OpenSSL check
the chain against the origin's CA file and the dates; `assess` adds what Envoy also checks — the
subject alt name against the expected name, the pins — and what Envoy does not: how many days
are left, and whether that is inside the group's warning window (the failover source: "so you don't
discover an expired cert at minute two of an incident"). A certificate "fails" when it does not
verify or expires within the window; an origin with verification turned off never fails here,
but its days to expiry are still reported.

`served_certificates` judges the edge's own certificates (TLS listeners) the same way: days to
expiry against the listener's `expiry_warning_days`.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from control_plane.desired.model import Desired

DAY_MS = 86_400_000


@dataclass(frozen=True)
class CertificateCheck:
    """What the probe expects of one origin's certificate (from the desired state)."""

    expected_name: str
    verify: bool
    spki_pins: tuple[str, ...]
    cert_pins: tuple[str, ...]
    expiry_warning_days: int


@dataclass(frozen=True)
class CertificateStatus:
    group: str
    origin: str
    checked_at_ms: int
    verified: bool | None  # None: verification turned off (insecure_skip_verify)
    not_after_ms: int | None  # None: no certificate could be fetched
    days_to_expiry: float | None
    problem: str | None  # why the certificate fails the probe; None when it passes
    subject: str = ""

    @property
    def passed(self) -> bool:
        return self.problem is None

    @property
    def state(self) -> str:
        """ok, unreachable, unverified, expired or expiring: a change of state is news."""
        if self.problem is None:
            return "ok"
        if self.not_after_ms is None:
            return "unreachable"
        if self.verified is False:
            return "unverified"
        return "expired" if (self.days_to_expiry or 0) <= 0 else "expiring"

    def as_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "origin": self.origin,
            "checked_at_ms": self.checked_at_ms,
            "verified": self.verified,
            "not_after_ms": self.not_after_ms,
            "days_to_expiry": None if self.days_to_expiry is None else round(
                self.days_to_expiry, 2),
            "problem": self.problem,
            "state": self.state,
            "subject": self.subject,
        }


def assess(
    group: str,
    origin: str,
    check: CertificateCheck,
    der: bytes | None,
    chain_error: str | None,
    now_ms: int,
) -> CertificateStatus:
    """`der`: the leaf the origin presented (None: none could be fetched, `chain_error` says why);
    `chain_error`: OpenSSL's reason the chain or dates did not verify, None when they did."""
    if der is None:
        return CertificateStatus(group, origin, now_ms, False if check.verify else None, None,
                                 None, f"no certificate: {chain_error or 'unknown error'}")
    cert = x509.load_der_x509_certificate(der)
    not_after_ms = int(cert.not_valid_after_utc.timestamp() * 1000)
    days = (not_after_ms - now_ms) / DAY_MS
    reasons = [] if chain_error is None else [chain_error]
    if not names_match(cert, check.expected_name):
        reasons.append(f"no subject alt name matches {check.expected_name!r} "
                       f"(certificate names: {', '.join(cert_names(cert)) or 'none'})")
    if (check.spki_pins or check.cert_pins) and not pinned(der, cert, check):
        reasons.append("matches none of the pins")
    problem = None
    if check.verify and reasons:
        problem = "does not verify: " + "; ".join(reasons)
    elif check.verify and days <= check.expiry_warning_days:
        problem = (f"expires in {days:.1f} days, within the {check.expiry_warning_days}-day "
                   "warning window" if days > 0 else "expired")
    return CertificateStatus(
        group, origin, now_ms,
        verified=(not reasons) if check.verify else None,
        not_after_ms=not_after_ms,
        days_to_expiry=days,
        problem=problem,
        subject=cert.subject.rfc4514_string(),
    )


def cert_names(cert: x509.Certificate) -> list[str]:
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [*sans.get_values_for_type(x509.DNSName),
            *(str(ip) for ip in sans.get_values_for_type(x509.IPAddress))]


def names_match(cert: x509.Certificate, expected: str) -> bool:
    """Envoy's rule: an IP against IP SANs; a DNS name against DNS SANs, case-insensitive, where
    a SAN `*.example.com` matches exactly one left-most label."""
    try:
        address = ipaddress.ip_address(expected)
    except ValueError:
        address = None
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    if address is not None:
        return address in sans.get_values_for_type(x509.IPAddress)
    return any(dns_match(san, expected) for san in sans.get_values_for_type(x509.DNSName))


def dns_match(san: str, name: str) -> bool:
    san, name = san.lower().rstrip("."), name.lower().rstrip(".")
    if san.startswith("*."):
        head, _, rest = name.partition(".")
        return bool(head) and rest == san[2:]
    return san == name


def pinned(der: bytes, cert: x509.Certificate, check: CertificateCheck) -> bool:
    spki = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    spki_pin = base64.b64encode(hashlib.sha256(spki).digest()).decode()
    return spki_pin in check.spki_pins or hashlib.sha256(der).hexdigest() in check.cert_pins


@dataclass(frozen=True)
class ServedCertificateStatus:
    """A certificate a TLS listener serves (the edge's own, sent to Envoys over SDS): judged
    like an origin's, by days to expiry against its listener's warning window."""

    listener: str
    certificate: str
    hostnames: tuple[str, ...]
    pops: tuple[str, ...]
    not_after_ms: int
    days_to_expiry: float
    expiry_warning_days: int
    fingerprint: str
    subject: str

    @property
    def problem(self) -> str | None:
        if self.days_to_expiry <= 0:
            return "expired"
        if self.days_to_expiry <= self.expiry_warning_days:
            return (f"expires in {self.days_to_expiry:.1f} days, within the "
                    f"{self.expiry_warning_days}-day warning window")
        return None

    def as_dict(self) -> dict[str, Any]:
        return {
            "listener": self.listener,
            "certificate": self.certificate,
            "hostnames": list(self.hostnames),
            "pops": list(self.pops),
            "not_after_ms": self.not_after_ms,
            "days_to_expiry": round(self.days_to_expiry, 2),
            "expiry_warning_days": self.expiry_warning_days,
            "problem": self.problem,
            "state": "ok" if self.problem is None else (
                "expired" if self.days_to_expiry <= 0 else "expiring"),
            "fingerprint": self.fingerprint,
            "subject": self.subject,
        }


def served_certificates(desired: Desired, now_ms: int) -> list[ServedCertificateStatus]:
    """Every certificate the desired state's TLS listeners serve, as loaded (the files were
    read and checked when the desired state was; a renewal is a new desired state)."""
    return [
        ServedCertificateStatus(
            listener=listener.name,
            certificate=cert.name,
            hostnames=cert.hostnames,
            pops=listener.pops if listener.pops is not None else desired.pop_names,
            not_after_ms=int(cert.not_after_s * 1000),
            days_to_expiry=(cert.not_after_s * 1000 - now_ms) / DAY_MS,
            expiry_warning_days=listener.tls.expiry_warning_days,
            fingerprint=cert.fingerprint,
            subject=cert.subject,
        )
        for listener in desired.listeners if listener.tls is not None
        for cert in listener.tls.certificates
    ]
