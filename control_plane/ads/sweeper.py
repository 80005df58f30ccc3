"""The xDS port's connections, swept: what `connections.plan` decides, done.

The services tell the sweeper which connections carry a valid stream (`vouch`, awaited once a
stream's node checks passed; the stream's end calls the release it returns — not a done
callback of the call: gRPC's would hold the call in a reference cycle).

A vouch is also the budget of an identity's connections (`Identify`: the certificate's with
mTLS, else the peer's address; None, a loopback peer, is exempt): an identity may hold
`proven_per_identity` connections that carried a valid stream; a stream that would make one
more is ended with RESOURCE_EXHAUSTED, and its connection stays unproven, for the sweep's
rules. A connection counts against its identity until a sweep no longer lists it (a refusal
makes the next sweep due at once).

A sweep lists the port's connections from the kernel (`socket_table.py`), plans, shuts down
the connections the plan closes and blocks the addresses it blocks; the listing and planning
run on a worker thread. A sweep is due when `TRIGGER_OPENS` connections were accepted in the
network namespace since the last one (checked every `TICK_S`, ~0.2 ms each: a flood is met
within a tenth of a second and a sweep), and at least every `MAX_PERIOD_S`, or a quarter of
the idle timeout when that is shorter (the idle rule). Sweeps never take more than
`SWEEP_SHARE` of a core: after one that took t of CPU the next waits t / SWEEP_SHARE.

What is closed, blocked and refused is counted and logged as one line when it starts, then one
summary every `REPORT_EVERY_S` while it goes on, never a line per connection.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import grpc

from control_plane.ads.budget import Identify, peer_identity
from control_plane.ads.connections import Block, Endpoint, Rules, Seen, Sweep, plan
from control_plane.ads.limits import AdsLimits, clip, connection_cap
from control_plane.ads.socket_table import SocketTable, endpoint_of

__all__ = ["REPORT_EVERY_S", "ConnectionSweeper"]

log = logging.getLogger(__name__)

REPORT_EVERY_S = 60.0
TICK_S = 0.1
TRIGGER_OPENS = 16  # connections accepted since the last sweep that make the next one due
MAX_PERIOD_S = 5.0
SWEEP_SHARE = 0.02  # of a core, at most, spent sweeping
IDENTITY_CHARS = 64  # an identity, as logged

Context = grpc.aio.ServicerContext[Any, Any]


def _nothing() -> None:
    pass


class ConnectionSweeper:
    def __init__(self, limits: AdsLimits, identify: Identify = peer_identity,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`identify`: a connection's client identity (its streams' contexts'); by default the
        peer's address (loopback: None, no budget)."""
        self.rules = Rules.of(limits, connection_cap(limits))
        self.proven_per_identity = limits.proven_per_identity
        self._identify = identify
        self._clock = clock
        self._uses: Counter[Endpoint] = Counter()  # valid streams open per connection
        self._proven: dict[Endpoint, str | None] = {}  # -> the identity that proved it
        self._by_identity: dict[str, set[Endpoint]] = {}  # the connections each one proved
        self._due = False  # a sweep is due at the next tick
        self._last_used: dict[Endpoint, float] = {}
        self._first_seen: dict[Endpoint, float] = {}
        self._blocks: dict[str, Block] = {}
        self.blocked: list[str] = []  # addresses blocked now
        self._table: SocketTable | None = None
        self._task: asyncio.Task[None] | None = None
        self.cost_s = 0.0  # CPU time the last sweep's listing and planning took
        self.acted: Counter[str] = Counter()  # connections closed and addresses blocked, by why
        self._unreported: Counter[str] = Counter()
        self._report: asyncio.TimerHandle | None = None

    # -- what the services say ---------------------------------------------------------------

    async def vouch(self, context: Context) -> Callable[[], None]:
        """A valid stream is open on `context`'s connection until the callable this returns is
        called (once, as the stream ends); the stream is ended with RESOURCE_EXHAUSTED instead
        when its identity holds `proven_per_identity` other connections that carried one."""
        endpoint = endpoint_of(context.peer())
        if endpoint is None or self._task is None:  # not sweeping: only the cap applies
            return _nothing
        if endpoint not in self._proven:
            identity = self._identify(context)
            if identity is not None:
                held = self._by_identity.setdefault(identity, set())
                if len(held) >= self.proven_per_identity:
                    await self._refuse(context, identity)
                held.add(endpoint)
            self._proven[endpoint] = identity
        self._uses[endpoint] += 1
        return functools.partial(self._release, endpoint)

    async def _refuse(self, context: Context, identity: str) -> None:
        self._due = True  # connections it no longer holds are forgotten at the next sweep
        why = (f"over budget: {len(self._by_identity[identity]):,} connections with valid "
               f"streams held by this identity, the limit is {self.proven_per_identity:,}")
        self._tell(Counter({f"refused streams of {clip(identity, IDENTITY_CHARS)!r}: "
                                    f"more than {self.proven_per_identity:,} connections with "
                                    "valid streams": 1}))
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, why)

    def holding(self, identity: str) -> int:
        """The connections `identity` proved that a sweep still lists."""
        return len(self._by_identity.get(identity, ()))

    def _release(self, endpoint: Endpoint) -> None:
        self._uses[endpoint] -= 1
        if self._uses[endpoint] <= 0:
            del self._uses[endpoint]
            self._last_used[endpoint] = self._clock()

    # -- sweeping ------------------------------------------------------------------------------

    def start(self, port: int) -> None:
        """Sweep the connections of `port` (this process's listening port) from now on; without
        the kernel's help (not Linux), only the connection cap gRPC enforces applies."""
        try:
            self._table = SocketTable(port)
        except OSError as err:
            log.warning("xDS connections are not swept (only capped at %d): %s",
                        self.rules.total, err)
            return
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._report is not None:
            self._report.cancel()
            self._report = None
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        table = self._table
        assert table is not None
        period = min(MAX_PERIOD_S, self.rules.idle_s / 4)
        last, opened = self._clock(), table.passive_opens()
        failed = False
        while True:
            await asyncio.sleep(TICK_S)
            now, opens = self._clock(), table.passive_opens()
            due = (now - last >= period or opens is None or opened is None
                   or opens - opened >= TRIGGER_OPENS or self._due)
            if not due or now - last < self.cost_s / SWEEP_SHARE:
                continue
            last, opened, self._due = now, opens, False
            try:
                await self.sweep()
                failed = False
            except OSError as err:
                if not failed:  # once per run of failures
                    log.warning("sweeping xDS connections failed (retrying): %s", err)
                failed = True

    async def sweep(self) -> Sweep:
        """One sweep, now."""
        table = self._table
        assert table is not None, "start() first"
        in_use, proven, last_used = set(self._uses), set(self._proven), dict(self._last_used)
        listed, result = await asyncio.to_thread(self._plan, table, in_use, proven, last_used)
        self._blocks = result.blocks
        for endpoint in [e for e in self._proven if e not in listed and e not in self._uses]:
            self._forget(endpoint)
        # a connection that has just begun a valid stream is not closed
        close = {e: why for e, why in result.close.items() if e not in self._uses}
        if close:
            await asyncio.to_thread(table.close, [listed[e] for e in close])
        acted = Counter(f"closed: {why}" for why in close.values())
        for address in result.offenders:
            acted[f"blocked {address} (more than {self.rules.unproven_per_address} "
                  "connections without a valid stream)"] += 1
        if acted:
            self._tell(acted)
        blocked = result.blocked(self._clock())
        if blocked != self.blocked:
            await asyncio.to_thread(table.block, blocked)
            self.blocked = blocked
        log.debug("swept %d xDS connections (%d in use): closed %d, %d addresses blocked",
                  len(listed), len(self._uses), len(close), len(blocked))
        return result

    def _forget(self, endpoint: Endpoint) -> None:
        """A proven connection gone: no longer its identity's."""
        identity = self._proven.pop(endpoint)
        self._last_used.pop(endpoint, None)
        if identity is not None:
            held = self._by_identity[identity]
            held.discard(endpoint)
            if not held:
                del self._by_identity[identity]

    def _plan(self, table: SocketTable, in_use: set[Endpoint], proven: set[Endpoint],
              last_used: dict[Endpoint, float]) -> tuple[dict[Endpoint, int], Sweep]:
        """(the port's connections -> their socket inodes, the plan); on a worker thread,
        whose CPU time it takes is `cost_s`."""
        started = time.thread_time()
        listed = dict(table.connections())
        now = self._clock()
        first_seen = {e: self._first_seen.get(e, now) for e in listed}
        self._first_seen = first_seen
        seen = [Seen(e, since, e in proven, last_used.get(e))
                for e, since in first_seen.items() if e not in in_use]
        result = plan(seen, len(first_seen) - len(seen), now, self.rules, self._blocks)
        self.cost_s = time.thread_time() - started
        return listed, result

    # -- reporting -----------------------------------------------------------------------------

    def _tell(self, acted: Counter[str]) -> None:
        self.acted.update(acted)
        if self._report is None:  # the first of a run: said at once
            log.warning("xDS connections %s (counted; a summary every %g s)", _listed(acted),
                        REPORT_EVERY_S)
            self._report = asyncio.get_running_loop().call_later(REPORT_EVERY_S, self._summary)
        else:
            self._unreported.update(acted)

    def _summary(self) -> None:
        self._report = None
        if not self._unreported:
            return
        log.warning("xDS connections in the last %g s: %s (cap %d, %d addresses blocked now)",
                    REPORT_EVERY_S, _listed(self._unreported), self.rules.total,
                    len(self.blocked))
        self._unreported.clear()
        self._report = asyncio.get_running_loop().call_later(REPORT_EVERY_S, self._summary)


def _listed(acted: Counter[str], most: int = 8) -> str:
    """'3 closed: why; blocked 10.0.0.7 (why)': the most frequent first, at most `most`."""
    shown = "; ".join(what if n == 1 and what.startswith("blocked") else f"{n} {what}"
                      for what, n in acted.most_common(most))
    left = len(acted) - most
    return shown + (f"; and {left} more" if left > 0 else "")
