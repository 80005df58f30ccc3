"""The `grpc_services:` section: gRPC services that proxyless gRPC clients dial (`xds:///`).

Each service is read into an `OriginGroup` with `grpc` set and no tiers, so the weight
controller, the cold-standby ramp, the rollout and the decision log treat it as any origin
group (one pair per PoP), while translation serves it to gRPC clients only. What gRPC itself
requires of what it is sent is checked here (gRFC A27): endpoint addresses are IP literals,
unique within the service; the target is a DNS-style name the clients dial as is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import yaml

from control_plane.desired.document import Document, Named
from control_plane.desired.fields import (
    HOSTNAME_RE,
    Bad,
    Fields,
    boolean,
    duration,
    host,
    integer,
    ip_address,
    text,
)
from control_plane.desired.layers import GROUP, read_layer
from control_plane.desired.model import (
    FailoverPolicy,
    GrpcService,
    HealthCheck,
    Origin,
    OriginGroup,
    StandbyRampPolicy,
    TierActionPolicy,
)
from control_plane.desired.origin_groups import read_preference
from control_plane.desired.policies import check_failover
from control_plane.desired.schema import (
    FAILOVER_FIELDS,
    HEALTH_CHECK_DEFAULTS,
    STANDBY_RAMP_FIELDS,
    build_from_layer,
)
from control_plane.desired.yaml_nodes import join

MAX_REQUESTS = 1_000_000
MAX_TIMEOUT_MS = 86_400_000
# the gRPC health service name probes ask about (grpc.health.v1): "" is the whole server
HEALTH_SERVICE_RE = re.compile(r"[A-Za-z0-9_.-]{0,200}")
MIRROR_KEYS = ("mirror_percent", "cacheable_routes")  # mirrors copy HTTP requests at an Envoy
RAMP_FIELDS = {k: v for k, v in STANDBY_RAMP_FIELDS.items() if k not in MIRROR_KEYS}
GRPC_HEALTH_FIELDS = {
    "interval": ("interval_ms", duration(100, 3_600_000)),
    "connect_timeout": ("connect_timeout_ms", duration()),
    "read_timeout": ("read_timeout_ms", duration()),
}


def target_name(node: yaml.Node) -> str:
    """What clients dial after `xds:///`, without the port: a DNS-style name."""
    value = text(node)
    if not HOSTNAME_RE.fullmatch(value):
        raise Bad(f"must be a DNS-style name like shop-api or shop-api.internal (the port is "
                  f"`port`), got {value!r}")
    return value


def health_service(node: yaml.Node) -> str:
    value = _string(node)
    if not HEALTH_SERVICE_RE.fullmatch(value):
        raise Bad(f"must be a gRPC service name like shop.v1.Catalog (or '' for the whole "
                  f"server), got {value!r}")
    return value


def _string(node: yaml.Node) -> str:
    if not isinstance(node, yaml.ScalarNode) or node.tag != "tag:yaml.org,2002:str":
        raise Bad("must be a string")
    return str(node.value)


def read_grpc_services(doc: Document, root: Fields, taken: Iterable[str]) -> list[OriginGroup]:
    """Every service of `grpc_services:` (absent: none); `taken`: the origin groups' names,
    which services may not reuse (a group's name identifies its pairs)."""
    node = root.node_of("grpc_services")
    if node is None:
        return []
    fields = Fields(node, "grpc_services", doc.sink)
    groups = set(taken)
    targets: dict[str, str] = {}
    services = []
    for named, value in doc.named_entries(fields, "gRPC service"):
        if named.name in groups:
            doc.sink.add(named.at, f"'{named.name}' is already an origin group; a gRPC service "
                         "needs a name of its own")
            continue
        service = _service(doc, named, Fields(value, named.at.path, doc.sink), targets)
        if service is not None:
            services.append(service)
    fields.finish()
    return services


def _service(doc: Document, named: Named, service: Fields,
             targets: dict[str, str]) -> OriginGroup | None:
    sink = doc.sink
    before = len(sink.problems)
    written = service.read("target", target_name)
    target = written or named.name
    port = service.read("port", integer(1, 65535), required=True)
    tls = bool(service.read("tls", boolean))
    max_requests = service.read("max_requests", integer(1, MAX_REQUESTS))
    timeout = service.read("timeout", duration(1, MAX_TIMEOUT_MS))
    if service.has("target") and written is None:
        pass  # its own problem is reported
    elif target in targets:
        sink.add(service.at("target"), f"target '{target}' is already served by gRPC service "
                 f"'{targets[target]}'")
    else:
        targets[target] = named.name
    origins, names = _origins(doc, service, port or 0, tls)
    preference = read_preference(doc, service, names)
    failover_fields = Fields(service.node_of("failover"), join(service.path, "failover"), sink)
    failover = doc.failover | read_layer(failover_fields, FAILOVER_FIELDS, GROUP)
    failover_fields.finish()
    check_failover(doc, failover, service.at("origins"), named.name, len(names))
    ramp_fields = Fields(service.node_of("standby_ramp"), join(service.path, "standby_ramp"),
                         sink)
    for key in MIRROR_KEYS:
        if ramp_fields.has(key):
            sink.add(ramp_fields.at(key), "cache-warming mirrors copy HTTP requests at an "
                     "Envoy; gRPC clients have none")
    ramp = doc.standby_ramp | read_layer(ramp_fields, RAMP_FIELDS, GROUP)
    ramp_fields.finish()
    health_fields = Fields(service.node_of("health_check"), join(service.path, "health_check"),
                           sink)
    health = HEALTH_CHECK_DEFAULTS | read_layer(health_fields, GRPC_HEALTH_FIELDS, GROUP)
    checked = health_fields.read("service", health_service) or ""
    health_fields.finish()
    service.finish()
    if len(sink.problems) > before or port is None or not service.ok:
        return None
    standby = build_from_layer(StandbyRampPolicy, ramp)
    return OriginGroup(
        name=named.name,
        origins=tuple(origins),
        preference=preference,
        max_origin_concurrency=max_requests or MAX_REQUESTS,
        tiers=(),
        failover=build_from_layer(FailoverPolicy, failover),
        health_check=build_from_layer(HealthCheck, health),
        tier_actions=TierActionPolicy(enabled=False),
        standby_ramp=StandbyRampPolicy(standby.enabled, standby.schedule, standby.cold_after_ms,
                                       standby.on_degrade, mirror_percent=0.0),
        grpc=GrpcService(target, port, tls, max_requests, timeout or 0, checked),
    )


def _origins(doc: Document, service: Fields, port: int,
             tls: bool) -> tuple[list[Origin], list[str]]:
    """The origins, and the names of all (also those with bad fields) for references. gRPC
    takes endpoint addresses as IP literals only, each address:port once (gRFC A27)."""
    sink = service.sink
    fields = Fields(service.node_of("origins"), join(service.path, "origins"), sink)
    if service.ok and not service.has("origins"):
        sink.add(service.at(), "missing required key 'origins'")
    elif fields.ok and not fields.entries:
        sink.add(fields.at(), "must list at least one origin")
    origins: list[Origin] = []
    names: list[str] = []
    seen: dict[tuple[str, int], str] = {}
    for named, node in doc.named_entries(fields, "origin"):
        origin_name = named.name
        names.append(origin_name)
        origin = Fields(node, named.at.path, sink)
        address = origin.read("address", ip_address, required=True)
        own_port = origin.read("port", integer(1, 65535))
        verify_name = origin.read("verify_name", host)
        if verify_name is not None and not tls:
            sink.add(origin.at("verify_name"), "verify_name needs tls: true on the service")
        origin.finish()
        if address is None:
            continue
        where = (address, own_port or port)
        if where in seen:
            sink.add(origin.at("address"), f"{address}:{where[1]} is already origin "
                     f"'{seen[where]}' of this service (gRPC refuses an address twice)")
            continue
        seen[where] = origin_name
        origins.append(Origin(origin_name, address, where[1], tls, verify_name=verify_name))
    fields.finish()
    return origins, names
