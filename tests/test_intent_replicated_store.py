"""The etcd layout of the running intent: pure mapping both ways (batch -> keys -> stored)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from control_plane.decide.controller import ControllerState
from control_plane.intent.etcd_store import IntentWrite
from control_plane.intent.replicated_store import batch_to_write, stored_intent_of
from control_plane.intent.store import RAMP_KIND, TIER_KIND, IntentBatch, StateCorrupted

names = st.sampled_from(["ewr", "sjc", "fra"])
groups = st.sampled_from(["shop", "api"])
weights = st.integers(0, 100).map(lambda p: {"primary": p, "secondary": 100 - p})
streaks = st.dictionaries(st.sampled_from(["primary", "secondary"]), st.integers(0, 9))
controllers = st.builds(lambda u, h: ControllerState(unhealthy_windows=u, healthy_windows=h),
                        streaks, streaks)
records = st.tuples(st.sampled_from([TIER_KIND, RAMP_KIND, "lend"]),
                    st.builds(lambda p, g: f"{p}/{g}", names, groups),
                    st.one_of(st.none(), st.dictionaries(st.text(max_size=3), st.integers())))
batches = st.builds(
    IntentBatch,
    groups=st.lists(st.tuples(names, groups, weights, controllers), max_size=4).map(tuple),
    forget_groups=st.lists(st.tuples(names, groups), max_size=2).map(tuple),
    records=st.lists(records, max_size=4).map(tuple),
    desired_digest=st.one_of(st.none(), st.text(alphabet="0123456789abcdef", min_size=4)),
)


def apply(values: dict[str, Any], write: IntentWrite) -> None:
    """What etcd does with one committed write (puts, then deletes, as one transaction)."""
    values.update(write.put)
    for key in write.delete:
        values.pop(key, None)


@given(st.lists(batches, max_size=6))
def test_a_sequence_of_batches_reads_back_as_the_last_word_on_each_key(seq: list[IntentBatch]
                                                                        ) -> None:
    values: dict[str, Any] = {}
    expected_groups: dict[tuple[str, str], Any] = {}
    expected_records: dict[str, dict[str, Any]] = {}
    digest = None
    for batch in seq:
        apply(values, batch_to_write(batch))
        for pop, group, w, controller in batch.groups:
            expected_groups[(pop, group)] = (w, controller)
        for key in batch.forget_groups:
            expected_groups.pop(key, None)
        for kind, key, value in batch.records:
            if value is None:
                expected_records.get(kind, {}).pop(key, None)
            else:
                expected_records.setdefault(kind, {})[key] = value
        digest = batch.desired_digest if batch.desired_digest is not None else digest
    stored = stored_intent_of(values, where="etcd://test/")
    assert {k: (g.weights, g.controller) for k, g in stored.groups.items()} == expected_groups
    assert stored.tier_decisions == expected_records.get(TIER_KIND, {})
    assert stored.ramps == expected_records.get(RAMP_KIND, {})
    others = {k: v for k, v in expected_records.items() if k not in (TIER_KIND, RAMP_KIND) and v}
    assert {k: v for k, v in stored.records.items() if v} == others
    assert stored.desired_digest == digest


@pytest.mark.parametrize(("key", "value", "why"), [
    ("groups/ewr/shop", {"weights": {"primary": 90}, "controller": {}}, "summing to 100"),
    ("groups/ewr/shop", {"weights": {"primary": 100}, "controller": {"x": 1}}, "controller"),
    ("groups/ewr", {"weights": {"primary": 100}}, "not a (PoP, group) entry"),
    ("kinds/tier", {}, "not a <kind>/<key> record"),
    ("digest", 5, "digest is not a string"),
    ("surprise", 1, "unknown intent key"),
])
def test_anything_that_does_not_parse_is_corrupted_state_naming_the_key(
    key: str, value: Any, why: str
) -> None:
    with pytest.raises(StateCorrupted) as err:
        stored_intent_of({key: value}, where="etcd://h:1/ballast/")
    assert f"etcd://h:1/ballast/: intent/{key}:" in str(err.value)
    assert why in str(err.value)
