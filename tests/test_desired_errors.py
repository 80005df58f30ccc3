"""How problems are reported: format, all at once, did-you-mean, unreadable and oversized files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from control_plane.desired import (
    MAX_FILE_BYTES,
    DesiredStateError,
    Problem,
    load_desired,
    parse_desired,
)

EXAMPLE = Path(__file__).parent.parent / "examples" / "desired.yaml"


def problems_of(text: str | bytes, source: str = "desired.yaml") -> list[str]:
    with pytest.raises(DesiredStateError) as caught:
        parse_desired(text, source)
    return [str(p) for p in caught.value.problems]


def test_problem_format() -> None:
    problem = Problem("desired.yaml", 14, 9,
                      "origin_groups.shop.tiers.critical.queue_policy.adaptive_lifo",
                      "low_watermark (90) must be below high_watermark (80)")
    assert str(problem) == (
        "desired.yaml:14:9: origin_groups.shop.tiers.critical.queue_policy.adaptive_lifo: "
        "low_watermark (90) must be below high_watermark (80)")
    assert str(Problem("d.yaml", 0, 0, "", "the file is empty")) == "d.yaml: the file is empty"
    assert str(Problem("d.yaml", 3, 1, "", "unknown key 'x'")) == "d.yaml:3:1: unknown key 'x'"


def test_every_problem_of_a_file_is_reported_at_once() -> None:
    text = EXAMPLE.read_text()
    text = text.replace("port_offset: 1}", "port_offset: one}")
    text = text.replace("max_step: 15", "max_step: 16")
    text = text.replace("port: 8082", "port: 80820")
    text = text.replace("tier: normal}", "tier: norml}")
    text = text.replace("low_watermark: 60}}\n  normal", "low_watermark: 90}}\n  normal")
    with pytest.raises(DesiredStateError) as caught:
        parse_desired(text, "desired.yaml")
    error = caught.value
    messages = [f"{p.path}: {p.message}" for p in error.problems]
    assert messages == [
        "pops.sjc.port_offset: must be an integer, got 'one'",
        "tiers.critical.queue_policy.adaptive_lifo: "
        "low_watermark (90) must be below high_watermark (80)",
        "failover.max_step: must be between 1 and 15, got 16",
        "origin_groups.shop.origins.secondary.port: must be between 1 and 65535, got 80820",
        "classification.rules[3].tier: unknown tier 'norml'; did you mean 'normal'?",
    ]
    assert str(error) == "\n".join(str(p) for p in error.problems)
    assert [p.line for p in error.problems] == sorted(p.line for p in error.problems)


@pytest.mark.parametrize(("typo", "meant"), [
    ("listners", "listeners"), ("origin_group", "origin_groups"), ("classificaton",
                                                                   "classification"),
])
def test_did_you_mean_for_top_level_keys(typo: str, meant: str) -> None:
    text = EXAMPLE.read_text().replace(f"\n{meant}:", f"\n{typo}:")
    assert any(f"unknown key '{typo}'; did you mean '{meant}'?" in p for p in problems_of(text))


def test_did_you_mean_inside_a_tier() -> None:
    text = EXAMPLE.read_text().replace("    max_queue_depth: 8000", "    max_queue_dept: 8000")
    assert problems_of(text) == [
        "desired.yaml:31:5: tiers.normal: unknown key 'max_queue_dept'; "
        "did you mean 'max_queue_depth'?"]


def test_no_suggestion_when_nothing_is_close() -> None:
    text = EXAMPLE.read_text().replace("  mode: health_proportional", "  zzz: 1")
    assert problems_of(text) == ["desired.yaml:53:3: failover: unknown key 'zzz'"]


def test_oversized_file_is_refused_before_parsing(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"# " + b"x" * MAX_FILE_BYTES + b"\n")
    with pytest.raises(DesiredStateError) as caught:
        load_desired(big)
    assert [str(p) for p in caught.value.problems] == [
        f"{big}: file is 1,048,579 bytes; the limit is 1 MiB (1,048,576 bytes)"]
    assert problems_of(b"#" * (MAX_FILE_BYTES + 1), "mem") == [
        "mem: file is 1,048,577 bytes; the limit is 1 MiB (1,048,576 bytes)"]


def test_a_file_of_exactly_the_limit_is_read(tmp_path: Path) -> None:
    text = EXAMPLE.read_bytes()
    padded = tmp_path / "padded.yaml"
    padded.write_bytes(text + b"#" * (MAX_FILE_BYTES - len(text)))
    assert load_desired(padded).pop_names == ("ewr", "sjc")


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(DesiredStateError) as caught:
        load_desired(missing)
    assert str(caught.value) == f"{missing}: cannot read file: No such file or directory"


def test_directory_is_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(DesiredStateError, match=r"not a regular file \(a directory\)"):
        load_desired(tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_unreadable_file(tmp_path: Path) -> None:
    locked = tmp_path / "locked.yaml"
    locked.write_text("pops: {}\n")
    locked.chmod(0)
    with pytest.raises(DesiredStateError, match="cannot read file: Permission denied"):
        load_desired(locked)


def test_not_utf8() -> None:
    assert problems_of(b"pops:\n  ewr: {listen_address: \xff}\n") == [
        "desired.yaml:2:25: not valid UTF-8 (byte 0xff); save the file as UTF-8"]


def test_utf8_byte_order_mark_is_accepted() -> None:
    data = b"\xef\xbb\xbf" + EXAMPLE.read_bytes()
    assert parse_desired(data, "bom.yaml").pop_names == ("ewr", "sjc")


def test_source_and_digest_of_text() -> None:
    desired = parse_desired(EXAMPLE.read_text(), "x.yaml")
    assert desired.source == "x.yaml"
    assert desired.digest == load_desired(EXAMPLE).digest


def test_control_characters_are_a_yaml_error() -> None:
    [problem] = problems_of("pops: {ewr: {}}\x07\n")
    assert problem.startswith("desired.yaml:1:1: YAML error: unacceptable character #x0007")
