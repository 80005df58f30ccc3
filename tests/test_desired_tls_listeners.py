"""TLS listeners and operator-added filters in the desired state: what loads, and each problem
with its file:line:col and path (missing file, key not matching, expired, not yet valid, SAN
not covering the hostname, an unknown filter type), the expiry warning, the certificate folder
layouts, and the PoPs a listener is served in."""

from __future__ import annotations

from pathlib import Path

import pytest

from control_plane.desired import DesiredStateError, parse_desired
from control_plane.desired.warnings import desired_warnings
from tests.support.certs import make_ca, make_leaf

CA = make_ca()


def doc(tls: str, extra: str = "", pops: str = "") -> str:
    return f"""
pops: {{ewr: {{}}, sjc: {{}}}}
origin_groups:
  shop:
    origins:
      primary: {{address: 127.0.0.1, port: 8081}}
listeners:
  - name: https
    port: 443{pops}
    tls:{tls}
    virtual_hosts:
      - {{name: shop, domains: ["*"], origin_group: shop}}{extra}
"""


def pair(folder: Path, name: str, hostnames: list[str], **validity: float) -> tuple[Path, Path]:
    return make_leaf(hostnames, CA, **validity).write(folder, name)


def certificate(name: str, cert: Path, key: Path, hostnames: str = "[shop.example.com]") -> str:
    return f"""
      certificates:
        - name: {name}
          hostnames: {hostnames}
          cert_file: {cert}
          key_file: {key}"""


def problems_of(text: str) -> list[str]:
    with pytest.raises(DesiredStateError) as caught:
        parse_desired(text, "d.yaml")
    return [str(p) for p in caught.value.problems]


def test_a_tls_listener_loads_its_certificates(tmp_path: Path) -> None:
    cert, key = pair(tmp_path, "shop", ["shop.example.com", "*.shop.example.com"])
    text = doc(certificate("shop", cert, key, "[shop.example.com, a.shop.example.com]")
               + "\n      alpn: [h2]\n      min_version: 1.3", pops="\n    pops: [ewr]")
    desired = parse_desired(text, "d.yaml")
    (listener,) = desired.listeners
    assert listener.pops == ("ewr",) and listener.served_in("ewr")
    assert not listener.served_in("sjc")
    assert listener.tls is not None
    (served,) = listener.tls.certificates
    assert (served.secret_name, served.hostnames) == (
        "https.shop", ("shop.example.com", "a.shop.example.com"))
    assert served.key_pem == key.read_bytes() and served.chain_pem == cert.read_bytes()
    assert (listener.tls.alpn, listener.tls.min_version, listener.tls.default) == (
        ("h2",), "1.3", "shop")
    assert "key_pem" not in repr(served) and "BEGIN" not in repr(desired)
    assert desired_warnings(desired) == []


def test_renewed_files_give_another_version(tmp_path: Path) -> None:
    cert, key = pair(tmp_path, "shop", ["shop.example.com"])
    text = doc(certificate("shop", cert, key))
    first = parse_desired(text, "d.yaml")
    pair(tmp_path, "shop", ["shop.example.com"])
    assert parse_desired(text, "d.yaml").digest != first.digest


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "cannot read {cert}: No such file or directory"),
        ("mismatch", "the private key in {key} does not match the certificate"),
        ("expired", "{cert}: expired on"),
        ("future", "{cert}: not valid yet"),
        ("san", "{cert}: its subject alt names (other.example.com) do not cover hostname "
                "'shop.example.com'"),
    ],
)
def test_certificate_problems_name_the_file_and_the_path(
    tmp_path: Path, case: str, message: str
) -> None:
    names, validity = ["shop.example.com"], {}
    if case == "san":
        names = ["other.example.com"]
    if case == "expired":
        validity = {"not_before_days": -30, "not_after_days": -1}
    if case == "future":
        validity = {"not_before_days": 2, "not_after_days": 90}
    cert, key = pair(tmp_path, "shop", names, **validity)
    if case == "missing":
        cert.unlink()
    if case == "mismatch":
        _, other_key = pair(tmp_path, "other", names)
        key = other_key
    problems = problems_of(doc(certificate("shop", cert, key)))
    expected = message.format(cert=cert, key=key)
    assert any(expected in p and "listeners[0].tls.certificates[0].cert_file" in p
               and p.startswith("d.yaml:14:22: ") for p in problems), problems


def test_a_certificate_close_to_expiry_is_a_warning(tmp_path: Path) -> None:
    cert, key = pair(tmp_path, "shop", ["shop.example.com"], not_after_days=5)
    desired = parse_desired(doc(certificate("shop", cert, key)
                                + "\n      expiry_warning_days: 10"), "d.yaml")
    (warning,) = desired_warnings(desired)
    assert warning.startswith("listeners.https.tls.certificates.shop: ")
    assert "expires in 5.0 days (warning at 10)" in warning or "expires in 4.9" in warning


@pytest.mark.parametrize(("crt", "key"), [("fullchain.pem", "privkey.pem"),
                                          ("tls.crt", "tls.key")])
def test_a_certificate_folder_as_certbot_or_cert_manager_lays_it_out(
    tmp_path: Path, crt: str, key: str
) -> None:
    cert_path, key_path = pair(tmp_path, "x", ["shop.example.com"])
    cert_path.rename(tmp_path / crt)
    key_path.rename(tmp_path / key)
    desired = parse_desired(doc(f"""
      certificates:
        - {{name: shop, hostnames: [shop.example.com], dir: {tmp_path}}}"""), "d.yaml")
    tls = desired.listeners[0].tls
    assert tls is not None
    assert (tls.certificates[0].cert_file, tls.certificates[0].key_file) == (
        f"{tmp_path}/{crt}", f"{tmp_path}/{key}")


def test_tls_settings_problems(tmp_path: Path) -> None:
    cert, key = pair(tmp_path, "shop", ["shop.example.com"])
    problems = problems_of(doc(certificate("shop", cert, key)
                               + "\n      min_version: 1.3\n      max_version: 1.2"
                               + "\n      alpn: [h3]", pops="\n    pops: [lax]"))
    text = "\n".join(problems)
    assert "listeners[0].pops[0]: unknown pop 'lax'" in text
    assert "min_version 1.3 is above max_version 1.2" in text
    assert "listeners[0].tls.alpn: must be one of h2, http/1.1, got 'h3'" in text


COMPRESSOR = """
    http_filters:
      - name: envoy.filters.http.compressor
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.compressor.v3.Compressor
          compressor_library:
            name: gzip
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.compression.gzip.compressor.v3.Gzip
"""


def plain_doc(filters: str) -> str:
    return f"""
pops: {{ewr: {{}}}}
origin_groups:
  shop:
    origins:
      primary: {{address: 127.0.0.1, port: 8081}}
listeners:
  - name: edge
    port: 10000{filters}
    virtual_hosts:
      - {{name: shop, domains: ["*"], origin_group: shop}}
"""


def test_extra_filters_are_typed_json_checked_against_envoys_messages() -> None:
    desired = parse_desired(plain_doc(COMPRESSOR.rstrip("\n")), "d.yaml")
    (extra,) = desired.listeners[0].http_filters
    assert extra.name == "envoy.filters.http.compressor"
    assert extra.type_name == "envoy.extensions.filters.http.compressor.v3.Compressor"
    assert extra.config  # the checked message's wire bytes


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("compressor.v3.Compressor", "compressor.v3.Compresor"),
         "listeners[0].http_filters[0].typed_config: unknown filter type 'type.googleapis.com/"
         "envoy.extensions.filters.http.compressor.v3.Compresor': no such Envoy message"),
        (("gzip.compressor.v3.Gzip", "gzip.compressor.v3.Gzipp"),
         "unknown filter type 'type.googleapis.com/envoy.extensions.compression.gzip."
         "compressor.v3.Gzipp'"),
        (("          compressor_library:",
          "          bogus_field: 1\n          compressor_library:"),
         "listeners[0].http_filters[0].typed_config: type.googleapis.com/envoy.extensions."
         "filters.http.compressor.v3.Compressor: "),
        (("name: envoy.filters.http.compressor", "name: envoy.filters.http.router"),
         "'envoy.filters.http.router' is Ballast's own filter"),
    ],
)
def test_bad_extra_filters_are_errors_with_their_path(edit: tuple[str, str], message: str) -> None:
    problems = problems_of(plain_doc(COMPRESSOR.replace(*edit).rstrip("\n")))
    assert any(message in p for p in problems), problems
    assert all(p.startswith("d.yaml:") for p in problems)
