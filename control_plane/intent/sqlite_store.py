"""Crash-safe controller state: SQLite in WAL mode with ``synchronous=FULL`` in the state directory.

Holds, per (PoP, origin group), the weights in force and the controller's streaks; the active tier
decisions and standby-ramp states (key -> JSON value); records of any other kind of intent (kind,
key -> JSON value); and the digest of the last applied desired state. Every ``save_*`` and every
``write`` is one transaction, durable when it returns, so after ``kill -9`` the store holds the
last completed save. Anything unreadable raises ``StateCorrupted`` naming the file: the state is
never reset silently. A file that is missing, or there but empty (0 bytes, or no tables), while
the state directory shows earlier use (``history``, e.g. a decision log) raises
``StateSuspicious``: a deleted file, a failed copy or a full disk looks exactly like that
(``--accept-empty-state`` starts from defaults on purpose). ``blank`` says whether the store
started from nothing, so the ``startup`` record can say the weights are the defaults.
``read``/``write`` are the ``IntentStore`` interface (``store.py``);
``write`` runs its transaction on a worker thread (a reconcile tick's rows are serialized and
synced to disk there, not on the event loop), then checkpoints the WAL into the database and
truncates it, so the WAL does not stay at SQLite's checkpoint size; one lock keeps the
connection to one thread at a time.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from control_plane.decide.controller import ControllerState
from control_plane.intent.store import (
    RAMP_KIND,
    TIER_KIND,
    GroupState,
    IntentBatch,
    StateCorrupted,
    StoredIntent,
    check_weights,
)

__all__ = [
    "STATE_FILE",
    "GroupState",
    "StateCorrupted",
    "StateStore",
    "StateSuspicious",
    "StoredIntent",
]

STATE_FILE = "state.db"
SCHEMA_VERSION = "1"
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS groups (pop TEXT NOT NULL, grp TEXT NOT NULL,"
    " weights TEXT NOT NULL, controller TEXT NOT NULL, PRIMARY KEY (pop, grp))",
    "CREATE TABLE IF NOT EXISTS tier_decisions (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS ramps (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS records (kind TEXT NOT NULL, key TEXT NOT NULL,"
    " value TEXT NOT NULL, PRIMARY KEY (kind, key))",
)
_KEYED_TABLES = {TIER_KIND: "tier_decisions", RAMP_KIND: "ramps"}  # kinds with their own table


class StateSuspicious(StateCorrupted):
    """The state file is missing or empty although the state directory was used before."""


class StateStore:
    """Open (creating if needed) ``state.db`` in ``state_dir``; checks its integrity first."""

    def __init__(
        self, state_dir: str | os.PathLike[str], *, history: str | None = None
    ) -> None:
        """`history`: what in the state directory shows earlier use (None: nothing, or a
        missing or empty file is accepted on purpose). `blank` says afterwards whether the
        store held nothing (no file, or one without tables): everything starts from defaults."""
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / STATE_FILE
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._existed = self.path.exists()
        self._size_before = self.path.stat().st_size if self._existed else 0
        self._history = history
        self.blank = False
        self._lock = threading.Lock()
        if not self._existed and history is not None:  # checked before connecting creates it
            raise self._suspicious("is missing")
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StateCorrupted(f"{self.path}: cannot open: {exc}") from exc
        try:
            self._prepare()
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise StateCorrupted(
                f"{self.path}: not a usable SQLite database ({exc}); "
                f"move it aside and start with --accept-empty-state to start from defaults"
            ) from exc
        except StateCorrupted:
            self._db.close()
            raise

    def _suspicious(self, found: str) -> StateSuspicious:
        return StateSuspicious(
            f"{self.path} {found} while {self._history} shows this state directory was used: "
            "the weights and streaks were probably lost (a deleted file, a failed copy or "
            "restore, a full disk). Restore state.db from a backup, or start from default "
            "weights on purpose with --accept-empty-state"
        )

    def _prepare(self) -> None:
        db = self._db
        mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StateCorrupted(f"{self.path}: cannot switch to WAL mode (got {mode})")
        db.execute("PRAGMA synchronous=FULL")
        problems = [row[0] for row in db.execute("PRAGMA integrity_check")]
        if problems != ["ok"]:
            raise StateCorrupted(
                f"{self.path}: integrity check failed: {'; '.join(problems[:5])}; "
                f"move it aside and start with --accept-empty-state to start from defaults"
            )
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        self.blank = not {"meta", "groups"} <= tables
        if self.blank and self._history is not None:
            raise self._suspicious(f"is there but empty ({self._size_before} bytes, "
                                   f"{'no tables' if not tables else 'tables missing'})")
        with self._transaction():
            for statement in _SCHEMA:
                db.execute(statement)
            row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
            elif row[0] != SCHEMA_VERSION:
                raise StateCorrupted(
                    f"{self.path}: schema version {row[0]!r}, this Ballast reads {SCHEMA_VERSION!r}"
                )

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def load(self) -> StoredIntent:
        """Everything stored; raises StateCorrupted on any row that does not parse."""
        try:
            with self._transaction() as db:
                group_rows = db.execute(
                    "SELECT pop, grp, weights, controller FROM groups"
                ).fetchall()
                tier_rows = db.execute("SELECT key, value FROM tier_decisions").fetchall()
                ramp_rows = db.execute("SELECT key, value FROM ramps").fetchall()
                record_rows = db.execute("SELECT kind, key, value FROM records").fetchall()
                digest_row = db.execute(
                    "SELECT value FROM meta WHERE key = 'desired_digest'"
                ).fetchone()
        except sqlite3.DatabaseError as exc:
            raise StateCorrupted(f"{self.path}: cannot read: {exc}") from exc
        groups: dict[tuple[str, str], GroupState] = {}
        for pop, group, weights_text, controller_text in group_rows:
            where = f"{self.path}: group {group!r} at pop {pop!r}"
            try:
                weights = check_weights(json.loads(weights_text))
                controller = ControllerState.from_dict(json.loads(controller_text))
            except (TypeError, ValueError) as exc:
                raise StateCorrupted(f"{where}: {exc}") from exc
            groups[(pop, group)] = GroupState(weights, controller)
        tiers: dict[str, Any] = {}
        for key, text in tier_rows:
            try:
                tiers[key] = json.loads(text)
            except (TypeError, ValueError) as exc:
                raise StateCorrupted(f"{self.path}: tier decision {key!r}: {exc}") from exc
        ramps: dict[str, Any] = {}
        for key, text in ramp_rows:
            try:
                ramps[key] = json.loads(text)
            except (TypeError, ValueError) as exc:
                raise StateCorrupted(f"{self.path}: ramp {key!r}: {exc}") from exc
        records: dict[str, dict[str, Any]] = {}
        for kind, key, text in record_rows:
            try:
                records.setdefault(kind, {})[key] = json.loads(text)
            except (TypeError, ValueError) as exc:
                raise StateCorrupted(f"{self.path}: {kind} record {key!r}: {exc}") from exc
        digest = digest_row[0] if digest_row is not None else None
        return StoredIntent(groups, tiers, digest, ramps, records)

    # -- the IntentStore interface ---------------------------------------------------------

    async def read(self) -> StoredIntent:
        return self.load()

    async def write(self, batch: IntentBatch) -> None:
        """One transaction: pairs saved and forgotten, records put and deleted, the digest."""
        if batch:
            await asyncio.to_thread(self._write, batch)

    def _write(self, batch: IntentBatch) -> None:
        rows = [
            (pop, group, json.dumps(check_weights(weights), sort_keys=True),
             json.dumps(state.to_dict(), sort_keys=True))
            for pop, group, weights, state in batch.groups
        ]
        with self._transaction() as db:
            db.executemany(
                "INSERT INTO groups VALUES (?, ?, ?, ?) ON CONFLICT (pop, grp) DO UPDATE SET "
                "weights = excluded.weights, controller = excluded.controller",
                rows,
            )
            db.executemany("DELETE FROM groups WHERE pop = ? AND grp = ?", batch.forget_groups)
            for kind, key, value in batch.records:
                table = _KEYED_TABLES.get(kind)
                if value is None and table is not None:
                    db.execute(f"DELETE FROM {table} WHERE key = ?", (key,))
                elif value is None:
                    db.execute("DELETE FROM records WHERE kind = ? AND key = ?", (kind, key))
                elif table is not None:
                    db.execute(f"INSERT OR REPLACE INTO {table} VALUES (?, ?)",
                               (key, json.dumps(value, sort_keys=True)))
                else:
                    db.execute("INSERT OR REPLACE INTO records VALUES (?, ?, ?)",
                               (kind, key, json.dumps(value, sort_keys=True)))
            if batch.desired_digest is not None:
                db.execute(
                    "INSERT OR REPLACE INTO meta VALUES ('desired_digest', ?)",
                    (batch.desired_digest,),
                )
        self._checkpoint()

    def _checkpoint(self) -> None:
        """Copy the WAL into the database and truncate it. SQLite's own checkpoints (every
        1,000 pages) leave the WAL file at its largest size, ~4 MB, reached after ~8 minutes
        of reconcile ticks (the soak, docs/benchmarks.md §7); truncated after every write, the
        store's files are the database, whose size is what it holds (+0.5 ms a write,
        measured)."""
        with self._lock:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> StateStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
