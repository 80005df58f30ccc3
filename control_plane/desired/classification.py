"""`classification`: which tier a request belongs to, and whose word about it is believed."""

from __future__ import annotations

from control_plane.desired.defaults import DEFAULT_TIER_NAME
from control_plane.desired.document import Document
from control_plane.desired.errors import At
from control_plane.desired.fields import (
    Fields,
    boolean,
    header_name,
    network,
    path_prefix,
    sequence,
    text,
)
from control_plane.desired.model import ClassificationRule, HeaderMatch
from control_plane.desired.yaml_nodes import join

HEADER_KINDS = ("exact", "prefix", "contains", "present")
MAX_TRUSTED_SOURCES = 64


def read_classification(document: Document, doc: Fields
) -> tuple[str, list[ClassificationRule], tuple[str, ...]]:
    fields = Fields(doc.node_of("classification"), "classification", document.sink)
    tiers = list(document.tier_layers)
    default_tier = document.reference(fields, "default_tier", "tiers", tiers, required=False)
    if not fields.has("default_tier") and tiers and DEFAULT_TIER_NAME not in tiers:
        document.sink.add(fields.at(), f"no tier is named '{DEFAULT_TIER_NAME}'; set "
                          "classification.default_tier to the tier for unmatched requests")
    rules = []
    items = sequence(fields.node_of("rules"), join(fields.path, "rules"), document.sink)
    for named, rule in document.unique_names(items, join(fields.path, "rules"), "rule"):
        tier = document.reference(rule, "tier", "tiers", tiers)
        prefix = rule.read("path_prefix", path_prefix)
        headers = _headers(document, rule)
        if rule.ok and not rule.has("path_prefix") and not rule.has("headers"):
            document.sink.add(rule.at(), "a rule needs path_prefix or headers; a rule without "
                              "conditions would match every request")
        rule.finish()
        if named is not None and tier is not None:
            rules.append(ClassificationRule(named.name, tier, prefix, headers))
    trusted = _trusted_sources(document, fields)
    fields.finish()
    return default_tier or DEFAULT_TIER_NAME, rules, trusted


def _trusted_sources(document: Document, classification: Fields) -> tuple[str, ...]:
    path, items = document.list_of(classification, "trusted_priority_sources",
                                   "network (or leave it out)", required=False)
    if len(items) > MAX_TRUSTED_SOURCES:
        document.sink.add(At.of(items[MAX_TRUSTED_SOURCES], path),
                          f"at most {MAX_TRUSTED_SOURCES} networks")
    networks: list[str] = []
    for index, item in enumerate(items):
        value = classification.convert(item, f"{path}[{index}]", network)
        if value is not None and value in networks:
            document.sink.add(At.of(item, f"{path}[{index}]"), f"{value} is listed twice")
        elif value is not None:
            networks.append(value)
    return tuple(networks)


def _headers(document: Document, rule: Fields) -> tuple[HeaderMatch, ...]:
    path, items = document.list_of(rule, "headers", "header condition", required=False)
    matches = []
    for index, item in enumerate(items):
        header = Fields(item, f"{path}[{index}]", document.sink)
        header_at = header.at()
        header_name_value = header.read("name", header_name, required=True)
        kinds = [k for k in HEADER_KINDS if header.has(k)]
        if header.ok and len(kinds) != 1:
            document.sink.add(header_at, "needs exactly one of exact, prefix, contains, "
                              f"present: true (found {', '.join(kinds) or 'none'})")
        value: str | None = ""
        for kind in HEADER_KINDS[:3]:
            if header.has(kind):
                value = header.read(kind, text)
        present = header.read("present", boolean)
        if present is False:
            document.sink.add(header.at("present"), "must be true (matching an absent header "
                              "is not supported)")
        header.finish()
        if header_name_value is not None and len(kinds) == 1 and value is not None:
            matches.append(HeaderMatch(header_name_value, kinds[0], value))
    return tuple(matches)
