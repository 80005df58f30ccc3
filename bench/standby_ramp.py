"""The cold-standby ramp against seed 002's incident, ramp on and off side by side:
`python -m bench.standby_ramp [--rps N] [--seed N]` (the scenario: `harness/standby_ramp.py`).
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import asdict
from typing import Any

from harness.standby_ramp import RunResult, Scenario, report, run


async def both(scenario: Scenario) -> list[RunResult]:
    return [await run(True, scenario), await run(False, scenario)]


def as_json(results: list[RunResult]) -> list[dict[str, Any]]:
    return [asdict(r) | {"within_thresholds": r.within_thresholds} for r in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rps", type=float, default=Scenario.rps)
    parser.add_argument("--seed", type=int, default=Scenario.seed)
    args = parser.parse_args()
    results = asyncio.run(both(Scenario(rps=args.rps, seed=args.seed)))
    print(report(results))


if __name__ == "__main__":
    main()
