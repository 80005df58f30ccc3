"""The soak's verdict on its samples (`bench/soak.py`'s `trend`): what is flat passes, what keeps
growing fails, whatever the noise; the decision log may grow, not speed up."""

from __future__ import annotations

import math

from bench.soak import trend


def points(values: list[float], hours: float = 2.0) -> list[tuple[float, float]]:
    step = hours / (len(values) - 1)
    return [(i * step, value) for i, value in enumerate(values)]


def test_a_sample_that_grows_then_levels_off_is_flat() -> None:
    # RSS warming up over the first half hour, then within a few MB of 95
    rss = [80 + 15 * (1 - math.exp(-i / 8)) + (i % 3) * 0.5 for i in range(121)]
    assert trend("rss_mb", points(rss)).ok


def test_a_sample_that_keeps_growing_fails() -> None:
    rss = [80 + 0.1 * i for i in range(121)]  # 6 MB an hour, a leak
    verdict = trend("rss_mb", points(rss))
    assert not verdict.ok and verdict.last_rise > verdict.bound


def test_small_levels_get_an_absolute_floor() -> None:
    # 40 descriptors, one more for the last hour: within 3 descriptors
    assert trend("fds", points([40.0] * 60 + [41.0] * 61)).ok
    assert not trend("fds", points([40.0 + i / 10 for i in range(121)])).ok  # 6 more an hour


def test_the_decision_log_may_grow_at_its_rate_but_not_faster() -> None:
    steady = [100.0 * i for i in range(121)]
    assert trend("log_kb", points(steady)).ok
    faster = [100.0 * i if i < 60 else 6000 + 300.0 * (i - 60) for i in range(121)]
    assert not trend("log_kb", points(faster)).ok
