"""The whole document, section by section: every check, every cross-reference, then the model.

`build_desired` reads the root node into a `Desired`, recording every problem it meets on the
way; it returns None when any was found, so a half-valid model never leaves this module.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import yaml

from control_plane.desired.defaults import DEFAULT_TIER_NAME, MAX_ORIGIN_CONCURRENCY
from control_plane.desired.errors import At, Sink
from control_plane.desired.fields import (
    Bad,
    Converter,
    Fields,
    boolean,
    cert_pin,
    check_name,
    cookie_name,
    did_you_mean,
    duration,
    file_path,
    header_name,
    host,
    integer,
    ip_address,
    name,
    network,
    path_prefix,
    sequence,
    spki_pin,
    text,
)
from control_plane.desired.filter_types import DEFAULT_ALLOWED, AllowedFilters, refusal
from control_plane.desired.grpc_services import read_grpc_services
from control_plane.desired.layers import (
    GLOBAL,
    GROUP,
    Layer,
    Located,
    blame,
    known,
    read_layer,
)
from control_plane.desired.model import (
    AccessLog,
    Affinity,
    ClassificationRule,
    Desired,
    ExtraFilter,
    FailoverPolicy,
    HeaderMatch,
    HealthCheck,
    Listener,
    ListenerTls,
    Origin,
    OriginGroup,
    OriginTlsPolicy,
    Pop,
    RolloutGates,
    RolloutPolicy,
    ServedCertificate,
    StandbyRampPolicy,
    Tier,
    TierActionPolicy,
    VirtualHost,
)
from control_plane.desired.schema import (
    ACCESS_LOG_FIELDS,
    DEFAULT_TIER_LAYERS,
    FAILOVER_DEFAULTS,
    FAILOVER_FIELDS,
    HEALTH_CHECK_DEFAULTS,
    HEALTH_CHECK_FIELDS,
    LISTENER_TLS_FIELDS,
    NEW_TIER_DEFAULTS,
    NO_TIER,
    ROLLOUT_FIELDS,
    ROLLOUT_GATE_FIELDS,
    STANDBY_RAMP_DEFAULTS,
    STANDBY_RAMP_FIELDS,
    TIER_ACTION_DEFAULTS,
    TIER_ACTION_FIELDS,
    TIER_ACTION_TIERS,
    TIER_REQUIRED,
    build_from_layer,
    build_tier,
    domain,
    read_tier_layer,
    server_name,
    tier_or_none,
)
from control_plane.desired.served_certs import chain_pem, load_chain, served_certificate
from control_plane.desired.typed_json import typed_config
from control_plane.desired.yaml_nodes import is_null, join, plain_value

HEADER_KINDS = ("exact", "prefix", "contains", "present")
CATCH_ALL_ROUTE_NAME = "default"  # the route of unmatched requests (translate/routes.py)
VERIFY_KEYS = ("verify_name", "ca_file", "pin_spki_sha256", "pin_cert_sha256")
TLS_ONLY_KEYS = ("sni", "insecure_skip_verify", *VERIFY_KEYS)
MAX_PINS = 16
MAX_EXPIRY_WARNING_DAYS = 365
MAX_TRUSTED_SOURCES = 64
MAX_EXTRA_FILTERS = 16
# a certificate directory's layouts: certbot's live/<name>/, cert-manager's Secret volume
CERT_DIR_LAYOUTS = (("fullchain.pem", "privkey.pem"), ("tls.crt", "tls.key"))
RESERVED_FILTERS = frozenset({"envoy.filters.http.router"})


class Files(Protocol):
    """How certificate files are read while the document is checked (the loader's, or a
    test's), and the time their dates are judged at."""

    now_s: float

    def read(self, path: str) -> bytes:
        """The file's bytes; OSError when it cannot be read."""

    def exists(self, path: str) -> bool: ...


class NoFiles:
    """Every file is missing (documents checked without a file system)."""

    now_s = 0.0

    def read(self, path: str) -> bytes:
        raise FileNotFoundError(2, "No such file or directory", path)

    def exists(self, path: str) -> bool:
        return False


def build_desired(root: yaml.Node, sink: Sink, digest: str, files: Files | None = None,
                  allowed_filters: AllowedFilters = DEFAULT_ALLOWED) -> Desired | None:
    """`allowed_filters`: the HTTP filter types `http_filters` may use (None: any)."""
    return _Document(sink, files or NoFiles(), allowed_filters).read(root, digest)


MAX_AFFINITY_TTL_MS = 365 * 86_400_000


@dataclass(frozen=True)
class _Named:
    """A name read from a key or a `name:` field, with where it was written."""

    name: str
    at: At


class _Document:
    def __init__(self, sink: Sink, files: Files, allowed_filters: AllowedFilters) -> None:
        self.sink = sink
        self.files = files
        self.allowed_filters = allowed_filters
        self.pops: dict[str, Pop] = {}
        self.tier_layers: dict[str, Layer] = {}
        self.tiers_at = At(1, 1, "tiers")
        self.failover: Layer = dict(FAILOVER_DEFAULTS)
        self.tier_actions: Layer = dict(TIER_ACTION_DEFAULTS)
        self.standby_ramp: Layer = dict(STANDBY_RAMP_DEFAULTS)
        self.cacheable_routes: list[Located] = []  # every `cacheable_routes` written
        self.groups: dict[str, OriginGroup | None] = {}
        self.unsure_pops: set[str] = set()  # a bad address or offset: skip their port checks
        self.broken: set[str] = set()  # sections that are not mappings: skip references to them

    def read(self, root: yaml.Node, digest: str) -> Desired | None:
        doc = Fields(root, "", self.sink, " (the whole document)")
        if not doc.ok:
            return None
        self.pops = self._pops(doc)
        self._tiers(doc.node_of("tiers"))
        failover = Fields(doc.node_of("failover"), "failover", self.sink)
        self.failover |= read_layer(failover, FAILOVER_FIELDS, GLOBAL)
        failover.finish()
        self._check_failover(self.failover, failover.at())
        self.tier_actions |= self._tier_actions_layer(doc, "tier_actions", GLOBAL)
        ramp = Fields(doc.node_of("standby_ramp"), "standby_ramp", self.sink)
        self.standby_ramp |= self._ramp_layer(ramp, GLOBAL)
        ramp.finish()
        access = Fields(doc.node_of("access_log"), "access_log", self.sink)
        access_log = read_layer(access, ACCESS_LOG_FIELDS, GLOBAL)
        access.finish()
        groups = self._origin_groups(doc)
        services = read_grpc_services(self, doc, self.groups)
        default_tier, rules, trusted = self._classification(doc)
        self._check_cacheable_routes({rule.name for rule in rules} | {CATCH_ALL_ROUTE_NAME})
        listeners = self._listeners(doc)
        rollout = self._rollout(doc)
        doc.finish()
        if self.sink.problems:
            return None
        return Desired(
            pops=tuple(self.pops.values()),
            origin_groups=(*(g for g in groups if g is not None), *services),
            classification=tuple(rules),
            default_tier=default_tier,
            listeners=tuple(listeners),
            trusted_priority_sources=trusted,
            access_log=AccessLog(**{k: v.value for k, v in access_log.items()}),
            rollout=rollout,
            source=self.sink.source,
            digest=digest,
            loaded_at_s=self.files.now_s,
        )

    # --- rollout -----------------------------------------------------------------------------

    def _rollout(self, doc: Fields) -> RolloutPolicy:
        """The `rollout:` section: strategy, canary PoPs (which must exist), waves, bake time
        and the gates' thresholds; every key optional."""
        fields = Fields(doc.node_of("rollout"), "rollout", self.sink)
        layer = read_layer(fields, ROLLOUT_FIELDS, GLOBAL)
        gates = Fields(fields.node_of("gates"), "rollout.gates", self.sink)
        gate_layer = read_layer(gates, ROLLOUT_GATE_FIELDS, GLOBAL)
        gates.finish()
        fields.finish()
        canary = layer.get("canary")
        if canary is not None and canary.value and "pops" not in self.broken:
            for pop in canary.value:
                if pop not in self.pops and canary.at is not None:
                    self.sink.add(canary.at, f"unknown pop '{pop}'"
                                  + did_you_mean(pop, list(self.pops)))
        written = {key: located.value for key, located in layer.items()
                   if located.value is not None}
        gate_values = {key: located.value for key, located in gate_layer.items()
                       if located.value is not None}
        policy = RolloutPolicy(**written, gates=RolloutGates(**gate_values))
        bake, flush = layer.get("bake_ms"), layer.get("stats_flush_interval_ms")
        if policy.strategy == "waves" and policy.bake_ms < policy.min_bake_ms:
            self.sink.add(blame(fields.at(), *(x for x in (bake, flush) if x is not None)),
                          f"bake ({policy.bake_ms / 1000:g}s) is below "
                          f"{policy.min_bake_ms / 1000:g}s, two stats flushes (Envoys flush "
                          f"every {policy.stats_flush_interval_ms / 1000:g}s, "
                          "stats_flush_interval): the first flush after a wave's ACKs still "
                          "carries traffic served on the old version, so its gate could not "
                          "judge one full flush of the change's own")
        return policy

    # --- standby ramp ------------------------------------------------------------------------

    def _ramp_layer(self, fields: Fields, layer: int) -> Layer:
        result = read_layer(fields, STANDBY_RAMP_FIELDS, layer)
        if "cacheable_routes" in result:
            self.cacheable_routes.append(result["cacheable_routes"])
        return result

    def _check_cacheable_routes(self, routes: set[str]) -> None:
        for written in self.cacheable_routes:
            for route in written.value or ():
                if route not in routes and written.at is not None:
                    self.sink.add(written.at, f"unknown route '{route}' (classification rule "
                                  f"names or {CATCH_ALL_ROUTE_NAME})" + did_you_mean(route, routes))

    # --- helpers -----------------------------------------------------------------------------

    def _named_entries(self, fields: Fields, what: str) -> Iterable[tuple[_Named, yaml.Node]]:
        """Entries of a mapping keyed by names; bad names are reported and skipped."""
        for key, value in fields.items():
            entry_path = join(fields.path, str(key.value))
            try:
                check_name(str(key.value), what)
            except Bad as bad:
                self.sink.add(At.of(key, fields.path), str(bad))
                continue
            yield _Named(str(key.value), At.of(value, entry_path)), value

    def _list(self, parent: Fields, key: str, what: str,
              required: bool = True) -> tuple[str, list[yaml.Node]]:
        """The path and items of the list under `key`; a missing key (when `required`), a
        non-list and an empty list are problems (`must list at least one <what>`)."""
        path = join(parent.path, key)
        node = parent.node_of(key)
        if required and parent.ok and node is None:
            self.sink.add(parent.at(), f"missing required key '{key}'")
        items = sequence(node, path, self.sink)
        if isinstance(node, yaml.SequenceNode) and not items:
            self.sink.add(At.of(node, path), f"must list at least one {what}")
        return path, items

    def _unique_names(self, items: list[yaml.Node], path: str, what: str) -> list[
            tuple[_Named | None, Fields]]:
        """List items that are mappings with a `name:`; duplicates are reported."""
        result: list[tuple[_Named | None, Fields]] = []
        seen: dict[str, int] = {}
        for index, item in enumerate(items):
            fields = Fields(item, f"{path}[{index}]", self.sink)
            value = fields.read("name", name(what), required=True)
            named = _Named(value, fields.at("name")) if value is not None else None
            if named is not None and named.name in seen:
                self.sink.add(named.at, f"duplicate {what} name '{named.name}' "
                              f"(first at line {seen[named.name]})")
            elif named is not None:
                seen[named.name] = named.at.line
            result.append((named, fields))
        return result

    def _reference(self, fields: Fields, key: str, section: str, options: Iterable[str],
                   required: bool = True) -> str | None:
        """A name that must exist in `section` (unchecked when that section is broken)."""
        value = fields.read(key, text, required=required)
        choices = list(options)
        what = {"tiers": "tier", "origin_groups": "origin group"}[section]
        if value is not None and value not in choices and section not in self.broken:
            self.sink.add(fields.at(key),
                          f"unknown {what} '{value}'" + did_you_mean(value, choices))
            return None
        return value

    def _note_broken(self, section: Fields) -> None:
        if not section.ok:
            self.broken.add(section.path)

    # --- pops --------------------------------------------------------------------------------

    def _pops(self, doc: Fields) -> dict[str, Pop]:
        fields = Fields(doc.node_of("pops"), "pops", self.sink)
        self._note_broken(fields)
        if not doc.has("pops"):
            self.sink.add(doc.at(), "missing required key 'pops' (the edge locations, by name)")
        elif fields.ok and not fields.entries:
            self.sink.add(fields.at(), "must list at least one pop")
        pops: dict[str, Pop] = {}
        for named, node in self._named_entries(fields, "pop"):
            pop = Fields(node if not is_null(node) else None, named.at.path, self.sink)
            address = pop.read("listen_address", ip_address)
            offset = pop.read("port_offset", integer(0, 65534))
            pop.finish()
            if (pop.has("listen_address") and address is None) or (
                    pop.has("port_offset") and offset is None):
                self.unsure_pops.add(named.name)
            pops[named.name] = Pop(named.name, address or "0.0.0.0", offset or 0)
        fields.finish()
        return pops

    # --- tiers -------------------------------------------------------------------------------

    def _tiers(self, node: yaml.Node | None) -> None:
        if node is None:
            self.tier_layers = {name: dict(layer) for name, layer in DEFAULT_TIER_LAYERS.items()}
            return
        fields = Fields(node, "tiers", self.sink)
        self._note_broken(fields)
        self.tiers_at = fields.at()
        if fields.ok and not fields.entries:
            self.sink.add(fields.at(), "must list at least one tier (or leave tiers out for "
                          "the defaults critical, normal, background)")
        for named, tier_node in self._named_entries(fields, "tier"):
            tier = Fields(tier_node, named.at.path, self.sink)
            base = DEFAULT_TIER_LAYERS.get(named.name)
            if base is None:
                missing = [key for key in TIER_REQUIRED if not tier.has(key)]
                if tier.ok and missing:
                    self.sink.add(tier.at(), f"missing required key(s) {_quoted(missing)} (only "
                                  "the default tiers critical, normal, background have defaults)")
                base = NEW_TIER_DEFAULTS
            self.tier_layers[named.name] = base | read_tier_layer(tier, GLOBAL)
            tier.finish()
        fields.finish()
        self._check_tiers(self.tier_layers, self.tiers_at, None)

    def _check_tiers(self, layers: dict[str, Layer], set_at: At,
                     concurrency: Located | None) -> None:
        """Shares sum to 100, priorities differ, watermarks are ordered, each tier gets a pool."""
        shares = [layer["share_percent"] for layer in layers.values() if "share_percent" in layer]
        if shares and len(shares) == len(layers) and known(*shares):
            total = sum(s.value for s in shares)
            if total != 100:
                parts = " + ".join(f"{n} {lay['share_percent'].value}" for n, lay in layers.items())
                at = set_at if _layer_of(shares) == GROUP else self.tiers_at
                self.sink.add(at, f"tier shares must sum to 100, got {total} ({parts})")
        seen: dict[int, str] = {}
        for tier_name, layer in layers.items():
            priority = layer.get("priority")
            if priority is not None and known(priority):
                if priority.value in seen:
                    self.sink.add(blame(set_at, priority), f"tiers '{seen[priority.value]}' and "
                                  f"'{tier_name}' both have priority {priority.value}; "
                                  "priorities must differ")
                seen.setdefault(priority.value, tier_name)
            self._check_hedging(tier_name, layer, set_at)
            high, low = layer["high_watermark"], layer["low_watermark"]
            if known(high, low) and low.value >= high.value:
                self.sink.add(blame(set_at, high, low), f"low_watermark ({low.value}) must be "
                              f"below high_watermark ({high.value})")
            share = layer.get("share_percent")
            if concurrency is not None and share is not None and known(share, concurrency):
                connections = share.value * concurrency.value // 100
                if connections < 1:
                    self.sink.add(blame(set_at, share, concurrency),
                                  f"tier '{tier_name}' gets {share.value}% of "
                                  f"max_origin_concurrency {concurrency.value} = 0 connections; "
                                  "raise the share or max_origin_concurrency")

    def _check_hedging(self, tier_name: str, layer: Layer, set_at: At) -> None:
        """A hedge is a retry (it needs one left) sent before the attempt's read timeout."""
        hedge = layer.get("hedge_delay_ms")
        if hedge is None or not known(hedge) or not hedge.value:
            return
        retries, read = layer.get("retries"), layer.get("read_timeout_ms")
        if retries is not None and known(retries) and retries.value < 1:
            self.sink.add(blame(set_at, hedge, retries), f"tier '{tier_name}' hedges "
                          "(hedge_delay) but has retries: 0; a hedge is one of the tier's "
                          "retries, so it needs retries of at least 1")
        if read is not None and known(read) and hedge.value >= read.value:
            self.sink.add(blame(set_at, hedge, read), f"hedge_delay ({hedge.value} ms) of tier "
                          f"'{tier_name}' must be below its read_timeout ({read.value} ms)")

    # --- failover ----------------------------------------------------------------------------

    def _check_failover(self, layer: Layer, fallback: At, group: str = "",
                        origins: int = 0) -> None:
        step, cap = layer["shift_step"], layer["max_step"]
        if known(step, cap) and step.value > cap.value:
            self.sink.add(blame(fallback, step, cap), f"shift_step ({step.value}) must not "
                          f"exceed max_step ({cap.value})")
        reuse, suppress = layer["damping_reuse"], layer["damping_suppress"]
        if known(reuse, suppress) and reuse.value >= suppress.value:
            self.sink.add(blame(fallback, reuse, suppress), f"damping_reuse ({reuse.value}) must "
                          f"be below damping_suppress ({suppress.value})")
        warm = layer["min_warm_pool"]
        if origins > 1 and known(warm) and warm.value * (origins - 1) >= 100:
            self.sink.add(blame(fallback, warm), f"min_warm_pool ({warm.value}) x "
                          f"{origins - 1} standby origins of group '{group}' = "
                          f"{warm.value * (origins - 1)}% leaves nothing for the preferred "
                          "origin; it must stay below 100")

    # --- origin groups -----------------------------------------------------------------------

    def _origin_groups(self, doc: Fields) -> list[OriginGroup | None]:
        fields = Fields(doc.node_of("origin_groups"), "origin_groups", self.sink)
        self._note_broken(fields)
        if not doc.has("origin_groups") and not doc.has("grpc_services"):
            self.sink.add(doc.at(), "missing required key 'origin_groups'")
        elif fields.ok and not fields.entries:
            self.sink.add(fields.at(), "must list at least one origin group")
        result = []
        for named, node in self._named_entries(fields, "origin group"):
            group = self._origin_group(named, Fields(node, named.at.path, self.sink))
            self.groups[named.name] = group
            result.append(group)
        fields.finish()
        return result

    def _origin_group(self, named: _Named, group: Fields) -> OriginGroup | None:
        concurrency_value = group.read("max_origin_concurrency", integer(1, 1_000_000))
        concurrency = Located(concurrency_value, group.at("max_origin_concurrency"), GROUP)
        if not group.has("max_origin_concurrency"):
            concurrency = Located(MAX_ORIGIN_CONCURRENCY, None, GROUP)
        origin_tls = self._origin_tls(group)
        origins, origin_names = self._origins(group, origin_tls)
        preference = self._preference(group, origin_names)
        tiers, tier_layers = self._group_tiers(group, concurrency)
        failover_fields = Fields(group.node_of("failover"), join(group.path, "failover"),
                                 self.sink)
        failover = self.failover | read_layer(failover_fields, FAILOVER_FIELDS, GROUP)
        failover_fields.finish()
        self._check_failover(failover, group.at("origins"), named.name, len(origin_names))
        health_fields = Fields(group.node_of("health_check"), join(group.path, "health_check"),
                               self.sink)
        health = HEALTH_CHECK_DEFAULTS | read_layer(health_fields, HEALTH_CHECK_FIELDS, GROUP)
        health_fields.finish()
        actions = self.tier_actions | self._tier_actions_layer(
            group, join(group.path, "tier_actions"), GROUP)
        tier_actions = self._resolve_tier_actions(actions, tier_layers, group.at())
        ramp_fields = Fields(group.node_of("standby_ramp"), join(group.path, "standby_ramp"),
                             self.sink)
        ramp = self.standby_ramp | self._ramp_layer(ramp_fields, GROUP)
        ramp_fields.finish()
        affinity = self._affinity(group)
        group.finish()
        if self.sink.problems or not group.ok or tier_actions is None:
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

    def _affinity(self, group: Fields) -> Affinity | None:
        """`affinity: {cookie: NAME[, ttl: DURATION]}` or `{header: NAME}`; absent: off."""
        fields = Fields(group.node_of("affinity"), join(group.path, "affinity"), self.sink)
        if fields.node is None or not fields.ok:
            return None
        cookie = fields.read("cookie", cookie_name)
        header = fields.read("header", header_name)
        ttl = fields.read("ttl", duration(0, MAX_AFFINITY_TTL_MS))
        fields.finish()
        if (cookie is None) == (header is None):
            if fields.has("cookie") == fields.has("header"):
                self.sink.add(fields.at(), "affinity needs exactly one of cookie or header")
            return None
        if header is not None:
            if ttl is not None:
                self.sink.add(fields.at("ttl"), "ttl applies to a cookie only")
            return Affinity("header", header)
        return Affinity("cookie", cookie, ttl or 0)

    def _origin_tls(self, group: Fields) -> OriginTlsPolicy:
        fields = Fields(group.node_of("origin_tls"), join(group.path, "origin_tls"), self.sink)
        ca_file = fields.read("ca_file", file_path)
        days = fields.read("expiry_warning_days", integer(0, MAX_EXPIRY_WARNING_DAYS))
        fields.finish()
        default = OriginTlsPolicy()
        return OriginTlsPolicy(
            ca_file=ca_file or default.ca_file,
            expiry_warning_days=default.expiry_warning_days if days is None else days,
        )

    def _origins(self, group: Fields,
                 origin_tls: OriginTlsPolicy) -> tuple[list[Origin], list[str]]:
        """The origins, and the names of all (also those with bad fields) for references."""
        fields = Fields(group.node_of("origins"), join(group.path, "origins"), self.sink)
        if group.ok and not group.has("origins"):
            self.sink.add(group.at(), "missing required key 'origins'")
        elif fields.ok and not fields.entries:
            self.sink.add(fields.at(), "must list at least one origin")
        origins, names = [], []
        for named, node in self._named_entries(fields, "origin"):
            names.append(named.name)
            origin = Fields(node, named.at.path, self.sink)
            address = origin.read("address", host, required=True)
            port = origin.read("port", integer(1, 65535), required=True)
            tls = origin.read("tls", boolean)
            sni = origin.read("sni", host)
            verify_name = origin.read("verify_name", host)
            ca_file = origin.read("ca_file", file_path)
            skip = origin.read("insecure_skip_verify", boolean)
            spki_pins = self._pins(origin, "pin_spki_sha256", spki_pin)
            cert_pins = self._pins(origin, "pin_cert_sha256", cert_pin)
            for key in TLS_ONLY_KEYS:
                if origin.has(key) and not tls:
                    self.sink.add(origin.at(key), f"{key} needs tls: true")
            if skip and any(origin.has(key) for key in VERIFY_KEYS):
                self.sink.add(origin.at("insecure_skip_verify"), "insecure_skip_verify: true "
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

    def _pins(self, origin: Fields, key: str, convert: Converter[str]) -> tuple[str, ...]:
        path = join(origin.path, key)
        node = origin.node_of(key)
        items = sequence(node, path, self.sink)
        if isinstance(node, yaml.SequenceNode) and not items:
            self.sink.add(At.of(node, path), "must list at least one pin (or leave it out)")
        if len(items) > MAX_PINS:
            self.sink.add(At.of(items[MAX_PINS], path), f"at most {MAX_PINS} pins")
        pins = (origin.convert(item, f"{path}[{i}]", convert) for i, item in enumerate(items))
        return tuple(pin for pin in pins if pin is not None)

    def _preference(self, group: Fields, origin_names: list[str]) -> dict[str, tuple[str, ...]]:
        node = group.node_of("preference")
        if node is None:
            return {pop: tuple(origin_names) for pop in self.pops}
        fields = Fields(node, join(group.path, "preference"), self.sink)
        preference: dict[str, tuple[str, ...]] = {}
        for key, value in fields.items():
            pop = str(key.value)
            pop_path = join(fields.path, pop)
            if "pops" in self.broken:
                continue
            if pop not in self.pops:
                self.sink.add(At.of(key, fields.path), f"unknown pop '{pop}'"
                              + did_you_mean(pop, list(self.pops)))
                continue
            order: list[str] = []
            for index, item in enumerate(sequence(value, pop_path, self.sink)):
                origin = fields.convert(item, f"{pop_path}[{index}]", name("origin"))
                item_at = At.of(item, f"{pop_path}[{index}]")
                if origin is None:
                    continue
                if origin not in origin_names:
                    self.sink.add(item_at, f"unknown origin '{origin}'"
                                  + did_you_mean(origin, origin_names))
                elif origin in order:
                    self.sink.add(item_at, f"origin '{origin}' is listed twice")
                else:
                    order.append(origin)
            missing = [o for o in origin_names if o not in order]
            if missing and isinstance(value, yaml.SequenceNode):
                self.sink.add(At.of(value, pop_path), f"missing origin(s) {_quoted(missing)}; "
                              "list every origin of the group, most preferred first")
            preference[pop] = tuple(order)
        for pop in self.pops:
            if fields.ok and pop not in fields.entries:
                self.sink.add(fields.at(), f"pop '{pop}' is missing; every pop needs a "
                              "preference order (or leave preference out: listed order)")
        fields.finish()
        return preference

    def _group_tiers(
        self, group: Fields, concurrency: Located
    ) -> tuple[tuple[Tier, ...], dict[str, Layer]]:
        layers = {name: dict(layer) for name, layer in self.tier_layers.items()}
        fields = Fields(group.node_of("tiers"), join(group.path, "tiers"), self.sink)
        for key, node in fields.items():
            tier_name = str(key.value)
            if tier_name not in layers:
                self.sink.add(At.of(key, fields.path), f"unknown tier '{tier_name}'"
                              + did_you_mean(tier_name, list(layers)))
                continue
            tier = Fields(node, join(fields.path, tier_name), self.sink)
            layers[tier_name] |= read_tier_layer(tier, GROUP)
            tier.finish()
        fields.finish()
        set_at = fields.at() if fields.node is not None else self.tiers_at
        self._check_tiers(layers, set_at, concurrency)
        if self.sink.problems:
            return (), layers
        return tuple(build_tier(name, layer) for name, layer in layers.items()), layers

    # --- tier actions ------------------------------------------------------------------------

    def _tier_actions_layer(self, parent: Fields, path: str, layer: int) -> Layer:
        """A `tier_actions` block as written: its fields and the tier names (or `none`)."""
        fields = Fields(parent.node_of("tier_actions"), path, self.sink)
        result = read_layer(fields, TIER_ACTION_FIELDS, layer)
        for key, field_name in TIER_ACTION_TIERS.items():
            if fields.has(key):
                result[field_name] = Located(fields.read(key, tier_or_none), fields.at(key), layer)
        fields.finish()
        return result

    def _resolve_tier_actions(
        self, layer: Layer, tiers: dict[str, Layer], fallback: At
    ) -> TierActionPolicy | None:
        """Tier names left out are chosen by priority: the trigger is the most critical tier;
        the second is demoted to the least critical (with three tiers or more), which is shed
        when it is sheddable. Written names must be tiers of the group that fit their role."""
        priorities = {name: tier["priority"].value for name, tier in tiers.items()
                      if "priority" in tier and known(tier["priority"])}
        if len(priorities) != len(tiers) or not tiers or "tiers" in self.broken:
            return None  # the tier set's own problems are reported already
        by_priority = sorted(priorities, key=lambda name: priorities[name])
        last = tiers[by_priority[-1]]
        defaults = {
            "trigger_tier": by_priority[0],
            "demote_tier": by_priority[1] if len(by_priority) >= 3 else None,
            "demote_to": by_priority[-1] if len(by_priority) >= 3 else None,
            "shed_tier": by_priority[-1] if len(by_priority) >= 2 and known(
                last["sheddable"]) and last["sheddable"].value else None,
        }
        names: dict[str, str | None] = {}
        ok = True
        for field_name, default in defaults.items():
            written = layer.get(field_name)
            if written is None:
                names[field_name] = default
                continue
            if written.value is None:
                ok = False
                continue
            name_value = None if written.value == NO_TIER else written.value
            if name_value is not None and name_value not in tiers:
                self.sink.add(blame(fallback, written), f"unknown tier '{name_value}'"
                              + did_you_mean(name_value, list(tiers)))
                ok = False
            names[field_name] = name_value
        if not ok or not known(*layer.values()):
            return None
        if names["demote_tier"] is None:
            names["demote_to"] = None
        trigger = names["trigger_tier"]
        if not self._check_tier_roles(names, layer, tiers, fallback) or trigger is None:
            return None
        values = {key: located.value for key, located in layer.items()
                  if key not in TIER_ACTION_TIERS.values()}
        return TierActionPolicy(trigger_tier=trigger, demote_tier=names["demote_tier"],
                                demote_to=names["demote_to"], shed_tier=names["shed_tier"],
                                **values)

    def _check_tier_roles(self, names: dict[str, str | None], layer: Layer,
                          tiers: dict[str, Layer], fallback: At) -> bool:
        """Demotion goes to a less critical tier; the trigger tier is never demoted or shed;
        only a sheddable tier is shed."""
        problems_before = len(self.sink.problems)

        def at(*keys: str) -> At:
            return blame(fallback, *(layer[k] for k in keys if k in layer))

        trigger, demote, to, shed = (names[k] for k in
                                     ("trigger_tier", "demote_tier", "demote_to", "shed_tier"))
        if trigger is None:
            self.sink.add(at("trigger_tier"), "trigger_tier cannot be none; set enabled: false "
                          "to turn tier actions off")
        if demote is not None and to is None:
            self.sink.add(at("demote_tier", "demote_to"), f"demote '{demote}' needs demote_to, "
                          "the less critical tier whose cluster takes the demoted share")
        elif demote is not None and to is not None:
            low, high = tiers[demote]["priority"].value, tiers[to]["priority"].value
            if high <= low:
                self.sink.add(at("demote_tier", "demote_to"), f"demote_to '{to}' (priority "
                              f"{high}) must be less critical than demote '{demote}' "
                              f"(priority {low})")
        if trigger is not None and trigger in (demote, shed):
            self.sink.add(at("trigger_tier", "demote_tier", "shed_tier"), f"the trigger tier "
                          f"'{trigger}' cannot also be demoted or shed")
        high, low = layer.get("shed_threshold"), layer.get("shed_lift_threshold")
        if high is not None and low is not None and known(high, low) and low.value >= high.value:
            self.sink.add(at("shed_lift_threshold", "shed_threshold"), f"shed_lift_threshold "
                          f"{low.value:g} must be below shed_threshold {high.value:g} (hysteresis)")
        if shed is not None:
            sheddable = tiers[shed]["sheddable"]
            if known(sheddable) and not sheddable.value:
                self.sink.add(at("shed_tier"), f"tier '{shed}' is not sheddable; only a tier "
                              "with sheddable: true may be shed")
        return len(self.sink.problems) == problems_before

    # --- classification ----------------------------------------------------------------------

    def _classification(
        self, doc: Fields
    ) -> tuple[str, list[ClassificationRule], tuple[str, ...]]:
        fields = Fields(doc.node_of("classification"), "classification", self.sink)
        tiers = list(self.tier_layers)
        default_tier = self._reference(fields, "default_tier", "tiers", tiers, required=False)
        if not fields.has("default_tier") and tiers and DEFAULT_TIER_NAME not in tiers:
            self.sink.add(fields.at(), f"no tier is named '{DEFAULT_TIER_NAME}'; set "
                          "classification.default_tier to the tier for unmatched requests")
        rules = []
        items = sequence(fields.node_of("rules"), join(fields.path, "rules"), self.sink)
        for named, rule in self._unique_names(items, join(fields.path, "rules"), "rule"):
            tier = self._reference(rule, "tier", "tiers", tiers)
            prefix = rule.read("path_prefix", path_prefix)
            headers = self._headers(rule)
            if rule.ok and not rule.has("path_prefix") and not rule.has("headers"):
                self.sink.add(rule.at(), "a rule needs path_prefix or headers; a rule without "
                              "conditions would match every request")
            rule.finish()
            if named is not None and tier is not None:
                rules.append(ClassificationRule(named.name, tier, prefix, headers))
        trusted = self._trusted_sources(fields)
        fields.finish()
        return default_tier or DEFAULT_TIER_NAME, rules, trusted

    def _trusted_sources(self, classification: Fields) -> tuple[str, ...]:
        path, items = self._list(classification, "trusted_priority_sources",
                                 "network (or leave it out)", required=False)
        if len(items) > MAX_TRUSTED_SOURCES:
            self.sink.add(At.of(items[MAX_TRUSTED_SOURCES], path),
                          f"at most {MAX_TRUSTED_SOURCES} networks")
        networks: list[str] = []
        for index, item in enumerate(items):
            value = classification.convert(item, f"{path}[{index}]", network)
            if value is not None and value in networks:
                self.sink.add(At.of(item, f"{path}[{index}]"), f"{value} is listed twice")
            elif value is not None:
                networks.append(value)
        return tuple(networks)

    def _headers(self, rule: Fields) -> tuple[HeaderMatch, ...]:
        path, items = self._list(rule, "headers", "header condition", required=False)
        matches = []
        for index, item in enumerate(items):
            header = Fields(item, f"{path}[{index}]", self.sink)
            header_at = header.at()
            header_name_value = header.read("name", header_name, required=True)
            kinds = [k for k in HEADER_KINDS if header.has(k)]
            if header.ok and len(kinds) != 1:
                self.sink.add(header_at, "needs exactly one of exact, prefix, contains, "
                              f"present: true (found {', '.join(kinds) or 'none'})")
            value: str | None = ""
            for kind in HEADER_KINDS[:3]:
                if header.has(kind):
                    value = header.read(kind, text)
            present = header.read("present", boolean)
            if present is False:
                self.sink.add(header.at("present"), "must be true (matching an absent header "
                              "is not supported)")
            header.finish()
            if header_name_value is not None and len(kinds) == 1 and value is not None:
                matches.append(HeaderMatch(header_name_value, kinds[0], value))
        return tuple(matches)

    # --- listeners ---------------------------------------------------------------------------

    def _listeners(self, doc: Fields) -> list[Listener]:
        # without listeners, Envoys get nothing: a fleet of proxyless gRPC clients only
        _, items = self._list(doc, "listeners", "listener", required=not doc.has("grpc_services"))
        listeners: list[Listener] = []
        ports: dict[tuple[str, int], tuple[str, str]] = {}
        for named, listener in self._unique_names(items, "listeners", "listener"):
            port = listener.read("port", integer(1, 65535), required=True)
            filters = self._extra_filters(listener)
            hosts = self._virtual_hosts(listener, tuple(f.name for f in filters))
            pops = self._listener_pops(listener)
            tls = self._listener_tls(listener, named.name if named else "?")
            redirect = listener.read("redirect_to_https", boolean) or False
            if redirect and listener.has("tls"):
                self.sink.add(listener.at("redirect_to_https"), "a TLS listener cannot redirect "
                              "to https; set redirect_to_https on the plain listener")
            listener.finish()
            if named is None or port is None:
                continue
            self._check_ports(named.name, port, listener.at("port"), ports, pops)
            listeners.append(Listener(named.name, port, hosts, tls, pops, redirect, filters))
        return listeners

    def _listener_pops(self, listener: Fields) -> tuple[str, ...] | None:
        """`pops: [ewr]`: the PoPs that serve the listener (left out: every PoP)."""
        if not listener.has("pops"):
            return None
        path, items = self._list(listener, "pops", "pop")
        pops: list[str] = []
        for index, item in enumerate(items):
            value = listener.convert(item, f"{path}[{index}]", text)
            if value is None:
                continue
            if value not in self.pops and "pops" not in self.broken:
                self.sink.add(At.of(item, f"{path}[{index}]"), f"unknown pop '{value}'"
                              + did_you_mean(value, list(self.pops)))
            elif value in pops:
                self.sink.add(At.of(item, f"{path}[{index}]"), f"pop '{value}' is listed twice")
            else:
                pops.append(value)
        return tuple(pops)

    def _listener_tls(self, listener: Fields, listener_name: str) -> ListenerTls | None:
        node = listener.node_of("tls")
        if node is None:
            return None
        tls = Fields(node, join(listener.path, "tls"), self.sink)
        values = read_layer(tls, LISTENER_TLS_FIELDS, GLOBAL)
        certs_path, items = self._list(tls, "certificates", "certificate")
        certificates: list[ServedCertificate] = []
        defaults: list[str] = []
        hostnames_seen: dict[str, str] = {}
        for named, cert in self._unique_names(items, certs_path, "certificate"):
            hostnames = self._hostnames(cert, hostnames_seen, named)
            if cert.read("default", boolean) and named is not None:
                defaults.append(named.name)
            files = self._certificate_files(cert)
            cert.finish()
            if named is None or files is None:
                continue
            served = self._served_certificate(cert, named.name, f"{listener_name}.{named.name}",
                                              hostnames, files)
            if served is not None:
                certificates.append(served)
        if len(defaults) > 1:
            self.sink.add(tls.at("certificates"), f"only one certificate may be the default, "
                          f"got {', '.join(defaults)}")
        default = defaults[0] if defaults else certificates[0].name if certificates else None
        for cert in certificates:
            if not cert.hostnames and cert.name != default:
                self.sink.add(tls.at("certificates"), f"certificate '{cert.name}' has no "
                              "hostnames and is not the default: no client would get it")
        client_ca = tls.read("client_ca_file", file_path)
        client_ca_pem = None
        if client_ca is not None:
            client_ca_file = self._read_file(tls.at("client_ca_file"), client_ca)
            if client_ca_file is not None:
                try:  # served as parsed: nothing of the file but its certificates
                    client_ca_pem = chain_pem(load_chain(client_ca_file, client_ca))
                except Bad as bad:
                    self.sink.add(tls.at("client_ca_file"), str(bad))
        low, high = values.get("min_version"), values.get("max_version")
        if low is not None and high is not None and known(low, high) \
                and float(low.value) > float(high.value):
            self.sink.add(blame(tls.at(), low, high), f"min_version {low.value} is above "
                          f"max_version {high.value}")
        tls.finish()
        if self.sink.problems or not certificates:
            return None
        plain = {key: located.value for key, located in values.items()}
        assert default is not None
        return ListenerTls(
            certificates=tuple(certificates),
            default=default,
            client_ca_file=client_ca,
            client_ca_pem=client_ca_pem,
            **plain,
        )

    def _hostnames(self, cert: Fields, seen: dict[str, str],
                   named: _Named | None) -> tuple[str, ...]:
        path, items = self._list(cert, "hostnames", "hostname", required=False)
        hostnames: list[str] = []
        for index, item in enumerate(items):
            value = cert.convert(item, f"{path}[{index}]", server_name)
            if value is None:
                continue
            if value in seen:
                self.sink.add(At.of(item, f"{path}[{index}]"), f"hostname '{value}' is already "
                              f"served by certificate '{seen[value]}' of this listener")
            else:
                seen[value] = named.name if named else "?"
                hostnames.append(value)
        return tuple(hostnames)

    def _certificate_files(self, cert: Fields) -> tuple[tuple[str, str], At] | None:
        """(certificate file, key file) and where they were written: `cert_file` and
        `key_file`, or `dir` (certbot's fullchain.pem + privkey.pem, else cert-manager's
        tls.crt + tls.key)."""
        directory = cert.read("dir", file_path)
        cert_file = cert.read("cert_file", file_path)
        key_file = cert.read("key_file", file_path)
        if directory is not None and (cert.has("cert_file") or cert.has("key_file")):
            self.sink.add(cert.at("dir"), "give dir, or cert_file and key_file, not both")
            return None
        if directory is not None:
            for crt, key in CERT_DIR_LAYOUTS:
                pair = (f"{directory.rstrip('/')}/{crt}", f"{directory.rstrip('/')}/{key}")
                if self.files.exists(pair[0]):
                    return pair, cert.at("dir")
            layouts = " or ".join(f"{c} + {k}" for c, k in CERT_DIR_LAYOUTS)
            self.sink.add(cert.at("dir"), f"{directory}: holds neither {layouts}")
            return None
        if cert_file is None or key_file is None:
            if cert.ok and not (cert.has("cert_file") and cert.has("key_file")):
                self.sink.add(cert.at(), "needs cert_file and key_file (or dir)")
            return None
        return (cert_file, key_file), cert.at("cert_file")

    def _served_certificate(
        self, cert: Fields, name_value: str, secret_name: str, hostnames: tuple[str, ...],
        files: tuple[tuple[str, str], At],
    ) -> ServedCertificate | None:
        (cert_file, key_file), at = files
        chain_pem = self._read_file(at, cert_file)
        key_at = cert.at("key_file") if cert.has("key_file") else at
        key_pem = self._read_file(key_at, key_file)
        if chain_pem is None or key_pem is None:
            return None
        try:
            return served_certificate(name_value, secret_name, hostnames,
                                      (cert_file, key_file), (chain_pem, key_pem),
                                      self.files.now_s)
        except Bad as bad:
            self.sink.add(at, str(bad))
            return None

    def _read_file(self, at: At, path: str) -> bytes | None:
        try:
            return self.files.read(path)
        except OSError as err:
            self.sink.add(at, f"cannot read {path}: {err.strerror or err}")
            return None

    def _extra_filters(self, listener: Fields) -> tuple[ExtraFilter, ...]:
        path, items = self._list(listener, "http_filters", "filter", required=False)
        if len(items) > MAX_EXTRA_FILTERS:
            self.sink.add(At.of(items[MAX_EXTRA_FILTERS], path),
                          f"at most {MAX_EXTRA_FILTERS} filters")
        filters: list[ExtraFilter] = []
        names: set[str] = set()
        for index, item in enumerate(items[:MAX_EXTRA_FILTERS]):
            entry = Fields(item, f"{path}[{index}]", self.sink)
            filter_name = entry.read("name", text, required=True)
            node = entry.node_of("typed_config")
            if entry.ok and node is None:
                self.sink.add(entry.at(), "missing required key 'typed_config' (typed JSON: "
                              "'@type' and the message's fields)")
            typed = None
            if node is not None:
                typed = entry.convert(node, join(entry.path, "typed_config"),
                                      lambda n: typed_config(plain_value(n)))
            entry.finish()
            refused = None if typed is None else refusal(
                typed[0].rsplit("/", 1)[-1], self.allowed_filters)
            if refused is not None:
                self.sink.add(entry.at("typed_config"), refused)
            elif filter_name in RESERVED_FILTERS:
                self.sink.add(entry.at("name"), f"'{filter_name}' is Ballast's own filter")
            elif filter_name is not None and filter_name in names:
                self.sink.add(entry.at("name"), f"filter '{filter_name}' is listed twice")
            elif filter_name is not None and typed is not None:
                names.add(filter_name)
                filters.append(ExtraFilter(filter_name, typed[0], typed[1]))
        return tuple(filters)

    def _check_ports(self, listener: str, port: int, at: At,
                     taken: dict[tuple[str, int], tuple[str, str]],
                     pops: tuple[str, ...] | None = None) -> None:
        """Each PoP listens on port + port_offset; two sockets on one machine may not collide.

        Within a PoP every listener needs its own port. Across PoPs, only a shared loopback
        address means one machine (the demo set-up port_offset exists for).
        """
        for pop in self.pops.values():
            if pop.name in self.unsure_pops or (pops is not None and pop.name not in pops):
                continue
            effective = port + pop.port_offset
            if effective > 65535:
                self.sink.add(at, f"port {port} + port_offset {pop.port_offset} of pop "
                              f"'{pop.name}' = {effective} is above 65535")
                continue
            shared = _is_loopback(pop.listen_address)
            key = (pop.listen_address if shared else f"pop {pop.name}", effective)
            if key in taken:
                other_pop, other_listener = taken[key]
                self.sink.add(at, f"listener '{listener}' of pop '{pop.name}' and listener "
                              f"'{other_listener}' of pop '{other_pop}' would both listen on "
                              f"{pop.listen_address}:{effective}")
            else:
                taken[key] = (pop.name, listener)

    def _virtual_hosts(self, listener: Fields,
                       filter_names: tuple[str, ...]) -> tuple[VirtualHost, ...]:
        path, items = self._list(listener, "virtual_hosts", "virtual host")
        hosts = []
        domains_seen: dict[str, str] = {}
        for named, vhost in self._unique_names(items, path, "virtual host"):
            group = self._reference(vhost, "origin_group", "origin_groups", self.groups)
            domains = self._domains(vhost, named, domains_seen)
            per_filter = self._per_filter_configs(vhost, filter_names)
            vhost.finish()
            if named is not None and group is not None:
                hosts.append(VirtualHost(named.name, domains, group, per_filter))
        return tuple(hosts)

    def _per_filter_configs(self, vhost: Fields,
                            filter_names: tuple[str, ...]) -> tuple[ExtraFilter, ...]:
        """`typed_per_filter_config: {<filter name>: typed JSON}`: per-route configs of the
        listener's operator-added filters, for this host's routes."""
        fields = Fields(vhost.node_of("typed_per_filter_config"),
                        join(vhost.path, "typed_per_filter_config"), self.sink)
        configs: list[ExtraFilter] = []
        for key, node in fields.items():
            filter_name = str(key.value)
            if filter_name not in filter_names:
                self.sink.add(At.of(key, fields.path), f"no filter named '{filter_name}' in "
                              "this listener's http_filters"
                              + did_you_mean(filter_name, filter_names))
                continue
            typed = fields.convert(node, join(fields.path, filter_name),
                                   lambda n: typed_config(plain_value(n)))
            if typed is not None:
                configs.append(ExtraFilter(filter_name, typed[0], typed[1]))
        fields.finish()
        return tuple(configs)

    def _domains(self, vhost: Fields, named: _Named | None,
                 seen: dict[str, str]) -> tuple[str, ...]:
        path, items = self._list(vhost, "domains", "domain (or '*')")
        domains = []
        for index, item in enumerate(items):
            value = vhost.convert(item, f"{path}[{index}]", domain)
            if value is None:
                continue
            owner = named.name if named else "?"
            if value in seen:
                self.sink.add(At.of(item, f"{path}[{index}]"), f"domain '{value}' is already "
                              f"used by virtual host '{seen[value]}' of this listener")
            else:
                seen[value] = owner
                domains.append(value)
        return tuple(domains)


def _is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


def _layer_of(values: list[Located]) -> int:
    return max((v.layer for v in values), default=GLOBAL)


def _quoted(names: list[str]) -> str:
    return ", ".join(f"'{n}'" for n in names)
