"""`ConfigAcks` with replicas: what a replica shares of its nodes (bounded, those not applied
listed first, every node counted), how a peer's value is read back (its size bounded before
parsing, every field after, whatever is wrong a ValueError), the union the leader's gates and the
faces read, a peer that cannot be read failing the gates closed, and a peer's NACKs dated by this
replica's clock."""

from __future__ import annotations

import json
from typing import Any

import pytest

from control_plane.acks import config_acks, shared_acks
from control_plane.acks.config_acks import ConfigAcks
from control_plane.acks.shared_acks import SharedAcks
from control_plane.ads.nodes import NodeEntry, NodeRegistry
from control_plane.ads.protocol import Nack as StreamNack
from control_plane.decide.gates import Nack, NodeAck

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
NEW, OLD = "n" * 64, "o" * 64


class Cache:
    """The output cache as `ConfigAcks` reads it: one current output per PoP."""

    def __init__(self) -> None:
        self.current: dict[str, object] = {}

    def entry(self, pop: str, key: str) -> object:
        return self.current.setdefault(pop, object())


def connect(nodes: NodeRegistry, cache: Cache, pop: str, node: str, state: str) -> NodeEntry:
    entry = nodes.connect(node_id=node, pop=pop, mode="sotw", envoy_version="1.40.0",
                          capability_key="k", capability_reason="")
    entry.answered_from = cache.entry(pop, "k")  # type: ignore[assignment]
    entry.sent(CDS, "1")
    if state == "applied":
        entry.acked(CDS, "1")
    elif state == "nacked":
        entry.nacked(CDS, "1", "refused")
    return entry


def acks(peers: dict[str, SharedAcks] | None = None, replica: str = "a"
         ) -> tuple[ConfigAcks, NodeRegistry, Cache]:
    nodes, cache = NodeRegistry(), Cache()
    return ConfigAcks(nodes, cache, lambda pop: NEW, lambda: 5000,  # type: ignore[arg-type]
                      replica=replica, peers=lambda: peers or {}), nodes, cache


def test_a_replica_shares_every_node_not_applied_first_and_reads_back_the_same() -> None:
    mine, nodes, cache = acks(replica="b")
    for node, state in (("e1", "applied"), ("e2", "pending"), ("e3", "nacked")):
        connect(nodes, cache, "ewr", node, state)
    connect(nodes, cache, "sjc", "s1", "applied")
    mine.nacked(next(nodes.entries("ewr")), StreamNack(CDS, "1", "n", "bad field"))
    shared = mine.shared()
    ewr = shared.pops["ewr"]
    assert [n[:2] for n in ewr.nodes] == [("e2", "pending"), ("e3", "nacked"), ("e1", "applied")]
    assert (ewr.version, ewr.applied, ewr.pending, ewr.nacked) == (NEW, 1, 1, 1)
    assert shared.nacks == ((5000, Nack("ewr", "e1", NEW, "1.40.0", CDS, "bad field", "b")),)
    assert SharedAcks.from_json("b", shared.to_json()) == shared


def test_the_leader_hears_every_replicas_nodes_and_nacks() -> None:
    peer, nodes, cache = acks(replica="b")
    connect(nodes, cache, "ewr", "e2", "pending")
    peer.nacked(next(nodes.entries("ewr")), StreamNack(CDS, "1", "n", "no such filter"))
    shared = SharedAcks.from_json("b", peer.shared().to_json())
    leader, nodes, cache = acks({"b": shared, "a": shared})  # its own key: not a peer
    connect(nodes, cache, "ewr", "e1", "applied")
    assert leader.nodes(["ewr"]) == (NodeAck("ewr", "e1", NEW, "a"),
                                     NodeAck("ewr", "e2", None, "b"))
    assert [(n.node, n.replica, n.message) for n in leader.nacks(5000)] == [
        ("e2", "b", "no such filter")]
    assert leader.nacks(5001) == ()
    shown = leader.pop("ewr").as_dict()
    assert (shown["applied"], shown["pending"], shown["nacked"]) == (1, 1, 0)
    assert shown["replicas"]["b"] == {"version": NEW, "applied": 0, "pending": 1, "nacked": 0}


def test_a_peer_serving_another_version_has_not_applied_this_one() -> None:
    peer, nodes, cache = acks(replica="b")
    connect(nodes, cache, "ewr", "e2", "applied")
    old = SharedAcks.from_json("b", {**peer.shared().to_json(), "pops": {"ewr": {
        **peer.shared().to_json()["pops"]["ewr"], "version": OLD}}})
    leader, _, _ = acks({"b": old})
    assert leader.nodes(["ewr"]) == (NodeAck("ewr", "e2", OLD, "b"),)
    shown = leader.pop("ewr").as_dict()
    assert (shown["applied"], shown["pending"]) == (0, 1), shown


def test_the_shared_list_is_bounded_and_what_it_leaves_out_still_counts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_acks, "SHARED_NODE_BYTES", 3 * (len("ewr-00") + 6 + 24))
    peer, nodes, cache = acks(replica="b")
    for i in range(10):
        connect(nodes, cache, "ewr", f"ewr-{i:02}", "pending" if i < 5 else "applied")
    shared = SharedAcks.from_json("b", peer.shared().to_json())
    ewr = shared.pops["ewr"]
    assert len(ewr.nodes) == 3 and (ewr.applied, ewr.pending) == (5, 5)
    leader, _, _ = acks({"b": shared})
    waiting = [n for n in leader.nodes(["ewr"]) if n.acked is None]
    assert [n.node for n in waiting] == ["ewr-00", "ewr-01", "ewr-02",
                                         "2 more node(s) not applied"]


def good() -> dict[str, Any]:
    return {"pops": {"ewr": {"version": NEW, "nodes": [["e1", "applied", "1.40.0"]],
                             "applied": 1, "pending": 0, "nacked": 0}},
            "nacks": [{"at_ms": 1, "pop": "ewr", "node": "e1", "version": NEW,
                       "envoy": "1.40.0", "type_url": CDS, "message": "m"}]}


@pytest.mark.parametrize("bad", [
    lambda v: v.update(pops=[]),
    lambda v: v["pops"]["ewr"]["nodes"][0].__setitem__(1, "maybe"),
    lambda v: v["pops"]["ewr"].update(applied=-1),
    lambda v: v["pops"]["ewr"].update(pending="1"),
    lambda v: v["pops"]["ewr"]["nodes"][0].__setitem__(0, 7),
    lambda v: v["nacks"][0].pop("message"),
    lambda v: v.update(nacks=v["nacks"] * (shared_acks.SHARED_NACKS + 1)),
])
def test_a_peers_value_that_is_not_one_is_refused(bad: Any) -> None:
    value = good()
    bad(value)
    with pytest.raises((KeyError, TypeError, ValueError)):
        SharedAcks.from_json("b", value)


@pytest.mark.parametrize("raw", [
    b"not json",
    b"\xff\xfe",
    b'{"pops": {}, "nacks": [{"at_ms": 1e999}]}',  # json reads inf: int() would overflow
    json.dumps({**good(), "nacks": [{**good()["nacks"][0], "at_ms": 1e999}]}).encode(),
    json.dumps({**good(), "nacks": [{**good()["nacks"][0], "at_ms": -5}]}).encode(),
    b"[" * 100_000 + b"]" * 100_000,  # deeper than the parser recurses
    b'{"pops": {}, "nacks": []' + b" " * shared_acks.MAX_SHARED_BYTES + b"}",
    b'{"pops": {"ewr": {"version": "v", "nodes": [["e1", "applied"]], "applied": 1,'
    b' "pending": 0, "nacked": 0}}, "nacks": []}',
])
def test_whatever_is_wrong_with_a_peers_bytes_is_a_value_error(raw: bytes) -> None:
    with pytest.raises(ValueError):
        SharedAcks.parse("b", raw)


def test_a_peers_good_bytes_read_back() -> None:
    shared = SharedAcks.parse("b", json.dumps(good()).encode())
    assert shared.pops["ewr"].nodes == (("e1", "applied", "1.40.0"),)


def test_a_peers_long_text_is_clipped_keeping_the_reason_at_its_end() -> None:
    value = good()
    value["nacks"][0]["message"] = "refused: " + "x" * 100_000 + " because: no such field"
    value["pops"]["ewr"]["nodes"][0][0] = "n" * 100_000
    shared = SharedAcks.from_json("b", value)
    message = shared.nacks[0][1].message
    assert message.startswith("refused: ") and message.endswith(" because: no such field")
    assert len(message) < shared_acks.MAX_PEER_MESSAGE_CHARS + 100
    assert len(shared.pops["ewr"].nodes[0][0]) == shared_acks.MAX_NODE_CHARS


def test_what_ads_keeps_of_a_nack_is_shared_and_read_back_whole() -> None:
    peer, nodes, cache = acks(replica="b")
    connect(nodes, cache, "ewr", "e1", "nacked")
    message = "x" * 2048 + "… [truncated: 90,000 characters] … " + "y" * 1024
    peer.nacked(next(nodes.entries("ewr")), StreamNack(CDS, "1", "n", message))
    shared = SharedAcks.parse("b", json.dumps(peer.shared().to_json()).encode())
    assert shared.nacks[0][1].message == message


def test_a_peer_that_cannot_be_read_holds_every_pop_not_applied() -> None:
    leader, nodes, cache = acks({"b": SharedAcks.unknown("its shared value is unreadable")})
    connect(nodes, cache, "ewr", "e1", "applied")
    assert leader.nodes(["ewr", "sjc"]) == (
        NodeAck("ewr", "e1", NEW, "a"),
        NodeAck("ewr", "the nodes on replica b: its shared value is unreadable", None, "b"),
        NodeAck("sjc", "the nodes on replica b: its shared value is unreadable", None, "b"))


def test_a_peers_nacks_are_dated_when_this_replica_first_read_them() -> None:
    """The peer's clock is an hour behind: its NACK still counts from the rollout's start."""
    value = good()
    value["nacks"][0]["at_ms"] = 1000  # an hour before the leader's clock
    first = SharedAcks.from_json("b", value).received(None, 3_601_000)
    leader, _, _ = acks({"b": first})
    assert [n.node for n in leader.nacks(3_600_500)] == ["e1"]
    # read again later (the peer shared a second NACK): the first keeps its time
    value["nacks"].append({**value["nacks"][0], "at_ms": 2000, "node": "e2"})
    again = SharedAcks.from_json("b", value).received(first, 3_700_000)
    assert again.read_ms == (3_601_000, 3_700_000)
    leader, _, _ = acks({"b": again})
    assert [n.node for n in leader.nacks(3_650_000)] == ["e2"]


def test_a_local_node_says_when_its_ack_arrived() -> None:
    """Issue 33: a wave's own window starts after each node's ACK: a local node carries the
    time its ACK made every type SYNCED; a pending one none; a peer's node none (unknown)."""
    import time

    mine, nodes, cache = acks()
    before = time.time()
    connect(nodes, cache, "ewr", "e1", "applied")
    connect(nodes, cache, "ewr", "e2", "pending")
    applied, pending = mine.nodes(["ewr"])
    assert applied.acked == NEW and applied.acked_ms is not None
    assert before * 1000 - 1 <= applied.acked_ms <= time.time() * 1000 + 1
    assert pending.acked is None and pending.acked_ms is None
