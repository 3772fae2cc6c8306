"""Hostile inputs, round three (issue #46, part A): the paths files name, the files users name,
what ``--write``/``--out`` write and text from recordings, each attack as the issue found it.
No VM, no model: files under ``tmp_path``, the CLI in-process."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from conftest import Cli

from runner.app.report import render_table, statistics_table
from runner.app.runs import load_results
from runner.core.episode import Episode
from runner.core.errors import InvalidInput
from runner.core.machines import name_problem
from runner.core.outcomes import AgentKind, Verdict
from runner.core.paths import MAX_SYMLINKS, contained, read_regular, repo_root, resolve_in_root
from runner.core.text import reason_first

# --- every path a file names is resolved inside its root ------------------------------------


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    """A root (an image's ``/``, a run directory) and a host folder beside it."""
    root, host = tmp_path / "root", tmp_path / "host"
    (root / "run" / "data").mkdir(parents=True)
    (root / "etc").mkdir()
    (host / "data").mkdir(parents=True)
    return root, host


def test_contained_follows_every_symlink_before_it_says_inside(tmp_path: Path) -> None:
    root, host = _tree(tmp_path)
    assert contained(root / "run" / "data", root) == root / "run" / "data"
    assert contained(root, root) == root
    assert contained(root / "no" / "such" / "file", root) == root / "no" / "such" / "file"
    (root / "out").symlink_to(host)  # an early component out of the root: the last one is plain
    assert contained(root / "out" / "data", root) is None
    assert contained(root / "run" / ".." / ".." / "host", root) is None
    assert contained(host, root) is None
    (root / "inner").symlink_to("run/data")  # a link that stays inside is fine
    assert contained(root / "inner", root) == root / "run" / "data"
    (root / "loop").symlink_to("loop")  # a loop is never "inside", whatever follows it
    assert contained(root / "loop" / ".." / ".." / "host", root) is None
    assert contained(root / "bad\0name", root) is None
    # a root reached through a symlink is the same root
    (tmp_path / "alias").symlink_to(root)
    assert contained(tmp_path / "alias" / "etc", root) == root / "etc"


def test_resolve_in_root_follows_symlinks_as_the_rooted_system_would(tmp_path: Path) -> None:
    root, host = _tree(tmp_path)
    (root / "var").mkdir()
    (root / "var" / "run").symlink_to("/run")  # Debian's own absolute link
    assert resolve_in_root(root, "/var/run/data") == root / "run" / "data"
    assert resolve_in_root(root, "var/run/data") == root / "run" / "data"
    # an absolute link to a host folder is that path inside the root (absent there), never the host's
    (root / "srv").symlink_to(host)
    assert resolve_in_root(root, "/srv/data") == root / str(host).lstrip("/") / "data"
    # a relative link climbing out stops at the root, like '..' in a chroot
    (root / "up").symlink_to(os.path.relpath(host, root))
    assert resolve_in_root(root, "/up/data") == root / "host" / "data"
    assert resolve_in_root(root, "/../../../etc") == root / "etc"
    assert resolve_in_root(root, "/run/data/../../etc") == root / "etc"
    (root / "self").symlink_to("/")
    assert resolve_in_root(root, "/self") == root
    # a loop, or more links than Linux follows, resolves to nothing
    (root / "a").symlink_to("b")
    (root / "b").symlink_to("a")
    assert resolve_in_root(root, "/a/x") is None
    for i in range(MAX_SYMLINKS + 1):
        (root / f"l{i}").symlink_to(f"l{i + 1}")
    (root / f"l{MAX_SYMLINKS + 1}").mkdir()
    assert resolve_in_root(root, "/l0") is None
    assert resolve_in_root(root, f"/l{MAX_SYMLINKS // 2}") == root / f"l{MAX_SYMLINKS + 1}"
    (root / "etc" / "file").write_text("x")
    assert resolve_in_root(root, "/etc/file/below") is None  # not a directory


# --- every file a user names is a regular file, checked for size first ----------------------


def test_read_regular_refuses_devices_fifos_and_large_files_unopened(tmp_path: Path) -> None:
    small = tmp_path / "small.txt"
    small.write_bytes(b"12345")
    assert read_regular(small, 5) == b"12345"
    with pytest.raises(InvalidInput, match=r"larger than 4 bytes$"):
        read_regular(small, 4)
    with pytest.raises(InvalidInput, match="larger than 4 bytes: not a cassette"):
        read_regular(small, 4, what="cassette")
    with pytest.raises(InvalidInput, match="/dev/full: not a regular file$"):
        read_regular("/dev/full", 1 << 20)
    with pytest.raises(InvalidInput, match="not a regular file"):
        read_regular("/dev/zero", 1 << 20)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(InvalidInput, match=r"not a regular file \(why\)"):
        read_regular(fifo, 1 << 20, hint=" (why)")  # refused unopened: an open would block
    with pytest.raises(InvalidInput, match="no such file"):
        read_regular(tmp_path / "absent", 10)
    with pytest.raises(InvalidInput, match="not a regular file"):
        read_regular(tmp_path, 10)


# --- every write keeps the target's mode and refuses a symlink -----------------------------

CASSETTE = repo_root() / "recordings" / "archive" / "2026-12-04-before-validity" / \
    "qwen2.5-coder-1.5b-json" / "ssh-stopped.r0.jsonl"


def test_report_out_keeps_the_mode_and_refuses_a_symlink(cli: Cli, tmp_path: Path) -> None:
    """Issue #46 item 9, ``report --html --out``: a 0600 report stays 0600; a symlink where
    the report goes is one line and exit 2 before anything is rendered, the link kept."""
    out = tmp_path / "r.html"
    out.write_text("old")
    out.chmod(0o600)
    r = cli("report", str(CASSETTE), "--html", "--out", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert out.stat().st_mode & 0o7777 == 0o600 and "<html" in out.read_text()
    victim = tmp_path / "victim.txt"
    victim.write_text("someone's file\n")
    link = tmp_path / "link.html"
    link.symlink_to(victim)
    r = cli("report", str(CASSETTE), "--html", "--out", str(link), cwd=tmp_path)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.startswith(f"rootbench: {link}: --out: is a symlink") and \
        len(r.stderr.splitlines()) == 1
    assert link.is_symlink() and victim.read_text() == "someone's file\n"


def test_export_refuses_a_symlink_where_a_trajectory_goes(cli: Cli, tmp_path: Path) -> None:
    """``export --out DIR``: each trajectory.json is written by the same rule (a file there
    keeps its mode, a symlink is refused), so a link planted in DIR never redirects a write."""
    out = tmp_path / "atif"
    r = cli("export", str(CASSETTE), "--out", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    [written] = [Path(line) for line in r.stdout.splitlines()]
    written.chmod(0o600)
    r = cli("export", str(CASSETTE), "--out", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert written.stat().st_mode & 0o7777 == 0o600
    victim = tmp_path / "victim.json"
    victim.write_text("{}\n")
    written.unlink()
    written.symlink_to(victim)
    r = cli("export", str(CASSETTE), "--out", str(out), cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert f"{written}: --out: is a symlink" in r.stderr
    assert written.is_symlink() and victim.read_text() == "{}\n"


# --- text from recordings in a table is one line, escaped for where it lands ---------------

EVIL = "evil\n| injected | row |\n<b>bold</b> [link](http://x)\x1b[31m"


def _hostile_episodes() -> list[Episode]:
    return [Episode(scenario=f"s{i}\n| x |", agent=AgentKind.MODEL, model=EVIL, protocol=EVIL,
                    round=0, verdict=v, reason=f"why\n{EVIL}", arm="a|b\nc")
            for i, v in enumerate((Verdict.PASS, Verdict.FAIL, Verdict.INFRA_ERROR))]


def _unescaped_pipes(line: str) -> int:
    return len(re.findall(r"(?<!\\)\|", line))


@pytest.mark.parametrize("fmt", ["github", "plain"])
def test_report_tables_keep_one_line_per_row_whatever_the_names_hold(fmt: str) -> None:
    """Issue #46 item 8, in ``report``'s tables: a model, protocol, scenario or reason from a
    recording held newlines, ``|`` and HTML, which added rows and cells to the table (a
    ``--format github`` table is Markdown). Each is one line now; in Markdown, escaped."""
    eps = _hostile_episodes()
    text = render_table(eps, fmt)
    stats = statistics_table(eps, fmt)
    for table, rows in ((text.split("\n\n")[0], len(eps)), (stats, len(eps) + 1)):  # + overall
        lines = table.splitlines()
        assert len(lines) == rows + (2 if fmt == "github" else 1), lines  # header (and rule)
        assert "\x1b" not in table
        if fmt == "github":
            assert len({_unescaped_pipes(line) for line in lines}) == 1, lines
            assert re.search(r"(?<!\\)<b>", table) is None, table
    why = text.split("not scored:\n", 1)[1].splitlines()
    assert len(why) == 1 and why[0].startswith("  s2 ")  # only the infra-error is not scored


# --- a machine's name ------------------------------------------------------------------------

def test_a_machine_may_not_take_a_name_its_hosts_file_gives_to_loopback() -> None:
    """Issue #46 item 9: a machine could be named ``localhost``; every guest's /etc/hosts
    gives that name to its own loopback, so ``ssh localhost`` never reached the other VM."""
    for name in ("localhost", "ip6-localhost", "ip6-loopback"):
        why = name_problem(name)
        assert why is not None and why.startswith(f"{name!r} is a reserved name")
    for name in ("db", "web", "localhost2", "app-localhost"):
        assert name_problem(name) is None


# --- an empty selection flag ---------------------------------------------------------------

@pytest.mark.parametrize("args", [["--tags", ""], ["--tags", ",", " "], ["--difficulty", ""],
                                  ["--exclude", ""], ["--only", ""], ["--only", " "]])
def test_a_selection_flag_with_no_word_is_one_line_exit_2(cli: Cli, args: list[str]) -> None:
    """Issue #46 item 9: ``--tags ''`` filtered nothing, so the command ran every scenario
    where the user meant to narrow it (and ``--only ''`` was called a path). An empty value
    names nothing: one line naming the flag, exit 2, before any work."""
    r = cli("list", *args)
    assert (r.returncode, r.stdout) == (2, ""), r.stdout[-300:]
    assert r.stderr == f"rootbench: {args[0]}: names nothing (an empty value would filter " \
                       "nothing: give a word, or leave the flag out)\n"


# --- an error about a long value says its reason -----------------------------------------

def test_a_schema_error_about_a_long_value_keeps_its_reason(tmp_path: Path) -> None:
    """Issue #46 item 9: a 100-machine spec's error was the list's repr cut at 200 characters,
    before the reason ("is too long"). The value is cut, the reason kept whole."""
    machines = [{"name": f"m{i}", "image": "debian-12-postgres"} for i in range(100)]
    message = f"{machines!r} is too long"
    shown = reason_first(message, machines)
    assert shown.endswith(" is too long") and shown.startswith("[{'name': 'm0'")
    assert len(shown) < 120 and "\n" not in shown
    assert reason_first("'abc' is not one of ['x']", "abc") == "'abc' is not one of ['x']"
    # the same in results.json, whose schema caps a scenario id at 200 characters
    run = tmp_path / "run"
    run.mkdir()
    episode = Episode(scenario="s" * 5000, agent=AgentKind.MODEL, model="m", protocol="json",
                      round=0, verdict=Verdict.PASS).to_dict()
    (run / "results.json").write_text(json.dumps({"run": {}, "episodes": [episode]}))
    with pytest.raises(InvalidInput) as err:
        load_results(run)
    assert err.value.field == "episodes[0].scenario", err.value
    assert err.value.detail.endswith(" is too long"), err.value.detail


def test_a_machine_named_localhost_is_refused_in_one_line(tmp_path: Path, cli: Cli) -> None:
    spec = tmp_path / "two.yaml"
    spec.write_text(
        "id: two\ntitle: t\ntask: t\naccess: network\n"
        "machines:\n  - {name: app, image: debian-12-nginx}\n"
        "  - {name: localhost, image: debian-12-nginx}\n"
        "setup: ['true']\nprobes:\n  - service: {name: nginx, active: true}\nsolution: ['true']\n")
    r = cli("validate", str(spec))
    [line, summary] = r.stdout.strip().splitlines()  # validate reports each file on stdout
    assert r.returncode == 2 and "machines[1].name" in line and "reserved" in line, r.stdout
    assert summary == "0 valid, 1 invalid"


def test_a_spec_with_too_many_machines_says_why_first(tmp_path: Path, cli: Cli) -> None:
    machines = "".join(f"  - {{name: m{i}, image: debian-12-nginx}}\n" for i in range(100))
    spec = tmp_path / "many.yaml"
    spec.write_text("id: many\ntitle: t\ntask: t\naccess: network\nmachines:\n" + machines +
                    "setup: ['true']\nprobes:\n  - service: {name: nginx, active: true}\n"
                    "solution: ['true']\n")
    r = cli("validate", str(spec))
    line = r.stdout.splitlines()[0]
    assert r.returncode == 2 and line.endswith("is too long") and len(line) < 400, r.stdout
