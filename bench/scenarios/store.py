"""Every request kept: one compressed file per run of a variant, and the scenario's own record
of how its runs were made, from which every report is computed (`report.write_report`).

`DIR/NAME/` holds, for scenario NAME:

- `meta.json`: the command, the machine, the commit, the dates, and each run in the order it
  ran (run index, variant, seed, file; or why it failed);
- one `<seed>-<variant>.jsonl.xz` per run (xz, JSON lines): a header line with everything the
  run recorded besides its requests (the edge's weights and hosts out every 0.5 s, the
  origins' counters every 0.1 s, the bench's own loop lag, the load average before and after,
  Envoy's counters at the end, Ballast's decision records by kind and the checks on them), then
  one line per request the load sent — variant, request number, PoP, kind, tier, path, start
  and end (seconds after the load started, client side), status, cause, shed, timed out, the
  origin that answered, and every attempt an origin saw (origin, host, arrival, start of work,
  end of work, result, mirrored copy or not).

Times are kept to the millisecond. A report is computed only from what `read_runs` gives back,
so `python -m bench.scenarios report DIR` recomputes it byte for byte.
"""

from __future__ import annotations

import dataclasses
import json
import lzma
from collections import Counter
from pathlib import Path
from typing import Any

from bench.scenarios.analysis import RunResult
from bench.scenarios.load import KINDS, Sample, Visit
from bench.scenarios.origin import OriginStats

FORMAT = 1
META = "meta.json"
COLUMNS = ("variant", "n", "pop", "kind", "tier", "path", "start", "end", "status", "cause",
           "shed", "timed_out", "origin", "attempts")
ATTEMPT_COLUMNS = ("origin", "host", "arrive", "start", "end", "result", "mirror")


def _t(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def run_file(run: RunResult) -> str:
    return f"{run.seed}-{run.label}.jsonl.xz"


def _header(run: RunResult) -> dict[str, Any]:
    return {
        "format": FORMAT, "columns": COLUMNS, "attempt_columns": ATTEMPT_COLUMNS,
        "variant": run.label, "seed": run.seed, "run": run.run,
        "started_utc": run.started_utc, "load_before": run.load_before,
        "load_after": run.load_after,
        "weights": [[_t(t), pop, w] for t, pop, w in run.weights],
        "unhealthy": [[_t(t), pop, list(out)] for t, pop, out in run.unhealthy],
        "records": [[_t(t), kind, pop] for t, kind, pop in run.records],
        "events": [[_t(t), what] for t, what in run.events],
        "loop_lag": [[_t(t), _t(lag)] for t, lag in run.loop_lag],
        "after_restart": run.after_restart,
        "origin_stats": [[_t(t), name, list(dataclasses.astuple(st))]
                         for t, name, st in run.origin_stats],
        "decisions": dict(sorted(run.decisions.items())),
        "decision_examples": dict(sorted(run.decision_examples.items())),
        "checks": {"nowhere_better": run.nowhere_better,
                   "held_though_better": run.held_though_better,
                   "shed_onsets": run.shed_onsets,
                   "shed_with_idle_slots": run.shed_with_idle_slots},
        "envoy_stats": run.envoy_stats, "probes": run.probes,
    }


def _row(variant: str, s: Sample) -> list[Any]:
    return [variant, s.n, s.pop, s.kind, s.tier, s.path, _t(s.at), _t(s.end), s.status,
            s.cause, int(s.shed), int(s.timed_out), s.origin,
            [[v.origin, v.host, _t(v.arrive), _t(v.start), _t(v.end), v.result, int(v.mirror)]
             for v in s.attempts]]


def write_run(directory: Path, run: RunResult) -> Path:
    """The run's file in `directory` (created); its name is `run_file(run)`."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / run_file(run)
    lines = [json.dumps(_header(run), separators=(",", ":"))]
    lines += [json.dumps(_row(run.label, s), separators=(",", ":"))
              for s in sorted(run.samples, key=lambda s: s.n)]
    path.write_bytes(lzma.compress(("\n".join(lines) + "\n").encode(), preset=9))
    return path


def read_run(path: Path) -> RunResult:
    lines = lzma.decompress(path.read_bytes()).decode().splitlines()
    head = json.loads(lines[0])
    if head.get("format") != FORMAT:
        raise ValueError(f"{path}: format {head.get('format')!r}, this bench reads {FORMAT}")
    samples = []
    for line in lines[1:]:
        (_, n, pop, kind, _tier, path_, start, end, status, _cause, shed, timed_out, origin,
         attempts) = json.loads(line)
        if kind not in KINDS:
            raise ValueError(f"{path}: request {n} of unknown kind {kind!r}")
        samples.append(Sample(
            start, pop, kind, status, round((end - start) * 1000, 3), origin, bool(shed),
            bool(timed_out), n, path_,
            tuple(Visit(o, h, a, st, e, r, bool(m)) for o, h, a, st, e, r, m in attempts)))
    checks = head["checks"]
    return RunResult(
        head["variant"], samples, seed=head["seed"], run=head["run"],
        weights=[(t, pop, w) for t, pop, w in head["weights"]],
        unhealthy=[(t, pop, tuple(out)) for t, pop, out in head["unhealthy"]],
        records=[(t, kind, pop) for t, kind, pop in head["records"]],
        events=[(t, what) for t, what in head["events"]],
        loop_lag=[(t, lag) for t, lag in head["loop_lag"]],
        after_restart=head["after_restart"],
        origin_stats=[(t, name, OriginStats(*values))
                      for t, name, values in head["origin_stats"]],
        decisions=Counter(head["decisions"]), decision_examples=head["decision_examples"],
        nowhere_better=checks["nowhere_better"],
        held_though_better=checks["held_though_better"], shed_onsets=checks["shed_onsets"],
        shed_with_idle_slots=checks["shed_with_idle_slots"],
        envoy_stats=head["envoy_stats"], probes=head["probes"],
        load_before=head["load_before"], load_after=head["load_after"],
        started_utc=head["started_utc"],
    )


def write_meta(directory: Path, meta: dict[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / META).write_text(json.dumps(meta, indent=1) + "\n")


def read_meta(directory: Path) -> dict[str, Any]:
    return dict(json.loads((directory / META).read_text()))


def read_runs(directory: Path, meta: dict[str, Any]) -> dict[str, list[RunResult]]:
    """Every run `meta` lists as made, by variant (in `meta["variants"]` order), each
    variant's runs in the order they ran."""
    runs: dict[str, list[RunResult]] = {v: [] for v in meta["variants"]}
    for entry in meta["runs"]:
        if entry.get("file"):
            runs[entry["variant"]].append(read_run(directory / entry["file"]))
    return {v: rs for v, rs in runs.items() if rs}
