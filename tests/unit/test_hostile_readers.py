"""Hostile input, round two (issue 27): what reads recordings and results, and what writes reports.

Every test here runs without a VM or a model. A run directory is made by hand
from committed oracle cassettes (their verdict lines are the episodes), so
each test starts from something real and changes one thing a hostile user
would.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Cli, CliResult, run_cli_process
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.app import atif, html_report
from runner.app.report import junit_xml
from runner.app.runs import load_results
from runner.core.errors import InvalidInput
from runner.core.paths import repo_root
from runner.core.text import FORMAT_RANGES, one_line, printable

ORACLE = repo_root() / "recordings" / "oracle"
IDS = ["bad-execstart", "broken-sshd-config"]


def _as_nobody(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as an unprivileged user (``nobody``) when this runs as root, so that file
    permissions mean something. A process: another user is a process's, never a call's."""
    prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
    # PYTHONPATH: nobody runs this checkout's code, whichever checkout the venv was installed from
    return run_cli_process(*args, prefix=prefix, env={"PYTHONPATH": str(repo_root())})


@pytest.fixture(scope="module", autouse=True)
def nobody_reaches_the_code() -> Iterator[None]:
    """``nobody`` must be able to start the CLI: search (x, never read) permission is lent, for
    this module's tests only, on the folders above the checkout and the venv that lack it.

    A checkout made by ``git clone . "$(mktemp -d)"`` sits in a 0700 folder of root's, which
    nobody cannot pass through to reach the interpreter or the code; the modes are put back
    after the last test.
    """
    lent: dict[Path, int] = {}
    if os.geteuid() == 0:
        for top in (repo_root(), Path(sys.executable).parent):
            for folder in [top, *top.parents]:
                mode = folder.stat().st_mode
                if folder not in lent and not mode & stat.S_IXOTH:
                    lent[folder] = stat.S_IMODE(mode)
                    folder.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
    try:
        yield
    finally:
        for folder, mode in lent.items():
            folder.chmod(mode)


def _one_line(r: CliResult | subprocess.CompletedProcess[str], code: int, *fragments: str) -> str:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "unexpected error" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    for fragment in fragments:
        assert fragment.lower() in r.stderr.lower(), r.stderr
    return r.stderr


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def _write_events(path: Path, events: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in events),
                    encoding="utf-8")
    return path


def _run_dir(tmp: Path, ids: list[str] = IDS, name: str = "run") -> Path:
    """A run directory as bench leaves it: results.json (the cassettes' verdicts) and cassettes/."""
    run = tmp / name
    episodes = []
    for i in ids:
        cassette = run / "cassettes" / f"{i}.r0.jsonl"
        cassette.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ORACLE / f"{i}.jsonl", cassette)
        verdict = {k: v for k, v in _events(cassette)[-1].items() if k != "type"}
        verdict["cassette"] = str(cassette)
        episodes.append(verdict)
    (run / "run.json").write_text("{}\n")
    (run / "results.json").write_text(json.dumps({"run": {}, "episodes": episodes}, indent=2))
    return run


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A folder every user may enter (pytest's own are root's alone), for the tests run as nobody."""
    path = Path(tempfile.mkdtemp(prefix="rootbench-h27-"))
    path.chmod(0o755)
    yield path
    for p in [path, *path.rglob("*")]:
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o755)
    shutil.rmtree(path)


def _results(run: Path) -> dict[str, Any]:
    return json.loads((run / "results.json").read_text())


# --- 1. every path a command writes is checked before any work --------------------------------

def test_report_out_to_an_existing_directory_is_refused_before_any_work(cli: Cli,
                                                                        tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    taken = tmp_path / "taken"
    taken.mkdir()
    _one_line(cli("report", str(run), "--html", "--out", str(taken)), 2, "--out",
              "is a directory")
    (run / "report.html").mkdir()  # the default target, taken by a folder
    _one_line(cli("report", str(run), "--html"), 2, "is a directory")


def test_report_out_to_an_unwritable_place_is_one_line(cli: Cli, open_tmp: Path) -> None:
    tmp_path = open_tmp
    run = _run_dir(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    _one_line(cli("report", str(run), "--html", "--out", str(blocker / "r.html")), 2, "--out",
              "not a directory")
    _one_line(cli("report", str(run), "--html", "--out", "/proc/rootbench/r.html"), 2, "--out")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    r = _as_nobody("report", str(run), "--html", "--out", str(locked / "r.html"))
    _one_line(r, 2, "--out", "ermission denied")
    assert not list(locked.iterdir()), "the check leaves nothing behind"


def test_export_out_to_an_existing_file_or_unwritable_place_is_one_line(cli: Cli,
                                                                        open_tmp: Path) -> None:
    tmp_path = open_tmp
    run = _run_dir(tmp_path)
    existing = tmp_path / "out.json"
    existing.write_text("keep me")
    _one_line(cli("export", str(run), "--out", str(existing)), 2, "--out", "regular file")
    assert existing.read_text() == "keep me"
    _one_line(cli("export", str(run), "--out", str(existing / "sub")), 2, "--out")
    _one_line(cli("export", str(run), "--out", "/proc/rootbench-atif"), 2, "--out")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    _one_line(_as_nobody("export", str(run), "--out", str(locked / "atif")), 2, "--out",
              "ermission denied")


def test_an_existing_trajectory_folder_that_is_a_file_is_one_line(cli: Cli, tmp_path: Path) -> None:
    run = _run_dir(tmp_path, IDS[:1])
    out = tmp_path / "atif"
    out.mkdir()
    (out / f"{IDS[0]}.r0").write_text("a file where a folder goes")
    _one_line(cli("export", str(run), "--out", str(out)), 2, "not a directory")


def test_report_and_export_files_have_the_mode_of_other_run_files(cli: Cli, tmp_path: Path) -> None:
    run = _run_dir(tmp_path, IDS[:1])
    assert cli("-q", "report", str(run), "--html").returncode == 0
    assert cli("-q", "export", str(run)).returncode == 0
    cassette_mode = stat.S_IMODE((run / "cassettes" / f"{IDS[0]}.r0.jsonl").stat().st_mode)
    umask = os.umask(0)
    os.umask(umask)
    made_files = [run / "report.html", *run.glob("atif/*/*/*.*")]
    assert len(made_files) == 4  # the report, agent/trajectory.json, verifier/reward.txt, .json
    for made in made_files:
        assert stat.S_IMODE(made.stat().st_mode) == 0o666 & ~umask == cassette_mode, made


def test_a_run_directory_that_cannot_be_entered_is_one_line(open_tmp: Path) -> None:
    run = _run_dir(open_tmp)
    run.chmod(0o700)  # root's: nobody cannot look inside
    _one_line(_as_nobody("report", str(run)), 2, str(run), "permission denied")
    _one_line(_as_nobody("report", str(run), "--html", "--out", str(open_tmp / "r.html")), 2,
              "permission denied")
    _one_line(_as_nobody("compare", str(run), str(run)), 2, "permission denied")


# --- 4. numbers in results.json ------------------------------------------------------------------

@pytest.mark.parametrize("raw,field,fragment", [
    ("NaN", "episodes[0].score", "NaN is not a number"),
    ("-Infinity", "episodes[0].seconds", "-Infinity is not a number"),
    ("1e999", "episodes[0].seconds", "out of range"),
    ("7" * 5000, "episodes[0].turns", "5000 digits"),
    ("1.5", "episodes[0].score", "greater than"),
])
def test_impossible_numbers_in_results_are_one_line_naming_file_and_field(
        cli: Cli, tmp_path: Path, raw: str, field: str, fragment: str) -> None:
    run = _run_dir(tmp_path, IDS[:1])
    data = _results(run)
    key = field.split(".")[-1]
    data["episodes"][0][key] = "@@"
    (run / "results.json").write_text(json.dumps(data).replace('"@@"', raw))
    with pytest.raises(InvalidInput) as caught:
        load_results(run)
    assert caught.value.field == field and fragment in str(caught.value), str(caught.value)
    assert "set_int_max_str_digits" not in str(caught.value)
    for args in (["report", str(run)], ["report", str(run), "--html"],
                 ["compare", str(run), str(run)]):
        _one_line(cli(*args), 2, "results.json", field)
    r = cli("bench", "--agent", "oracle", "--resume", str(run), "--runs-dir", str(tmp_path))
    _one_line(r, 2, "results.json", field)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(number=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(),
                        st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e999",
                                         "9" * 4301, "-" + "9" * 5000]),
                        st.integers(min_value=4000, max_value=6000).map(lambda n: "7" * n)),
       key=st.sampled_from(["score", "seconds", "turns", "tokens_in", "prompt_ms", "round",
                            "hint_level", "milestone_fraction"]))
def test_any_number_in_results_loads_in_range_or_is_one_line(tmp_path: Path, number: object,
                                                              key: str) -> None:
    run = _run_dir(tmp_path, IDS[:1], name=f"run-{key}")
    data = _results(run)
    data["episodes"][0][key] = "@@"
    raw = number if isinstance(number, str) else json.dumps(number)  # NaN, Infinity as Python does
    (run / "results.json").write_text(json.dumps(data).replace('"@@"', raw))
    try:
        _info, episodes = load_results(run)
    except InvalidInput as exc:
        assert exc.path and exc.path.endswith("results.json") and exc.field == f"episodes[0].{key}"
        assert "\n" not in str(exc) and len(str(exc)) < 400
        return
    value = getattr(episodes[0], key) if key != "score" else episodes[0].score
    assert isinstance(value, int | float) and value == value and abs(value) != float("inf")
    assert value >= 0
    if key in ("score", "milestone_fraction"):
        assert value <= 1


# --- 6. --format json: one JSON document on stdout, errors too ----------------------------------

@pytest.mark.parametrize("args,code", [
    (["report", "/nonexistent-run"], 2),
    (["compare", "/nonexistent-a", "/nonexistent-b"], 2),
    (["list", "/nonexistent-specs"], 2),
    (["replay", "/nonexistent.jsonl"], 2),
    (["report", "--format", "json", "--bogus-flag"], 2),
])
def test_json_errors_are_one_json_document_on_stdout(cli: Cli, args: list[str], code: int) -> None:
    r = cli(*args, "--format", "json") if "--format" not in args else cli(*args)
    assert r.returncode == code, (r.stdout, r.stderr)
    doc = json.loads(r.stdout)
    assert doc["exit"] == code and isinstance(doc["error"], str) and doc["error"]


def test_report_html_with_json_prints_json(cli: Cli, tmp_path: Path) -> None:
    run = _run_dir(tmp_path, IDS[:1])
    r = cli("-q", "report", str(run), "--html", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"report": str(run / "report.html")}


# --- 5. bidirectional overrides and other format characters never reach a reader -----------------

RLO_NAME = "gnp\u202e.exe"  # shown with its override: "gnp" then "exe." reversed, i.e. "gnpexe.png"-ish
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c\u200b\ufeff\U000e0041"


def _format_chars(text: str) -> set[str]:
    return {c for c in text if unicodedata.category(c) == "Cf"}


def test_the_format_table_is_this_pythons_unicode_category_cf() -> None:
    ours = {c for a, b in FORMAT_RANGES for c in range(a, b + 1)}
    theirs = {c for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf"}
    assert ours == theirs


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec=None), max_size=80)
       | st.text(alphabet=st.sampled_from(BIDI + "ab.\n\x1b[31m"), max_size=40))
def test_shown_text_has_no_format_or_control_characters(text: str) -> None:
    for shown in (printable(text), one_line(text)):
        assert not _format_chars(shown)
        assert not any(unicodedata.category(c) == "Cc" and c not in "\n\t" for c in shown)
        shown.encode("utf-8")  # never a lone surrogate
    assert "\n" not in one_line(text)


def _bidi_run(tmp: Path, payload: str) -> Path:
    """A run whose scenario, reason, command output and model text all carry ``payload``."""
    run = _run_dir(tmp, IDS[:1])
    cassette = run / "cassettes" / f"{IDS[0]}.r0.jsonl"
    events = _events(cassette)
    for e in events:
        if e["type"] == "header":
            e["scenario"]["title"] += payload
            e["scenario"]["task"] += payload
        elif e["type"] == "guest" and e["op"] == "exec":
            e["result"]["output"] += payload
        elif e["type"] == "model":
            e["reply"]["message"]["content"] = f"{e['reply']['message'].get('content') or ''}{payload}"
        elif e["type"] == "verdict":
            e["reason"] += payload
    _write_events(cassette, events)
    data = _results(run)
    data["episodes"][0]["reason"] += payload
    data["episodes"][0]["model"] += payload
    (run / "results.json").write_text(json.dumps(data, ensure_ascii=False))
    return run


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=30)
       .map(lambda s: s + RLO_NAME + BIDI))
def test_report_table_junit_html_and_atif_show_no_format_characters(tmp_path: Path,
                                                                     payload: str) -> None:
    run = _bidi_run(tmp_path / str(abs(hash(payload))), payload)
    _info, episodes = load_results(run)
    assert not _format_chars(junit_xml(episodes))
    page = html_report.render(html_report.load_run_arms(run))
    assert not _format_chars(page)
    assert "gnp.exe" in page
    for path in atif.export([run], tmp_path / str(abs(hash(payload))) / "atif"):
        assert not _format_chars(path.read_text(encoding="utf-8"))


def test_cli_report_and_list_write_no_format_characters(cli: Cli, tmp_path: Path) -> None:
    run = _bidi_run(tmp_path, RLO_NAME + BIDI)
    data = _results(run)
    data["episodes"][0]["scenario"] += RLO_NAME + BIDI
    (run / "results.json").write_text(json.dumps(data, ensure_ascii=False))
    r = cli("report", str(run))
    assert r.returncode == 0 and "gnp.exe" in r.stdout and not _format_chars(r.stdout), r.stdout
    spec = (repo_root() / "specs" / f"{IDS[0]}.yaml").read_text(encoding="utf-8")
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "x.yaml").write_text(spec.replace("\ntitle: ", f"\ntitle: {RLO_NAME}{BIDI} ", 1),
                                  encoding="utf-8")
    r = cli("list", str(specs))
    assert r.returncode == 0, r.stderr
    assert "gnp.exe" in r.stdout and not _format_chars(r.stdout + r.stderr), r.stdout


# --- 2. every read confined to the directories the command was given ----------------------------

def _secret_cassette(tmp: Path) -> Path:
    """A valid cassette *outside* the run directory, holding text that must never be shown."""
    events = _events(ORACLE / f"{IDS[0]}.jsonl")
    events[0]["scenario"]["task"] = "TOP-SECRET-OUTSIDE-THE-RUN"
    return _write_events(tmp / "elsewhere" / "secret.r0.jsonl", events)


@pytest.mark.parametrize("how", ["scenario", "cassette", "arm", "symlink"])
def test_report_never_reads_a_cassette_outside_its_run_directory(cli: Cli, tmp_path: Path,
                                                                 how: str) -> None:
    secret = _secret_cassette(tmp_path)
    run = _run_dir(tmp_path, IDS[:1])
    data = _results(run)
    ep = data["episodes"][0]
    (run / "cassettes" / f"{IDS[0]}.r0.jsonl").unlink()
    ep["cassette"] = None
    if how == "scenario":
        ep["scenario"] = "../../elsewhere/secret"
    elif how == "cassette":
        ep["cassette"] = str(secret)
    elif how == "arm":
        ep["arm"], ep["cassette"] = "../../elsewhere", "secret.r0.jsonl"
    else:
        (run / "cassettes" / f"{IDS[0]}.r0.jsonl").symlink_to(secret)
    (run / "results.json").write_text(json.dumps(data))
    r = cli("-q", "report", str(run), "--html", "--out", str(tmp_path / "r.html"))
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "TOP-SECRET" not in page
    assert "outside the run directory" in page or "not in the run directory" in page


def test_report_still_finds_cassettes_inside_by_any_of_those_fields(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, IDS[:1])
    data = _results(run)
    data["episodes"][0]["cassette"] = f"runs/moved/cassettes/{IDS[0]}.r0.jsonl"  # made elsewhere
    (run / "results.json").write_text(json.dumps(data))
    page = html_report.render(html_report.load_run_arms(run))
    assert "not in the run directory" not in page and "outside the run" not in page


# --- 3. replay: unreadable folders, verdicts of another episode ----------------------------------

def test_an_unreadable_subfolder_is_reported_and_the_exit_is_not_0(open_tmp: Path) -> None:
    folder = open_tmp / "recs"
    (folder / "locked").mkdir(parents=True)
    shutil.copy2(ORACLE / f"{IDS[0]}.jsonl", folder / f"{IDS[0]}.jsonl")
    shutil.copy2(ORACLE / f"{IDS[1]}.jsonl", folder / "locked" / f"{IDS[1]}.jsonl")
    (folder / "locked").chmod(0o700)  # root's: nobody cannot list it
    r = _as_nobody("replay", "--offline", str(folder))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "locked" in r.stderr and "cannot list the folder" in r.stderr, r.stderr
    assert "1/2 replayed verdicts equal" in r.stdout and "unreadable" in r.stdout, r.stdout
    # A top folder that cannot be listed is said to be one, not "no cassettes found".
    (folder / "locked").chmod(0o755)
    folder.chmod(0o700)
    r = _as_nobody("replay", "--offline", str(folder))
    assert r.returncode == 2 and "no cassettes found" not in r.stderr, r.stderr
    assert "permission denied" in r.stderr.lower(), r.stderr
    r = _as_nobody("export", str(folder), "--out", str(open_tmp / "atif"))
    _one_line(r, 2, "permission denied")


@pytest.mark.parametrize("key,value", [("scenario", "ssh-stopped"), ("agent", "model"),
                                       ("model", "gpt-4o"), ("protocol", "json"), ("round", 3)])
def test_a_verdict_of_another_episode_never_replays_same(cli: Cli, tmp_path: Path, key: str,
                                                          value: object) -> None:
    events = _events(ORACLE / f"{IDS[0]}.jsonl")
    events[-1][key] = value
    cassette = _write_events(tmp_path / "c.jsonl", events)
    r = cli("replay", "--offline", "--format", "json", str(cassette))
    (row,) = json.loads(r.stdout)
    assert r.returncode == 2 and row["outcome"] == "unreadable", row
    assert f"verdict.{key}" in row["note"], row


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(min_value=0, max_value=50),
       t=st.one_of(st.floats(min_value=-10, max_value=1e7, allow_nan=False),
                   st.sampled_from([0.0, 1e6, 1e300])))
def test_a_tampered_clock_line_is_blamed_on_itself(tmp_path: Path, which: int, t: float) -> None:
    from runner.app.replay import load_replayable, replay_loaded

    events = _events(ORACLE / f"{IDS[0]}.jsonl")
    clocks = [i for i, e in enumerate(events) if e["type"] == "clock"]
    at = clocks[which % len(clocks)]
    if events[at]["t"] == t:
        return
    events[at]["t"] = t
    cassette = _write_events(tmp_path / f"c{which}.jsonl", events)
    line = at + 1
    try:
        outcome = replay_loaded(load_replayable(cassette), offline=True)
    except InvalidInput as exc:  # refused on reading: the edited line is the one named
        assert exc.line == line and exc.field == "clock.t", str(exc)
        return
    # Readable (the edit kept the readings in order): a replay that diverged names it first.
    if not outcome.same:
        first = outcome.note.split(";")[0]
        assert f"line {line}" in first or f"(line {line})" in first, outcome.note


# --- 6. a crafted output cannot blow the report up ------------------------------------------------

def test_a_10_mb_output_is_cut_in_the_report_and_says_by_how_much(cli: Cli, tmp_path: Path) -> None:
    run = _run_dir(tmp_path, IDS[:1])
    cassette = run / "cassettes" / f"{IDS[0]}.r0.jsonl"
    events = _events(cassette)
    huge = "A" * (10 * 1024 * 1024)
    execs = [e for e in events if e["type"] == "guest" and e["op"] == "exec"]
    execs[0]["result"]["output"] = huge
    _write_events(cassette, events)
    r = cli("-q", "report", str(run), "--html")
    assert r.returncode == 0, r.stderr
    size = (run / "report.html").stat().st_size
    assert size < 2 * 1024 * 1024, size
    page = (run / "report.html").read_text(encoding="utf-8")
    cut = len(huge) - html_report.MAX_SHOWN_CHARS
    assert f"{cut:,} more characters of {len(huge):,} cut from the report" in page
    assert f"{len(huge)} characters" in page  # the fold still tells the whole size


# --- 7. messages --------------------------------------------------------------------------------

def _spec_with(tmp: Path, old: str, new: str) -> Path:
    text = (repo_root() / "specs" / f"{IDS[0]}.yaml").read_text(encoding="utf-8")
    assert old in text
    path = tmp / "x.yaml"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return path


def test_an_exponent_without_a_dot_is_a_number(cli: Cli, tmp_path: Path) -> None:
    spec = _spec_with(tmp_path, "within: 5", "within: 5e0")
    r = cli("validate", str(spec))
    assert r.returncode == 0 and "ok (bad-execstart)" in r.stdout, r.stdout
    spec = _spec_with(tmp_path, "within: 5", "within: 1e9")
    r = cli("validate", str(spec))
    assert r.returncode == 2 and "greater than the maximum" in r.stdout, r.stdout
    assert "is not of type 'number'" not in r.stdout
    spec = _spec_with(tmp_path, "within: 5", "within: '1e1'")
    r = cli("validate", str(spec))
    assert r.returncode == 2 and "quoted" in r.stdout, r.stdout


def test_an_alias_is_reported_at_its_own_line(cli: Cli, tmp_path: Path) -> None:
    text = (repo_root() / "specs" / f"{IDS[0]}.yaml").read_text(encoding="utf-8")
    lines = text.splitlines()
    lines[0] = lines[0] + "  # &base anchors below"
    text = "\n".join(lines).replace("budget:", "budget: &base", 1) + "\nextra:\n  <<: *base\n"
    spec = tmp_path / "x.yaml"
    spec.write_text(text, encoding="utf-8")
    r = cli("validate", str(spec))
    assert r.returncode == 2, r.stdout
    assert f"{spec}:{len(text.splitlines())}: " in r.stdout and "aliases" in r.stdout, r.stdout


def test_a_cut_short_cassette_counts_the_turns_it_has(tmp_path: Path) -> None:
    events = _events(ORACLE / f"{IDS[0]}.jsonl")[:-1]  # no verdict: cut short
    turns = sum(e["type"] == "model" for e in events)
    assert turns > 1
    cassette = _write_events(tmp_path / "cut.jsonl", events)
    (run,) = html_report.runs_from_cassettes([cassette])
    (ep,) = run.episodes
    assert ep.turns == turns and "cut short" in ep.get("reason") and f"{turns} turns" in ep.get("reason")
    page = html_report.render([run])
    assert f"{turns} turns (cut short)" in page and " 0 turns" not in page


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_results_json_that_is_a_directory_or_fifo_is_named_and_never_blocks(
        cli: Cli, tmp_path: Path, kind: str) -> None:
    run = _run_dir(tmp_path, IDS[:1])
    (run / "results.json").unlink()
    if kind == "directory":
        (run / "results.json").mkdir()
    else:
        os.mkfifo(run / "results.json")
    what = "a directory" if kind == "directory" else "a FIFO"
    for args in (["report", str(run)], ["report", str(run), "--html"],
                 ["compare", str(run), str(run)],
                 ["bench", "--agent", "oracle", "--resume", str(run), "--runs-dir", str(tmp_path)]):
        r = cli(*args, timeout=60)  # a FIFO opened for reading would block here forever
        _one_line(r, 2, "results.json", what)
        assert "no results.json" not in r.stderr


def test_a_specs_folder_that_is_not_one_is_one_line(cli: Cli, tmp_path: Path) -> None:
    cassette = ORACLE / f"{IDS[0]}.jsonl"
    _one_line(cli("replay", "--offline", "--specs", str(tmp_path / "none"), str(cassette)), 2,
              "--specs", "no such directory")
    (tmp_path / "file").write_text("x")
    _one_line(cli("replay", "--offline", "--specs", str(tmp_path / "file"), str(cassette)), 2,
              "--specs", "not a directory")
