"""`rootbench compare` on real runs: oracle runs replayed from the committed cassettes (no VM)
and noop runs on real VMs (marked vm)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import IDS, Cli, _oracle_run, run_cli

from runner.core.paths import repo_root

ORACLE = repo_root() / "recordings" / "oracle"
def test_a_run_against_itself_shows_no_difference(cli: Cli, oracle_run: Path) -> None:
    r = cli("compare", str(oracle_run), str(oracle_run))
    assert r.returncode == 0, r.stderr
    assert "no difference shown with this many runs (8 pairs)" in r.stdout
    assert "cannot estimate" in r.stdout
    assert "is better than" not in r.stdout


def test_json_is_one_document_and_more_runs_are_each_compared_with_the_first(
        cli: Cli, oracle_run: Path) -> None:
    r = cli("compare", str(oracle_run), str(oracle_run), str(oracle_run), "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)  # the whole of stdout
    assert len(doc["comparisons"]) == 2
    for c in doc["comparisons"]:
        assert c["a"]["path"] == str(oracle_run) and c["pairs"] == 8 and c["winner"] is None
        assert c["pass_diff_ci"] == [0.0, 0.0] and c["mcnemar_p"] == 1.0


def test_results_json_and_bench_json_carry_the_statistics(cli: Cli,
                                                          oracle_run: Path, tmp_path: Path) -> None:
    results = json.loads((oracle_run / "results.json").read_text())
    st = results["statistics"]
    assert st["confidence"] == 0.95 and [s["scenario"] for s in st["scenarios"]] == IDS
    assert st["overall"]["scored"] == 8 and st["overall"]["pass_at_1"] == 1.0
    assert st["overall"]["pass_at_k"] == {"1": 1.0, "2": 1.0}
    assert st["overall"]["pass_at_1_ci"][0] == pytest.approx(0.6756, abs=1e-4)  # Wilson, 8/8
    r = cli("report", str(oracle_run), "--format", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["statistics"] == st


def test_the_statistics_table_follows_a_repeated_bench(cli: Cli, tmp_path: Path) -> None:
    run = _oracle_run(tmp_path, IDS[:1], 2)
    r = cli("report", str(run))
    assert r.returncode == 0, r.stderr
    r = cli("-q", "bench", "--agent", "oracle", "--record-to", str(tmp_path / "rec"),
            "--record-mode", "once", "--only", IDS[0], "--repeat", "2",
            "--runs-dir", str(tmp_path / "again"))
    assert r.returncode == 0, r.stderr
    assert "| pass@1 [95% CI]" in r.stdout and "| overall" in r.stdout
    assert "1.00 [0.34, 1.00]" in r.stdout  # Wilson 2/2


def test_a_damaged_or_missing_run_is_one_line_and_exit_2(cli: Cli,
                                                         oracle_run: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "results.json").write_text('{"episodes": [{"scenario": "x"}]}')
    for other in (bad, tmp_path / "missing"):
        r = cli("compare", str(oracle_run), str(other))
        assert r.returncode == 2, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
        assert str(other) in r.stderr and r.stdout == ""


# --- the published figures: docs/results.md against what the code computes today ---------------

DOCS = repo_root() / "docs" / "results.md"
# (recordings folder of A, of B): each pair's compare is a "$ rootbench compare A B" block in
# docs/results.md, and each folder a row of a statistics table whose model cell links to it.
# The re-measured runs in recordings/live/ get a line here when the page shows them.
PUBLISHED = [
    pytest.param("recordings/archive/2026-12-04-before-validity/qwen2.5-coder-1.5b-json",
                 "recordings/archive/2026-12-04-before-validity/qwen2.5-coder-0.5b-json",
                 id="2026-12-04-before-validity"),
    pytest.param("recordings/live/qwen2.5-coder-1.5b-json",
                 "recordings/live/qwen2.5-coder-0.5b-json", id="live-rules-2"),
]


def _documented_compare(a: str, b: str) -> str:
    """The output shown under ``$ rootbench compare A B`` in the docs' fenced block."""
    command = f"$ rootbench compare {a} {b}\n"
    text = DOCS.read_text()
    assert command in text, f"docs/results.md has no block of {command.strip()}"
    rest = text[text.index(command) + len(command):]
    return rest[:rest.index("\n```")]


def _documented_row(folder: str) -> dict[str, str]:
    """The statistics table row whose model cell links to ``folder``, by column title."""
    lines = DOCS.read_text().splitlines()
    (i,) = [n for n, line in enumerate(lines) if line.startswith("|") and f"](../{folder}/)" in line]
    head = i
    while lines[head - 1].startswith("|"):
        head -= 1
    cells = [c.strip() for c in lines[i].strip("|").split("|")]
    titles = [c.strip() for c in lines[head].strip("|").split("|")]
    return dict(zip(titles, cells, strict=True))


def _ci(point: float, ci: list[float]) -> str:
    return f"{point:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]"


@pytest.mark.parametrize(("a", "b"), PUBLISHED)
def test_the_published_compare_is_what_compare_prints_today(cli: Cli, a: str, b: str) -> None:
    r = cli("compare", a, b)  # relative paths, as the docs show them, from the checkout's root
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip("\n") == _documented_compare(a, b)


# Folders with a statistics row of their own in docs/results.md.
PUBLISHED_ROWS = [pytest.param(f, id=f.split("/")[-2] + "/" + f.split("/")[-1]) for f in (
    "recordings/archive/2026-12-04-before-validity/qwen2.5-coder-1.5b-json",
    "recordings/archive/2026-12-04-before-validity/qwen2.5-coder-0.5b-json",
    "recordings/live/qwen2.5-coder-1.5b-json",
    "recordings/live/qwen2.5-coder-0.5b-json")]


@pytest.mark.parametrize("folder", PUBLISHED_ROWS)
def test_the_published_statistics_rows_are_what_report_computes_today(cli: Cli,
                                                                      folder: str) -> None:
    r = cli("report", folder, "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    o = doc["statistics"]["overall"]
    row = _documented_row(folder)
    assert row["episodes"] == str(o["runs"]) == str(len(doc["episodes"]))
    assert row["scenarios"] == f"{len(doc['statistics']['scenarios'])} of " \
                               f"{len(doc['statistics']['scenarios'])}"
    assert row["pass@1 at level 0 [95 % CI]"] == _ci(o["pass_at_1"], o["pass_at_1_ci"])
    assert row["solved with hints"].split(":")[0] == f"{o['solved']} of {o['scored']}"
    assert row["mean assist [95 % CI]"] == ("-" if o["mean_assist"] is None
                                            else _ci(o["mean_assist"], o["mean_assist_ci"]))
    assert row["mean score [95 % CI]"] == _ci(o["mean_score"], o["mean_score_ci"])
    assert row["repair score [95 % CI]"] == _ci(o["mean_repair"], o["mean_repair_ci"])
    assert row["milestones (first tries)"] == f"{o['mean_milestones']:.2f}"
    assert row["median time to fix"] == (
        "- (never fixed)" if not o["fixed"] else
        f"{o['median_fix_s']:.1f} s ({o['fixed']} fixed run{'s' if o['fixed'] > 1 else ''})")
    # The episodes were read from the cassettes' verdict lines: no machine's paths shown.
    assert all(not str(ep["cassette"]).startswith("/") for ep in doc["episodes"])

def test_compare_names_the_models_and_explains_the_test(cli: Cli,
                                                        oracle_run: Path, tmp_path: Path) -> None:
    # A recordings folder (cassettes, no results.json) against the run directory made from it.
    rec = tmp_path / "rec"
    rec.mkdir()
    for i in IDS:
        shutil.copy2(ORACLE / f"{i}.jsonl", rec / f"{i}.jsonl")
    r = cli("compare", str(rec), str(oracle_run))
    assert r.returncode == 0, r.stderr
    assert "A: oracle (A), from " in r.stdout and "B: oracle (B), from " in r.stdout
    assert "| pass@1 [95% CI]" in r.stdout and "4/4 = 1.00 [0.51, 1.00] at level 0" in r.stdout
    assert "McNemar's exact test on the 4 paired first tries: only A passed 0, only B passed 0, " \
           "p = 1.00" in r.stdout
    assert "(p: the chance of a split at least this uneven if A and B were equally good" in r.stdout
    assert "4 scored first tries had no partner" in r.stdout  # the run's round 1 has none in rec
    assert "A is better" not in r.stdout and "B is better" not in r.stdout
    # A cassette cut short (no verdict line) has no episode: said, not silently dropped.
    lines = (ORACLE / f"{IDS[0]}.jsonl").read_text().splitlines(True)
    (rec / f"{IDS[0]}.jsonl").write_text("".join(lines[:-1]))
    r = cli("compare", str(rec), str(oracle_run), "--format", "json")
    assert r.returncode == 0, r.stderr
    (c,) = json.loads(r.stdout)["comparisons"]
    assert (c["a"]["cut_short"], c["a"]["episodes"], c["pairs"]) == (1, 3, 3)
    r = cli("compare", str(rec), str(oracle_run))
    assert "1 of A's cassettes end before a verdict (cut short) and are left out" in r.stdout


def test_a_folder_with_neither_results_nor_cassettes_is_one_line(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for command in ("compare", "report"):
        args = [str(tmp_path / "empty")] * (2 if command == "compare" else 1)
        r = cli(command, *args)
        assert r.returncode == 2 and r.stdout == ""
        assert r.stderr.strip() == f"rootbench: {tmp_path / 'empty'}: not a run directory or a " \
                                   "folder of cassettes (no results.json)"


@pytest.mark.parametrize("model", ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"])
def test_the_readme_results_at_a_glance_are_what_report_computes_today(model: str) -> None:
    """The front page's model table is the overall row of ``report`` on the live folder."""
    r = run_cli("report", f"recordings/live/{model}-json", "--format", "json")
    assert r.returncode == 0, r.stderr
    o = json.loads(r.stdout)["statistics"]["overall"]
    lines = (repo_root() / "README.md").read_text().splitlines()
    (row,) = [ln for ln in lines if ln.startswith(f"| {model} |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == [
        model, _ci(o["pass_at_1"], o["pass_at_1_ci"]), _ci(o["mean_repair"], o["mean_repair_ci"]),
        "not judged (before rules 3)", f"{o['solved']} of {o['scored']}",
        "-" if o["mean_assist"] is None else _ci(o["mean_assist"], o["mean_assist_ci"]),
        _ci(o["mean_score"], o["mean_score_ci"])]


@pytest.mark.parametrize("reference", ["noop", "oracle"])
def test_the_readmes_reference_rows_are_what_report_computes_on_the_committed_baselines(
        reference: str, tmp_path: Path) -> None:
    """Beside the models, the README shows noop's and the oracle's overall row of ``report``
    over the scenarios the models' runs ran: the repair score reads against 0 for doing
    nothing and 1 for the oracle."""
    folder = repo_root() / {"noop": "recordings/oracle/noop", "oracle": "recordings/oracle"}[reference]
    ran = {p.name.split(".")[0] for p in (repo_root() / "recordings" / "live").glob("*/*.jsonl")}
    for scenario_id in ran:  # the same scenarios, as the block pairs them
        shutil.copy2(folder / f"{scenario_id}.jsonl", tmp_path / f"{scenario_id}.jsonl")
    r = run_cli("report", str(tmp_path), "--format", "json")
    assert r.returncode == 0, r.stderr
    o = json.loads(r.stdout)["statistics"]["overall"]
    assert o["mean_repair"] == (0.0 if reference == "noop" else 1.0)
    lines = (repo_root() / "README.md").read_text().splitlines()
    (row,) = [ln for ln in lines if ln.startswith(f"| {reference} (reference) |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:3] + cells[4:] == [
        f"{reference} (reference)", _ci(o["pass_at_1"], o["pass_at_1_ci"]),
        _ci(o["mean_repair"], o["mean_repair_ci"]), "-", "-", _ci(o["mean_score"], o["mean_score_ci"])]
    # the unsafe-fix rate: judged only on the runs recorded under rules 3 (the oracle's, since
    # 2026-12-07), "not judged" where none was
    assert (cells[3] == "not judged (before rules 3)") is (o.get("unsafe_rate") is None), (cells[3], o)
