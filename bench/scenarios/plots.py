"""The report's PNG plots (matplotlib, Agg), drawn from the first run of each variant:
weights per PoP, latency of answered requests per tier, errors, the origins' load, the standby's
warming."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from PIL import Image

from bench.scenarios.analysis import (
    RunResult,
    error_rate,
    failed,
    origin_rates,
    percentile,
    series,
    shed_rate,
)
from bench.scenarios.load import MIX
from bench.scenarios.runner import Scenario

COLOURS = {"ballast": "tab:blue", "binary-naive": "tab:red", "binary-deep": "tab:purple",
           "binary-warm": "tab:brown", "priority-spill": "tab:orange", "fifo-naive": "tab:red",
           "static-tiers-naive": "tab:purple", "static-tiers": "tab:orange"}
TIER_OF = {k.name: k.tier for k in MIX}
DPI = 72
PLOTS = ("weights", "latency", "errors", "origins", "standby")


def window(scenario: Scenario) -> tuple[float, float]:
    a, b = scenario.incident
    return a * scenario.duration_s, b * scenario.duration_s


def _colour(label: str) -> str:
    return COLOURS.get(label, "tab:gray")


def _save(fig: plt.Figure, path: Path) -> None:
    """PNG with a 64-colour palette: the plots are line art, a third of the bytes."""
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    Image.open(path).convert("RGB").quantize(colors=64).save(path, optimize=True)


def _marks(ax: plt.Axes, run: RunResult, scenario: Scenario) -> None:
    start, end = window(scenario)
    ax.axvspan(start, end, color="0.93", zorder=0)
    for t, _, _ in run.records:
        ax.axvline(t, color="tab:green", alpha=0.2, linewidth=0.8)
    for t, _ in run.events:
        ax.axvline(t, color="black", linestyle="--", linewidth=1.2)


def plot_weights(scenario: Scenario, runs: dict[str, RunResult], path: Path) -> None:
    fig, axes = plt.subplots(len(scenario.pops), 1, figsize=(8, 2.2 * len(scenario.pops)),
                             sharex=True, squeeze=False)
    for ax, pop in zip(axes[:, 0], scenario.pops, strict=True):
        _marks(ax, runs["ballast"], scenario)
        for label, run in runs.items():
            pts = [(t, w.get("primary", 0)) for t, p, w in run.weights if p == pop and w]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.step(xs, ys, where="post", color=_colour(label),
                        label=f"{label}: primary", linewidth=1.6)
        ax.set_ylabel(f"{pop}: primary %")
        ax.set_ylim(-5, 105)
        ax.legend(loc="lower left", fontsize=8)
    axes[-1, 0].set_xlabel("seconds (grey: incident; green: Ballast decision records; "
                           "dashed: kill/restart)")
    fig.suptitle(f"{scenario.name}: primary's share per PoP (first run of each variant)")
    fig.tight_layout()
    _save(fig, path)


def plot_latency(scenario: Scenario, runs: dict[str, RunResult], path: Path, width: float
                 ) -> None:
    kinds = [k.name for k in MIX]
    fig, axes = plt.subplots(1, len(kinds), figsize=(10, 3.2), sharey=True)
    for ax, kind in zip(axes, kinds, strict=True):
        _marks(ax, runs["ballast"], scenario)
        for label, run in runs.items():
            samples = [s for s in run.samples if s.kind == kind and not failed(s)]
            for q, style in ((50, ":"), (95, "-")):
                xs, ys = series(samples, width,
                                lambda g, q=q: percentile([s.latency_ms for s in g], q))
                ax.plot(xs, ys, style, color=_colour(label), linewidth=1.2,
                        label=f"{label} p{q}")
        ax.set_title(f"{kind} ({TIER_OF[kind]}), answered only", fontsize=10)
        ax.set_yscale("log")
        ax.set_xlabel("seconds")
    axes[0].set_ylabel("client latency (ms)")
    axes[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    _save(fig, path)


def plot_errors(scenario: Scenario, runs: dict[str, RunResult], path: Path, width: float
                ) -> None:
    fig, ax = plt.subplots(figsize=(8, 3))
    _marks(ax, runs["ballast"], scenario)
    for label, run in runs.items():
        xs, ys = series(run.samples, width, lambda g: 100 * error_rate(g))
        ax.plot(xs, ys, color=_colour(label), label=f"{label}: failed (every cause)")
        xs, ys = series(run.samples, width, lambda g: 100 * shed_rate(g))
        if any(ys):
            ax.plot(xs, ys, ":", color=_colour(label), label=f"{label}: of which shed")
    ax.set_ylabel("% of requests")
    ax.set_xlabel("seconds")
    ax.legend(fontsize=8)
    ax.set_title(f"{scenario.name}: requests without their intended answer")
    fig.tight_layout()
    _save(fig, path)


def plot_origins(scenario: Scenario, runs: dict[str, RunResult], path: Path) -> None:
    names = list(scenario.origins)
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 3), sharey=True,
                             squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        _marks(ax, runs["ballast"], scenario)
        for label, run in runs.items():
            pts = [(t, n) for t, o, n in run.origin_load if o == name]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, color=_colour(label), linewidth=0.9, label=label)
        spec = scenario.origins[name]
        if spec.workers:
            ax.axhline(spec.workers + spec.max_waiting, color="black", linewidth=0.8,
                       linestyle=":")
        ax.set_title(f"{name}: requests inside (working + waiting)", fontsize=10)
        ax.set_xlabel("seconds")
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    _save(fig, path)


def plot_standby(scenario: Scenario, runs: dict[str, RunResult], path: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(12, 3))
    titles = ("standby: cache hit ratio (%)", "standby: backend fetches/s",
              "standby: open connections")
    for i, (ax, title) in enumerate(zip(axes, titles, strict=True)):
        _marks(ax, runs["ballast"], scenario)
        for label, run in runs.items():
            pts = origin_rates(run, scenario.standby)
            if pts:
                ys = [(100 * p[2] if i == 0 else p[3] if i == 1 else p[4]) for p in pts]
                ax.plot([p[0] for p in pts], ys, color=_colour(label), linewidth=1.0,
                        label=label)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("seconds")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    _save(fig, path)


def write_plots(scenario: Scenario, runs: dict[str, list[RunResult]], out: Path) -> list[str]:
    """Every plot of the report into `out`; the plots' names (`PLOTS` that apply)."""
    first = {v: rs[0] for v, rs in runs.items()}
    width = max(1.0, scenario.duration_s / 60)
    plot_weights(scenario, first, out / f"{scenario.name}-weights.png")
    plot_latency(scenario, first, out / f"{scenario.name}-latency.png", width)
    plot_errors(scenario, first, out / f"{scenario.name}-errors.png", width)
    plot_origins(scenario, first, out / f"{scenario.name}-origins.png")
    if scenario.standby:
        plot_standby(scenario, first, out / f"{scenario.name}-standby.png")
    return [p for p in PLOTS if p != "standby" or scenario.standby]
