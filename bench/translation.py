"""Translation and serialization: `translate_pop` per PoP, and the ways to put a response on the
wire — packing `Any` per response, reusing `Resource.payload` in a message built per stream,
and pre-serialized resources with only version and nonce added per stream.
"""

from __future__ import annotations

from typing import Any

from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryResponse, DiscoveryResponse

from bench.common import desired_by_name, table, time_per_call
from control_plane.ads.encoding import ResponseEncoder
from control_plane.ads.protocol import DeltaResponse, SotwResponse
from control_plane.ads.server import encode_delta, encode_sotw
from control_plane.translate import translate_pop
from control_plane.translate.resources import (
    CLUSTER_TYPE,
    ENDPOINT_TYPE,
    LISTENER_TYPE,
    ROUTE_TYPE,
    Capabilities,
    PopResources,
    Resource,
)

SHORT = {CLUSTER_TYPE: "CDS", ENDPOINT_TYPE: "EDS", LISTENER_TYPE: "LDS", ROUTE_TYPE: "RDS"}
# The measured floor (docs/architecture.md, "gRPC and the fan-out floor"), per response at
# 50 resources: pack Any 286 µs, build message + serialize 60 µs,
# pre-serialized prefix + concatenation 3 µs
FLOOR_US = {"pack_any": 286.0, "message": 60.0, "preserialized": 3.0}


def bench_translate(min_time: float) -> list[dict[str, Any]]:
    rows = []
    for name in ("example", "large"):
        desired = desired_by_name(name)
        for caps in (Capabilities(adaptive_lifo=False), Capabilities(adaptive_lifo=True)):
            seconds = time_per_call(lambda d=desired, c=caps: translate_pop(d, "ewr", c),
                                    min_time=min_time)
            resources = translate_pop(desired, "ewr", caps)
            count = sum(len(items) for items in resources.by_type.values())
            size = {
                SHORT[t]: sum(len(r.payload) for r in items.values())
                for t, items in resources.by_type.items()
            }
            rows.append({
                "desired": name, "caps": caps.key, "resources": count, "us": seconds * 1e6,
                "us_per_resource": seconds * 1e6 / count, "bytes": size,
                "total_bytes": sum(size.values()),
            })
    return rows


def pack_any(response: SotwResponse) -> bytes:
    """Every stream packs every message again (no shared payload)."""
    message = DiscoveryResponse(
        version_info=response.version, type_url=response.type_url, nonce=response.nonce
    )
    for item in response.resources:
        message.resources.add().Pack(item.message)
    return message.SerializeToString()


def bench_serialize(min_time: float) -> list[dict[str, Any]]:
    large = translate_pop(desired_by_name("large"), "ewr", Capabilities())
    example = translate_pop(desired_by_name("example"), "ewr", Capabilities())
    cases: list[tuple[str, PopResources, str, int]] = [
        ("example", example, CLUSTER_TYPE, 3),
        ("example", example, ENDPOINT_TYPE, 3),
        ("large", large, CLUSTER_TYPE, 50),
        ("large", large, ENDPOINT_TYPE, 50),
        ("large", large, CLUSTER_TYPE, 150),
        ("large", large, ENDPOINT_TYPE, 150),
    ]
    rows = []
    for name, snapshot, type_url, count in cases:
        items: tuple[Resource, ...] = tuple(snapshot.of_type(type_url).values())[:count]
        sotw = SotwResponse(type_url, "0123456789abcdef", "17", items)
        delta = DeltaResponse(type_url, "0123456789abcdef", "17", items, ())
        encoder = ResponseEncoder()
        # the three paths must give the same message
        expected = encode_sotw(sotw)
        assert DiscoveryResponse.FromString(pack_any(sotw)) == expected
        assert DiscoveryResponse.FromString(encoder.encode(sotw)) == expected
        assert DeltaDiscoveryResponse.FromString(encoder.encode(delta)) == encode_delta(delta)
        t = {
            "pack_any": time_per_call(lambda r=sotw: pack_any(r), min_time=min_time),
            "message": time_per_call(lambda r=sotw: encode_sotw(r).SerializeToString(),
                                     min_time=min_time),
            "preserialized": time_per_call(lambda r=sotw, e=encoder: e.encode(r),
                                           min_time=min_time),
            "delta_message": time_per_call(lambda r=delta: encode_delta(r).SerializeToString(),
                                           min_time=min_time),
            "delta_preserialized": time_per_call(lambda r=delta, e=encoder: e.encode(r),
                                                 min_time=min_time),
        }
        rows.append({
            "desired": name, "type": SHORT[type_url], "resources": count,
            "bytes": len(expected.SerializeToString()),
            **{f"{k}_us": v * 1e6 for k, v in t.items()},
            "pack_any_vs_message": t["pack_any"] / t["message"],
            "message_vs_preserialized": t["message"] / t["preserialized"],
            "delta_message_vs_preserialized": t["delta_message"] / t["delta_preserialized"],
        })
    return rows


def run(*, quick: bool) -> dict[str, Any]:
    min_time = 0.05 if quick else 0.2
    return {"translate": bench_translate(min_time), "serialize": bench_serialize(min_time)}


def report(results: dict[str, Any]) -> str:
    translate = table(
        ["desired", "caps", "resources", "µs/PoP", "µs/resource", "bytes", "CDS", "EDS", "LDS",
         "RDS"],
        [[r["desired"], r["caps"], r["resources"], r["us"], r["us_per_resource"],
          r["total_bytes"], *(r["bytes"].get(k, 0) for k in ("CDS", "EDS", "LDS", "RDS"))]
         for r in results["translate"]],
    )
    serialize = table(
        ["desired", "type", "resources", "bytes", "pack Any µs", "message µs", "pre-ser. µs",
         "Any/msg", "msg/pre", "delta msg µs", "delta pre µs", "delta msg/pre"],
        [[r["desired"], r["type"], r["resources"], r["bytes"], r["pack_any_us"],
          r["message_us"], r["preserialized_us"], r["pack_any_vs_message"],
          r["message_vs_preserialized"], r["delta_message_us"], r["delta_preserialized_us"],
          r["delta_message_vs_preserialized"]]
         for r in results["serialize"]],
    )
    notes = ", ".join(f"{k} {v:g} µs" for k, v in FLOOR_US.items())
    return (
        f"translate_pop, one PoP (ewr), all types:\n{translate}\n\n"
        "Serialization of one SotW response per stream (version + nonce differ per stream):\n"
        "  pack Any = DiscoveryResponse with Any.Pack(message) per resource, serialized;\n"
        "  message  = DiscoveryResponse built per stream from Resource.payload, serialized;\n"
        "  pre-ser. = resources serialized once (cached), version + nonce appended per stream.\n"
        f"{serialize}\n(the measured floor at 50 resources: {notes})"
    )
