"""How much of a hedged tier a standby took, and how: from the origins' attempt logs.

Every attempt of a request carries the same `x-request-id` (Envoy's), and its attempt number
(`x-envoy-attempt-count`). A standby attempt after the first is a **hedge** when the request's
earlier attempt on another origin was still unanswered when it arrived (Envoy sent it after the
hedge delay, and will take whichever answers first), and a **retry** when that attempt had
answered already (a 5xx: Envoy retried it on another origin). Used by the hedged-tier matrix
(`tests/test_hedged_matrix.py`) and its figures in docs/benchmarks.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from harness.demo_origin import Attempt


@dataclass(frozen=True)
class StandbyShare:
    """A standby's attempts of one tier's requests over a span (counts of requests)."""

    requests: int  # requests of the tier whose first attempt arrived in the span
    first: int  # of those, first attempts on the standby (its weight's share)
    hedges: int  # attempts on the standby while the request's other attempt was unanswered
    retries: int  # attempts on the standby after the other attempt had failed

    @property
    def hedged(self) -> float:
        """Hedges to the standby per request."""
        return self.hedges / self.requests if self.requests else 0.0

    @property
    def by_weight_and_hedges(self) -> float:
        """The standby's share of the requests through its weight and hedges (retries after a
        failed answer are the retry budget's, as in every tier)."""
        return (self.first + self.hedges) / self.requests if self.requests else 0.0

    @property
    def with_retries(self) -> float:
        return (self.first + self.hedges + self.retries) / self.requests if self.requests else 0.0


def standby_share(primary: Iterable[Attempt], standby: Iterable[Attempt], tier: str,
                  since: float, until: float, pop: str | None = None) -> StandbyShare:
    """The standby's share of `tier`'s requests (through `pop`, or any) whose first attempt
    arrived in [since, until) (time.monotonic())."""
    mine = [a for a in primary if a.tier == tier and pop in (None, a.pop)]
    theirs = [a for a in standby if a.tier == tier and pop in (None, a.pop)]
    started = {a.request_id for a in (*mine, *theirs)
               if a.number == 1 and since <= a.arrived < until and a.request_id}
    earlier: dict[str, list[Attempt]] = {}
    for attempt in mine:
        if attempt.request_id in started:
            earlier.setdefault(attempt.request_id, []).append(attempt)
    first = hedges = retries = 0
    for attempt in theirs:
        if attempt.request_id not in started:
            continue
        if attempt.number == 1:
            first += 1
            continue
        before = [a for a in earlier.get(attempt.request_id, ()) if a.number < attempt.number]
        if any(a.done > attempt.arrived for a in before):
            hedges += 1
        else:
            retries += 1
    return StandbyShare(len(started), first, hedges, retries)
