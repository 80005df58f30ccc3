"""Which connected nodes the metric source hears nothing from (`observe/source.py`)."""

from __future__ import annotations

from control_plane.decide.signals import OriginSignals
from control_plane.observe.source import silent_fix, silent_nodes

SIGNAL = OriginSignals(10, 0, 0, 5.0, 9.0, 0.0, 0, None, 0)


def test_the_sink_names_each_node_it_heard_nothing_from() -> None:
    connected = {"ewr": {"ewr-1": 0, "ewr-2": 0, "ewr-3": 5_000}, "sjc": {"sjc-1": 0}}
    signals = {("ewr", "shop"): {"primary": SIGNAL}}
    # ewr-3 connected after the window began: it may not have flushed yet
    assert silent_nodes(connected, signals, {"ewr-1"}, 3_000) == {
        "ewr": ("ewr-2",), "sjc": ("sjc-1",)}
    assert silent_nodes(connected, signals, {"ewr-1", "ewr-2", "sjc-1"}, 3_000) == {}


def test_prometheus_names_the_nodes_of_a_pop_without_series() -> None:
    connected = {"ewr": {"ewr-1": 0}, "sjc": {"sjc-1": 0, "sjc-2": 0}}
    signals = {("ewr", "shop"): {"primary": SIGNAL}}
    assert silent_nodes(connected, signals, None, 3_000) == {"sjc": ("sjc-1", "sjc-2")}


def test_the_fix_depends_on_the_source() -> None:
    sink = silent_fix("sjc", ("sjc-1",), "sink")
    assert "node(s) sjc-1 of PoP sjc stream no stats to Ballast" in sink
    assert "ballast bootstrap --pop sjc --node-id <id> --metrics-sink" in sink
    prometheus = silent_fix("sjc", ("sjc-1", "sjc-2"), "prometheus")
    assert 'no Prometheus series with ballast_pop="sjc" from node(s) sjc-1, sjc-2' in prometheus
    assert "labelled ballast_pop: sjc" in prometheus
