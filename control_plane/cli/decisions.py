"""`ballast decisions`: the decision log as a table or JSON lines, optionally following it.

Records hold text nodes sent (a NACK's message, a node's id and version): every cell of the table
is escaped for the terminal (`security/terminal.py`), and JSON lines are ASCII (JSON's own
`\\u` escapes), so neither can move the cursor or forge a line."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from control_plane.cli.admin_client import (
    AdminError,
    ServerSource,
    add_auth_options,
    add_server_option,
    client_for,
)
from control_plane.decisions.kinds import KINDS
from control_plane.decisions.read import (
    FileSource,
    Query,
    Record,
    RecordSource,
    parse_since,
    record_time,
    since_cutoff,
)
from control_plane.intent.state_dir import DEFAULT_STATE_DIR, STATE_DIR_ENV, state_dir
from control_plane.security.terminal import escape

HELP = "show the decision log: what the controller and the server decided, and why"
HEADER = ("TIME", "SEQ", "KIND", "POP", "GROUP", "WEIGHTS", "RULE")
TABLE_BATCH = 1000
NOT_FOUND = 3  # exit status: the PoP or group asked for is in no record


def _since(text: str) -> Any:
    try:
        return parse_since(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _kinds(text: str) -> list[str]:
    kinds = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [kind for kind in kinds if kind not in KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(
            f"unknown kind {', '.join(unknown) or repr(text)}; known kinds: {', '.join(KINDS)}"
        )
    return kinds


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"wants a whole number >= 1, got {text!r}")
    return value


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"wants a number of seconds > 0, got {text!r}")
    return value


def add_state_dir(parser: argparse.ArgumentParser) -> None:
    """Where records come from: a local state directory, or a running server (`--server`)."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--state-dir",
        metavar="DIR",
        help=f"state directory (default: ${STATE_DIR_ENV} or {DEFAULT_STATE_DIR})",
    )
    add_server_option(
        where, "read the records from this running Ballast's admin API instead", defaults=False
    )
    add_auth_options(parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_state_dir(parser)
    parser.add_argument("--pop", help="only this PoP")
    parser.add_argument("--group", help="only this origin group")
    parser.add_argument(
        "--kind", type=_kinds, action="append", metavar="K",
        help="only these kinds (repeat or comma-separate): " + ", ".join(KINDS),
    )
    parser.add_argument(
        "--since", type=_since, metavar="WHEN",
        help="only newer records: a duration ago (30s, 10m, 2h, 1d) or an ISO-8601 time",
    )
    parser.add_argument("--limit", type=_positive, metavar="N", help="only the newest N records")
    parser.add_argument("--json", action="store_true", help="one JSON record per line")
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing new records")
    parser.add_argument(
        "--interval", type=_interval, default=1.0, metavar="SECONDS",
        help="how often --follow polls (default 1)",
    )


def source_for(args: argparse.Namespace) -> RecordSource:
    if args.server is not None:
        return ServerSource(client_for(args))
    return FileSource(state_dir(args.state_dir))


def _weights(record: Record) -> str:
    before = record.get("weights_before") or {}
    after = record.get("weights_after") or {}
    names = list(dict.fromkeys([*before, *after]))
    parts = []
    for name in names:
        old, new = before.get(name), after.get(name)
        parts.append(f"{name} {old}→{new}" if old != new else f"{name} {new}")
    # what was pushed only: a proposal a later step of the tick changed is in the rule
    return ", ".join(parts)


def _row(record: Record) -> tuple[str, ...]:
    rule = record.get("rule")
    if rule is None and record.get("detail") is not None:
        rule = json.dumps(record["detail"], separators=(",", ":"))
    return tuple(escape(cell) for cell in (
        record_time(record).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3],
        str(record["seq"]),
        str(record.get("kind")),
        str(record.get("pop") or "-"),
        str(record.get("group") or "-"),
        _weights(record) or "-",
        rule or "",
    ))


# the narrowest each column but the rule starts (a followed table keeps its columns where a
# new PoP, group or weight change would otherwise shift every later column): the time is
# fixed, every kind fits, a weight change of two origins fits
MIN_WIDTHS = (23, 5, max(map(len, KINDS)), 5, 7, 34)


class Columns:
    """The table's column widths, kept from the first rows to the last one followed: as wide
    as the rows printed so far needed (at least `MIN_WIDTHS`), never narrower, so rows printed
    one at a time (`--follow`) line up with those before them."""

    def __init__(self) -> None:
        self.widths = [max(len(h), w) for h, w in zip(HEADER[:-1], MIN_WIDTHS, strict=True)]

    def lines(self, rows: list[tuple[str, ...]]) -> str:
        """`rows` padded to the widths, widened first where a cell of them needs it."""
        for row in rows:
            self.widths = [max(w, len(cell)) for w, cell in zip(self.widths, row, strict=False)]
        return "\n".join(
            "  ".join([*(cell.ljust(w) for cell, w in zip(row, self.widths, strict=False)),
                       row[-1]])
            for row in rows
        )


def _print_all(records: Iterator[Record], as_json: bool, columns: Columns) -> int | None:
    """Print records as they stream in, a batch at a time, under a header (`columns` keeps the
    widths); the last seq printed, None when there were none."""
    last: int | None = None
    while batch := list(itertools.islice(records, TABLE_BATCH)):
        rows = [HEADER] if last is None else []
        last = int(batch[-1]["seq"])
        if as_json:
            _emit(batch, True, columns)
            continue
        print(columns.lines([*rows, *map(_row, batch)]))
        sys.stdout.flush()
    return last


def _emit(records: list[Record], as_json: bool, columns: Columns) -> None:
    if as_json:
        for record in records:
            print(json.dumps(record, separators=(",", ":")))
    else:
        print(columns.lines([_row(record) for record in records]))
    sys.stdout.flush()


def _unknown(source: RecordSource, pop: str | None, group: str | None) -> str:
    """Which of the PoP and group filters no record ever named ("" when both are known, or
    not given): a (PoP, group) served has records from its first tick on."""
    if pop is not None and not source.query(Query(pop=pop, limit=1)):
        return f"no record names pop {pop!r}"
    if group is not None and not source.query(Query(pop=pop, group=group, limit=1)):
        return f"no record names group {group!r}" + (f" in pop {pop!r}" if pop else "")
    return ""


def run(args: argparse.Namespace) -> int:
    source = source_for(args)
    kinds = frozenset(kind for group in args.kind or () for kind in group)
    try:
        since = since_cutoff(args.since, datetime.now(UTC)) if args.since is not None else None
    except ValueError as err:
        print(f"ballast decisions: --since: {err}", file=sys.stderr)
        return 2
    query = Query(pop=args.pop, group=args.group, kinds=kinds, since=since, limit=args.limit)
    columns = Columns()
    try:
        last = _print_all(source.records(query), args.json, columns)
        if last is None and not args.follow:
            unknown = _unknown(source, args.pop, args.group)
            if unknown:
                print(f"ballast decisions: not found: {unknown} in {source}", file=sys.stderr)
                return NOT_FOUND
            print(f"no decisions in {source} matching the filters")
        if args.follow:
            after = last or 0
            if last is None and not args.json:  # the followed rows get the header
                print(columns.lines([HEADER]))
            stream = source.follow(Query(args.pop, args.group, kinds, since), after,
                                   args.interval, stop=lambda: False)
            for record in stream:
                _emit([record], args.json, columns)
    except AdminError as err:
        print(f"ballast decisions: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # e.g. piped into `head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 0
