"""The spec loader: every bad input ends in one clear InvalidInput, never a traceback."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.core import yamlfile
from runner.core.errors import InvalidInput
from runner.core.paths import repo_root
from runner.core.probes import HttpProbe, ServiceProbe
from runner.core.spec import (
    Scenario,
    check_specs,
    load_spec,
    load_specs,
    scenario_from_dict,
    scenario_from_text,
    scenario_to_dict,
)
from runner.core.yamlfile import parse_yaml

GOOD = textwrap.dedent("""\
    id: demo
    title: Demo
    image: debian-12-nginx
    task: The site is down.
    setup: [systemctl stop nginx]
    probes:
      - name: nginx up
        service: {name: nginx, active: true}
      - http: {url: "http://localhost/", status: 200, body_contains: Welcome}
        within: 5
    invariants:
      - service: {name: ssh, active: true}
    solution: [systemctl start nginx]
    forbidden: ['rm\\s+-rf\\s+/']
""")


def _write(tmp_path: Path, text: str | bytes, name: str = "x.yaml") -> Path:
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


def test_good_spec_loads_with_defaults(tmp_path: Path) -> None:
    s = load_spec(_write(tmp_path, GOOD))
    assert s.id == "demo" and s.budget.turns == 10 and s.budget.output_limit == 4000
    assert [p.kind for p in s.probes] == ["service", "http"]
    assert s.probes[0].name == "nginx up"
    assert s.probes[1].name.startswith("http http://localhost/") and s.probes[1].within == 5.0
    assert s.invariants[0].name == "service ssh active=true"
    assert len(s.spec_hash) == 64


def test_probes_are_built_into_typed_kinds(tmp_path: Path) -> None:
    s = load_spec(_write(tmp_path, GOOD))
    assert s.probes[0].condition == ServiceProbe("nginx", active=True)
    # ``status: 200`` was written out: same check as the default, and the name still shows it.
    assert s.probes[1].condition == HttpProbe("http://localhost/", body_contains="Welcome")
    assert s.probes[1].name == "http http://localhost/ -> 200"


def test_probes_keep_their_cassette_header_shape(tmp_path: Path) -> None:
    """Cassettes store each probe as kind + params as written; old ones must keep loading."""
    s = load_spec(_write(tmp_path, GOOD))
    d = json.loads(json.dumps(scenario_to_dict(s)))
    assert d["probes"] == [
        {"kind": "service", "params": {"name": "nginx", "active": True}, "name": "nginx up",
         "within": None},
        {"kind": "http", "params": {"url": "http://localhost/", "status": 200,
                                    "body_contains": "Welcome"},
         "name": "http http://localhost/ -> 200", "within": 5.0}]
    assert d["invariants"] == [{"kind": "service", "params": {"name": "ssh", "active": True},
                                "name": "service ssh active=true", "within": None}]
    back = scenario_from_dict(d)
    assert back == s and json.loads(json.dumps(scenario_to_dict(back))) == d


def test_every_committed_cassette_header_round_trips() -> None:
    for path in sorted((repo_root() / "recordings").rglob("*.jsonl")):
        with path.open(encoding="utf-8") as fh:
            recorded = json.loads(fh.readline())["scenario"]
        rewritten = json.dumps(scenario_to_dict(scenario_from_dict(recorded)), ensure_ascii=False)
        assert rewritten == json.dumps(recorded, ensure_ascii=False), path


@pytest.mark.parametrize("probe", [
    {"kind": "socket", "params": {"x": 1}, "name": "n", "within": None},
    {"kind": "service", "params": {"name": "ssh", "colour": "red"}, "name": "n", "within": None},
    {"kind": "service", "params": {"active": True}, "name": "n", "within": None},
    {"kind": "service", "params": "ssh", "name": "n", "within": None},
    {"kind": "service", "params": {"name": "ssh"}, "name": "n", "within": "soon"},
    {"kind": "service", "params": {"name": "ssh"}, "name": 7, "within": None},
    {"kind": "service", "params": {"name": "ssh"}, "within": None},
    ["service", {"name": "ssh"}],
])
def test_a_damaged_probe_in_a_cassette_header_is_invalid_input(tmp_path: Path, probe: Any) -> None:
    d = scenario_to_dict(load_spec(_write(tmp_path, GOOD)))
    d["probes"] = [probe]
    with pytest.raises(InvalidInput, match="the cassette's scenario is unreadable"):
        scenario_from_dict(d)


BAD: dict[str, tuple[str | bytes, str]] = {
    "empty": ("", "empty"),
    "list": ("- a\n- b\n", "mapping at the top level, not a list"),
    "scalar": ("hello\n", "not a str"),
    "syntax": ("id: [unclosed\n", "YAML syntax error"),
    "duplicate key": (GOOD + "id: again\n", "duplicate key 'id'"),
    "unknown key": (GOOD + "colour: red\n", "colour"),
    "wrong type": (GOOD.replace("status: 200", "status: abc"), "probes[1].http.status"),
    "out of range": (GOOD + "budget: {turns: 0}\n", "budget.turns"),
    "unknown kind": (GOOD.replace("service: {name: ssh, active: true}", "socket: {x: 1}"),
                     "unknown probe kind or key 'socket'"),
    "two kinds": (GOOD.replace("service: {name: nginx, active: true}",
                               "service: {name: nginx}\n    file: {path: /x}"), "several probe kinds"),
    "no kind": (GOOD.replace("  - service: {name: ssh, active: true}", "  - name: lonely"),
                "no probe kind"),
    "bad id": (GOOD.replace("id: demo", "id: Demo!"), "id"),
    "bad regex": (GOOD.replace("rm\\s+-rf\\s+/", "(unclosed"), "forbidden[0]"),
    "unknown image": (GOOD.replace("image: debian-12-nginx", "image: no-such-image"),
                      "no image recipe"),
    "alias": (GOOD + "tags: &a [x]\ndescription: *a\n", "aliases are not allowed"),
    "binary": (b"\x00\x01\x02garbage\xff", "binary data"),
    "not utf8": (b"id: \xff\xfe\n", "not UTF-8"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_gives_one_line_naming_the_file(tmp_path: Path, case: str) -> None:
    text, expected = BAD[case]
    path = _write(tmp_path, text)
    with pytest.raises(InvalidInput) as info:
        load_spec(path)
    message = str(info.value)
    assert message.startswith(str(path)), message
    assert expected in message, message
    assert "\n" not in message


def test_error_names_the_line(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD.replace("status: 200", "status: abc"))
    with pytest.raises(InvalidInput) as info:
        load_spec(path)
    line = next(i for i, text in enumerate(GOOD.splitlines(), 1) if "status: 200" in text)
    assert f"{path}:{line}: probes[1].http.status: 'abc' is not of type 'integer'" == str(info.value)


def test_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefgh", "bcdefghi", strict=True))
    with pytest.raises(InvalidInput, match="aliases"):
        load_spec(_write(tmp_path, bomb))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="no such file"):
        load_spec(tmp_path / "nope.yaml")


def test_duplicate_ids_across_files(tmp_path: Path) -> None:
    _write(tmp_path, GOOD, "a.yaml")
    _write(tmp_path, GOOD, "b.yaml")
    results = check_specs([tmp_path])
    assert results[0][2] is None
    assert results[1][2] is not None and "duplicate id 'demo'" in str(results[1][2])
    with pytest.raises(InvalidInput, match="duplicate id"):
        load_specs([tmp_path])


def test_committed_specs_are_valid() -> None:
    scenarios = load_specs([repo_root() / "specs"])
    assert len(scenarios) >= 3
    assert {"rogue-port-80", "permission-403", "nginx-config-syntax"} <= {s.id for s in scenarios}


# --- property: any text is a scenario or the one invalid-spec error ------------------------

_yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(["id", "title", "image", "task", "setup", "probes", "http",
                                      "service", "name", "url", "status", "budget", "turns",
                                      "solution", "within", "x"]), children, max_size=5),
    max_leaves=20)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=400))
def test_any_text_is_valid_or_invalid_input(text: str) -> None:
    try:
        result = scenario_from_text(text, "fuzz.yaml")
    except InvalidInput as exc:
        assert str(exc).startswith("fuzz.yaml")
    else:
        assert isinstance(result, Scenario)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_yaml_values)
def test_any_yaml_structure_is_valid_or_invalid_input(value: object) -> None:
    text = yaml.safe_dump(value)
    try:
        scenario_from_text(text, "fuzz.yaml")
    except InvalidInput as exc:
        assert str(exc).startswith("fuzz.yaml") and "\n" not in str(exc)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(sorted(yaml.safe_load(GOOD))), st.data())
def test_mutating_one_field_of_a_good_spec(key: str, data: st.DataObject) -> None:
    spec = yaml.safe_load(GOOD)
    spec[key] = data.draw(_yaml_values)
    try:
        scenario_from_text(yaml.safe_dump(spec), "fuzz.yaml")
    except InvalidInput as exc:
        assert "\n" not in str(exc)


SHORTCUTS = textwrap.dedent("""\
    shortcuts:
      - name: start it by hand
        kind: started-by-hand
        why: nginx runs outside its unit, so a reboot loses it
        commands: [nginx]
      - name: start it by hand
        kind: other
        why: the same name twice
        commands: ['true']
""")


def test_shortcuts_are_read_and_kept_out_of_the_cassette_header(tmp_path: Path) -> None:
    one = SHORTCUTS.rsplit("  - name: start it by hand", 1)[0]
    s = load_spec(_write(tmp_path, GOOD + one))
    [cut] = s.shortcuts
    assert (cut.name, str(cut.kind), cut.commands) == ("start it by hand", "started-by-hand", ("nginx",))
    assert "shortcuts" not in scenario_to_dict(s)
    assert scenario_from_dict(scenario_to_dict(s)).shortcuts == ()


def test_shortcut_names_are_unique_and_kinds_known(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=r"shortcuts\[1\]\.name: shortcut name 'start it by hand' is used twice"):
        load_spec(_write(tmp_path, GOOD + SHORTCUTS))
    with pytest.raises(InvalidInput, match=r"shortcuts"):
        load_spec(_write(tmp_path, GOOD + SHORTCUTS.replace("kind: other", "kind: sneaky")))


def test_every_committed_spec_is_proven_against_at_least_two_shortcuts() -> None:
    """The adversarial review is part of a scenario: verify runs each shortcut and proves it fails."""
    for spec in load_specs([repo_root() / "specs"]):
        assert len(spec.shortcuts) >= 2, f"{spec.id} lists {len(spec.shortcuts)} shortcut(s)"
        assert all(cut.why.strip() and cut.commands for cut in spec.shortcuts), spec.id


def test_the_recheck_keys_in_the_spec_and_the_cassette_schemas(tmp_path: Path) -> None:
    """``recheck_after`` and ``reboot``: read from the spec, written to the header only when set,
    and the cassette schema accepts the header, the judge's reboot exchange and the verdict."""
    from runner.core.cassette import _validator
    valid = _validator().is_valid
    s = load_spec(_write(tmp_path, GOOD + "recheck_after: 30\nreboot: true\n"))
    assert (s.recheck_after, s.reboot) == (30.0, True)
    head = {"type": "header", "format": 1, "scenario": json.loads(json.dumps(scenario_to_dict(s)))}
    assert valid(head) and scenario_from_dict(head["scenario"]) == s
    assert "reboot" not in scenario_to_dict(load_spec(_write(tmp_path, GOOD, "plain.yaml")))
    for bad in ({"recheck_after": 0}, {"recheck_after": "30"}, {"reboot": "yes"}):
        assert not valid({**head, "scenario": {**head["scenario"], **bad}}), bad
    reboot = {"type": "guest", "op": "reboot", "input": {"timeout": 300.0},
              "result": {"clean": True, "seconds": 41.2}}
    assert valid(reboot)
    assert valid({**reboot, "result": {"error": "guest-down", "message": "no shell"}})
    assert not valid({**reboot, "result": {"clean": True}})
    assert not valid({**reboot, "input": {"timeout": 300.0, "command": "reboot"}})
    verdict = {"type": "verdict", "verdict": "fail", "scenario": "demo", "agent": "oracle",
               "model": "oracle", "protocol": "tools"}
    for stage, ok in (("pause", True), ("reboot", True), (None, True), ("later", False)):
        assert valid({**verdict, "failed_recheck": stage}) is ok, stage


# --- the strict YAML loader (runner/core/yamlfile.py): libyaml first, the reference to word errors

def _either(text: str, accelerated: bool) -> tuple[str, str]:
    """What ``parse_yaml`` gives, as text that compares NaN equal: ("ok", data+lines) or the error."""
    try:
        data, lines = parse_yaml(text, "f.yaml", accelerated=accelerated)
    except InvalidInput as exc:
        return "error", str(exc)
    return "ok", repr((data, sorted(lines.items(), key=repr)))


def test_the_loader_is_accelerated_here() -> None:
    """The fast path is libyaml's: without it every replay re-reads specs 20 times slower."""
    assert yaml.__with_libyaml__ and yamlfile._FastLoader is not None


def test_both_parsers_read_every_committed_spec_and_recipe_alike() -> None:
    files = sorted((repo_root() / "specs").glob("*.yaml")) + sorted((repo_root() / "images").glob("*.yaml"))
    assert len(files) > 60
    for f in files:
        text = f.read_text()
        fast, reference = _either(text, True), _either(text, False)
        assert fast[0] == "ok" and fast == reference, f


EDGES = [
    GOOD.replace("\n", "\r\n"), GOOD.replace("\n", "\r"), GOOD + "description: a\u2028b\n",
    GOOD + "description: \"a\\u0085b\"\ntags: [x, \"y\"]\n", "%YAML 1.1\n---\n" + GOOD,
    "%YAML 1.2\n---\n" + GOOD, "%YAML 1.3\n---\n" + GOOD, GOOD + "...\n", "\ufeff" + GOOD,
    "a: 1e9\nb: .5\nc: -.inf\nd: .NaN\ne: 0x1F\nf: 0o17\ng: 017\nh: 1:30\ni: 1_000\nj: +1.\n",
    "a: !!str 1\nb: !!binary aGk=\nc: 2001-12-14\nd: ~\ne: yes\nf: [a, {b: c}]\n",
    "? [a, b]\n: 1\n", "? a\n: 1\n? b\n", "a: |\n  x\n   y\nb: >-\n  z\n\n  w\n",
    "a: &x 1\nb: 2\n", "&a k: 1\nother: *a\n", "a: &a [1]\nb: *a\n", "a: *nope\n",
    "a: &a {x: 1}\nb: {<<: *a, y: 2}\n", "a:\n  <<: {x: 1}\n  y: 2\n", "- [" * 600 + "]" * 600,
    "- " * 1200 + "x\n", "a: 'unterminated\n", "a: b: c\n", "\ta: 1\n", "a: 1\na: 2\n",
    "x: " + "9" * 4301 + "\n", "x: " + "9" * 4300 + "\n", "x: 0x" + "f" * 4000 + "\n",
    "? " + "1" * 5000 + "\n: x\n", "x: " + "1" * 5000 + ":30\n", "",
    "# only a comment\n", "---\n---\n", "a: 1\n--- \nb: 2\n",
    # each of these once read differently by the two parsers (found by the property test below)
    "1\t", "a: 1\t\n", "---", "!", "?", "---\n?  _", "&a- \r[?:\x85]", ">#@ \u2028  0",
    "\ufeff\ufeffaa", "[-6.7\n66e+16, null ?ull, null]\n", "{the?n: x}\n", "[1118?]\n",
    "a:\n  - x\nb:\n", "a: {x: }\n", "a: [x, ]\n",
]

HOSTILE = {  # PyYAML's own slips on these were a crash (exit 1, a crash log), not a line
    "x: !!bool maybe\n": "f.yaml:1: 'maybe' cannot be read as tag:yaml.org,2002:bool",
    "x: !!int ''\n": "f.yaml:1: '' cannot be read as tag:yaml.org,2002:int",
    "a: b\nx: \"\\UFFFFFFFF\"\n": "f.yaml:2: YAML syntax error: ",
}


@pytest.mark.parametrize("text", sorted(HOSTILE))
@pytest.mark.parametrize("accelerated", [True, False])
def test_a_value_pyyaml_slips_on_is_one_line(text: str, accelerated: bool) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_yaml(text, "f.yaml", accelerated=accelerated)
    assert str(info.value).startswith(HOSTILE[text]) and "\n" not in str(info.value)


def test_a_dot_and_underscores_is_text_not_a_broken_float() -> None:
    """YAML 1.2's float pattern took `._` for a float, which float() refused: a crash."""
    for accelerated in (True, False):
        assert parse_yaml("x: ._\ny: .5_0\n", "f.yaml", accelerated=accelerated)[0] == \
            {"x": "._", "y": 0.5}


@pytest.mark.parametrize("text", EDGES, ids=range(len(EDGES)))
def test_both_parsers_agree_on_the_edges(text: str) -> None:
    """Line ends, directives, tags, aliases, nesting past libyaml's depth, huge integers:
    the data and lines, or the error message, are the reference parser's."""
    assert _either(text, True) == _either(text, False)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=st.sampled_from(list("ab1:-?[]{},&*!#|>'\"\n\t .e\r%@`~\\x\u2028\x85")),
               max_size=80) | st.text(max_size=200))
def test_both_parsers_agree_on_any_text(text: str) -> None:
    assert _either(text, True) == _either(text, False)


@pytest.mark.parametrize("accelerated", [True, False])
def test_an_alias_of_a_key_is_refused_at_its_line(accelerated: bool) -> None:
    """A key's anchor reused as a value: composed, it is the key node met again."""
    with pytest.raises(InvalidInput) as info:
        parse_yaml("&a k: 1\nother: *a\n", "f.yaml", accelerated=accelerated)
    assert str(info.value) == "f.yaml:2: YAML anchors and aliases are not allowed (an alias *a)"


@pytest.mark.parametrize("number", ["9" * 4301, "-" + "9" * 5000, "0x" + "f" * 3600,
                                    "1" * 4400 + ":30"])
def test_a_huge_integer_is_one_line_naming_file_and_line(cli: Cli, tmp_path: Path,
                                                         number: str) -> None:
    """Python will not print an integer of over 4300 digits: it was a crash (exit 1, crash log)
    in validate and list; now the loader refuses it where it is written."""
    path = _write(tmp_path, GOOD.replace("  - name: nginx up\n",
                                         f"  - name: nginx up\n    weight: {number}\n"))
    line = GOOD.splitlines().index("  - name: nginx up") + 2
    want = f"{path}:{line}: probes[0].weight: an integer of over 4300 digits (if it is text, quote it)"
    r = cli("validate", str(path))  # validate tables each file's verdict on stdout
    assert (r.returncode, r.stdout.splitlines()[0], r.stderr) == (2, want, ""), r
    r = cli("list", str(tmp_path))
    assert (r.returncode, r.stderr.strip()) == (2, f"rootbench: {want}"), r


def test_an_integer_of_4300_digits_is_still_a_number(tmp_path: Path) -> None:
    data, _lines = parse_yaml("x: " + "9" * 4300 + "\n", "f.yaml")
    assert data["x"] == 10 ** 4300 - 1


def test_what_no_run_reads_leaves_a_models_recording_of_the_spec_standing(tmp_path: Path) -> None:
    """A model's run reads the task, the hints and the system prompt; the judge reads the probes.
    The label, the tags, the title and the description are read by neither, so a label corrected
    by measurement (issue #49 item 6) must not retire the recordings; a task reworded must."""
    from runner.core.cassette import Cassette
    from runner.core.spec import UNREAD_KEYS, ran_as_today, scenario_from_text

    root = repo_root()
    cassette = Cassette.load(root / "recordings" / "live" / "qwen2.5-coder-1.5b-json" / "ssh-stopped.r0.jsonl")
    text = (root / "specs" / "ssh-stopped.yaml").read_text()
    today = scenario_from_text(text, "ssh-stopped.yaml")
    head = cassette.head
    assert ran_as_today(head.spec_hash, head.scenario, today)
    relabelled = text.replace("difficulty: easy", "difficulty: hard").replace(
        "title: ", "title: The ", 1)
    assert relabelled != text and {"difficulty", "title"} <= UNREAD_KEYS
    assert ran_as_today(head.spec_hash, head.scenario, scenario_from_text(relabelled, "x.yaml"))
    reworded = text.replace("task: |\n  ", "task: |\n  Please: ", 1)
    assert reworded != text
    assert not ran_as_today(head.spec_hash, head.scenario, scenario_from_text(reworded, "x.yaml"))
