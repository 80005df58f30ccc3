"""Shared helpers: /proc readings, timing loops, the synthetic desired states, report tables."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from control_plane.desired import Desired, parse_desired

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "desired.yaml"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


# -- /proc of another process ------------------------------------------------------------------


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a whole process (all threads), from /proc/<pid>/stat (10 ms ticks)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of stat(5)


def proc_rss_bytes(pid: int) -> int:
    pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return pages * PAGE


# -- timing ------------------------------------------------------------------------------------


def time_per_call(fn: Callable[[], Any], *, min_time: float = 0.2, repeat: int = 5) -> float:
    """Best-of-`repeat` seconds per call of `fn`, each round running at least `min_time`."""
    fn()  # warm up
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if time.perf_counter() - start >= min_time / 4:
            break
        calls *= 4
    calls = max(1, int(calls * (min_time / max(time.perf_counter() - start, 1e-9)) / 4))
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


# -- desired states ----------------------------------------------------------------------------


def example_desired() -> Desired:
    return parse_desired(EXAMPLE.read_text(), str(EXAMPLE))


def synthetic_desired(groups: int = 50, origins: int = 4) -> Desired:
    """The example's PoPs, tiers and rules with `groups` origin groups of `origins` origins,
    one virtual host per group: groups x 3 tiers clusters per PoP."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    pops = list(doc["pops"])
    doc["origin_groups"] = {}
    hosts = []
    for g in range(groups):
        names = [f"o{i}" for i in range(origins)]
        doc["origin_groups"][f"g{g:03d}"] = {
            "max_origin_concurrency": 120,
            "origins": {
                name: {"address": f"10.{g // 250}.{g % 250}.{i + 1}", "port": 8080}
                for i, name in enumerate(names)
            },
            # rotate the preference so PoPs prefer different origins
            "preference": {
                pop: names[p % origins :] + names[: p % origins] for p, pop in enumerate(pops)
            },
        }
        hosts.append({"name": f"g{g:03d}", "domains": [f"g{g:03d}.example"], "origin_group":
                      f"g{g:03d}"})
    doc["listeners"] = [{"name": "edge", "port": 10000, "virtual_hosts": hosts}]
    return parse_desired(yaml.safe_dump(doc, sort_keys=False), f"<synthetic {groups}x{origins}>")


def desired_by_name(name: str) -> Desired:
    if name == "example":
        return example_desired()
    if name == "large":
        return synthetic_desired()
    raise ValueError(f"unknown desired state {name!r} (example, large)")


# -- report ------------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.rjust(w) if n else c.ljust(w) for c, w in zip(row, widths,
                                                                                strict=True)))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value != value:  # nan
            return "-"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
