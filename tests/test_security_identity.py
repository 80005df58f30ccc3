"""Node and admin identities in URI SANs: made, read back, checked against a stream's claim."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from control_plane.security.certs import issue_client, make_ca, uri_sans
from control_plane.security.identity import (
    AdminIdentity,
    NodeIdentity,
    admin_uri,
    node_mismatch,
    node_uri,
    parse_identity,
    short,
)

text = st.text(min_size=1, max_size=80)


@given(text, text)
def test_node_uri_round_trips_any_pop_and_id(pop: str, node_id: str) -> None:
    assert parse_identity(node_uri(pop, node_id)) == NodeIdentity(pop, node_id)
    assert node_mismatch([node_uri(pop, node_id)], pop, node_id) is None


@given(text)
def test_admin_uri_round_trips(name: str) -> None:
    assert parse_identity(admin_uri(name)) == AdminIdentity(name)


def test_the_documented_form() -> None:
    assert node_uri("ewr", "ewr-edge-1") == "spiffe://ballast/pop/ewr/node/ewr-edge-1"
    assert node_uri("ewr", "a/b") == "spiffe://ballast/pop/ewr/node/a%2Fb"
    assert admin_uri("oncall") == "spiffe://ballast/admin/oncall"


def test_uris_that_are_not_ours_name_nobody() -> None:
    for uri in ("spiffe://other/pop/ewr/node/n", "spiffe://ballast/pop/ewr", "https://x",
                "spiffe://ballast/pop//node/n", "spiffe://ballast/pop/ewr/node/n/extra"):
        assert parse_identity(uri) is None


def test_mismatches_say_why() -> None:
    ewr = node_uri("ewr", "n1")
    assert node_mismatch([], "ewr", "n1") is not None
    assert "PoP 'sjc'" in (node_mismatch([node_uri("sjc", "n1")], "ewr", "n1") or "")
    assert "node 'n1'" in (node_mismatch([ewr], "ewr", "n2") or "")
    assert "2 node identities" in (node_mismatch([ewr, node_uri("ewr", "n2")], "ewr", "n1") or "")
    assert "no node identity" in (node_mismatch([admin_uri("n1")], "ewr", "n1") or "")


def test_claims_are_quoted_short() -> None:
    why = node_mismatch([node_uri("ewr", "n1")], "ewr", "x" * 5_000_000) or ""
    assert len(why) < 300
    assert "(5000000 chars)" in why
    assert short("abc") == "abc"


def test_issued_client_certificate_carries_the_uri() -> None:
    ca = make_ca()
    issued = issue_client(ca, node_uri("ewr", "ewr-1"), "ewr-1", days=1)
    assert uri_sans(issued.cert_pem) == ["spiffe://ballast/pop/ewr/node/ewr-1"]
    assert uri_sans(b"not a certificate") == []
