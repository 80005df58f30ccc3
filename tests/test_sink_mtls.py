"""With mTLS, the metrics sinks are bound to the sender's certificate: a node can report stats
for its own PoP only (metrics_service streams, OTLP exports, access logs)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from envoy.service.accesslog.v3 import als_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as otlp
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2

from control_plane.gen.ballast.v1 import metrics_service_pb2 as ms
from control_plane.gen.ballast.v1 import prometheus_metrics_pb2 as prom
from control_plane.observe.access_log import SERVICE as ALS_SERVICE
from control_plane.observe.access_log import AccessLogStore, add_access_log_service
from control_plane.observe.sink import METHOD, OTLP_METHOD, SinkStore, add_metrics_service
from control_plane.observe.source import wall_ms
from control_plane.security.cert_dir import CertDir, Pair
from control_plane.security.peer import check_node_peer, peer_pop
from control_plane.security.tls import ReloadingCredentials, TlsFiles
from harness.models import example_desired


@pytest.fixture
async def sink(tmp_path: Path) -> AsyncIterator[tuple[SinkStore, int, CertDir]]:
    certs = CertDir(tmp_path)
    authority, _ = certs.load_or_make_ca(1)
    certs.make_server(authority, ["127.0.0.1"], 1)
    certs.make_node(authority, "ewr", "ewr-1", 1)
    certs.make_admin(authority, "oncall", 1)
    store = SinkStore(desired=example_desired())
    server = grpc.aio.server()
    add_metrics_service(server, store, verify_peer=check_node_peer, peer_pop=peer_pop)
    credentials = ReloadingCredentials(TlsFiles(certs.server.cert, certs.server.key,
                                                certs.ca.cert))
    port = server.add_secure_port("127.0.0.1:0", credentials.credentials())
    await server.start()
    yield store, port, certs
    await server.stop(None)


def channel(port: int, certs: CertDir, pair: Pair) -> grpc.aio.Channel:
    return grpc.aio.secure_channel(f"127.0.0.1:{port}", grpc.ssl_channel_credentials(
        certs.ca.cert.read_bytes(), pair.key.read_bytes(), pair.cert.read_bytes()))


def flush(node_id: str, zone: str, value: float) -> bytes:
    labels = {"ballast_cluster": "shop.critical", "local_zone": zone, "upstream_zone": "primary"}
    metric = prom.Metric(label=[prom.LabelPair(name=k, value=v) for k, v in labels.items()],
                         counter=prom.Counter(value=value))
    message = ms.StreamMetricsMessage(envoy_metrics=[prom.MetricFamily(
        name="cluster.zone.upstream_rq_completed", type=prom.COUNTER, metric=[metric])])
    message.identifier.node.id = node_id
    message.identifier.node.locality.zone = zone
    return message.SerializeToString()


async def stream(ch: grpc.aio.Channel, *messages: bytes) -> None:
    async def each() -> AsyncIterator[bytes]:
        for message in messages:
            yield message
            await asyncio.sleep(0.05)

    call = ch.stream_unary(METHOD, request_serializer=None, response_deserializer=None)
    await call(each())


async def test_metrics_stream_of_the_certificates_node_counts_another_is_refused(
    sink: tuple[SinkStore, int, CertDir],
) -> None:
    store, port, certs = sink
    start = wall_ms()
    async with channel(port, certs, certs.node("ewr", "ewr-1")) as ch:
        await stream(ch, flush("ewr-1", "ewr", 10), flush("ewr-1", "ewr", 14))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stream(ch, flush("sjc-1", "sjc", 10), flush("sjc-1", "sjc", 99))
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "PoP 'ewr', the node claims PoP 'sjc'" in (refused.value.details() or "")
    now = wall_ms()
    signals = await store.window(now, now - start + 1000)
    assert signals[("ewr", "shop")]["primary"].requests == 4
    assert ("sjc", "shop") not in signals or signals[("sjc", "shop")]["primary"].requests == 0


def export(points: list[tuple[str, float]]) -> bytes:
    """rq_total of shop.critical's primary as seen by Envoys of the PoPs given."""
    data = [
        metrics_pb2.NumberDataPoint(as_int=int(value), attributes=[
            KeyValue(key="envoy.cluster_name", value=AnyValue(string_value="shop.critical")),
            KeyValue(key="envoy.endpoint_address", value=AnyValue(string_value="127.0.0.1:8081")),
            KeyValue(key="ballast_pop", value=AnyValue(string_value=pop)),
        ])
        for pop, value in points
    ]
    metric = metrics_pb2.Metric(name="cluster.endpoint.rq_total", sum=metrics_pb2.Sum(
        data_points=data, aggregation_temporality=metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE,
        is_monotonic=True))
    request = otlp.ExportMetricsServiceRequest(resource_metrics=[metrics_pb2.ResourceMetrics(
        instrumentation_library_metrics=[metrics_pb2.InstrumentationLibraryMetrics(
            metrics=[metric])])])
    return request.SerializeToString()


async def test_otlp_points_of_other_pops_are_dropped(
    sink: tuple[SinkStore, int, CertDir],
) -> None:
    store, port, certs = sink
    start = wall_ms()
    async with channel(port, certs, certs.node("ewr", "ewr-1")) as ch:
        call = ch.unary_unary(OTLP_METHOD, request_serializer=None, response_deserializer=None)
        await call(export([("ewr", 5), ("sjc", 5)]))
        await asyncio.sleep(0.01)
        await call(export([("ewr", 8), ("sjc", 500)]))
    windows = store.host_windows(start - 1, wall_ms() + 1)
    assert windows[("ewr", "shop", "primary")].requests == 3
    assert ("sjc", "shop", "primary") not in windows
    async with channel(port, certs, certs.admin("oncall")) as ch:
        call = ch.unary_unary(OTLP_METHOD, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call(export([("ewr", 9)]))
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED


def access_logs(node_id: str, zone: str) -> bytes:
    message = als_pb2.StreamAccessLogsMessage()
    message.identifier.node.id = node_id
    message.identifier.node.locality.zone = zone
    entry = message.http_logs.log_entry.add()
    entry.common_properties.upstream_cluster = "shop.critical"
    entry.common_properties.time_to_first_upstream_tx_byte.FromMilliseconds(12)
    entry.common_properties.time_to_last_downstream_tx_byte.FromMilliseconds(40)
    return message.SerializeToString()


async def test_access_logs_of_another_pop_are_refused(tmp_path: Path) -> None:
    certs = CertDir(tmp_path)
    authority, _ = certs.load_or_make_ca(1)
    certs.make_server(authority, ["127.0.0.1"], 1)
    node = certs.make_node(authority, "ewr", "ewr-1", 1)
    store = AccessLogStore()
    server = grpc.aio.server()
    add_access_log_service(server, store, verify_peer=check_node_peer)
    credentials = ReloadingCredentials(TlsFiles(certs.server.cert, certs.server.key,
                                                certs.ca.cert))
    port = server.add_secure_port("127.0.0.1:0", credentials.credentials())
    await server.start()
    try:
        async with channel(port, certs, node) as ch:
            call = ch.stream_unary(f"/{ALS_SERVICE}/StreamAccessLogs",
                                   request_serializer=None, response_deserializer=None)

            async def one(message: bytes) -> AsyncIterator[bytes]:
                yield message

            await call(one(access_logs("ewr-1", "ewr")))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call(one(access_logs("ewr-1", "sjc")))
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        kept = store.samples(wall_ms() + 1, 60_000)
        assert set(kept) == {("ewr", "shop.critical")}
    finally:
        await server.stop(None)
