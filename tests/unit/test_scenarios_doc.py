"""docs/scenarios.md held to the code: the shortcut kinds and the forbidden baseline.

A scenario author reads the kinds a shortcut may have and what the built-in
baseline forbids in the docs, not in the schema or in ``forbidden.py``; these
tests fail when either moves without the page (the kinds table against the
enum and the schema, each example against its spec; the baseline's rules by
name and order, each example against the rule it must or must not break, and
its lists generated from the code's own sets).
"""

from __future__ import annotations

import json
import re

from runner.core import forbidden
from runner.core.forbidden import BASELINE, baseline_rule
from runner.core.paths import repo_root
from runner.core.spec import ShortcutKind, load_spec

DOC = repo_root() / "docs" / "scenarios.md"
FORK_BOMB = "a fork bomb"  # the one rule that is not a Rule: the text itself is the harm


def _block(name: str) -> list[str]:
    """The lines between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->`` in the doc."""
    text = DOC.read_text(encoding="utf-8")
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    assert text.count(begin) == 1 and text.count(end) == 1, f"{DOC}: one {begin} and one {end}"
    return text.split(begin)[1].split(end)[0].strip("\n").splitlines()


def _cells(row: str) -> list[str]:
    """A Markdown table row's cells, with ``\\|`` (a pipe inside a cell) as ``|``."""
    parts = re.split(r"(?<!\\)\|", row.strip())[1:-1]
    return [p.strip().replace("\\|", "|") for p in parts]


def _rows(lines: list[str]) -> list[list[str]]:
    """The body rows of the one table in ``lines`` (header and rule left out)."""
    table = [line for line in lines if line.startswith("|")]
    return [_cells(line) for line in table[2:]]


def _code_spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_the_shortcut_kinds_table_is_the_enum_and_each_example_is_a_shortcut_of_that_kind() -> None:
    rows = _rows(_block("shortcut-kinds"))
    kinds = [_code_spans(row[0])[0] for row in rows]
    assert kinds == [k.value for k in ShortcutKind], "docs/scenarios.md's kinds are not the enum's"
    schema = json.loads((repo_root() / "schema" / "scenario.schema.json").read_text())
    assert kinds == schema["$defs"]["shortcut"]["properties"]["kind"]["enum"]
    for kind, (_k, meaning, example) in zip(kinds, rows, strict=True):
        assert meaning, kind
        m = re.fullmatch(r"`([a-z0-9-]+)`: (.+)", example)
        assert m, f"{kind}: the example is `spec-id`: shortcut name, not {example!r}"
        spec = load_spec(repo_root() / "specs" / f"{m[1]}.yaml")
        named = {s.name: s.kind.value for s in spec.shortcuts}
        assert named.get(m[2]) == kind, f"{m[1]} has no shortcut {m[2]!r} of kind {kind}"


def _lists() -> list[str]:
    """The baseline's lists as the doc shows them, from the code's own sets and patterns."""
    def paths(values: object) -> str:
        assert isinstance(values, (set, frozenset, tuple))
        return ", ".join(f"`{v}`" for v in sorted(str(x) for x in values))

    return [
        f"- system directories (`SYSTEM_DIRS`): {paths(forbidden.SYSTEM_DIRS)}",
        f"- package trees, every file below them (`PACKAGE_TREES`): {paths(forbidden.PACKAGE_TREES)}",
        f"- the accounts' files (`ACCOUNT_FILES`): {paths(forbidden.ACCOUNT_FILES)}",
        f"- ssh's units (`SSH_UNITS`): {paths(forbidden.SSH_UNITS)}",
        f"- disk devices (`DISK_DEVICE`, a regex): `{forbidden.DISK_DEVICE.pattern}`",
        f"- programs that only make or wipe file systems (`FORMATTERS`, a regex): "
        f"`{forbidden.FORMATTERS.pattern}`",
        f"- wrappers dropped before the program is judged: {paths(forbidden._WRAPPERS)}",
        f"- shells whose `-c` text is judged as a command of its own (so is `eval`'s): "
        f"{paths(forbidden._SHELLS)}",
    ]


def test_the_forbidden_baseline_in_the_docs_is_the_codes() -> None:
    lines = _block("forbidden-baseline")
    rows = _rows(lines)
    assert [row[0] for row in rows] == [r.name for r in BASELINE] + [FORK_BOMB]
    for name, caught, passed in rows:
        examples = _code_spans(caught)
        assert examples, name
        for command in examples:
            assert baseline_rule(command) == name, (command, name)
        for command in _code_spans(passed):
            assert baseline_rule(command) is None, (command, name)
    shown = [line for line in lines if line.startswith("- ")]
    expected = _lists()
    assert shown == expected, (
        "docs/scenarios.md's forbidden baseline lists are not the code's; put these lines "
        "under its table:\n" + "\n".join(expected))


def test_the_docs_say_an_alternative_has_no_kind_as_the_schema_says() -> None:
    schema = json.loads((repo_root() / "schema" / "scenario.schema.json").read_text())
    fields = list(schema["$defs"]["alternative"]["properties"])
    assert fields == ["name", "why", "commands"]
    rows = _rows(_block("alternatives"))
    assert len(rows) >= 3 and all(len(row) == 3 and all(row) for row in rows)
    text = DOC.read_text(encoding="utf-8")
    assert "An alternative has `name:`, `why:` and `commands:`, and no `kind:`" in text
    # each "a shortcut when" cell names a shortcut kind that exists
    kinds = {k.value for k in ShortcutKind}
    for row in rows:
        named = [k for k in _code_spans(row[2]) if k in kinds]
        assert named, f"{row[0]}: say which shortcut kind it becomes"
