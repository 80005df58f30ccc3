"""Intent writes larger than one etcd request (128 operations, 1.5 MiB by default): split into
fenced transactions in an order whose every prefix reads back as a consistent intent, or refused
before anything is written when one value cannot fit (`etcd_store.transactions`). Against a real
etcd: a rollout whose first write holds two desired-state versions near 1 MiB, and a wave of 149
PoPs whose baselines are saved at once, through the rollout driver and the change transaction."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control_plane.acks.config_acks import ConfigAcks
from control_plane.ads.nodes import NodeRegistry
from control_plane.decide.rollout import start
from control_plane.decisions.log import DecisionLog
from control_plane.decisions.recorder import DecisionRecorder
from control_plane.desired import parse_desired
from control_plane.intent import etcd_store
from control_plane.intent.etcd_store import (
    MAX_REQUEST_BYTES,
    MAX_TXN_OPS,
    WRITING,
    EtcdStore,
    IntentWrite,
    Leadership,
    TooLarge,
    marked,
    transactions,
)
from control_plane.intent.replicated_store import ReplicatedStore, batch_to_write
from control_plane.intent.rollout_state import ROLLOUT_KEY, Version, restored
from control_plane.intent.store import (
    ROLLOUT_BEFORE_KIND,
    ROLLOUT_KIND,
    SERVING_KEY,
    SERVING_KIND,
    VERSION_KIND,
    IntentBatch,
)
from control_plane.rollout.rollouts import Rollouts
from control_plane.xds_port.server import intent_and_cache
from harness.etcd import EtcdServer, etcd_binary
from tests.support.rollout_inputs import Healthy, WithNodes

T0 = 1_800_000_000_000
KEYS = [f"kinds/v/{i}" for i in range(8)] + ["digest", "kinds/rollout/current"]


def _size(key: str, value: bytes | None) -> int:
    return etcd_store._size((key, value))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS), st.integers(0, 600_000), max_size=10),
       st.lists(st.sampled_from([f"kinds/b/{i}" for i in range(300)] + ["kinds/serving/pops"]),
                unique=True, max_size=300),
       st.integers(0, 250))
def test_a_write_is_split_within_the_limits_and_in_a_safe_order(
        sizes: dict[str, int], deletes: list[str], small: int) -> None:
    put: dict[str, Any] = {key: "x" * size for key, size in sizes.items()}
    put.update({f"groups/p{i}/shop": {"weights": {"a": 100}} for i in range(small)})
    deletes = [key for key in deletes if key not in put]
    last = frozenset(key for key in [*put, *deletes]
                     if key in ("digest", "kinds/rollout/current", "kinds/serving/pops"))
    write = IntentWrite(put=put, delete=deletes, last=last)
    chunks = transactions(write)
    for chunk in chunks:
        assert 0 < len(chunk) <= MAX_TXN_OPS
        assert sum(_size(key, value) for key, value in chunk) <= MAX_REQUEST_BYTES
    ops = [op for chunk in chunks for op in chunk]
    assert sorted(key for key, _ in ops) == sorted([*put, *deletes])  # each key once
    if len(chunks) > 1:
        # values first, then the keys a reader starts from together, then the other deletes
        order = [0 if key not in last and value is not None else 1 if key in last else 2
                 for key, value in ops]
        assert order == sorted(order)
        assert len({i for i, chunk in enumerate(chunks) for key, _ in chunk if key in last}) <= 1


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 400), st.integers(0, 3))
def test_a_split_write_is_marked_under_way_from_its_first_transaction_to_its_last(
        pairs: int, large: int) -> None:
    """A follower adopts nothing while ``intent/writing`` is there: every prefix of a write in
    several transactions but the whole one leaves it there; the whole one never does."""
    write = IntentWrite(
        put={**{f"groups/p{i}/shop": {"weights": {"a": 100}} for i in range(pairs)},
             **{f"kinds/v/{i}": "x" * 600_000 for i in range(large)}})
    split = transactions(write)
    chunks = marked(split)
    for chunk in chunks:
        assert 0 < len(chunk) <= MAX_TXN_OPS
        assert sum(_size(key, value) for key, value in chunk) <= MAX_REQUEST_BYTES
        assert len({key for key, _ in chunk}) == len(chunk)  # etcd: each key once
    marker = False  # as a reader sees etcd after each transaction
    for i, chunk in enumerate(chunks):
        for key, value in chunk:
            if key == WRITING:
                marker = value is not None
        assert marker == (len(split) > 1 and i < len(chunks) - 1), (i, len(chunks))
    assert chunks[-1][-1] == (WRITING, None)
    assert [op for chunk in chunks for op in chunk if op[0] != WRITING] == [
        op for chunk in split for op in chunk if op[0] != WRITING]


def test_one_value_larger_than_a_request_is_refused_before_anything() -> None:
    with pytest.raises(TooLarge, match=r"intent/kinds/desired_version/abc is 1,7\d\d,\d\d\d bytes"):
        transactions(IntentWrite(put={"kinds/desired_version/abc": "y" * 1_700_000,
                                      "digest": "abc"}))
    # text is kept as UTF-8, not \u-escaped: a file of 700,000 'é' is 1.4 MB, not 4.2 MB
    (chunk,) = transactions(IntentWrite(put={"kinds/desired_version/abc": "é" * 700_000}))
    assert chunk[0][1] is not None and len(chunk[0][1]) < 1_400_100


def _rollout_records(old: Version, new: Version, wave: int, phase: str) -> dict[str, Any]:
    rollout, _ = start(new.desired.rollout, old.digest, new.digest, new.desired.pop_names,
                       old.desired.pop_names, T0)
    data = rollout.to_dict() | {"wave": wave, "phase": phase}
    return {"rollout": data, "failed": {}}


def test_every_prefix_of_a_split_rollout_write_reads_back_consistent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A rollout passing: its state, `serving` gone, the old version and 40 baselines deleted —
    split into transactions of at most 5 operations; a crash after any of them leaves what
    `restored` reads back without a contradiction."""
    old, new = versions(pops=6, pad=0)
    start_batch = IntentBatch(records=(
        (ROLLOUT_KIND, ROLLOUT_KEY, _rollout_records(old, new, 0, "baking")),
        (VERSION_KIND, old.digest, old.stored()), (VERSION_KIND, new.digest, new.stored()),
        (SERVING_KIND, SERVING_KEY, {pop: old.digest for pop in old.desired.pop_names[1:]}),
        *((ROLLOUT_BEFORE_KIND, f"p{i:03d}", {"origins": [], "tiers": [],
                                              "tier_action_onsets": 0}) for i in range(40))),
        desired_digest=new.digest)
    passed = IntentBatch(records=(
        (ROLLOUT_KIND, ROLLOUT_KEY, _rollout_records(old, new, 1, "passed")),
        (SERVING_KIND, SERVING_KEY, None), (VERSION_KIND, old.digest, None),
        *((ROLLOUT_BEFORE_KIND, f"p{i:03d}", None) for i in range(40))))
    values: dict[str, Any] = {}
    for key, value in batch_to_write(start_batch).put.items():
        values[key] = value
    monkeypatch.setattr(etcd_store, "MAX_TXN_OPS", 5)
    chunks = transactions(batch_to_write(passed))
    assert len(chunks) > 5
    for done in range(len(chunks) + 1):
        state = dict(values)
        for chunk in chunks[:done]:
            for key, value in chunk:
                if value is None:
                    state.pop(key, None)
                else:
                    state[key] = etcd_store.json.loads(value)
        records: dict[str, dict[str, Any]] = {}
        for key, value in state.items():
            if key.startswith("kinds/"):
                kind, _, name = key[len("kinds/"):].partition("/")
                records.setdefault(kind, {})[name] = value
        held = restored(records, {}, lambda data, source: parse_desired(data, source), "etcd")
        assert held is not None
        if held.rollout.phase == "passed":
            assert held.serving == {} and held.target.digest == new.digest
        else:
            assert set(held.serving) == set(old.desired.pop_names[1:])


# -- through the rollout driver, on a real etcd ----------------------------------------------

YAML = """\
# {pad}
pops:
{pops}
origin_groups:
  shop:
    origins:
      primary: {{address: 127.0.0.1, port: 8001}}
      secondary: {{address: 127.0.0.1, port: {secondary}}}
rollout: {{canary: [p000], waves: [100%], bake: 1m, gates: {{min_samples: 5}}}}
listeners:
  - name: edge
    port: 10000
    virtual_hosts:
      - {{name: shop, domains: ["*"], origin_group: shop}}
"""


def versions(pops: int, pad: int) -> tuple[Version, Version]:
    """Two versions of a fleet of `pops` PoPs, each file padded to about `pad` bytes (a long
    comment, text that is not ASCII included)."""
    names = [f"p{i:03d}" for i in range(pops)]
    listed = "\n".join(f"  {name}: {{listen_address: 10.0.{i // 250}.{i % 250 + 1}}}"
                       for i, name in enumerate(names))

    def made(secondary: int) -> Version:
        text = YAML.format(pad="", pops=listed, secondary=secondary)
        filler = "Prüfung " * (max(pad - len(text.encode()), 0) // len("Prüfung ".encode()))
        data = text.replace("# \n", f"# {filler}\n", 1).encode()
        return Version(parse_desired(data, "desired.yaml"), data)

    return made(8002), made(9002)


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    if etcd_binary() is None:
        pytest.skip("etcd not installed")
    server = EtcdServer().start()
    yield server
    server.cleanup()


@pytest.fixture
async def leader(etcd: EtcdServer, request: pytest.FixtureRequest
                 ) -> AsyncIterator[tuple[EtcdStore, Leadership]]:
    host, port = etcd.endpoint.split(":")
    store = EtcdStore([(host, int(port))], prefix=f"/limits/{request.node.name}/")
    lead = await store.campaign("a", await store.grant_lease(30))
    assert lead is not None
    yield store, lead
    await store.close()


async def test_a_rollout_of_large_versions_to_149_pops_at_once_is_saved_in_etcd(
        tmp_path: Path, leader: tuple[EtcdStore, Leadership]) -> None:
    etcd, lead = leader
    shared = ReplicatedStore(etcd, lambda: lead)
    old, new = versions(pops=150, pad=1_000_000)
    assert len(old.data) > 990_000 and len(new.data) > 990_000
    log = DecisionLog(tmp_path)
    recorder = DecisionRecorder(log)
    owner, cache = intent_and_cache(old.desired, store=shared, recorder=recorder)
    acks = ConfigAcks(NodeRegistry(), cache, lambda pop: owner.intent.desired_of(pop).digest)
    now = [T0]
    # a wave with no connected node waits (issue 33): one made-up node per PoP
    rollouts = Rollouts(owner, WithNodes(owner, acks),  # type: ignore[arg-type]
                        Healthy(list(old.desired.pop_names)), recorder, old,
                        clock=lambda: now[0])
    try:
        # the rollout starts: both versions' bytes in one change (about 2 MB)
        async with rollouts.lock:
            async with owner.change() as change:
                begun = await rollouts.begin(change, new, immediate=False, by="test")
                change.record(begun.records)
            begun.done()
        now[0] = T0 + 1000  # a look early in the bake sees the canary's node applying it
        await rollouts.look()
        # the canary baked: the other 149 PoPs get the new version and their baselines at once
        now[0] = T0 + 60_001
        await rollouts.look()
        assert rollouts.rollout is not None and rollouts.rollout.wave == 1
        assert owner.intent.serving == {}
        stored = await shared.read()
        held = restored(stored.records, {}, lambda data, source: parse_desired(data, source),
                        shared.where)
        assert held is not None and held.rollout == rollouts.rollout
        assert held.target.data == new.data and held.serving == {}
        assert set(held.before) == set(new.desired.pop_names)
        # a file too large for one etcd request is refused with the reason; nothing written
        revision = (await etcd.load())[0]
        with pytest.raises(TooLarge, match="one etcd request carries at most"):
            await shared.write(IntentBatch(records=(
                (VERSION_KIND, "f" * 64, {"source": "x", "yaml": "z" * 1_600_000}),)))
        assert (await etcd.load())[0] == revision
    finally:
        log.close()
