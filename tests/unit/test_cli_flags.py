"""The command line's flags as users meet them (no VM, no model): scenario selection by
--only ids and globs, --tags, --difficulty (measured tiers), --exclude and --limit; bundled
scenario ids where a spec path goes; one-line argparse errors with "did you mean";
defaults in help; perf's --format json; --ray-address auto and RAY_ADDRESS; the bench's
estimate of the time left."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import Cli, CliResult, run_cli

from runner.app.progress import duration, left_text
from runner.core import measured
from runner.core.errors import InvalidInput
from runner.core.outcomes import Tier
from runner.core.paths import repo_root
from runner.core.selection import Selection, choose
from runner.core.spec import load_specs

ROOT = repo_root()
ORACLE = ROOT / "recordings" / "oracle"


def listed(*args: str) -> list[str]:
    r = run_cli("list", "--format", "json", *args)
    assert r.returncode == 0, r.stderr
    return [row["id"] for row in json.loads(r.stdout)]


def one_line_exit_2(r: CliResult) -> str:
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "usage:" not in r.stderr
    [line] = r.stderr.strip().splitlines()
    return line


# --- selection ---------------------------------------------------------------------------------

SUITE = load_specs([ROOT / "specs"])


def test_a_glob_selects_every_matching_id_in_the_order_asked() -> None:
    cron = sorted(s.id for s in SUITE if s.id.startswith("cron-"))
    assert len(cron) >= 2
    ids = listed("--only", "rogue-port-80", "cron-*", "rogue-*")
    assert ids == ["rogue-port-80", *cron]  # as asked, each once


def test_tags_select_the_easy_tier_and_limit_takes_the_first() -> None:
    easy = [s.id for s in SUITE if "easy-tier" in s.tags]
    assert len(easy) >= 10  # the tier the issue had to paste twelve ids for
    assert listed("--tags", "easy-tier") == easy
    assert listed("--tags", "easy-tier", "--limit", "3") == easy[:3]
    assert listed("--tags", "cron,dns") == [s.id for s in SUITE if {"cron", "dns"} & set(s.tags)]
    assert listed("--only", "nginx-*", "--tags", "easy-tier") == [
        s.id for s in SUITE if s.id.startswith("nginx-") and "easy-tier" in s.tags]


@pytest.mark.parametrize(("args", "fragment"), [
    (["--only", "specs/rogue-port-80.yaml"],
     "'specs/rogue-port-80.yaml' is a path, not a scenario id (its id is 'rogue-port-80'"),
    (["--only", "rogue-port-8O"], "no scenario with id 'rogue-port-8O'"),
    (["--only", "rogue-prot-80"], "did you mean 'rogue-port-80'?"),
    (["--only", "zz-*"], "no scenario id matches 'zz-*'"),
    (["--tags", "easy-teir"], "no scenario has the tag 'easy-teir' (did you mean 'easy-tier'?)"),
    (["--limit", "0"], "--limit: must be a number of scenarios from 1 up, not 0"),
    (["--only", "cron-*", "--tags", "proxy"], "no scenario has all of"),
])
def test_a_bad_selection_is_one_line_exit_2(cli: Cli, args: list[str], fragment: str) -> None:
    line = one_line_exit_2(cli("list", *args))
    assert line.startswith("rootbench: --") and fragment in line, line


def test_bench_and_verify_refuse_a_path_as_an_id_before_any_vm(cli: Cli, tmp_path: Path) -> None:
    env = {"TMPDIR": str(tmp_path)}
    for command in (["bench", "--agent", "oracle", "--runs-dir", str(tmp_path / "runs")],
                    ["verify", "--shortcuts", "recorded"]):
        line = one_line_exit_2(cli(*command, "--only", "specs/permission-403.yaml", env=env))
        assert "its id is 'permission-403'" in line, line
    assert not (tmp_path / "runs").exists() and not list(tmp_path.glob("rb-*"))


def test_bench_runs_the_selection_from_recordings_and_says_time_left(cli: Cli,
                                                                     tmp_path: Path) -> None:
    """--tags and --limit in a real bench (replayed from the oracle recordings: no VM)."""
    r = cli("bench", "--agent", "oracle", "--tags", "easy-tier", "--limit", "2",
            "--record-to", str(ORACLE), "--record-mode", "none", "--runs-dir", str(tmp_path),
            "--format", "json")
    assert r.returncode == 0, r.stderr
    easy = [s.id for s in SUITE if "easy-tier" in s.tags][:2]
    assert [e["scenario"] for e in json.loads(r.stdout)["episodes"]] == easy
    # Nothing ran live, so there is no duration to go on: the line says so instead of guessing.
    assert f"[bench] 1/2 {easy[0]} (time left: estimating...)" in r.stderr, r.stderr


def test_choose_composes_in_order_and_never_silently_selects_nothing() -> None:
    ids = [s.id for s in choose(SUITE, Selection(only=("*-80", "permission-*"), limit=2))]
    assert ids == ([s.id for s in SUITE if s.id.endswith("-80")]
                   + [s.id for s in SUITE if s.id.startswith("permission-")])[:2]
    assert choose(SUITE, Selection()) == SUITE
    with pytest.raises(InvalidInput, match="--only"):
        choose(SUITE, Selection(only=("../specs/x.yml",)))
    with pytest.raises(InvalidInput, match="did you mean 'rogue-port-80'"):
        choose(SUITE, Selection(only=("Rogue-Port-80",)))
    with pytest.raises(InvalidInput, match="'nginx-stopped.yml' is a path, not a scenario id "
                                           r"\(its id is 'nginx-stopped'"):
        choose(SUITE, Selection(only=("nginx-stopped.yml",)))


# --- argparse: one line, did you mean ----------------------------------------------------------

@pytest.mark.parametrize(("args", "expected"), [
    (["bnech"], "rootbench: error: argument COMMAND: invalid choice: 'bnech' (choose from "),
    (["bnech"], "; did you mean 'bench'? (see rootbench --help)"),
    (["bench", "--modle", "x"], "rootbench bench: error: unrecognized arguments: --modle "
                                "(did you mean --model"),
    (["bench", "--temprature=0.5"], "(did you mean --temperature?)"),
    (["bench", "--accel", "kmv"], "rootbench bench: error: argument --accel: invalid choice: "
                                  "'kmv' (choose from 'auto', 'kvm', 'tcg'); did you mean 'kvm'?"),
    (["bench", "--temperature", "warm"], "rootbench bench: error: argument --temperature: "
                                         "invalid float value: 'warm' (see rootbench bench --help)"),
    (["verify", "--shortcuts", "recoded"], "did you mean 'recorded'?"),
    (["image", "biuld"], "rootbench image: error: argument ACTION: invalid choice: 'biuld'"),
    ([], "rootbench: error: the following arguments are required: COMMAND"),
    (["list", "-q"], "rootbench list: error: -q is an option of rootbench itself: give it before "
                     "the command (rootbench -q ...)"),
])
def test_argument_errors_are_one_line_with_a_suggestion(cli: Cli, args: list[str],
                                                        expected: str) -> None:
    line = one_line_exit_2(cli(*args))
    assert expected in line, line


def test_an_argument_error_with_format_json_still_gives_a_json_document(cli: Cli) -> None:
    r = cli("list", "--format", "json", "--lmit", "2")
    assert r.returncode == 2 and json.loads(r.stdout) == {"error": r.stderr.strip(), "exit": 2}
    assert "did you mean --limit?" in r.stderr


def test_help_shows_the_defaults(cli: Cli) -> None:
    text = cli("bench", "--help").stdout
    blocks = {b.split()[0].rstrip(","): " ".join(b.split())  # one option's help, unwrapped
              for b in re.split(r"\n  (?=-)", text.split("\noptions:", 1)[1])
              if b.strip()}
    for flag, default in [("--temperature", "0.0"), ("--seed", "0"), ("--max-tokens", "512"),
                          ("--ctx-size", "16384"), ("--repeat", "1"), ("--format", "github"),
                          ("--record-mode", "all"), ("--executor", "local")]:
        assert blocks[flag].endswith(f"(default: {default})"), blocks[flag]
    assert "(default: None)" not in text and "(default: False)" not in text


# --- perf: one spelling of the JSON flag -------------------------------------------------------

@pytest.mark.parametrize("flags", [["--format", "json"], ["--json"]])
def test_perf_format_json_and_its_deprecated_alias(cli: Cli, flags: list[str]) -> None:
    # it replays every committed cassette (~17 CPU-seconds for ~1,100): room for a loaded host
    r = cli("-q", "perf", *flags, "--no-vm", "--no-model", timeout=240)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["replay_cassettes"] > 0  # one JSON document on stdout
    deprecated = "rootbench perf: --json is deprecated; use --format json"
    assert (deprecated in r.stderr) == (flags == ["--json"]), r.stderr


# --- --ray-address auto and RAY_ADDRESS --------------------------------------------------------

def test_ray_address_comes_from_the_environment_as_for_rays_own_tools(cli: Cli,
                                                                      tmp_path: Path) -> None:
    env = {"TMPDIR": str(tmp_path), "RAY_ADDRESS": "127.0.0.1:1"}
    base = ["-q", "bench", "--agent", "oracle", "--executor", "ray", "--only", "rogue-port-80",
            "--runs-dir", str(tmp_path / "runs")]
    # No flag: RAY_ADDRESS is the address; auto: Ray's resolver reads RAY_ADDRESS first too.
    for extra in ([], ["--ray-address", "auto"]):
        line = one_line_exit_2(cli(*base, *extra, env=env))
        assert line.startswith("rootbench: --ray-address: nothing answers at ") and ":1 (" in line
    # A flag given wins over the environment.
    line = one_line_exit_2(cli(*base, "--ray-address", "127.0.0.1:2", env=env))
    assert "nothing answers at 127.0.0.1:2" in line, line
    assert not (tmp_path / "runs").exists()


def test_ray_executor_without_any_address_says_how_to_give_one(cli: Cli, tmp_path: Path) -> None:
    env: dict[str, str | None] = {"RAY_ADDRESS": None}
    line = one_line_exit_2(cli("bench", "--agent", "oracle", "--executor", "ray",
                               "--runs-dir", str(tmp_path), env=env))
    assert "--ray-address HOST:PORT" in line and "auto" in line and "RAY_ADDRESS" in line


# --- the time left -----------------------------------------------------------------------------

def test_time_left_is_the_mean_duration_times_what_is_left_over_the_slots() -> None:
    assert left_text([], 29, 1) == "time left: estimating..."
    assert left_text([60.0, 120.0], 10, 1) == "about 15 min left"  # mean 90 s x 10
    assert left_text([60.0, 120.0], 10, 2) == "about 8 min left"  # two at once: 450 s
    assert left_text([30.0], 1, 1) == "about 30 s left"
    assert left_text([3600.0], 2, 1) == "about 2 h 00 min left"
    assert duration(float("nan")) == "1 s" and duration(4000) == "1 h 07 min"




# --- bundled scenario ids where a spec path goes (#49 item 2) ----------------------------------

def test_run_and_mcp_take_a_bundled_id_and_a_path_still_works(cli: Cli, tmp_path: Path) -> None:
    # --record-mode none with an empty folder stops before any VM, naming the scenario it read.
    (tmp_path / "empty").mkdir()
    stop = ["--agent", "oracle", "--record-to", str(tmp_path / "empty"), "--record-mode", "none",
            "--runs-dir", str(tmp_path / "runs")]
    for spec in ("nginx-stopped", "specs/nginx-stopped.yaml", str(ROOT / "specs/nginx-stopped.yaml")):
        line = one_line_exit_2(cli("run", spec, *stop))
        assert "missing: nginx-stopped (round 0)" in line, (spec, line)
    line = one_line_exit_2(cli("run", "nginx-stoped", *stop))
    assert line.startswith("rootbench: SPEC: no scenario with id 'nginx-stoped' (did you mean "
                           "'nginx-stopped'"), line
    # From another folder (as from the wheel) the checkout's path is not there: its id is.
    line = one_line_exit_2(cli("run", "specs/nginx-stopped.yaml", *stop, cwd=tmp_path))
    assert "no such file (the bundled scenario 'nginx-stopped' is given by its id alone)" in line
    line = one_line_exit_2(cli("run", "nginx-stopped", *stop, cwd=tmp_path))
    assert "missing: nginx-stopped (round 0)" in line, line
    # mcp: a known id gets as far as its flags; an unknown one is the same one line.
    assert "--http-remote: needs --http" in one_line_exit_2(
        cli("mcp", "nginx-stopped", "--http-remote"))
    assert "did you mean 'nginx-stopped'" in one_line_exit_2(cli("mcp", "nginx-stoped"))


def test_verify_list_and_bench_take_ids_among_their_paths(cli: Cli, tmp_path: Path) -> None:
    assert listed("nginx-stopped", "specs/ssh-stopped.yaml", "cron-*") == [
        "nginx-stopped", "ssh-stopped", *sorted(s.id for s in SUITE if s.id.startswith("cron-"))]
    bad = ["--noop", "recorded", "--recorded-from", str(tmp_path / "none")]
    assert "PATH: no scenario with id 'nginx-stoped' (did you mean 'nginx-stopped'" in \
        one_line_exit_2(cli("verify", "nginx-stoped", *bad))
    # A known id is read, and verify goes on to its next check (no VM started).
    assert "--recorded-from: not a directory" in one_line_exit_2(cli("verify", "nginx-stopped",
                                                                     *bad))


# --- --difficulty (measured tier) and --exclude (#49 item 6) ------------------------------------

def test_difficulty_selects_by_measured_tier_and_exclude_leaves_out(cli: Cli) -> None:
    facts = measured.load()
    easy = [s.id for s in SUITE if facts[s.id].tier is Tier.EASY]
    assert easy and listed("--difficulty", "easy") == easy
    # The measured tier, not the spec's label: most labelled easy are not measured easy.
    assert len([s for s in SUITE if s.difficulty == "easy"]) > len(easy)
    both = listed("--difficulty", "easy,medium")
    assert both == [s.id for s in SUITE if facts[s.id].tier in (Tier.EASY, Tier.MEDIUM)]
    assert listed("--difficulty", "easy", "--exclude", easy[0]) == easy[1:]
    assert listed("--only", "cron-*", "--exclude", "cron-s*") == [
        s.id for s in SUITE if s.id.startswith("cron-") and not s.id.startswith("cron-s")]
    # Excluding a scenario that is not selected anyway is fine; one that does not exist is not.
    assert listed("--only", "ssh-stopped", "--exclude", "nginx-stopped") == ["ssh-stopped"]
    for args, fragment in ((["--difficulty", "eassy"], "--difficulty: no tier 'eassy' (did you "
                                                       "mean 'easy'?)"),
                           (["--exclude", "nginx-stoped"], "--exclude: no scenario with id "
                                                           "'nginx-stoped' (did you mean"),
                           (["--exclude", "specs/ssh-stopped.yaml"], "--exclude: 'specs/ssh-"
                                                                      "stopped.yaml' is a path"),
                           (["--only", "ssh-stopped", "--exclude", "ssh-*"],
                            "--exclude: no scenario has all of: --only, --exclude")):
        line = one_line_exit_2(cli("list", *args))
        assert fragment in line, line
