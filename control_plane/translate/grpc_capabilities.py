"""Proxyless gRPC clients: telling one from an Envoy, and what its release can accept.

A gRPC client says what it is in its node: `user_agent_name` "gRPC C-core linux Python",
"gRPC Java", "gRPC Go", "gRPC Node Pure JS"; `user_agent_version` the release, after the
C-core version for the languages wrapping C-core ("C-core 58.0.0 Python 1.85.3"). A node of
another proxyless client can say it with `node.metadata.ballast_client: grpc` (its release is
then unknown). What is gated is what gRPC added after its first xDS releases, with the release
that added it (`grpc_xds_features.md`): a field a client does not know it ignores, a value it
does not support it NACKs, so what a client lacks is left out of what it gets (with a note).
An unknown release gets none of them.
"""

from __future__ import annotations

import re

from envoy.config.core.v3.base_pb2 import Node

from control_plane.translate.resources import Capabilities

CLIENT_METADATA = "ballast_client"  # node.metadata value "grpc": a proxyless gRPC client
USER_AGENT_PREFIX = "gRPC"
# feature -> (what it is, first release per family): gRFC A32, A31, A29; grpc-js (Node) has
# its own release numbers and no certificate providers
FEATURES: dict[str, tuple[str, dict[str, tuple[int, int]]]] = {
    "max_requests": ("circuit breaking max_requests (gRFC A32)", {"core": (1, 37), "node": (1, 4)}),
    "timeout": ("max_stream_duration (gRFC A31)", {"core": (1, 37), "node": (1, 4)}),
    "tls": ("TLS through certificate providers (gRFC A29)", {"core": (1, 41)}),
}
_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")
_WRAPPERS = frozenset({"C-core", "linux", "windows", "macos", "darwin"})


def is_grpc_client(node: Node) -> bool:
    if node.user_agent_name.startswith(USER_AGENT_PREFIX):
        return True
    field = node.metadata.fields.get(CLIENT_METADATA)
    return field is not None and field.string_value == "grpc"


def grpc_release(node: Node) -> tuple[str, tuple[int, int] | None, str]:
    """(family, (major, minor) or None when unknown, how to show the client). The release is
    the last version in `user_agent_version` that is not C-core's own."""
    words = node.user_agent_name.split()
    language = next((w for w in reversed(words[1:]) if w not in _WRAPPERS), "")
    if "Node" in words:
        language = "Node"
    release: tuple[int, int] | None = None
    shown = ""
    tokens = node.user_agent_version.split()
    for index, token in enumerate(tokens):
        match = _VERSION.fullmatch(token)
        if match is not None and (index == 0 or tokens[index - 1] != "C-core"):
            release, shown = (int(match[1]), int(match[2])), token.lstrip("v")
    family = "node" if language == "Node" else "core"
    name = f"gRPC {language}".strip() if language else "gRPC client"
    return family, release, f"{name} {shown or 'of unknown release'}"


def describe_grpc_client(node: Node) -> str:
    """How status names the client, e.g. `gRPC Python 1.85.3`."""
    return grpc_release(node)[2]


def grpc_node_capabilities(node: Node) -> tuple[Capabilities, str]:
    """The gated features the client's release has, and why, in words."""
    family, release, shown = grpc_release(node)
    have: list[str] = []
    lacks: list[str] = []
    for feature, (what, since) in FEATURES.items():
        first = since.get(family)
        if release is not None and first is not None and release >= first:
            have.append(feature)
        elif first is None:
            lacks.append(f"{what}: not in {family}")
        else:
            lacks.append(f"{what}: from {first[0]}.{first[1]}")
    reason = f"{shown}: a proxyless gRPC client"
    if lacks:
        reason += f"; lacks {', '.join(lacks)}"
    return Capabilities(grpc=frozenset(have)), reason


def grpc_capabilities_for_key(key: str) -> Capabilities:
    """The capabilities a `grpc+...` key stands for; ValueError for a feature not known."""
    features = frozenset(part for part in key.split("+")[1:] if part)
    unknown = sorted(features - set(FEATURES))
    if key.split("+")[0] != "grpc" or unknown:
        raise ValueError(f"unknown gRPC capability key {key!r}; features: "
                         f"{', '.join(FEATURES)}")
    return Capabilities(grpc=features)
