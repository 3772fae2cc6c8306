"""The typed cassette header: one reader for every format, upgrading the old ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runner.core.cassette import Cassette
from runner.core.cassette_header import (
    FORMAT_VERSION,
    CassetteHeader,
    Harness,
    ProtocolChoice,
    SandboxOptions,
    read_header,
)
from runner.core.errors import InvalidInput
from runner.core.outcomes import AgentKind
from runner.core.paths import repo_root
from runner.core.rules import CURRENT_RULES, Rules

ROOT = repo_root()
# Recorded before hints, fix tracking and rules existed: format 1 lacking all three.
BEFORE_HINTS = (ROOT / "recordings/archive/2026-12-03-before-hints/qwen2.5-coder-0.5b-json"
                / "rogue-port-80.r0.jsonl")
# format 1 with every field of today's: the cpu-hog oracle as recorded under judging rules 2, kept here
# because the committed recordings are made again under newer formats and rules
ORACLE = ROOT / "tests/unit/data/oracle-format1-rules2.jsonl"


def _first_line(path: Path) -> dict[str, Any]:
    head: dict[str, Any] = json.loads(path.read_text("utf-8").split("\n", 1)[0])
    return head


def test_a_committed_format_1_header_reads_with_the_defaults_of_its_time() -> None:
    raw = _first_line(BEFORE_HINTS)
    assert raw["format"] == 1 and not {"hint_level", "track_fix", "rules", "seed"} & set(raw)
    head = Cassette.load(BEFORE_HINTS).head
    assert head.format == 1
    assert (head.hint_level, head.track_fix, head.rules, head.seed) == (0, False, Rules.V1, None)
    # What it did record is read as recorded.
    assert head.scenario_id == raw["scenario"]["id"] == "rogue-port-80"
    assert head.spec_hash == raw["spec_hash"]
    assert head.protocol == ProtocolChoice(raw["protocol"]["name"], raw["protocol"]["reason"])
    assert head.harness == Harness("rootbench", raw["harness"]["version"])
    assert head.options == SandboxOptions(raw["options"]["accel"], raw["options"]["transport"])
    assert head.agent is AgentKind.MODEL and head.model_name == raw["model"]["name"]
    assert head.started_at == raw["started_at"] and head.round == raw["round"]


def test_a_format_1_header_with_the_later_fields_keeps_them() -> None:
    head = Cassette.load(ORACLE).head
    assert head.format == 1 and head.track_fix is True and head.rules is Rules.V2
    assert head.agent is AgentKind.ORACLE


def test_a_bare_format_1_header_is_upgraded_field_by_field() -> None:
    head = read_header({"type": "header", "format": 1,
                        "scenario": {"id": "x", "spec_hash": "ab" * 32},
                        "model": {"kind": "openai", "name": "m"}}, "old.jsonl")
    assert head == CassetteHeader(format=1, scenario={"id": "x", "spec_hash": "ab" * 32},
                                  model={"kind": "openai", "name": "m"},
                                  spec_hash="ab" * 32,  # the scenario's, as replay checked it
                                  agent=AgentKind.MODEL)
    assert (head.protocol.name, head.round, head.hint_level) == ("tools", 0, 0)


def test_a_format_2_header_round_trips() -> None:
    head = CassetteHeader(
        scenario={"id": "cpu-hog", "task": "t"}, harness=Harness("rootbench", "9.9"),
        started_at="2026-12-05T03:00:00+00:00", spec_hash="0" * 64,
        image={"accel": "tcg"}, model={"kind": "openai", "name": "m", "n_ctx": 4096},
        agent=AgentKind.MODEL, protocol=ProtocolChoice("json", "asked"),
        options=SandboxOptions("tcg", "ssh"), round=2, hint_level=1, track_fix=True,
        rules=CURRENT_RULES, seed=7)
    event = head.to_event()
    assert event["format"] == FORMAT_VERSION == 2 and event["type"] == "header"
    again = read_header(json.loads(json.dumps(event)), "new.jsonl")
    assert again == head
    assert again.to_event() == event


def test_an_upgraded_header_is_written_as_format_2() -> None:
    old = Cassette.load(BEFORE_HINTS).head
    event = old.to_event()
    assert event["format"] == 2 and event["rules"] == 1 and event["hint_level"] == 0
    again = read_header(event, "upgraded.jsonl")
    assert again.format == 2 and {**vars(again), "format": 1} == vars(old)


@pytest.mark.parametrize("version", [3, 0, "2", True, None, 1.5, [2]])
def test_an_unknown_format_is_one_line_naming_the_field(version: object, tmp_path: Path) -> None:
    raw = _first_line(ORACLE)
    raw["format"] = version
    with pytest.raises(InvalidInput) as info:
        read_header(raw, "x.jsonl")
    assert info.value.field == "header.format" and info.value.path == "x.jsonl"
    assert "\n" not in str(info.value) and "unknown to this rootbench" in str(info.value)
    if version == 3:
        assert "newer rootbench" in str(info.value)
    # The same from the file: refused for its version before any field a newer format changed.
    path = tmp_path / "newer.jsonl"
    raw["scenario"] = "a shape this rootbench never wrote"
    path.write_text("\n".join([json.dumps(raw),
                               *ORACLE.read_text("utf-8").splitlines()[1:]]) + "\n")
    with pytest.raises(InvalidInput) as info:
        Cassette.load(path)
    assert info.value.field == "header.format" and info.value.path == str(path)
    assert info.value.line == 1 and "\n" not in str(info.value)


@pytest.mark.parametrize(("field", "value"), [
    ("hint_level", "2"), ("hint_level", -1), ("track_fix", "yes"), ("rules", 99),
    ("rules", True), ("round", 1.5), ("agent", "somebody"), ("seed", "7"),
    ("protocol", "json"), ("started_at", 5), ("model", []),
])
@pytest.mark.parametrize("version", [1, 2])
def test_a_wrong_typed_field_is_one_line_naming_it(field: str, value: object,
                                                   version: int, tmp_path: Path) -> None:
    raw = {**Cassette.load(ORACLE).head.to_event(), "format": version, field: value}
    with pytest.raises(InvalidInput) as info:
        read_header(raw, "x.jsonl")
    assert info.value.field == f"header.{field}", str(info.value)
    assert str(info.value).startswith(f"x.jsonl:1: header.{field}: ")
    assert "\n" not in str(info.value)
    # Read from a file, the schema or the reader says the same field.
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([json.dumps(raw),
                               *ORACLE.read_text("utf-8").splitlines()[1:]]) + "\n")
    with pytest.raises(InvalidInput) as info:
        Cassette.load(path)
    assert (info.value.field or "").startswith(f"header.{field}"), str(info.value)
    assert info.value.line == 1


@pytest.mark.parametrize("field", ["hint_level", "track_fix", "rules", "protocol", "agent"])
def test_format_2_requires_what_format_1_could_lack(field: str, tmp_path: Path) -> None:
    raw = Cassette.load(ORACLE).head.to_event()
    del raw[field]
    with pytest.raises(InvalidInput) as info:
        read_header(raw, "x.jsonl")
    assert info.value.field == f"header.{field}" and "format 2" in str(info.value)
    path = tmp_path / "short.jsonl"
    path.write_text("\n".join([json.dumps(raw),
                               *ORACLE.read_text("utf-8").splitlines()[1:]]) + "\n")
    with pytest.raises(InvalidInput) as info:
        Cassette.load(path)
    assert info.value.field == f"header.{field}"
    # The same header as format 1 means what it meant then.
    assert read_header({**raw, "format": 1}, "x.jsonl").format == 1


def test_every_committed_header_reads_and_upgrades_without_loss() -> None:
    paths = sorted((ROOT / "recordings").rglob("*.jsonl"))
    assert len(paths) > 100
    for path in paths:
        raw = _first_line(path)
        head = read_header(raw, str(path))
        # read as written (format 1 before 2026-12-05, 2 since): committed ones are never rewritten
        assert head.format == raw["format"] in (1, 2), path
        upgraded = read_header(head.to_event(), str(path))
        assert {**vars(upgraded), "format": head.format} == vars(head), path
        for key in ("hint_level", "track_fix", "round", "seed", "started_at", "spec_hash"):
            if key in raw:
                assert getattr(head, key) == raw[key], (path, key)
        if "rules" in raw:
            assert int(head.rules) == raw["rules"], path
