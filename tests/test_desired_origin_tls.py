"""Origin TLS keys: verification on by default, CA file per group or origin, names, pins, the
explicit (and warned about) way to turn verification off, and their problems."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from control_plane.desired import DesiredStateError, parse_desired
from control_plane.desired.model import SYSTEM_CA_BUNDLE
from control_plane.desired.warnings import desired_warnings
from tests.support.certs import make_ca, make_leaf

SPKI = "n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg="
HASH = "AB:" * 31 + "CD"


def doc(origin: str, group_extra: str = "") -> str:
    return f"""
pops: {{ewr: {{}}}}
origin_groups:
  shop:{group_extra}
    origins:
      plain: {{address: 127.0.0.1, port: 8081}}
      secure: {origin}
listeners:
  - {{name: edge, port: 10000, virtual_hosts: [{{name: shop, domains: ["*"], origin_group: shop}}]}}
"""


def problems_of(text: str) -> list[str]:
    with pytest.raises(DesiredStateError) as caught:
        parse_desired(text, "d.yaml")
    return [str(p) for p in caught.value.problems]


def test_tls_origin_is_verified_against_the_system_bundle_by_default() -> None:
    desired = parse_desired(doc("{address: origin.example.com, port: 443, tls: true}"), "d.yaml")
    group = desired.group("shop")
    origin = group.origin("secure")
    assert (origin.verify, origin.ca_file, origin.expected_name) == (
        True, SYSTEM_CA_BUNDLE, "origin.example.com")
    assert group.origin_tls.expiry_warning_days == 14
    assert desired_warnings(desired) == []


def test_group_ca_file_origin_override_name_and_pins() -> None:
    desired = parse_desired(doc(
        f"{{address: 10.0.0.2, port: 443, tls: true, sni: shop.example.com, "
        f"verify_name: origin.internal, ca_file: /etc/origin/ca.pem, "
        f"pin_spki_sha256: [{SPKI}], pin_cert_sha256: ['{HASH}']}}",
        "\n    origin_tls: {ca_file: /etc/ballast/group-ca.pem, expiry_warning_days: 30}"),
        "d.yaml")
    group = desired.group("shop")
    origin = group.origin("secure")
    assert origin.ca_file == "/etc/origin/ca.pem"
    assert (origin.server_name, origin.expected_name) == ("shop.example.com", "origin.internal")
    assert origin.spki_pins == (SPKI,)
    assert origin.cert_pins == ("ab" * 31 + "cd",)
    assert group.origin_tls.expiry_warning_days == 30
    assert group.origin_tls.ca_file == "/etc/ballast/group-ca.pem"


def test_group_ca_file_is_the_default_of_its_origins() -> None:
    desired = parse_desired(doc("{address: 10.0.0.2, port: 443, tls: true}",
                                "\n    origin_tls: {ca_file: /etc/ballast/ca.pem}"), "d.yaml")
    assert desired.group("shop").origin("secure").ca_file == "/etc/ballast/ca.pem"


def test_turning_verification_off_is_a_warning() -> None:
    desired = parse_desired(
        doc("{address: 10.0.0.2, port: 443, tls: true, insecure_skip_verify: true}"), "d.yaml")
    assert desired.group("shop").origin("secure").verify is False
    (warning,) = desired_warnings(desired)
    assert warning.startswith("origin_groups.shop.origins.secure.insecure_skip_verify: TLS "
                              "verification is OFF")


@pytest.mark.parametrize(("origin", "group_extra", "expected"), [
    ("{address: a.example, port: 443, ca_file: /x.pem}", "",
     "origin_groups.shop.origins.secure.ca_file: ca_file needs tls: true"),
    ("{address: a.example, port: 443, tls: true, ca_file: relative.pem}", "",
     "origin_groups.shop.origins.secure.ca_file: must be an absolute file path"),
    ("{address: a.example, port: 443, tls: true, pin_spki_sha256: [abc]}", "",
     "origin_groups.shop.origins.secure.pin_spki_sha256[0]: must be the base64 of a SHA-256"),
    ("{address: a.example, port: 443, tls: true, pin_cert_sha256: [abc]}", "",
     "origin_groups.shop.origins.secure.pin_cert_sha256[0]: must be the hex SHA-256"),
    ("{address: a.example, port: 443, tls: true, pin_spki_sha256: []}", "",
     "origin_groups.shop.origins.secure.pin_spki_sha256: must list at least one pin"),
    ("{address: a.example, port: 443, tls: true, verify_name: 'no spaces'}", "",
     "origin_groups.shop.origins.secure.verify_name: must be an IP address or a DNS name"),
    (f"{{address: a.example, port: 443, tls: true, insecure_skip_verify: true, "
     f"pin_spki_sha256: [{SPKI}]}}", "",
     "origin_groups.shop.origins.secure.insecure_skip_verify: insecure_skip_verify: true turns "
     "verification off; remove it or the verification keys (pin_spki_sha256)"),
    ("{address: a.example, port: 443, tls: true}", "\n    origin_tls: {expiry_warning_days: 400}",
     "origin_groups.shop.origin_tls.expiry_warning_days: must be"),
    ("{address: a.example, port: 443, tls: true}", "\n    origin_tls: {ca: /x.pem}",
     "origin_groups.shop.origin_tls: unknown key 'ca'"),
])
def test_problems(origin: str, group_extra: str, expected: str) -> None:
    found = problems_of(doc(origin, group_extra))
    assert any(expected in problem for problem in found), found


def test_pins_made_from_a_real_certificate_are_accepted() -> None:
    leaf = make_leaf(["origin.test"], make_ca())
    desired = parse_desired(doc(
        f"{{address: 127.0.0.1, port: 443, tls: true, pin_spki_sha256: ['{leaf.spki_sha256}'], "
        f"pin_cert_sha256: ['{leaf.cert_sha256}']}}"), "d.yaml")
    origin = desired.group("shop").origin("secure")
    assert (origin.spki_pins, origin.cert_pins) == ((leaf.spki_sha256,), (leaf.cert_sha256,))


def test_validate_prints_the_warning(tmp_path: Path) -> None:
    path = tmp_path / "d.yaml"
    path.write_text(doc("{address: 10.0.0.2, port: 443, tls: true, insecure_skip_verify: true}"))
    result = subprocess.run(
        [sys.executable, "-m", "control_plane", "validate", str(path), "--no-envoy"],
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert (f"{path}: warning: origin_groups.shop.origins.secure.insecure_skip_verify: TLS "
            "verification is OFF") in result.stdout

