"""Issue 36, break 3: text a node sends reaches operators' terminals escaped.

A node connects over real gRPC with an id and an Envoy version string holding `ESC ] 0 ; … BEL`
(retitles a terminal), `ESC [ 2 J` (clears it) and `\\r\\n FAKE-LINE` (a line that looks like
Ballast's own), and NACKs a change with the same in its `error_detail`; the change is rolled back
with the NACK in its reason. Every CLI output that shows any of it — `status`, `status NODE`,
`decisions` (table, JSON and `--follow`), `rollout status`, `explain` — holds no control
character but its own line breaks, and shows the text escaped (`\\x1b]0;`). The control: the
server's own JSON (`/nodes`, the records) holds the raw characters, so the escaping is the
CLI's doing. The record's text (the rollback's reason) is escaped where it was made.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import unicodedata
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from control_plane.cli.main import main
from control_plane.cli.plan import PopPlan, report
from control_plane.decisions.read import iter_records
from control_plane.lifecycle.service import BallastService, ServiceConfig
from control_plane.security.terminal import escape, escaped
from control_plane.translate.diff import FieldChange, ResourceChange
from control_plane.translate.resources import CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE
from harness.eventually import eventually
from harness.xds_client import XdsClient, local_channel, make_node

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "desired.yaml"
TITLE, CLEAR, FAKE = "\x1b]0;pwned\x07", "\x1b[2J", "\r\n FAKE-LINE SYNCED"
HOSTILE_ID = f"ewr-evil{TITLE}"
HOSTILE_VERSION = f"1.40.0{CLEAR}{FAKE}"
HOSTILE_NACK = f"bad cluster{TITLE}{CLEAR}{FAKE}\u202e\x9b31m"
SHOWN = "\\x1b]0;pwned\\x07"  # how TITLE reads once escaped
BIDI = {"\u061c", "\u200e", "\u200f", "\u2028", "\u2029", *map(chr, range(0x202A, 0x202F)),
        *map(chr, range(0x2066, 0x206A))}


def raw_controls(text: str) -> list[str]:
    """Every character a terminal would act on, but the output's own line breaks."""
    return [c for c in text if c != "\n" and (unicodedata.category(c) == "Cc" or c in BIDI)]


def strings(value: Any) -> Iterator[str]:
    """Every string in a JSON value, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


# -- the function ----------------------------------------------------------------------------

@given(st.text())
def test_escaped_text_has_no_control_character_and_escaping_is_idempotent(text: str) -> None:
    shown = escape(text)
    assert not raw_controls(shown) and "\n" not in shown
    assert escape(shown) == shown
    assert escape("".join(c for c in text if not raw_controls(c) and c != "\n")) == \
        "".join(c for c in text if not raw_controls(c) and c != "\n")  # the rest unchanged


def test_escapes_read_like_python_and_json_values_are_escaped_keys_too() -> None:
    assert escape(HOSTILE_NACK) == ("bad cluster\\x1b]0;pwned\\x07\\x1b[2J\\r\\n FAKE-LINE "
                                    "SYNCED\\u202e\\x9b31m")
    assert escaped({"a\x1b": ["\t", 1, None, {"k": "\x00"}]}) == \
        {"a\\x1b": ["\\t", 1, None, {"k": "\\x00"}]}


def test_plan_lines_are_escaped() -> None:
    change = ResourceChange("Cluster", f"shop{CLEAR}", "change",
                            (FieldChange("name", f"a{FAKE}", "b"),))
    shown = report("new.yaml", "http://x", [PopPlan("ewr", "running", [change])])
    assert not raw_controls(shown), shown
    assert "shop\\x1b[2J" in shown and "FAKE-LINE" in shown


# -- through a running server ----------------------------------------------------------------

@dataclass
class Hostile:
    service: BallastService
    desired: Path
    state_dir: Path

    @property
    def url(self) -> str:
        assert self.service.admin is not None
        return self.service.admin.url

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=5) as response:
            return json.loads(response.read())


@pytest.fixture
async def hostile(tmp_path: Path) -> AsyncIterator[Hostile]:
    """A server whose change was rolled back by the hostile node's NACK."""
    desired = tmp_path / "desired.yaml"
    shutil.copy(EXAMPLE, desired)
    service = BallastService(ServiceConfig(
        desired_path=desired, state_dir=tmp_path / "state", xds_address="127.0.0.1:0",
        admin_address="127.0.0.1:0", probes=False, reload_poll_s=0.1, rollout_poll_ms=100))
    await service.start()
    first: dict[str, str] = {}

    def reject(type_url: str, names: list[str]) -> str | None:
        """ACK the first version of each type, NACK every later one (the change)."""
        if type_url not in first:
            first[type_url] = "seen"
            return None
        return HOSTILE_NACK

    node = make_node(HOSTILE_ID, "ewr")
    node.user_agent_version = HOSTILE_VERSION
    channel = local_channel(f"127.0.0.1:{service.server.port}")
    client = await XdsClient(channel, node, reject=reject).start()
    try:
        await client.subscribe(CLUSTER_TYPE)
        await client.wait_for(lambda c: bool(c.responses(CLUSTER_TYPE)), 10)
        await client.subscribe(ENDPOINT_TYPE, sorted(client.names(CLUSTER_TYPE)))
        await client.subscribe(LISTENER_TYPE)
        await client.wait_for(lambda c: bool(c.responses(LISTENER_TYPE)), 10)
        await client.subscribe(ROUTE_TYPE, ["edge"])
        await client.wait_for(lambda c: len(c.state.acked) == 4, 10)
        desired.write_text(desired.read_text().replace("connect_timeout: 300ms",
                                                       "connect_timeout: 301ms", 1))
        await eventually(lambda: [r for r in iter_records(tmp_path / "state")
                                  if r["kind"] == "rolled_back"], 20,
                         "the change rolled back by the NACK")
        yield Hostile(service, desired, tmp_path / "state")
    finally:
        await client.close()
        await channel.close()
        await service.stop(0)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    assert main(list(argv)) == 0, argv
    out = capsys.readouterr().out
    assert not raw_controls(out), (argv, [c for c in raw_controls(out)])
    return out


async def test_node_text_reaches_no_terminal_raw(
    hostile: Hostile, capsys: pytest.CaptureFixture[str],
) -> None:
    # the control: what the server holds and answers is the node's raw text
    nodes = await asyncio.to_thread(hostile.get, "/nodes")
    [shown] = [n for n in nodes["nodes"] if n["node_id"] == HOSTILE_ID]
    assert shown["envoy_version"] == HOSTILE_VERSION
    nacks = [r for r in iter_records(hostile.state_dir) if r["kind"] == "nack"]
    assert HOSTILE_NACK in [r["detail"]["message"] for r in nacks]
    # ... and what records say in words quotes it escaped: the NACK's rule, the rollback's
    assert all(not raw_controls(r["rule"]) for r in nacks)
    assert escape(HOSTILE_NACK) in nacks[0]["rule"]
    # the record's text that quotes the NACK (the rollback's reason) was escaped when made
    [rolled_back] = [r for r in iter_records(hostile.state_dir)
                     if r["kind"] == "rolled_back"]
    texts = list(strings(rolled_back))
    assert not [t for t in texts if raw_controls(t)]
    assert any(escape(HOSTILE_NACK) in t for t in texts), texts

    server = ("--server", hostile.url)
    out = await asyncio.to_thread(cli, capsys, "status", *server)
    assert escape(HOSTILE_ID) in out and escape(HOSTILE_VERSION) in out
    assert escape(HOSTILE_NACK) in out
    out = await asyncio.to_thread(cli, capsys, "status", HOSTILE_ID, *server)
    assert SHOWN in out and "\\r\\n FAKE-LINE SYNCED" in out
    out = await asyncio.to_thread(cli, capsys, "rollout", "status", *server)
    assert "rolled back" in out and escape(HOSTILE_NACK) in out
    out = await asyncio.to_thread(cli, capsys, "explain", "--pop", "ewr", "--group", "shop",
                                  *server)
    assert escape(HOSTILE_NACK) in out
    for source in (server, ("--state-dir", str(hostile.state_dir))):
        out = await asyncio.to_thread(cli, capsys, "decisions", *source)
        assert SHOWN in out
        out = await asyncio.to_thread(cli, capsys, "decisions", "--json", *source)
        records = [json.loads(line) for line in out.splitlines()]
        assert HOSTILE_NACK in [r["detail"]["message"] for r in records  # JSON keeps it
                                if r["kind"] == "nack"]
    # --follow: the records printed as they come, each line escaped
    child = subprocess.Popen(
        [sys.executable, "-m", "control_plane", "decisions", "--follow", "--interval", "0.05",
         "--kind", "nack", *server], stdout=subprocess.PIPE, cwd=ROOT)
    assert child.stdout is not None
    try:
        line = await asyncio.to_thread(child.stdout.readline)
        while b"nack" not in line:
            line = await asyncio.to_thread(child.stdout.readline)
        text = line.decode()
        assert not raw_controls(text.rstrip("\n")) and SHOWN in text, text
    finally:
        child.terminate()
        child.wait(10)
