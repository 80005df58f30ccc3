"""Certificate probes: the pure judgement of a certificate, and the prober against real loopback
HTTPS origins presenting certificates made by the test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from cryptography.hazmat.primitives import serialization

from control_plane.desired.model import HealthCheck
from control_plane.observe.certificates import DAY_MS, CertificateCheck, assess, dns_match
from control_plane.observe.probes import Prober, ProbeTarget
from control_plane.observe.source import wall_ms
from harness.envoy_process import free_port
from tests.support.certs import Issued, make_ca, make_leaf
from tests.support.tls_origins import TlsOrigins

pytestmark = pytest.mark.timeout(60)

NAME = "origin.test"
FAST = HealthCheck(interval_ms=200, connect_timeout_ms=1000, read_timeout_ms=1000,
                   cacheable_path="/", uncacheable_path="/")


def check(**changes: object) -> CertificateCheck:
    values: dict[str, object] = {"expected_name": NAME, "verify": True, "spki_pins": (),
                                 "cert_pins": (), "expiry_warning_days": 14}
    values.update(changes)
    return CertificateCheck(**values)  # type: ignore[arg-type]


def der(issued: Issued) -> bytes:
    return issued.cert.public_bytes(serialization.Encoding.DER)


@pytest.mark.parametrize(("san", "name", "matches"), [
    ("origin.test", "origin.test", True),
    ("ORIGIN.test", "origin.TEST", True),
    ("*.test", "origin.test", True),
    ("*.test", "a.origin.test", False),
    ("*.origin.test", "origin.test", False),
    ("other.test", "origin.test", False),
])
def test_dns_names_match_like_envoy(san: str, name: str, matches: bool) -> None:
    assert dns_match(san, name) is matches


def test_assess_a_certificate() -> None:
    ca = make_ca()
    now = wall_ms()
    good = make_leaf([NAME], ca, not_after_days=90)
    status = assess("shop", "primary", check(), der(good), None, now)
    assert status.passed and status.verified is True and status.state == "ok"
    assert 89.9 < (status.days_to_expiry or 0) <= 90
    assert status.not_after_ms is not None and abs(status.not_after_ms - (now + 90 * DAY_MS)) < 5000

    soon = assess("shop", "primary", check(), der(make_leaf([NAME], ca, not_after_days=5)),
                  None, now)
    assert soon.state == "expiring" and soon.verified is True
    assert soon.problem is not None and "within the 14-day warning window" in soon.problem

    wrong = assess("shop", "primary", check(), der(make_leaf(["other.test"], ca)), None, now)
    assert wrong.state == "unverified" and wrong.verified is False
    assert "no subject alt name matches 'origin.test' (certificate names: other.test)" in str(
        wrong.problem)

    unpinned = assess("shop", "primary", check(spki_pins=(make_leaf([NAME], ca).spki_sha256,)),
                      der(good), None, now)
    assert "matches none of the pins" in str(unpinned.problem)
    pinned = assess("shop", "primary", check(cert_pins=(good.cert_sha256,)), der(good), None, now)
    assert pinned.passed

    chain = assess("shop", "primary", check(), der(good), "self-signed certificate", now)
    assert chain.problem == "does not verify: self-signed certificate"

    off = assess("shop", "primary", check(verify=False), der(make_leaf(["x.test"], None,
                 not_after_days=2)), "self-signed certificate", now)
    assert off.passed and off.verified is None and off.days_to_expiry is not None

    gone = assess("shop", "primary", check(), None, "TLS handshake failed: refused", now)
    assert gone.state == "unreachable" and gone.problem == (
        "no certificate: TLS handshake failed: refused")


@pytest.fixture
def tls_origins(tmp_path: Path) -> Iterator[TlsOrigins]:
    running = TlsOrigins(tmp_path)
    yield running
    running.close()


async def test_prober_records_each_certificate_and_fails_probes_of_bad_ones(
        tmp_path: Path, tls_origins: TlsOrigins) -> None:
    ca = make_ca()
    ca_file, _ = ca.write(tmp_path, "ca")
    cases = {
        "valid": (make_leaf([NAME], ca), {}),
        "self_signed": (make_leaf([NAME], None), {}),
        "wrong_name": (make_leaf(["other.test"], ca), {}),
        "expired": (make_leaf([NAME], ca, not_before_days=-30, not_after_days=-1), {}),
        "expiring": (make_leaf([NAME], ca, not_after_days=5), {}),
        "skip": (make_leaf(["other.test"], None), {"verify": False}),
    }
    targets = []
    for name, (issued, changes) in cases.items():
        port = tls_origins.start(name, issued)
        targets.append(ProbeTarget("shop", name, f"https://127.0.0.1:{port}", FAST, sni=NAME,
                                   host="127.0.0.1", port=port, ca_file=str(ca_file),
                                   certificate=check(**changes)))
    dead = free_port()
    targets.append(ProbeTarget("shop", "dead", f"https://127.0.0.1:{dead}", FAST, sni=NAME,
                               host="127.0.0.1", port=dead, ca_file=str(ca_file),
                               certificate=check()))
    seen: list[tuple[str, str | None]] = []
    prober = Prober(targets, on_certificate=lambda s, p: seen.append(
        (s.origin, p.state if p else None)))
    start = wall_ms()
    async with aiohttp.ClientSession() as session:
        await prober.probe_once(session)
        await prober.probe_once(session)
    now = wall_ms()
    states = {origin: status.state for (_, origin), status in prober.certificates.items()}
    assert states == {"valid": "ok", "self_signed": "unverified", "wrong_name": "unverified",
                      "expired": "unverified", "expiring": "expiring", "skip": "ok",
                      "dead": "unreachable"}
    problems = {origin: s.problem for (_, origin), s in prober.certificates.items()}
    assert "self-signed certificate" in str(problems["self_signed"])
    assert "certificate has expired" in str(problems["expired"])
    assert "no subject alt name matches" in str(problems["wrong_name"])
    shares = {name: prober.share("shop", name, now, now - start + 1) for name in states}
    assert shares == {"valid": 1.0, "self_signed": 0.0, "wrong_name": 0.0, "expired": 0.0,
                      "expiring": 0.0, "skip": 1.0, "dead": 0.0}
    assert prober.certificates[("shop", "skip")].verified is None
    assert len(seen) == 2 * len(targets)
    assert {origin for origin, before in seen if before is None} == set(states)
    listed = prober.certificates_json()
    assert [item["origin"] for item in listed] == sorted(states)
