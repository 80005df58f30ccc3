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
    # its last valid stream ended 60 s ago / 10 s ago
    (Seen(("10.0.0.1", 1), since=NOW - 9999, proven=True, last_used=NOW - 60), True),
    (Seen(("10.0.0.1", 1), since=NOW - 9999, proven=True, last_used=NOW - 10), False),
    # loopback peers are not exempt from the idle rule
    (Seen(("127.0.0.1", 1), since=NOW - 61), True),
])
def test_idle_connections_close_whatever_streams_they_open(connection: Seen,
                                                           closed: bool) -> None:
    sweep = plan([connection], 10, NOW, RULES, {})
    assert (connection.endpoint in sweep.close) is closed
    if closed:
        assert sweep.close[connection.endpoint] == "no valid stream for 60 s"


def test_an_address_over_its_budget_keeps_its_oldest_and_is_blocked() -> None:
    old = unproven("10.0.0.7", 5, age=PROOF_S + 1)
    young = unproven("10.0.0.7", 3, age=0.1, port=20_000)
    proven = [Seen(("10.0.0.7", 30_000), NOW - 100, proven=True, last_used=NOW - 1)]
    other = unproven("10.0.0.8", 4, age=30)  # within its budget
    sweep = plan(old + young + proven + other, 1, NOW, RULES, {})
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
    assert plan(burst, 0, NOW, RULES, {}).close == {}
    flood = unproven("10.0.0.7", FLOOD_FACTOR * RULES.unproven_per_address + 1, age=1.0)
    sweep = plan(flood, 0, NOW, RULES, {})
    assert len(sweep.close) == len(flood) - RULES.unproven_per_address
    assert sweep.offenders == ("10.0.0.7",)


def test_loopback_addresses_are_exempt_from_the_per_address_budget() -> None:
    local = unproven("127.0.0.1", 50, age=30) + unproven("::1", 50, age=30)
    assert plan(local, 0, NOW, RULES, {}).close == {}


def test_repeated_offences_double_the_block_up_to_its_maximum() -> None:
    blocks: dict[str, Block] = {}
    durations = []
    now = NOW
    for _ in range(8):
        sweep = plan(unproven("10.0.0.7", 10, age=PROOF_S + 1, now=now), 0, now, RULES, blocks)
        blocks = sweep.blocks
        durations.append(blocks["10.0.0.7"].until - now)
        now = blocks["10.0.0.7"].until + 1  # offends again as soon as the block ends
    assert durations == [min(BLOCK_S * 2 ** i, BLOCK_MAX_S) for i in range(8)]
    # clean for BLOCK_MAX_S after its block ended: forgotten, the next block is the first
    later = now + BLOCK_MAX_S
    assert "10.0.0.7" not in plan([], 0, later, RULES, blocks).blocks
    again = plan(unproven("10.0.0.7", 10, age=PROOF_S + 1, now=later), 0, later, RULES, blocks)
    assert again.blocks["10.0.0.7"].strikes == 1


def test_near_the_cap_connections_without_a_valid_stream_make_room_oldest_first() -> None:
    rules = Rules(total=100, reserve=10, unproven_per_address=4, idle_s=60.0)
    # 95 connections of 95 addresses, each within its budget; 60 of them in use
    idle = [Seen((f"10.2.0.{i}", 1), NOW - 50, proven=True, last_used=NOW - 20 + i)
            for i in range(15)]
    new = [Seen((f"10.3.0.{i}", 1), NOW - 20 + i) for i in range(20)]
    sweep = plan(idle + new, 60, NOW, rules, {})
    # 5 over 90: the 5 oldest that never carried a valid stream
    assert set(sweep.close) == {c.endpoint for c in new[:5]}
    assert all("kept for new nodes" in why for why in sweep.close.values())
    # more over than there are unproven ones: the longest idle proven ones go next; 120
    # connections, room for 90: the 20 unproven, then the 10 idle longest
    many = plan(idle + new, 85, NOW, rules, {})
    assert set(many.close) == {c.endpoint for c in new + idle[:10]}
    # all in use: nothing to close
    assert plan([], 120, NOW, rules, {}).close == {}


def test_at_most_max_blocked_addresses_are_blocked_at_once() -> None:
    blocks = {f"10.9.{i // 256}.{i % 256}": Block(NOW + i, 1) for i in range(1, 400)}
    blocked = plan([], 0, NOW, RULES, blocks).blocked(NOW)
    assert len(blocked) == MAX_BLOCKED
    assert "10.9.1.143" in blocked and "10.9.0.1" not in blocked  # the latest-ending kept


connections = st.lists(
    st.builds(
        lambda endpoint, since, ended: Seen(endpoint, since, proven=ended is not None,
                                            last_used=ended),
        endpoint=st.tuples(st.sampled_from(["10.0.0.1", "10.0.0.2", "127.0.0.1", "2001:db8::1"]),
                           st.integers(1, 60_000)),
        since=st.floats(NOW - 200, NOW),
        ended=st.none() | st.floats(NOW - 200, NOW),
    ),
    max_size=300, unique_by=lambda c: c.endpoint)


@settings(max_examples=200, deadline=None)
@given(connections, st.integers(0, 300), st.integers(5, 200))
def test_plan_properties(seen: list[Seen], in_use: int, total: int) -> None:
    rules = Rules(total=total, reserve=max(1, total // 16), unproven_per_address=4, idle_s=60)
    sweep = plan(seen, in_use, NOW, rules, {})
    assert set(sweep.close) <= {c.endpoint for c in seen}  # never one a valid stream uses
    kept = [c for c in seen if c.endpoint not in sweep.close]
    # what stays: no idle connection, and within the room unless only connections in use
    # are left
    assert not any(NOW - c.quiet_since >= rules.idle_s for c in kept)
    assert in_use + len(kept) <= rules.total - rules.reserve or not kept
    # an offender keeps at most its budget of unproven connections, and is blocked
    for address in sweep.offenders:
        left = [c for c in kept if c.endpoint[0] == address and not c.proven]
        assert len(left) <= rules.unproven_per_address
        assert address in sweep.blocked(NOW)
