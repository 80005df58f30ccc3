"""Capability keys (`none`, `fifo`, `lifo`, each also with `+als` and/or `+lrs`, and with
`-f<hash>` for nodes lacking added filters' types; `grpc+<features>` for gRPC clients) as the
admin API and `ballast plan` name them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from control_plane.translate.grpc_capabilities import grpc_capabilities_for_key
from control_plane.translate.resources import Capabilities

CAPABILITY_KEYS: dict[str, Capabilities] = {
    caps.key: caps
    for access_log in (False, True)
    for reports in (False, True)
    for caps in (
        Capabilities(queue_policies=False, access_log=access_log, load_reports=reports),
        Capabilities(access_log=access_log, load_reports=reports),
        Capabilities(adaptive_lifo=True, access_log=access_log, load_reports=reports),
    )
}


def capabilities_for_key(key: str) -> Capabilities:
    """The capabilities a key stands for; `ValueError` naming the known keys otherwise. A key
    of nodes lacking HTTP filter types (`<key>-f<hash>`) names them only by hash: it stands
    for its base key (as if the filters were there). `grpc+...`: proxyless gRPC clients."""
    if key.startswith("grpc"):
        return grpc_capabilities_for_key(key)
    base, _, filters = key.partition("-f")
    if filters:
        key = base
    try:
        return CAPABILITY_KEYS[key]
    except KeyError:
        known = ", ".join(CAPABILITY_KEYS)
        raise ValueError(f"unknown capability key {key!r}; known: {known}") from None


def most_common_key(keys: Iterable[str]) -> str | None:
    """The key most nodes have (ties: alphabetical first), None when there are no nodes."""
    counts = Counter(keys)
    if not counts:
        return None
    return min(counts, key=lambda key: (-counts[key], key))
