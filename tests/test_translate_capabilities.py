"""The queue-policy gate: what a node's `node.extensions` (names, type URLs, `disabled`) earn it,
and what each Envoy release `ballast render/bootstrap --envoy-version` knows."""

from __future__ import annotations

import pytest
from envoy.config.core.v3.base_pb2 import Node
from google.protobuf.struct_pb2 import Struct

from control_plane.translate import translate_pop
from control_plane.translate.bootstrap import ads_bootstrap
from control_plane.translate.capabilities import (
    ADAPTIVE_LIFO_TYPE_NAME,
    ENVOY_RELEASES,
    FIFO_TYPE_NAME,
    read_node_capabilities,
)
from control_plane.translate.envoy_http_filters import ENVOY_1_40_HTTP_FILTER_TYPES
from control_plane.translate.listeners import access_log
from control_plane.translate.mirror import is_mirror_cluster
from control_plane.translate.queue_policy import read_back
from control_plane.translate.resources import CLUSTER_TYPE, LISTENER_TYPE, Capabilities
from harness.models import example_desired

FIFO = "envoy.queue_policy.fifo"
LIFO = "envoy.queue_policy.adaptive_lifo"
CATEGORY = "envoy.queue_policy"


def node(*extensions: tuple[str, list[str], bool]) -> Node:
    """A node listing Envoy 1.40's HTTP filters (so the filter gate holds nothing back) and
    `extensions` (name, type URLs, disabled) as queue policies."""
    result = Node(id="n")
    for type_name in sorted(ENVOY_1_40_HTTP_FILTER_TYPES):
        result.extensions.add(name=type_name, category="envoy.filters.http",
                              type_urls=[type_name])
    for name, type_urls, disabled in extensions:
        result.extensions.add(name=name, category=CATEGORY, type_urls=type_urls, disabled=disabled)
    return result


@pytest.mark.parametrize(
    ("extensions", "key", "why"),
    [
        ((), "none", "do not list envoy.queue_policy.fifo: Cluster field 62 not sent"),
        (((FIFO, [FIFO_TYPE_NAME], False),), "fifo",
         "list envoy.queue_policy.fifo and do not list envoy.queue_policy.adaptive_lifo"),
        (((FIFO, [FIFO_TYPE_NAME], True),), "none",
         "list as disabled envoy.queue_policy.fifo"),
        # Envoy picks by type URL: a FIFO entry under another type is not the policy we send
        (((FIFO, ["envoy.extensions.queue_policy.fifo.v4.Other"], False),), "none",
         "list under other type URLs than " + FIFO_TYPE_NAME),
        # a renamed extension with our type URL is the policy we send
        ((("vendor.fifo", [FIFO_TYPE_NAME], False),), "fifo", "list envoy.queue_policy.fifo"),
        (((FIFO, [], False),), "fifo", "list envoy.queue_policy.fifo"),
        (((FIFO, [FIFO_TYPE_NAME], False), (LIFO, [ADAPTIVE_LIFO_TYPE_NAME], False)), "lifo",
         "list envoy.queue_policy.fifo and envoy.queue_policy.adaptive_lifo"),
        (((FIFO, [FIFO_TYPE_NAME], False), (LIFO, [ADAPTIVE_LIFO_TYPE_NAME], True)), "fifo",
         "list as disabled envoy.queue_policy.adaptive_lifo"),
        # adaptive LIFO alone: Envoy without the FIFO policy has no field 62 to carry it in
        (((LIFO, [ADAPTIVE_LIFO_TYPE_NAME], False),), "none", "Cluster field 62 not sent"),
    ],
)
def test_queue_policy_gate(
    extensions: tuple[tuple[str, list[str], bool], ...], key: str, why: str
) -> None:
    read = read_node_capabilities(node(*extensions))
    assert read.capabilities.key == key
    assert why in read.reason


def test_no_queue_policy_means_no_field_62_and_a_note_for_lifo_tiers() -> None:
    none = translate_pop(example_desired(), "ewr", Capabilities(queue_policies=False))
    fifo = translate_pop(example_desired(), "ewr", Capabilities())
    for name, resource in none.of_type(CLUSTER_TYPE).items():
        assert not read_back(resource.payload).HasField("queuing_policies"), name
    assert all(read_back(r.payload).HasField("queuing_policies")  # every tier cluster
               for name, r in fifo.of_type(CLUSTER_TYPE).items() if not is_mirror_cluster(name))
    # the example's tiers ask for adaptive LIFO: each says why it gets no queue policy at all
    assert none.notes
    assert all("node lists no queue policy: field 62 not sent" in n for n in none.notes)


def test_releases_from_1_36_know_field_62_only_from_1_40() -> None:
    assert list(ENVOY_RELEASES) == ["1.36", "1.37", "1.38", "1.39", "1.40"]
    assert [r.capabilities.key for r in ENVOY_RELEASES.values()] == ["none"] * 4 + ["fifo"]


def test_metrics_sink_bootstrap_for_1_36_has_no_drop_action() -> None:
    def otel(release: str) -> dict:
        sinks = ads_bootstrap(node_id="n", pop="ewr", metrics_sink=True,
                              envoy_release=release)["stats_sinks"]
        (sink,) = [s for s in sinks if s["name"] == "envoy.stat_sinks.open_telemetry"]
        return sink["typed_config"]

    assert "DropAction" not in str(otel("1.36"))
    assert "custom_metric_conversions" not in otel("1.36")
    assert "DropAction" in str(otel("1.37")) and "DropAction" in str(otel("1.40"))


def test_a_node_asking_for_access_logs_gets_listeners_with_the_grpc_access_log() -> None:
    node = Node(id="n")
    metadata = Struct()
    metadata.update({"ballast_access_log": True})
    node.metadata.CopyFrom(metadata)
    found = read_node_capabilities(node)
    assert found.capabilities.access_log and found.capabilities.key == "none+als"
    assert "ballast_access_log" in found.reason
    plain = translate_pop(example_desired(), "ewr", Capabilities())
    logged = translate_pop(example_desired(), "ewr", Capabilities(access_log=True))
    assert plain.of_type(LISTENER_TYPE)["edge"].payload != logged.of_type(LISTENER_TYPE)[
        "edge"].payload
    text = str(logged.of_type(LISTENER_TYPE)["edge"].message)
    assert "envoy.access_loggers.http_grpc" in text and "ballast_xds" in text
    sampled = access_log(example_desired().access_log.sample_rate).filter.runtime_filter
    assert sampled.percent_sampled.numerator == 100_000  # 10 % per million
    assert sampled.use_independent_randomness
