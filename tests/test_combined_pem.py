"""Issue 36, break 6: a certificate file holding a private key never shows the key.

The probe that filed it: with `cert_file` holding the certificate and its key (a "combined
PEM"), `ballast render` and `/resources` showed the key inside `certificate_chain`: the chain was
served as the file's bytes. Now a certificate file (a listener's chain, a client CA) is refused
at validation when it holds any PEM block but `CERTIFICATE` — a private key of every encoding
above all — naming the file and the block's line; and the chain served is written again from
the parsed certificates, so bytes outside any block (a key pasted without its armour) never
reach a rendering either. Every PEM block type, before, between and after the certificates; a
hypothesis property over labels and what surrounds the blocks; `ballast render` and a running
server's `/resources` with a combined PEM.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
from pathlib import Path

import aiohttp
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from control_plane.cli.main import main
from control_plane.decisions.read import iter_records
from control_plane.desired import DesiredStateError, parse_desired
from control_plane.lifecycle.service import BallastService, ServiceConfig
from control_plane.translate import render_json, translate_pop
from control_plane.translate.resources import Capabilities
from harness.envoy_process import free_port
from harness.eventually import eventually
from tests.support.tls_listeners import HOSTNAMES, TlsSite, key_pem, tls_desired_yaml

PORTS = dict(https_port=20443, listener_port=20080, primary_port=20081, secondary_port=20082)


def pem(label: str, body: bytes) -> bytes:
    text = base64.encodebytes(body).decode().replace("\n", "")
    lines = [text[i:i + 64] for i in range(0, len(text), 64)]
    return f"-----BEGIN {label}-----\n{chr(10).join(lines)}\n-----END {label}-----\n".encode()


def private_keys() -> dict[str, bytes]:
    """A private key in every PEM encoding `openssl` and `cryptography` write."""
    ec_key = ec.generate_private_key(ec.SECP256R1())
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    none = serialization.NoEncryption()
    pem_ = serialization.Encoding.PEM
    return {
        "PRIVATE KEY": ec_key.private_bytes(pem_, serialization.PrivateFormat.PKCS8, none),
        "EC PRIVATE KEY": ec_key.private_bytes(
            pem_, serialization.PrivateFormat.TraditionalOpenSSL, none),
        "RSA PRIVATE KEY": rsa_key.private_bytes(
            pem_, serialization.PrivateFormat.TraditionalOpenSSL, none),
        "ENCRYPTED PRIVATE KEY": ec_key.private_bytes(
            pem_, serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret")),
        "OPENSSH PRIVATE KEY": ec_key.private_bytes(
            pem_, serialization.PrivateFormat.OpenSSH, none),
        "DSA PRIVATE KEY": pem("DSA PRIVATE KEY", b"\x30\x82" + bytes(300)),
        "ANY PRIVATE KEY": pem("ANY PRIVATE KEY", bytes(range(200))),
    }


OTHER_BLOCKS = ("EC PARAMETERS", "PUBLIC KEY", "CERTIFICATE REQUEST", "NEW CERTIFICATE REQUEST",
                "X509 CRL", "TRUSTED CERTIFICATE", "PKCS7", "CMS", "DH PARAMETERS",
                "ATTRIBUTE CERTIFICATE", "")
KEYS = private_keys()


def body_lines(block: bytes) -> list[str]:
    return [line for line in block.decode().splitlines() if line and not line.startswith("-----")]


BASE64 = re.compile(r"[A-Za-z0-9+/]{40,}={0,2}")


def leaks(text: str, block: bytes) -> bool:
    """Whether `text` holds any line of `block`'s body, or the body in one piece — as it is, or
    inside a base64 string of `text` (how JSON carries an `inline_bytes` chain)."""
    decoded = [base64.b64decode(s + "=" * (-len(s) % 4), validate=False).decode("latin-1")
               for s in BASE64.findall(text)]
    lines = body_lines(block)
    return any(form in shown for shown in (text, *decoded) for form in ["".join(lines), *lines])


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> TlsSite:
    site = TlsSite(tmp_path_factory.mktemp("certs"))
    for name, hostname in HOSTNAMES.items():
        site.write(name, hostname)
    return site


def problems_of(site: TlsSite, chain: bytes, where: str = "cert_file") -> list[str]:
    """The problems of the desired state with `chain` as shop's certificate file (or, `where`
    "client_ca_file", as the listener's client CA); [] when it validates."""
    path = site.folder / f"shop-{where}.pem"
    path.write_bytes(chain)
    yaml = tls_desired_yaml(site, **PORTS)
    if where == "cert_file":
        yaml = yaml.replace(str(site.cert_file("shop")), str(path))
    else:
        yaml = yaml.replace("    tls:\n", f"    tls:\n      client_ca_file: {path}\n")
    try:
        parse_desired(yaml, "desired.yaml")
    except DesiredStateError as err:
        return [str(p) for p in err.problems]
    return []


def rejected(state_dir: Path) -> bool:
    return any(r["kind"] == "config_rejected" and "holds a private key" in str(r)
               for r in iter_records(state_dir))


def chain_of(site: TlsSite) -> tuple[bytes, bytes]:
    """(leaf, CA) certificates of shop, as PEM."""
    leaf = site.cert_file("shop").read_bytes()
    return leaf, site.ca.cert.public_bytes(serialization.Encoding.PEM)


@pytest.mark.parametrize("label", [*KEYS, *OTHER_BLOCKS])
@pytest.mark.parametrize("where", ["cert_file", "client_ca_file"])
def test_every_block_but_certificates_is_refused_with_file_and_line(
    site: TlsSite, label: str, where: str,
) -> None:
    block = KEYS.get(label) or pem(label, bytes(range(120)))
    leaf, ca = chain_of(site)
    for at, chain in ((1, block + leaf + ca),
                      (leaf.count(b"\n") + 1, leaf + block + ca),
                      ((leaf + ca).count(b"\n") + 1, leaf + ca + block)):
        [problem] = problems_of(site, chain, where)
        path = site.folder / f"shop-{where}.pem"
        assert f"{path}:{at}: " in problem, problem
        assert problem.startswith("desired.yaml:")  # and where the file is named
        assert not leaks(problem, block)
        if label in KEYS:
            assert f"holds a private key ({label})" in problem, problem
        else:
            assert "CERTIFICATE blocks only" in problem, problem


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(label=st.text(st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789"), max_size=24),
       junk=st.lists(st.sampled_from(["key-lines", "text", "blank"]), max_size=4),
       place=st.integers(0, 2))
def test_no_arrangement_puts_key_bytes_in_a_rendered_chain(
    site: TlsSite, label: str, junk: list[str], place: int,
) -> None:
    """Whatever surrounds the certificates — another block, a key's body without its armour,
    text — the file is refused, or what is rendered is its certificates and nothing else."""
    key = KEYS["PRIVATE KEY"]
    pieces = {"key-lines": "\n".join(body_lines(key)).encode() + b"\n",
              "text": b"# exported by the PKI on 2026-01-01\n", "blank": b"\n"}
    leaf, ca = chain_of(site)
    extra = b"".join(pieces[j] for j in junk)
    if label.strip() and label.strip() != "CERTIFICATE":
        extra += pem(label.strip(), bytes(range(64))) if label.strip() != "PRIVATE KEY" else key
    chain = [leaf + ca + extra, extra + leaf + ca, leaf + extra + ca][place]
    path = site.folder / "shop-prop.pem"
    path.write_bytes(chain)
    yaml = tls_desired_yaml(site, **PORTS).replace(str(site.cert_file("shop")), str(path))
    try:
        desired = parse_desired(yaml, "desired.yaml")
    except DesiredStateError as err:
        assert all(not leaks(str(p), key) for p in err.problems)
        return
    rendered = json.dumps(render_json(translate_pop(desired, "ewr", Capabilities())))
    assert not leaks(rendered, key)
    [served] = [c for listener in desired.listeners if listener.tls is not None
                for c in listener.tls.certificates if c.name == "shop"]
    assert served.chain_pem == leaf + ca  # the certificates, as parsed, and nothing else


def test_render_refuses_a_combined_pem_and_shows_no_key(
    site: TlsSite, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    key = key_pem(site.issued["shop"])
    combined = tmp_path / "combined.pem"
    combined.write_bytes(site.cert_file("shop").read_bytes() + key)
    desired = tmp_path / "desired.yaml"
    desired.write_text(tls_desired_yaml(site, **PORTS).replace(str(site.cert_file("shop")),
                                                             str(combined)))
    assert main(["render", str(desired), "--pop", "ewr"]) == 1
    out, err = capsys.readouterr()
    assert f"{combined}:" in err and "holds a private key (PRIVATE KEY)" in err
    assert not leaks(out + err, key)
    # the control of the check itself: a chain holding the key, rendered, is seen to leak
    good = parse_desired(tls_desired_yaml(site, **PORTS), "desired.yaml")
    listeners = tuple(
        dataclasses.replace(listener, tls=dataclasses.replace(listener.tls, certificates=tuple(
            dataclasses.replace(c, chain_pem=c.chain_pem + key)
            for c in listener.tls.certificates)))
        if listener.tls is not None else listener for listener in good.listeners)
    leaky = dataclasses.replace(good, listeners=listeners)
    assert leaks(json.dumps(render_json(translate_pop(leaky, "ewr", Capabilities()))), key)
    # the control: the same files, the key in its own file, render (and show the chain)
    desired.write_text(tls_desired_yaml(site, **PORTS))
    assert main(["render", str(desired), "--pop", "ewr"]) == 0
    out = capsys.readouterr().out
    assert "certificate_chain" in out and not leaks(out, key)


async def test_a_running_server_refuses_a_combined_pem_and_keeps_serving(
    tmp_path: Path,
) -> None:
    site = TlsSite(tmp_path / "certs")
    for name, hostname in HOSTNAMES.items():
        site.write(name, hostname)
    ports = dict(https_port=free_port(), listener_port=free_port(), primary_port=free_port(),
                 secondary_port=free_port())
    desired = tmp_path / "desired.yaml"
    desired.write_text(tls_desired_yaml(site, **ports))
    service = BallastService(ServiceConfig(
        desired_path=desired, state_dir=tmp_path / "state", xds_address="127.0.0.1:0",
        admin_address="127.0.0.1:0", probes=False, reload_poll_s=0.1))
    await service.start()
    try:
        key = key_pem(site.issued["shop"])
        before = service.server.intent.desired.digest
        with site.cert_file("shop").open("ab") as chain:  # the renewal script got it wrong
            chain.write(key)
        await eventually(lambda: rejected(tmp_path / "state"), 10, "the file refused")
        assert service.server.intent.desired.digest == before  # the last good pair serves
        assert service.admin is not None
        async with aiohttp.ClientSession() as http, \
                http.get(f"{service.admin.url}/resources?pop=ewr") as response:
            text = await response.text()
        assert "certificate_chain" in text and not leaks(text, key)
    finally:
        await service.stop(0)
