"""Seed 000's scenario through a real Envoy (`harness/tier_scenario.py`): checkout p95 with
a single FIFO cluster, with Ballast's static tiers and with the tier controller, plus the
measured queue wait against the extra latency checkout clients saw. Report: docs/benchmarks.md.

    .venv/bin/python -m bench.tiers [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from harness.tier_scenario import SLOW, Phases, run

SETUPS = ("fifo", "static", "controller")


async def main(phases: Phases) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="ballast-bench-tiers-") as tmp:
        for setup in SETUPS:
            result = await run(setup, phases, Path(tmp))
            rows.append(result.summary(SLOW))
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short phases (~40 s)")
    args = parser.parse_args()
    phases = Phases(before=3, slow=10, after=6, settle=3) if args.quick else Phases()
    for row in asyncio.run(main(phases)):
        print(json.dumps(row))
