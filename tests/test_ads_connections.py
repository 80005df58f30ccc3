"""The sweep's plan (`ads/connections.py`): which connections close, which addresses are
blocked — tables over the rules, and properties over generated connection tables."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control_plane.ads.connections import (
    BLOCK_MAX_S,
    BLOCK_S,
    FLOOD_FACTOR,
    MAX_BLOCKED,
    PROOF_S,
    Block,
    Rules,
    Seen,
    plan,
)
from control_plane.ads.limits import AdsLimits

RULES = Rules(total=1000, reserve=64, unproven_per_address=4, idle_s=60.0)
NOW = 1000.0


def unproven(address: str, count: int, age: float, port: int = 10_000,
             now: float = NOW) -> list[Seen]:
    return [Seen((address, port + i), now - age) for i in range(count)]


def test_rules_of_limits_keep_a_sixteenth_for_new_identities() -> None:
    rules = Rules.of(AdsLimits(connection_idle_ms=3000, unproven_per_address=7), 3584)
    assert rules == Rules(total=3584, reserve=224, unproven_per_address=7, idle_s=3.0)
    assert Rules.of(AdsLimits(), 64).reserve == 16


@pytest.mark.parametrize(("connection", "closed"), [
    # never carried a valid stream (bogus streams or none): idle since first seen
    (Seen(("10.0.0.1", 1), since=NOW - 60), True),
    (Seen(("10.0.0.1", 1), since=NOW - 59.9), False),
    # a valid stream open: never idle, however old
    (Seen(("10.0.0.1", 1), since=NOW - 9999, in_use=True, proven=True), False),
    # its last valid stream ended 60 s ago / 10 s ago
    (Seen(("10.0.0.1", 1), since=NOW - 9999, proven=True, last_used=NOW - 60), True),
    (Seen(("10.0.0.1", 1), since=NOW - 9999, proven=True, last_used=NOW - 10), False),
    # loopback peers are not exempt from the idle rule
    (Seen(("127.0.0.1", 1), since=NOW - 61), True),
])
def test_idle_connections_close_whatever_streams_they_open(connection: Seen,
                                                           closed: bool) -> None:
    sweep = plan([connection], NOW, RULES, {})
    assert (connection.endpoint in sweep.close) is closed
    if closed:
        assert sweep.close[connection.endpoint] == "no valid stream for 60 s"


def test_an_address_over_its_budget_keeps_its_oldest_and_is_blocked() -> None:
    old = unproven("10.0.0.7", 5, age=PROOF_S + 1)
    young = unproven("10.0.0.7", 3, age=0.1, port=20_000)
    proven = [Seen(("10.0.0.7", 30_000), NOW - 100, in_use=True, proven=True)]
    other = unproven("10.0.0.8", 4, age=30)  # within its budget
    sweep = plan(old + young + proven + other, NOW, RULES, {})
    oldest_four = sorted(old, key=lambda c: c.since)[:4]
    assert set(sweep.close) == {c.endpoint for c in old + young} - {c.endpoint for c in
                                                                      oldest_four}
    assert sweep.offenders == ("10.0.0.7",)
    assert sweep.blocks["10.0.0.7"] == Block(NOW + BLOCK_S, 1)
    assert sweep.blocked(NOW) == ["10.0.0.7"]
    assert sweep.blocked(NOW + BLOCK_S) == []


def test_young_connections_count_only_in_a_flood() -> None:
    """Nodes behind one address starting together are not an offence until they had time to
    open their streams, unless they are more than FLOOD_FACTOR times the budget."""
    burst = unproven("10.0.0.7", FLOOD_FACTOR * RULES.unproven_per_address, age=1.0)
    assert plan(burst, NOW, RULES, {}).close == {}
    flood = unproven("10.0.0.7", FLOOD_FACTOR * RULES.unproven_per_address + 1, age=1.0)
    sweep = plan(flood, NOW, RULES, {})
    assert len(sweep.close) == len(flood) - RULES.unproven_per_address
    assert sweep.offenders == ("10.0.0.7",)


def test_loopback_addresses_are_exempt_from_the_per_address_budget() -> None:
    local = unproven("127.0.0.1", 50, age=30) + unproven("::1", 50, age=30)
    assert plan(local, NOW, RULES, {}).close == {}


def test_repeated_offences_double_the_block_up_to_its_maximum() -> None:
    blocks: dict[str, Block] = {}
    durations = []
    now = NOW
    for _ in range(8):
        sweep = plan(unproven("10.0.0.7", 10, age=PROOF_S + 1, now=now), now, RULES, blocks)
        blocks = sweep.blocks
        durations.append(blocks["10.0.0.7"].until - now)
        now = blocks["10.0.0.7"].until + 1  # offends again as soon as the block ends
    assert durations == [min(BLOCK_S * 2 ** i, BLOCK_MAX_S) for i in range(8)]
    # clean for BLOCK_MAX_S after its block ended: forgotten, the next block is the first
    later = now + BLOCK_MAX_S
    assert "10.0.0.7" not in plan([], later, RULES, blocks).blocks
    again = plan(unproven("10.0.0.7", 10, age=PROOF_S + 1, now=later), later, RULES, blocks)
    assert again.blocks["10.0.0.7"].strikes == 1


def test_near_the_cap_connections_without_a_valid_stream_make_room_oldest_first() -> None:
    rules = Rules(total=100, reserve=10, unproven_per_address=4, idle_s=60.0)
    # 95 connections of 95 addresses, each within its budget
    in_use = [Seen((f"10.1.0.{i}", 1), NOW - 50, in_use=True, proven=True) for i in range(60)]
    idle = [Seen((f"10.2.0.{i}", 1), NOW - 50, proven=True, last_used=NOW - 20 + i)
            for i in range(15)]
    new = [Seen((f"10.3.0.{i}", 1), NOW - 20 + i) for i in range(20)]
    sweep = plan(in_use + idle + new, NOW, rules, {})
    # 5 over 90: the 5 oldest that never carried a valid stream
    assert set(sweep.close) == {c.endpoint for c in new[:5]}
    assert all("kept for new nodes" in why for why in sweep.close.values())
    # more over than there are unproven ones: the longest idle proven ones go next
    busy = [Seen((f"10.5.0.{i}", 1), NOW - 1, in_use=True, proven=True) for i in range(25)]
    many = plan(in_use + idle + new + busy, NOW, rules, {})
    # 120 connections, room for 90: the 20 unproven, then the 10 idle longest
    assert set(many.close) == {c.endpoint for c in new + idle[:10]}


def test_at_most_max_blocked_addresses_are_blocked_at_once() -> None:
    blocks = {f"10.9.{i // 256}.{i % 256}": Block(NOW + i, 1) for i in range(1, 400)}
    blocked = plan([], NOW, RULES, blocks).blocked(NOW)
    assert len(blocked) == MAX_BLOCKED
    assert "10.9.1.143" in blocked and "10.9.0.1" not in blocked  # the latest-ending kept


connections = st.lists(
    st.builds(
        lambda endpoint, since, state, ended: Seen(
            endpoint, since, in_use=state == "in use", proven=state != "unproven",
            last_used=ended if state == "was used" else None),
        endpoint=st.tuples(st.sampled_from(["10.0.0.1", "10.0.0.2", "127.0.0.1", "2001:db8::1"]),
                           st.integers(1, 60_000)),
        since=st.floats(NOW - 200, NOW),
        state=st.sampled_from(["in use", "was used", "unproven"]),
        ended=st.floats(NOW - 200, NOW),
    ),
    max_size=300, unique_by=lambda c: c.endpoint)


@settings(max_examples=200, deadline=None)
@given(connections, st.integers(5, 200))
def test_plan_properties(seen: list[Seen], total: int) -> None:
    rules = Rules(total=total, reserve=max(1, total // 16), unproven_per_address=4, idle_s=60)
    sweep = plan(seen, NOW, rules, {})
    # a connection with a valid stream is never closed
    assert not any(c.endpoint in sweep.close for c in seen if c.in_use)
    kept = [c for c in seen if c.endpoint not in sweep.close]
    # what stays: no idle connection, within the room unless all that is left is in use
    assert not any(not c.in_use and NOW - c.quiet_since >= rules.idle_s for c in kept)
    room = rules.total - rules.reserve
    assert len(kept) <= room or all(c.in_use for c in kept)
    # an offender keeps at most its budget of unproven connections
    for address in sweep.offenders:
        left = [c for c in kept if c.endpoint[0] == address and not c.proven]
        assert len(left) <= rules.unproven_per_address
        assert address in sweep.blocked(NOW)
