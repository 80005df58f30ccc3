"""`origin_groups.<name>`: the origins and TLS to them, the preference per PoP, the group's tiers
and its layers of the policies, session affinity."""

from __future__ import annotations

import yaml

from control_plane.desired.defaults import MAX_ORIGIN_CONCURRENCY
from control_plane.desired.document import Document, Named, quoted
from control_plane.desired.errors import At
from control_plane.desired.fields import (
    Converter,
    Fields,
    boolean,
    cert_pin,
    cookie_name,
    did_you_mean,
    duration,
    file_path,
    header_name,
    host,
    integer,
    name,
    sequence,
    spki_pin,
)
from control_plane.desired.layers import GROUP, Layer, Located, read_layer
from control_plane.desired.model import (
    Affinity,
    FailoverPolicy,
    HealthCheck,
    Origin,
    OriginGroup,
    OriginTlsPolicy,
    StandbyRampPolicy,
    Tier,
)
from control_plane.desired.policies import (
    check_failover,
    check_tiers,
    ramp_layer,
    resolve_tier_actions,
    tier_actions_layer,
)
from control_plane.desired.schema import (
    FAILOVER_FIELDS,
    HEALTH_CHECK_DEFAULTS,
    HEALTH_CHECK_FIELDS,
    build_from_layer,
    build_tier,
    read_tier_layer,
)
from control_plane.desired.yaml_nodes import join

VERIFY_KEYS = ("verify_name", "ca_file", "pin_spki_sha256", "pin_cert_sha256")
TLS_ONLY_KEYS = ("sni", "insecure_skip_verify", *VERIFY_KEYS)
MAX_PINS = 16
MAX_EXPIRY_WARNING_DAYS = 365
MAX_AFFINITY_TTL_MS = 365 * 86_400_000


def read_origin_groups(document: Document, doc: Fields) -> list[OriginGroup | None]:
    fields = Fields(doc.node_of("origin_groups"), "origin_groups", document.sink)
    document.note_broken(fields)
    if not doc.has("origin_groups") and not doc.has("grpc_services"):
        document.sink.add(doc.at(), "missing required key 'origin_groups'")
    elif fields.ok and not fields.entries:
        document.sink.add(fields.at(), "must list at least one origin group")
    result = []
    for named, node in document.named_entries(fields, "origin group"):
        group = _origin_group(document, named, Fields(node, named.at.path, document.sink))
        document.groups[named.name] = group
        result.append(group)
    fields.finish()
    return result


def _origin_group(document: Document, named: Named, group: Fields) -> OriginGroup | None:
    concurrency_value = group.read("max_origin_concurrency", integer(1, 1_000_000))
    concurrency = Located(concurrency_value, group.at("max_origin_concurrency"), GROUP)
    if not group.has("max_origin_concurrency"):
        concurrency = Located(MAX_ORIGIN_CONCURRENCY, None, GROUP)
    origin_tls = _origin_tls(document, group)
    origins, origin_names = _origins(document, group, origin_tls)
    preference = read_preference(document, group, origin_names)
    tiers, tier_layers = _group_tiers(document, group, concurrency)
    failover_fields = Fields(group.node_of("failover"), join(group.path, "failover"),
                             document.sink)
    failover = document.failover | read_layer(failover_fields, FAILOVER_FIELDS, GROUP)
    failover_fields.finish()
    check_failover(document, failover, group.at("origins"), named.name, len(origin_names))
    health_fields = Fields(group.node_of("health_check"), join(group.path, "health_check"),
                           document.sink)
    health = HEALTH_CHECK_DEFAULTS | read_layer(health_fields, HEALTH_CHECK_FIELDS, GROUP)
    health_fields.finish()
    actions = document.tier_actions | tier_actions_layer(
        document, group, join(group.path, "tier_actions"), GROUP)
    tier_actions = resolve_tier_actions(document, actions, tier_layers, group.at())
    ramp_fields = Fields(group.node_of("standby_ramp"), join(group.path, "standby_ramp"),
                         document.sink)
    ramp = document.standby_ramp | ramp_layer(document, ramp_fields, GROUP)
    ramp_fields.finish()
    affinity = _affinity(document, group)
    group.finish()
    if document.sink.problems or not group.ok or tier_actions is None:
        return None
    return OriginGroup(
        name=named.name,
        origins=tuple(origins),
        preference=preference,
        max_origin_concurrency=concurrency.value,
        tiers=tiers,
        failover=build_from_layer(FailoverPolicy, failover),
        health_check=build_from_layer(HealthCheck, health),
        tier_actions=tier_actions,
        origin_tls=origin_tls,
        standby_ramp=build_from_layer(StandbyRampPolicy, ramp),
        affinity=affinity,
    )


def _affinity(document: Document, group: Fields) -> Affinity | None:
    """`affinity: {cookie: NAME[, ttl: DURATION]}` or `{header: NAME}`; absent: off."""
    fields = Fields(group.node_of("affinity"), join(group.path, "affinity"), document.sink)
    if fields.node is None or not fields.ok:
        return None
    cookie = fields.read("cookie", cookie_name)
    header = fields.read("header", header_name)
    ttl = fields.read("ttl", duration(0, MAX_AFFINITY_TTL_MS))
    fields.finish()
    if (cookie is None) == (header is None):
        if fields.has("cookie") == fields.has("header"):
            document.sink.add(fields.at(), "affinity needs exactly one of cookie or header")
        return None
    if header is not None:
        if ttl is not None:
            document.sink.add(fields.at("ttl"), "ttl applies to a cookie only")
        return Affinity("header", header)
    return Affinity("cookie", cookie, ttl or 0)


def _origin_tls(document: Document, group: Fields) -> OriginTlsPolicy:
    fields = Fields(group.node_of("origin_tls"), join(group.path, "origin_tls"), document.sink)
    ca_file = fields.read("ca_file", file_path)
    days = fields.read("expiry_warning_days", integer(0, MAX_EXPIRY_WARNING_DAYS))
    fields.finish()
    default = OriginTlsPolicy()
    return OriginTlsPolicy(
        ca_file=ca_file or default.ca_file,
        expiry_warning_days=default.expiry_warning_days if days is None else days,
    )


def _origins(document: Document, group: Fields,
             origin_tls: OriginTlsPolicy) -> tuple[list[Origin], list[str]]:
    """The origins, and the names of all (also those with bad fields) for references."""
    fields = Fields(group.node_of("origins"), join(group.path, "origins"), document.sink)
    if group.ok and not group.has("origins"):
        document.sink.add(group.at(), "missing required key 'origins'")
    elif fields.ok and not fields.entries:
        document.sink.add(fields.at(), "must list at least one origin")
    origins, names = [], []
    for named, node in document.named_entries(fields, "origin"):
        names.append(named.name)
        origin = Fields(node, named.at.path, document.sink)
        address = origin.read("address", host, required=True)
        port = origin.read("port", integer(1, 65535), required=True)
        tls = origin.read("tls", boolean)
        sni = origin.read("sni", host)
        verify_name = origin.read("verify_name", host)
        ca_file = origin.read("ca_file", file_path)
        skip = origin.read("insecure_skip_verify", boolean)
        spki_pins = _pins(document, origin, "pin_spki_sha256", spki_pin)
        cert_pins = _pins(document, origin, "pin_cert_sha256", cert_pin)
        for key in TLS_ONLY_KEYS:
            if origin.has(key) and not tls:
                document.sink.add(origin.at(key), f"{key} needs tls: true")
        if skip and any(origin.has(key) for key in VERIFY_KEYS):
            document.sink.add(origin.at("insecure_skip_verify"), "insecure_skip_verify: true "
                              "turns verification off; remove it or the verification keys ("
                              + ", ".join(k for k in VERIFY_KEYS if origin.has(k)) + ")")
        origin.finish()
        if address is not None and port is not None:
            origins.append(Origin(
                named.name, address, port, bool(tls), sni,
                verify=not skip,
                ca_file=ca_file or origin_tls.ca_file,
                verify_name=verify_name,
                spki_pins=spki_pins,
                cert_pins=cert_pins,
            ))
    fields.finish()
    return origins, names


def _pins(document: Document, origin: Fields, key: str, convert: Converter[str]) -> tuple[str, ...]:
    path = join(origin.path, key)
    node = origin.node_of(key)
    items = sequence(node, path, document.sink)
    if isinstance(node, yaml.SequenceNode) and not items:
        document.sink.add(At.of(node, path), "must list at least one pin (or leave it out)")
    if len(items) > MAX_PINS:
        document.sink.add(At.of(items[MAX_PINS], path), f"at most {MAX_PINS} pins")
    pins = (origin.convert(item, f"{path}[{i}]", convert) for i, item in enumerate(items))
    return tuple(pin for pin in pins if pin is not None)


def read_preference(document: Document, group: Fields,
                    origin_names: list[str]) -> dict[str, tuple[str, ...]]:
    node = group.node_of("preference")
    if node is None:
        return {pop: tuple(origin_names) for pop in document.pops}
    fields = Fields(node, join(group.path, "preference"), document.sink)
    preference: dict[str, tuple[str, ...]] = {}
    for key, value in fields.items():
        pop = str(key.value)
        pop_path = join(fields.path, pop)
        if "pops" in document.broken:
            continue
        if pop not in document.pops:
            document.sink.add(At.of(key, fields.path), f"unknown pop '{pop}'"
                              + did_you_mean(pop, list(document.pops)))
            continue
        order: list[str] = []
        for index, item in enumerate(sequence(value, pop_path, document.sink)):
            origin = fields.convert(item, f"{pop_path}[{index}]", name("origin"))
            item_at = At.of(item, f"{pop_path}[{index}]")
            if origin is None:
                continue
            if origin not in origin_names:
                document.sink.add(item_at, f"unknown origin '{origin}'"
                                  + did_you_mean(origin, origin_names))
            elif origin in order:
                document.sink.add(item_at, f"origin '{origin}' is listed twice")
            else:
                order.append(origin)
        missing = [o for o in origin_names if o not in order]
        if missing and isinstance(value, yaml.SequenceNode):
            document.sink.add(At.of(value, pop_path), f"missing origin(s) {quoted(missing)}; "
                              "list every origin of the group, most preferred first")
        preference[pop] = tuple(order)
    for pop in document.pops:
        if fields.ok and pop not in fields.entries:
            document.sink.add(fields.at(), f"pop '{pop}' is missing; every pop needs a "
                              "preference order (or leave preference out: listed order)")
    fields.finish()
    return preference


def _group_tiers(document: Document, group: Fields, concurrency: Located
) -> tuple[tuple[Tier, ...], dict[str, Layer]]:
    layers = {name: dict(layer) for name, layer in document.tier_layers.items()}
    fields = Fields(group.node_of("tiers"), join(group.path, "tiers"), document.sink)
    for key, node in fields.items():
        tier_name = str(key.value)
        if tier_name not in layers:
            document.sink.add(At.of(key, fields.path), f"unknown tier '{tier_name}'"
                              + did_you_mean(tier_name, list(layers)))
            continue
        tier = Fields(node, join(fields.path, tier_name), document.sink)
        layers[tier_name] |= read_tier_layer(tier, GROUP)
        tier.finish()
    fields.finish()
    set_at = fields.at() if fields.node is not None else document.tiers_at
    check_tiers(document, layers, set_at, concurrency)
    if document.sink.problems:
        return (), layers
    return tuple(build_tier(name, layer) for name, layer in layers.items()), layers
