"""The state store: round trips, one transaction per save, corruption is reported not reset."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from control_plane.decide.controller import ControllerState
from control_plane.intent.sqlite_store import GroupState, StateCorrupted, StateStore, StoredIntent
from control_plane.intent.store import IntentBatch
from harness.eventually import eventually_blocking
from tests.support.stored import write_now

STATE = ControllerState({"a": 2, "b": 0}, {"a": 0, "b": 7})


def test_empty_store_loads_empty(tmp_path: Path) -> None:
    with StateStore(tmp_path / "state") as store:
        assert store.load() == StoredIntent()


def test_round_trip_survives_reopen(tmp_path: Path) -> None:
    with StateStore(tmp_path) as store:
        write_now(store, IntentBatch(groups=(("ewr", "api", {"a": 85, "b": 15}, STATE),)))
        write_now(store, IntentBatch(groups=(("sjc", "api", {"a": 95, "b": 5}, ControllerState()),
                                             ("ewr", "api", {"a": 75, "b": 25}, STATE)),
                                     desired_digest="d1"))
        write_now(store, IntentBatch(records=(
            ("tier", "ewr/api/background", {"action": "shed", "since_ms": 5}),
            ("tier", "ewr/api/normal", "demote"))))
        write_now(store, IntentBatch(records=(("tier", "ewr/api/normal", None),)))
    with StateStore(tmp_path) as store:
        stored = store.load()
    assert stored.groups == {
        ("ewr", "api"): GroupState({"a": 75, "b": 25}, STATE),
        ("sjc", "api"): GroupState({"a": 95, "b": 5}, ControllerState()),
    }
    assert stored.tier_decisions == {"ewr/api/background": {"action": "shed", "since_ms": 5}}
    assert stored.desired_digest == "d1"


def test_wal_and_full_sync(tmp_path: Path) -> None:
    with StateStore(tmp_path):
        pass
    db = sqlite3.connect(tmp_path / "state.db")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()


async def test_the_store_does_not_grow_over_repeated_ticks(tmp_path: Path) -> None:
    """A tick rewrites the same pairs: the files (database and WAL) stay at what they hold. With
    SQLite's own checkpoints the WAL grew to ~4 MB (the soak, docs/benchmarks.md §7)."""
    def files() -> int:
        return sum(p.stat().st_size for p in tmp_path.glob("state.db*"))

    with StateStore(tmp_path) as store:
        sizes = []
        for tick in range(300):  # 300 ticks x 40 pairs, each written anew
            await store.write(IntentBatch(groups=tuple(
                (f"p{p}", f"g{g}", {"a": tick % 100, "b": 100 - tick % 100}, STATE)
                for p in range(2) for g in range(20))))
            sizes.append(files())
        assert (tmp_path / "state.db-wal").stat().st_size == 0  # checkpointed and truncated
    assert max(sizes[50:]) <= max(sizes[:50])  # bounded by the rows, not by the ticks
    assert max(sizes) < 128 * 1024, max(sizes)  # the database, 32 KB of WAL index


@pytest.mark.parametrize("weights", [{"a": 90, "b": 5}, {"a": 100.0}, {}, {"a": -5, "b": 105}])
def test_bad_weights_are_refused_and_state_kept(tmp_path: Path, weights: dict) -> None:
    with StateStore(tmp_path) as store:
        write_now(store, IntentBatch(groups=(("ewr", "api", {"a": 95, "b": 5}, STATE),)))
        with pytest.raises(ValueError, match="summing to 100"):
            write_now(store, IntentBatch(groups=(("sjc", "api", {"a": 95, "b": 5}, STATE),
                                                 ("ewr", "api", weights, STATE)),
                                         desired_digest="new"))
        stored = store.load()
    assert set(stored.groups) == {("ewr", "api")}
    assert stored.desired_digest is None


def test_not_a_database(tmp_path: Path) -> None:
    (tmp_path / "state.db").write_bytes(b"this is not sqlite at all, just text\n" * 200)
    with pytest.raises(StateCorrupted, match=r"state\.db: not a usable SQLite database"):
        StateStore(tmp_path)
    assert (tmp_path / "state.db").read_bytes().startswith(b"this is not sqlite")  # untouched


def test_damaged_pages_fail_the_integrity_check(tmp_path: Path) -> None:
    with StateStore(tmp_path) as store:
        for i in range(300):
            write_now(store, IntentBatch(groups=((f"pop{i}", "api", {"a": 95, "b": 5}, STATE),)))
    db = sqlite3.connect(tmp_path / "state.db")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    path = tmp_path / "state.db"
    data = bytearray(path.read_bytes())
    page = 4096
    for offset in range(2 * page, len(data), page):  # scribble over every page's header
        data[offset:offset + 16] = b"\xff" * 16
    path.write_bytes(bytes(data))
    with pytest.raises(StateCorrupted, match=str(path)):
        StateStore(tmp_path).load()


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("weights", '{"a": 90, "b": 5}', "summing to 100"),
        ("weights", "not json", "group 'api' at pop 'ewr'"),
        ("controller", '{"unhealthy_windows": {"a": -1}, "healthy_windows": {}}', "count >= 0"),
    ],
)
def test_unparsable_rows(tmp_path: Path, column: str, value: str, message: str) -> None:
    with StateStore(tmp_path) as store:
        write_now(store, IntentBatch(groups=(("ewr", "api", {"a": 95, "b": 5}, STATE),)))
    db = sqlite3.connect(tmp_path / "state.db")
    db.execute(f"UPDATE groups SET {column} = ?", (value,))
    db.commit()
    db.close()
    with StateStore(tmp_path) as store, pytest.raises(StateCorrupted, match=message) as info:
        store.load()
    assert str(tmp_path / "state.db") in str(info.value)


def test_unknown_schema_version(tmp_path: Path) -> None:
    with StateStore(tmp_path):
        pass
    db = sqlite3.connect(tmp_path / "state.db")
    db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    db.commit()
    db.close()
    with pytest.raises(StateCorrupted, match="schema version '99'"):
        StateStore(tmp_path)


WRITER = """
import asyncio
import sys
from control_plane.decide.controller import ControllerState
from control_plane.intent.sqlite_store import StateStore
from control_plane.intent.store import IntentBatch

store = StateStore(sys.argv[1])
i = 0
while True:
    i += 1
    shift = i % 91
    weights = {"primary": 95 - shift, "secondary": 5 + shift}
    state = ControllerState({"primary": i}, {"secondary": i})
    asyncio.run(store.write(IntentBatch(
        groups=(("ewr", "api", weights, state), ("sjc", "api", weights, state)),
        desired_digest=str(i))))
    print(i, flush=True)
"""


def test_kill_9_in_the_middle_of_a_write_loop(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parent.parent,
    )
    assert child.stdout is not None
    stdout = child.stdout
    acknowledged = eventually_blocking(lambda: (n := int(stdout.readline())) >= 200 and n, 30,
                                       "200 acknowledged saves", interval=0)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert acknowledged >= 200
    with StateStore(tmp_path) as store:
        stored = store.load()
    count = int(stored.desired_digest or 0)
    assert count >= acknowledged  # every acknowledged save is durable
    for key in (("ewr", "api"), ("sjc", "api")):  # and each save is all-or-nothing
        group = stored.groups[key]
        shift = count % 91
        assert group.weights == {"primary": 95 - shift, "secondary": 5 + shift}
        assert group.controller == ControllerState({"primary": count}, {"secondary": count})


def test_forget_group_and_digest(tmp_path: Path) -> None:
    with StateStore(tmp_path) as store:
        write_now(store, IntentBatch(groups=(("ewr", "api", {"a": 95, "b": 5}, STATE),
                                             ("ewr", "img", {"a": 95, "b": 5}, STATE))))
        write_now(store, IntentBatch(forget_groups=(("ewr", "img"),)))
        write_now(store, IntentBatch(desired_digest="sha256:abc"))
        stored = store.load()
    assert set(stored.groups) == {("ewr", "api")}
    assert stored.desired_digest == "sha256:abc"


async def test_intent_batches_are_atomic_and_keep_any_record_kind(tmp_path: Path) -> None:
    """The IntentStore face: a batch of pairs, forgotten pairs, records of any kind (a new
    kind of intent needs no schema change) and the digest; a bad batch writes nothing."""
    with StateStore(tmp_path) as store:
        await store.write(IntentBatch(
            groups=(("ewr", "api", {"a": 85, "b": 15}, STATE),
                    ("sjc", "api", {"a": 95, "b": 5}, ControllerState())),
            records=(("tier", "ewr/api", {"active": True}), ("ramp", "ewr/api", {"r": 1}),
                     ("mirror", "ewr/api", [1, 2])),
            desired_digest="d1",
        ))
        with pytest.raises(ValueError, match="summing to 100"):
            await store.write(IntentBatch(groups=(("ewr", "api", {"a": 1}, STATE),),
                                          forget_groups=(("sjc", "api"),), desired_digest="d2"))
        await store.write(IntentBatch(forget_groups=(("sjc", "api"),),
                                      records=(("mirror", "ewr/api", None),
                                               ("lend", "sjc/api", "on"))))
    with StateStore(tmp_path) as store:
        stored = await store.read()
    assert stored == StoredIntent(
        groups={("ewr", "api"): GroupState({"a": 85, "b": 15}, STATE)},
        tier_decisions={"ewr/api": {"active": True}},
        desired_digest="d1",
        ramps={"ewr/api": {"r": 1}},
        records={"lend": {"sjc/api": "on"}},
    )
