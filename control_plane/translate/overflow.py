"""What a client gets when a tier's queue is full: the tier's `shed_action`, not Envoy's bare 503.

A request that finds its tier cluster's pending queue full (`max_pending_requests`) or its
concurrency exhausted is answered by Envoy's router with a local reply flagged `UO` (upstream
overflow). The HTTP connection manager's `local_reply_config` rewrites local replies: one mapper
per (origin group, tier) of the listener's virtual hosts matches `UO` on that tier's cluster (a
CEL filter on `xds.cluster_name`, so two groups with a tier of the same name keep their own
actions) and answers as a shed route does (`routes.py`): `reject` 503, `defer` 202, `stale` 503
with `x-ballast-serve-stale: 1` and `cache-control: no-store`; each with `x-ballast-shed: <tier>`
and `retry-after` = the tier's `queue_timeout` in whole seconds (at least 1: by then the queue
that overflowed has drained). The first mapper that matches wins; an overflow of any other
cluster keeps Envoy's own reply.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from envoy.config.accesslog.v3.accesslog_pb2 import (
    AccessLogFilter,
    AndFilter,
    ExtensionFilter,
    ResponseFlagFilter,
)
from envoy.config.core.v3.base_pb2 import DataSource, HeaderValue, HeaderValueOption
from envoy.extensions.access_loggers.filters.cel.v3.cel_pb2 import ExpressionFilter
from envoy.extensions.filters.network.http_connection_manager.v3.http_connection_manager_pb2 import (  # noqa: E501
    LocalReplyConfig,
    ResponseMapper,
)
from google.protobuf.wrappers_pb2 import UInt32Value

from control_plane.desired.model import SHED_STATUS, OriginGroup, ShedAction
from control_plane.translate.clusters import cluster_name
from control_plane.translate.proto_values import packed

OVERFLOW_FLAG = "UO"
CEL_FILTER = "envoy.access_loggers.extension_filters.cel"
SHED_HEADER = "x-ballast-shed"
SERVE_STALE_HEADER = "x-ballast-serve-stale"


@dataclass(frozen=True)
class OverflowReply:
    """What one tier's overflow is answered with (all a mapper reads of the desired state)."""

    group: str
    tier: str
    shed_action: ShedAction
    queue_timeout_ms: int

    @property
    def retry_after_s(self) -> int:
        return max(1, math.ceil(self.queue_timeout_ms / 1000))


def overflow_of(groups: Iterable[OriginGroup]) -> tuple[OverflowReply, ...]:
    """Every tier of `groups` (each group once, in the order given)."""
    seen: set[str] = set()
    out: list[OverflowReply] = []
    for group in groups:
        if group.name in seen:
            continue
        seen.add(group.name)
        out.extend(OverflowReply(group.name, t.name, t.shed_action, t.queue_timeout_ms)
                   for t in group.tiers)
    return tuple(out)


def overflow_replies(replies: Iterable[OverflowReply]) -> LocalReplyConfig:
    return LocalReplyConfig(mappers=[_mapper(reply) for reply in replies])


def _mapper(tier: OverflowReply) -> ResponseMapper:
    cluster = cluster_name(tier.group, tier.tier)
    cel = ExpressionFilter(expression=f"xds.cluster_name == {_cel_string(cluster)}")
    match = AccessLogFilter(and_filter=AndFilter(filters=[
        AccessLogFilter(response_flag_filter=ResponseFlagFilter(flags=[OVERFLOW_FLAG])),
        AccessLogFilter(extension_filter=ExtensionFilter(name=CEL_FILTER,
                                                         typed_config=packed(cel))),
    ]))
    retry_after = tier.retry_after_s
    headers = [_header("retry-after", str(retry_after)), _header(SHED_HEADER, tier.tier)]
    if tier.shed_action == "stale":
        headers += [_header(SERVE_STALE_HEADER, "1"), _header("cache-control", "no-store")]
    later = "accepted; do it" if tier.shed_action == "defer" else "retry"
    return ResponseMapper(
        filter=match,
        status_code=UInt32Value(value=SHED_STATUS[tier.shed_action]),
        body=DataSource(inline_string=f"shed: tier {tier.tier}'s queue is full; {later} in "
                                      f"{retry_after} s\n"),
        headers_to_add=headers,
    )


def _header(name: str, value: str) -> HeaderValueOption:
    return HeaderValueOption(header=HeaderValue(key=name, value=value),
                             append_action=HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD)


def _cel_string(text: str) -> str:
    """A CEL string literal (cluster names are `<group>.<tier>`, names checked by the desired
    state, but quote them properly anyway)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
