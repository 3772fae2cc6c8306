"""``rootbench view``: one index page of every run in a folder (issue #49 item 9).

A real oracle bench (replayed offline from the committed cassettes: the
``oracle_run`` fixture) and a damaged run directory beside it; the index must
list both, newest first, with the figures ``report`` computes for the good one
and the damage named for the other, link only reports that exist, write a
missing report first, and keep a hostile folder name as text.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from conftest import Cli

from runner.app.runs import load_results
from runner.app.runs_index import INDEX_NAME, index_row
from runner.app.stats import summarize


def test_view_lists_every_run_with_its_figures_and_a_link_to_its_report(
        cli: Cli, oracle_run: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    good = runs / "20261201-101010-bench"
    shutil.copytree(oracle_run, good)
    (good / "report.html").unlink(missing_ok=True)  # the index writes the missing report first
    hostile = runs / '20261202-101010-<img src=x onerror=alert(1)>"'
    hostile.mkdir()
    (hostile / "results.json").write_text('{"episodes": [{"scenario": 7}]}')
    (runs / "not-a-run").mkdir()  # neither results nor report: not listed
    # what `rootbench rejudge` recorded of the good run; a damaged record of the other
    (good / "rejudged.json").write_text(json.dumps({"confirmed": 7, "episodes": 8}))
    (hostile / "rejudged.json").write_text(json.dumps({"confirmed": 9, "episodes": 8}))

    r = cli("view", str(runs), "--format", "json")
    assert r.returncode == 0, r.stderr
    index = Path(json.loads(r.stdout)["index"])
    assert index == runs / INDEX_NAME and (good / "report.html").is_file()
    page = index.read_text()

    # newest first: the damaged run of 12-02 above the bench of 12-01
    assert page.index("2026-12-02 10:10:10") < page.index("2026-12-01 10:10:10")
    assert "not-a-run" not in page
    # the good run's figures, as report computes them
    _info, episodes = load_results(good)
    overall = summarize(episodes).overall
    row = index_row(good, runs.resolve())
    assert row.episodes == len(episodes) > 0 and row.pass_at_1 == overall.pass_at_1 == 1.0
    assert row.agent == "oracle" and row.what == "bench" and row.rejudged == "7/8 confirmed"
    assert page.count("confirmed</td>") == 1  # 9 of 8 is no record: its row says "-"
    assert f">{overall.pass_at_1:.2f}<" in page
    # one link, to the one report there is; the hostile name is text, not markup
    assert re.findall(r'href="([^"]*)"', page) == ["20261201-101010-bench/report.html"]
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    # the damage is named in its row, by the file and the field
    assert "/results.json: episodes[0]: &#39;agent&#39; is a required property" in page
    assert str(tmp_path) not in page
    assert "<script" not in page and "default-src &#39;none&#39;" in page  # no script may run


def test_view_of_a_folder_that_is_not_there_is_one_line_exit_2(cli: Cli, tmp_path: Path) -> None:
    r = cli("view", str(tmp_path / "nowhere"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "nowhere" in r.stderr


def test_a_rejudgement_under_newer_rules_confirms_the_verdict_and_names_a_new_flag() -> None:
    from runner.app.rejudge import judged_again
    from runner.app.replay import ReplayOutcome
    from runner.core.outcomes import ReplayResult

    flagged = ReplayOutcome("c.jsonl", "x", "pass", "pass [left-behind]", ReplayResult.DIFFERENT,
                            "", 1.0, 2)
    assert not judged_again(flagged, Path("c.jsonl")).confirmed  # a claim checked: flags too
    row = judged_again(flagged, Path("c.jsonl"), other_rules=True)
    assert row.confirmed and row.note.startswith("same verdict, flagged now: pass [left-behind]")
    failed = ReplayOutcome("c.jsonl", "x", "pass", "fail [failed-recheck]", ReplayResult.DIFFERENT,
                           "", 1.0, 2)
    assert not judged_again(failed, Path("c.jsonl"), other_rules=True).confirmed
