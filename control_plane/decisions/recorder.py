"""`DecisionRecorder`: the one write path of decision records, for every writer.

The reconcile tick, a reload, start-up and shutdown, leadership changes and the ADS callbacks
all hand their records here; the recorder owns what each of them needs the same way:

- **full-disk buffering**: a write the log refuses (OSError: a full disk) keeps the records, and
  every record after them, in memory (bounded; the oldest are dropped past the bound, and
  counted) until `flush` can write them, marked `recorded_late` with the time they happened;
- **durability**: `write(..., durable=True)` fsyncs at once; `sync` (awaited, the fsync on a
  worker thread) makes everything written before it durable — a tick's records, written with
  one write, get one fsync;
- **the event loop**: `write_synced` (a change's records) makes the lines of a large batch on a
  worker thread — a first tick's 2,000 records are 3 MB of JSON, 17 ms of the loop — while what
  other writers hand in meanwhile waits, in order, for the batch to be appended (so the seqs
  the lines were made with still follow the log's);
- **the rate limit** for routine, client-caused records (`routine`: node connects, NACKs,
  ...); decisions are never limited;
- **metrics**: `ballast_decisions_total` per kind, counted when a record reaches the log.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from control_plane.decisions.log import (
    DecisionLog,
    Draft,
    Lines,
    check_replicated,
    draft,
    format_time,
)
from control_plane.decisions.rate_limit import RecordLimiter
from control_plane.own_metrics.registry import BallastMetrics

log = logging.getLogger(__name__)

UNWRITTEN_RECORDS = 1000  # records kept in memory while the log cannot be written (disk full)
RECORD_OVERHEAD_BYTES = 256  # time, seq, kind and the empty fields of a record (the limit)
LINES_OFF_LOOP = 100  # a batch of at least these many records has its lines made on a thread


@dataclass(frozen=True)
class _Unwritten:
    made: Draft | dict[str, Any]  # a record of this process, or one another replica wrote
    durable: bool
    at: datetime


class DecisionRecorder:
    def __init__(
        self,
        decisions: DecisionLog,
        *,
        limiter: RecordLimiter | None = None,
        metrics: BallastMetrics | None = None,
        keep: int = UNWRITTEN_RECORDS,
    ) -> None:
        self.log = decisions
        self.limiter = limiter
        self.metrics = metrics
        self._unwritten: deque[_Unwritten] = deque(maxlen=keep)
        self.dropped = 0  # records lost past the bound while the log could not be written
        self.error: str | None = None  # why the log cannot be written now
        # while a batch's lines are made on a thread: what other writers do meanwhile, in order
        self._held: list[Callable[[], None]] | None = None
        self._making = asyncio.Lock()

    @property
    def waiting(self) -> int:
        """Records kept in memory until the log can take them."""
        return len(self._unwritten)

    def record(self, kind: str, *, durable: bool = True, **fields: Any) -> None:
        """One record (unknown kinds or fields raise, as `draft`)."""
        self.write([draft(kind, **fields)], durable=durable)

    def routine(self, kind: str, *, durable: bool = False, **fields: Any) -> bool:
        """A client-caused record, written if the rate limit allows (by default not fsync'd at
        once: the periodic `flush` makes it durable within a second); False when it was
        counted instead."""
        if self.limiter is not None:
            size = RECORD_OVERHEAD_BYTES + len(str(fields.get("rule", ""))) + len(json.dumps(
                fields.get("detail"), separators=(",", ":"), ensure_ascii=False, default=str))
            if not self.limiter.take(kind, size):
                if self.limiter.suppressed_total == 1:
                    log.warning("routine records over their rate limit: counting them instead "
                                "of writing")
                return False
        self.record(kind, durable=durable, **fields)
        return True

    def write(self, drafts: Sequence[Draft], *, durable: bool = True) -> None:
        """Records made ahead, in one write (all or none in the log); kept in order when the
        log cannot take them (and when older records still wait)."""
        if not drafts:
            return
        if self._held is not None:
            self._held.append(lambda: self.write(drafts, durable=durable))
            return
        self._append(drafts, None, durable)

    async def write_synced(self, drafts: Sequence[Draft]) -> None:
        """Records made ahead, in one write, made durable (`sync`): a change's records. The
        lines of a batch of `LINES_OFF_LOOP` or more are made on a worker thread; records
        other writers hand in meanwhile are written after the batch, in the order they came."""
        if len(drafts) < LINES_OFF_LOOP:
            self.write(drafts, durable=False)
        else:
            async with self._making:
                await self._write_made(drafts)
        await self.sync()

    async def _write_made(self, drafts: Sequence[Draft]) -> None:
        if self._unwritten:
            self._flush_unwritten()
        if self._unwritten:  # the log takes nothing now: these wait behind the others
            self.write(drafts, durable=False)
            return
        lines = self.log.lines(drafts)
        self._held = []
        try:
            await asyncio.to_thread(lines.made)
            self._append(drafts, lines, False)
        finally:
            held, self._held = self._held, None
            for deferred in held:
                deferred()

    def _append(self, drafts: Sequence[Draft], lines: Lines | None, durable: bool) -> None:
        """`drafts` (as `lines`, when made ahead for the log as it is) appended, or kept."""
        if self._unwritten:
            self._flush_unwritten()
        if not self._unwritten:
            try:
                if lines is None:
                    self.log.write_drafts(drafts, durable=durable)
                else:
                    self.log.append_lines(lines, durable=durable)
            except OSError as err:
                self._failed(err, drafts)
            except Exception:  # a listener of the log raised: the records are in the log
                log.exception("a decision log listener failed")
                self._count(drafts)
                return
            else:
                self._count(drafts)
                return
        now = datetime.now(UTC)
        for made in drafts:
            self._keep(_Unwritten(made, durable, now))

    def replicated(self, record: dict[str, Any]) -> None:
        """A record another replica wrote, appended with its own time, replica and term (made
        durable by the next sync); kept in order like any other while the log cannot take it.
        ValueError (nothing kept) for one that is not a replicated record."""
        if self._held is not None:
            check_replicated(record)
            self._held.append(lambda: self.replicated(record))
            return
        if self._unwritten:
            self._flush_unwritten()
        if not self._unwritten:
            try:
                self.log.append_replicated(record, durable=False)
                return
            except OSError as err:
                self.error = f"{type(err).__name__}: {err}"
                log.error("cannot append a replicated record (%s); kept until it can", err)
        self._keep(_Unwritten(dict(record), False, datetime.now(UTC)))

    async def sync(self) -> None:
        """Everything written so far made durable (the fsync on a worker thread). A failing
        fsync is logged and retried by the next sync or `flush`: it never raises."""
        try:
            await self.log.sync_in_thread()
        except OSError as err:
            log.error("cannot sync the decision log: %s", err)
            self.error = f"{type(err).__name__}: {err}"

    def flush(self) -> None:
        """The periodic chores: records kept meanwhile written, a note of the budget's
        suppressed records, everything made durable."""
        if self._held is not None:
            return  # the batch being made is followed by a sync
        self._flush_unwritten()
        self.note_suppressed()
        try:
            self.log.sync()
        except OSError as err:
            log.error("cannot sync the decision log: %s", err)

    def note_suppressed(self) -> None:
        """One record of the routine records the rate limit kept out since the last such note."""
        if self.limiter is None:
            return
        counts = self.limiter.pending_note()
        if counts is None:
            return
        config = self.limiter.config
        self.record(
            "records_suppressed",
            rule=f"{sum(counts.values())} routine records not written: clients caused more "
            f"than the rate limit ({config.burst_bytes:,} bytes at once, {config.bytes_per_s:,} "
            "bytes/s); decisions are never suppressed",
            detail={"suppressed": counts, "total_since_start": self.limiter.suppressed_total},
        )

    # -- internals -------------------------------------------------------------------------

    def _failed(self, err: OSError, drafts: Sequence[Draft]) -> None:
        self.error = f"{type(err).__name__}: {err}"
        log.error("cannot write %s to the decision log (%s); kept until it can",
                  ", ".join(sorted({d.kind for d in drafts})), err)

    def _keep(self, item: _Unwritten) -> None:
        if len(self._unwritten) == self._unwritten.maxlen:
            self.dropped += 1
        self._unwritten.append(item)

    def _flush_unwritten(self) -> None:
        while self._unwritten:
            item = self._unwritten[0]
            try:
                if isinstance(item.made, dict):  # another replica's: its own time says when
                    self.log.append_replicated(item.made, durable=item.durable)
                else:
                    made = self._late(item.made, item.at)
                    self.log.write_drafts([made], durable=item.durable)
                    self._count([made])
            except OSError as err:
                self.error = f"{type(err).__name__}: {err}"
                return
            self._unwritten.popleft()
        if self.error is not None:
            log.warning("decision log writable again (%s); records kept meanwhile written%s",
                        self.error, f", {self.dropped} dropped" if self.dropped else "")
            self.error = None
            self.dropped = 0

    def _late(self, made: Draft, at: datetime) -> Draft:
        """`made` marked as written late: when it happened, and why it waited."""
        detail = made.fields.get("detail")
        late = {**(detail if isinstance(detail, dict) else {"detail": detail}),
                "recorded_late": {"happened_at": format_time(at), "reason": self.error}}
        return draft(made.kind, **{**made.fields, "detail": late})

    def _count(self, drafts: Sequence[Draft]) -> None:
        if self.metrics is None:
            return
        counts: dict[str, int] = {}
        for made in drafts:
            counts[made.kind] = counts.get(made.kind, 0) + 1
        for kind, count in counts.items():
            self.metrics.decisions.labels(kind).inc(count)
