"""Hostile or broken input ends in one line and exit 2 (or 1), never a traceback, never a hang.

Everything here runs without a VM or a model: flags are checked before any work.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Cli, CliResult
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.app.runs import load_results
from runner.core.errors import InvalidInput
from runner.core.paths import repo_root


def _one_clean_line(r: CliResult, code: int, *fragments: str) -> None:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for fragment in fragments:
        assert fragment in r.stderr, r.stderr


@pytest.mark.parametrize("flags,fragment", [
    (["--endpoint", "not-a-url"], "--endpoint"),
    (["--endpoint", "http://127.0.0.1:99999"], "--endpoint"),
    (["--endpoint", "ftp://host/"], "--endpoint"),
    (["--model", "no-such-model"], "--model"),
    (["--model", "x/../../y"], "--model"),
    (["--model-file", "/nonexistent.gguf"], "--model-file"),
    (["--llama-server", "/nonexistent"], "--llama-server"),
    (["--llama-server", "/"], "--llama-server"),
    (["--temperature", "nan"], "--temperature"),
    (["--temperature", "-1"], "--temperature"),
    (["--max-tokens", "-1"], "--max-tokens"),
    (["--ctx-size", "0"], "--ctx-size"),
    (["--repeat", "0"], "--repeat"),
    (["--retry-infra", "-1"], "--retry-infra"),
    (["--record-mode", "once"], "--record-mode"),
])
def test_bad_flags_are_refused_before_any_work(cli: Cli, flags: list[str], fragment: str,
                                               tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    r = cli("bench", "--runs-dir", str(runs), *flags)
    _one_clean_line(r, 2, fragment)
    assert not runs.exists(), "nothing may be made before the flags are checked"


def test_run_checks_flags_too(cli: Cli, tmp_path: Path) -> None:
    r = cli("run", str(repo_root() / "specs" / "rogue-port-80.yaml"), "--temperature", "inf",
            "--runs-dir", str(tmp_path / "runs"))
    _one_clean_line(r, 2, "--temperature")


def test_runs_dir_that_cannot_be_made(cli: Cli, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = cli("bench", "--agent", "oracle", "--only", "rogue-port-80", "--runs-dir", str(blocker))
    _one_clean_line(r, 2, "--runs-dir")


def _results(tmp_path: Path, data: object | str) -> Path:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "run.json").write_text("{}")
    text = data if isinstance(data, str) else json.dumps(data)
    (run / "results.json").write_text(text)
    return run


GOOD_EPISODE = {"scenario": "rogue-port-80", "agent": "oracle", "model": "oracle",
                "protocol": "tools", "verdict": "pass", "seconds": 1.5, "turns": 2}


@pytest.mark.parametrize("data,field", [
    ("{not json", None),
    ([1, 2], None),
    ({"episodes": "none"}, "episodes"),
    ({"episodes": [dict(GOOD_EPISODE, verdict="great")]}, "episodes[0].verdict"),
    ({"episodes": [dict(GOOD_EPISODE, seconds="abc")]}, "episodes[0].seconds"),
    ({"episodes": [dict(GOOD_EPISODE, turns="ten")]}, "episodes[0].turns"),
    ({"episodes": [{"verdict": "pass"}]}, "episodes[0]"),
])
def test_damaged_results_are_one_line_for_report_and_resume(cli: Cli, tmp_path: Path,
                                                             data: object,
                                                             field: str | None) -> None:
    run = _results(tmp_path, data)
    for args in (["report", str(run)], ["bench", "--agent", "oracle", "--resume", str(run)]):
        r = cli(*args)
        _one_clean_line(r, 2, "results.json", *([field] if field else []))


def test_good_results_still_load(cli: Cli, tmp_path: Path) -> None:
    run = _results(tmp_path, {"episodes": [GOOD_EPISODE], "run": {}})
    _info, episodes = load_results(run)
    assert episodes[0].verdict == "pass" and episodes[0].turns == 2
    r = cli("report", str(run))
    assert r.returncode == 0 and "| rogue-port-80" in r.stdout, r.stderr


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) |
                    st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) |
                    st.dictionaries(st.text(max_size=12), inner, max_size=6), max_leaves=30)
EPISODE_LIKE = st.fixed_dictionaries({}, optional={k: JSON for k in GOOD_EPISODE}).map(
    lambda d: {**GOOD_EPISODE, **d})


@settings(max_examples=150, deadline=10_000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(JSON, st.fixed_dictionaries({"episodes": st.lists(EPISODE_LIKE, max_size=3)})))
def test_fuzzed_results_end_in_results_or_invalid_input(tmp_path: Path, data: object) -> None:
    run = _results(tmp_path, data)
    try:
        _info, episodes = load_results(run)
    except InvalidInput as exc:
        assert "\n" not in str(exc)
        return
    from runner.app.report import render_table

    for fmt in ("github", "json"):
        render_table(episodes, fmt)


def test_list_prints_no_control_sequences(cli: Cli, tmp_path: Path) -> None:
    spec = tmp_path / "evil.yaml"
    spec.write_text('id: evil\ntitle: "bad \\e]0;pwned\\a \\e[31mred\\e[0m \\x9b2J"\n'
                    "image: debian-12-nginx\ntask: t\nsetup: ['true']\n"
                    "probes: [{service: {name: nginx, active: true}}]\nsolution: ['true']\n")
    r = cli("list", str(spec))
    assert r.returncode == 0, r.stderr
    assert "bad" in r.stdout and "red" in r.stdout
    assert not any(ch in r.stdout for ch in "\x1b\x07\x9b"), repr(r.stdout)


SPEC_TEXT = st.one_of(
    st.text(max_size=400),
    st.builds(lambda title, extra: (
        f"id: fuzz\ntitle: {json.dumps(title)}\nimage: debian-12-nginx\ntask: t\n"
        f"setup: ['true']\nprobes: [{{service: {{name: nginx, active: true}}}}]\n"
        f"solution: ['true']\n{extra}"),
        st.text(max_size=40),
        st.sampled_from(["", "budget: {seconds: .nan}\n", "budget: {turns: 1e400}\n",
                         "forbidden: ['(a+)+$']\n", "forbidden: ['a{4294967296}']\n",
                         "forbidden: ['" + "(" * 5000 + "']\n",
                         "probes: [{http: {url: 'http://localhost:99999/', from: host}}]\n",
                         "tags: [!!binary aGVsbG8=]\n", "difficulty: 3\n"])))


@settings(max_examples=120, deadline=10_000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=SPEC_TEXT)
def test_fuzzed_spec_text_ends_in_a_scenario_or_invalid_input(tmp_path: Path, text: str) -> None:
    from runner.core.spec import load_spec

    path = tmp_path / "fuzz.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        scenario = load_spec(path)
    except InvalidInput as exc:
        assert "\n" not in str(exc)
        return
    from runner.core.text import printable

    printable(scenario.title).encode("utf-8")


def test_catastrophic_patterns_match_in_linear_time() -> None:
    import time

    from runner.core.patterns import search

    t0 = time.monotonic()
    assert not search("(a+)+$", "a" * 33 + "!")
    assert not search("(x+x+)+y", "x" * 5000)
    assert time.monotonic() - t0 < 1.0  # Python's re takes minutes on the first alone


def test_validate_checks_every_file_despite_monster_patterns(cli: Cli, tmp_path: Path) -> None:
    good = (repo_root() / "specs" / "rogue-port-80.yaml").read_text()
    (tmp_path / "a-good.yaml").write_text(good)
    monster = "(" * 5000 + "a" + ")" * 5000
    (tmp_path / "b-huge.yaml").write_text(
        good.replace("id: rogue-port-80", "id: b-huge")
        .replace("forbidden:", f"forbidden:\n  - 'a{{4294967296}}'\n  - '{monster}'", 1))
    (tmp_path / "c-lookbehind.yaml").write_text(good.replace("id: rogue-port-80", "id: c-look")
                                                .replace("forbidden:", "forbidden:\n  - '(?<=x)y'", 1))
    (tmp_path / "d-nan.yaml").write_text(good.replace("id: rogue-port-80", "id: d-nan") +
                                         "budget: {seconds: .nan}\n")
    (tmp_path / "e-port.yaml").write_text(good.replace("id: rogue-port-80", "id: e-port")
                                          .replace("http://localhost/", "http://localhost:99999/"))
    r = cli("validate", str(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr + r.stdout, r.stdout + r.stderr
    out = r.stdout
    assert "a-good.yaml: ok" in out and "1 valid, 4 invalid" in out, out
    assert "b-huge.yaml:" in out and "forbidden[1]" in out and "longer than 1000" in out
    assert "c-lookbehind.yaml:" in out and "RE2" in out
    assert "d-nan.yaml:" in out and "budget.seconds" in out and "finite" in out
    assert "e-port.yaml:" in out and "url" in out and "65535" in out


def test_a_cache_that_is_a_file_is_one_line(cli: Cli, tmp_path: Path) -> None:
    blocker = tmp_path / "cache-file"
    blocker.write_text("x")
    runs = tmp_path / "runs"
    r = cli("bench", "--agent", "oracle", "--only", "rogue-port-80", "--runs-dir", str(runs),
            env={"ROOTBENCH_CACHE": str(blocker)}, timeout=60)
    _one_clean_line(r, 2, "ROOTBENCH_CACHE", "not a folder")
    assert not runs.exists()


@pytest.mark.parametrize("edit,fields", [
    (lambda t: t.replace("title: ", 'title: "lone \\udc80 surrogate" #', 1), ["title", "Unicode"]),
    (lambda t: t.replace("http://localhost/", "http://localhost:abc/"), ["url", "65535"]),
    (lambda t: t.replace("    service: {name: nginx, active: true}",
                         "    service: {name: nginx, active: true}\n    within: .nan", 1),
     ["within", "finite"]),
])
def test_specs_that_used_to_validate_and_crash_later(cli: Cli, tmp_path: Path,
                                                     edit: Callable[[str], str],
                                                     fields: list[str]) -> None:
    spec = tmp_path / "x.yaml"
    spec.write_text(edit((repo_root() / "specs" / "rogue-port-80.yaml").read_text()))
    for command in ("validate", "list"):
        r = cli(command, str(spec))
        assert r.returncode == 2 and "Traceback" not in r.stderr + r.stdout, r.stdout + r.stderr
        said = r.stdout + r.stderr
        assert "x.yaml:" in said and all(f in said for f in fields), said
