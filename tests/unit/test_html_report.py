"""The HTML report: written by bench, run, verify and report; read in Debian's real headless Chromium.

The browser tests load the report of committed cassettes from file:// and
check what a person sees (scenario names, verdicts, a command and its
output), that folding works, and that the console stays clean. A cassette
full of hostile text (script tags, event handlers, javascript: links, tag
breakouts, ANSI and OSC escapes) must come out as text: nothing runs,
nothing is added to the page, the title stays the report's.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path

import markupsafe
import pytest
from conftest import Cli
from html_reports import LIVE_JSON, ORACLE, RECORDINGS, report_html

from runner.app import html_report
from runner.app.agents import AgentChoice
from runner.app.bench import run_bench
from runner.app.episodes import RunOptions
from runner.app.runs import write_results
from runner.core import layout
from runner.core.cassette import Cassette, RecordMode
from runner.core.episode import Episode
from runner.core.errors import InvalidInput
from runner.core.outcomes import AgentKind
from runner.core.paths import repo_root
from runner.core.selection import pick_ids
from runner.core.spec import load_specs

# --- without a browser --------------------------------------------------------------------------

def _bench(run_dir: Path, ids: list[str]) -> list:  # type: ignore[type-arg]
    scenarios = pick_ids(load_specs([repo_root() / "specs"]), ids)
    return run_bench(scenarios, AgentChoice(kind=AgentKind.ORACLE), RunOptions(), run_dir,
                     record_to=ORACLE, record_mode=RecordMode.ONCE, listeners=[_refresher(run_dir)])


def _refresher(run_dir: Path) -> html_report.Refresher:
    """The report as the CLI hands it to a bench: a listener (the bench never imports it)."""
    return html_report.Refresher(run_dir, logging.getLogger("rootbench.bench"))


def test_bench_writes_the_report_after_each_scenario_so_an_interrupted_one_has_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A real fault stops the bench at its second scenario: that scenario's recorded cassette is
    # damaged, so replaying it raises. The report written after the first must be there.
    record = tmp_path / "record"
    record.mkdir()
    shutil.copy(ORACLE / "rogue-port-80.jsonl", record)
    (record / "permission-403.jsonl").write_text("{not a cassette\n")
    scenarios = pick_ids(load_specs([repo_root() / "specs"]), ["rogue-port-80", "permission-403"])
    run_dir = tmp_path / "run"
    with caplog.at_level("INFO", logger="rootbench.bench"), pytest.raises(InvalidInput):
        run_bench(scenarios, AgentChoice(kind=AgentKind.ORACLE), RunOptions(), run_dir,
                  record_to=record, record_mode=RecordMode.ONCE, listeners=[_refresher(run_dir)])
    page = (run_dir / "report.html").read_text()
    assert "rogue-port-80" in page and "permission-403" not in page
    assert f"report (refreshed at most every 10 s, and at the end): {run_dir / 'report.html'}" \
        in caplog.text

    caplog.clear()
    with caplog.at_level("INFO", logger="rootbench.bench"):
        _bench(run_dir / "again", ["rogue-port-80", "permission-403"])
    page = (run_dir / "again" / "report.html").read_text()
    assert "rogue-port-80" in page and "permission-403" in page
    assert f"report: {run_dir / 'again' / 'report.html'}" in caplog.text


def test_report_cli_run_dirs_side_by_side_and_bad_input(tmp_path: Path, cli: Cli) -> None:
    a, b = tmp_path / "run-a", tmp_path / "run-b"
    _bench(a, ["rogue-port-80"])
    _bench(b, ["rogue-port-80", "permission-403"])
    (a / "report.html").unlink()
    assert report_html(cli, str(a)) == a / "report.html"  # one run directory: its own report.html
    out = tmp_path / "ab.html"
    assert report_html(cli, str(a), str(b), "--out", str(out)) == out
    page = out.read_text()
    assert "<title>rootbench: run-a vs run-b</title>" in page
    assert page.count('class="group"') == 2  # the heat map has one column group per run
    r = cli("report", str(a), "--out", str(out))
    assert r.returncode == 2 and "--out" in r.stderr
    r = cli("report", str(ORACLE / "cpu-hog.jsonl"))
    assert r.returncode == 2 and "--html" in r.stderr
    assert cli("report", str(tmp_path / "nope"), "--html").returncode == 2


def test_without_matplotlib_the_report_has_no_plots_and_says_so(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    cassettes = sorted(LIVE_JSON.glob("*.jsonl"))
    with_plots = html_report.write_cassette_report(cassettes, tmp_path / "a.html").read_text()
    assert with_plots.count('src="data:image/svg+xml;base64,') == 3
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    page = html_report.write_cassette_report(cassettes, tmp_path / "b.html").read_text()
    assert "matplotlib is not installed" in page and "data:image/svg+xml" not in page
    assert "nginx-config-syntax" in page


def test_new_episode_fields_get_columns_and_old_results_render_without(tmp_path: Path) -> None:
    run = html_report.runs_from_cassettes([LIVE_JSON / "rogue-port-80.r0.jsonl"])  # before scores
    old = html_report.render(run)
    assert ">score<" not in old and ">time to fix<" not in old
    ep = run[0].episodes[0]
    ep.data.update(score=0.75, hint_level=2, fixed_at=12.5, milestones=[{"name": "found it"}])
    new = html_report.render(run)
    for header in (">score<", ">hint level<", ">time to fix<"):
        assert header in new
    assert ">0.75<" in new and ">12.5 s<" in new and "name=found it" in new


# A real-model --ladder run (0 hints, then one more after each failure), recorded on 2026-12-04.
LADDER_JSON = RECORDINGS / "archive" / "2026-12-04-before-validity" / "qwen2.5-coder-1.5b-json"


def _ladder_run(run: Path) -> list[Episode]:
    """The run directory a bench made of the recorded ladder: its cassettes where the bench puts
    them, results.json with each episode as its cassette's verdict line says, in the bench's order."""
    episodes = []
    for source in sorted(LADDER_JSON.glob("*.jsonl")):
        ep = Episode.from_dict(Cassette.load(source).verdict or {})
        target = layout.cassette_path(run, ep.scenario, ep.round, ep.hint_level)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        ep.cassette = str(target)
        episodes.append(ep)
    episodes.sort(key=lambda e: (e.scenario, e.round, e.hint_level))
    write_results(run, {"options": {"ladder": True}}, episodes)
    return episodes


def _sections(page: str) -> dict[str, str]:
    """Each episode's trajectory section of a report, by its anchor."""
    parts = page.split('<details class="episode" id="')[1:]
    return {part.split('"', 1)[0]: part for part in parts}


def test_a_ladder_runs_report_shows_each_levels_own_transcript(tmp_path: Path) -> None:
    episodes = _ladder_run(tmp_path / "run")
    hinted = [i for i, ep in enumerate(episodes) if ep.hint_level]
    assert len(episodes) == 48 and len(hinted) == 33  # the run of issue 32
    page = html_report.write_run_report(tmp_path / "run").read_text(encoding="utf-8")
    sections = _sections(page)
    assert len(sections) == 48
    for i, ep in enumerate(episodes):
        own = html_report.load_trajectory(layout.cassette_path(tmp_path / "run", ep.scenario,
                                                               ep.round, ep.hint_level))
        section = sections[f"run0-ep{i}"]
        # The task as that level's model was sent it: with that level's hints, no more, no less.
        assert str(markupsafe.escape(own.task)) in section, (ep.scenario, ep.hint_level)
        replies = [str(markupsafe.escape(t.content)) for t in own.turns if t.content]
        assert replies and all(r in section for r in replies), (ep.scenario, ep.hint_level)
        if ep.hint_level:
            assert f"hint level {ep.hint_level}" in section.split("</summary>")[0]
            unaided = html_report.load_trajectory(layout.cassette_path(
                tmp_path / "run", ep.scenario, ep.round))
            assert own.task != unaided.task
            assert str(markupsafe.escape(unaided.task)) + "<" not in section


def test_a_ladder_runs_heat_map_shows_the_level_each_round_passed_at(tmp_path: Path) -> None:
    episodes = _ladder_run(tmp_path / "run")
    page = html_report.write_run_report(tmp_path / "run").read_text(encoding="utf-8")
    heat = page.split('id="heatmap"')[1].split("</table>")[0]

    def cell(scenario: str) -> str:
        return heat.split(f"<th>{scenario}</th>")[1].split("</tr>")[0]

    def anchor(scenario: str, level: int) -> str:
        return f'#run0-ep{[(e.scenario, e.hint_level) for e in episodes].index((scenario, level))}"'

    levels = {(e.scenario, e.hint_level): e.verdict.value for e in episodes}
    assert [levels[("cron-stopped", lv)] for lv in (0, 1, 2)] == ["fail", "fail", "pass"]
    assert anchor("cron-stopped", 2) + ">pass h2</a>" in cell("cron-stopped")
    # Never passed: the round's last level, a plain fail.
    assert [levels[("cron-job-commented", lv)] for lv in range(4)] == ["fail"] * 4
    assert anchor("cron-job-commented", 3) + ">fail</a>" in cell("cron-job-commented")
    # Passed unaided: no level to show.
    unaided = next(e.scenario for e in episodes if e.hint_level == 0 and e.verdict.value == "pass")
    assert anchor(unaided, 0) + ">pass</a>" in cell(unaided)
    assert "passed at hint level N" in page


# --- in Chromium --------------------------------------------------------------------------------


# --- hostile text ----------------------------------------------------------------------------------


# --- at a glance ------------------------------------------------------------------------------------

ARCHIVE = RECORDINGS / "archive" / "2026-12-04-before-validity"


def test_two_runs_side_by_side_show_statistics_and_compares_verdict_at_the_top(tmp_path: Path) -> None:
    from runner.app.compare import compare_runs, verdict_lines
    from runner.app.report import statistics_rows
    from runner.app.runs import episodes_from_recordings

    a, b = ARCHIVE / "qwen2.5-coder-1.5b-json", ARCHIVE / "qwen2.5-coder-0.5b-json"
    runs = html_report.runs_from_cassettes([*sorted(a.glob("*.jsonl")), *sorted(b.glob("*.jsonl"))])
    page = html_report.render(runs)
    glance = page[page.index('id="glance"'):page.index('id="overview"')]
    # compare's very words, the models named, above each run's statistics
    for line in verdict_lines(compare_runs([a, b])[0]):
        assert str(markupsafe.escape(line)) in glance, line
    assert "qwen2.5-coder-1.5b (json) solves more rounds" in glance
    # each run's overall row: the terminal table's strings (pass@1 with its interval, solved, assist)
    overall = statistics_rows(episodes_from_recordings(a)[0])[1][-1]
    assert overall[0] == "overall" and "9/15" in overall
    headers = statistics_rows(episodes_from_recordings(a)[0])[0]
    assert "".join(f"<tr><th>{markupsafe.escape(h)}</th><td>{v}</td></tr>\n"
                   for h, v in zip(headers[1:], overall[1:], strict=True)) in glance
    # the fingerprint (ports, hashes) comes after, folded
    assert page.index("model fingerprint (") > page.index('id="overview"')
    assert "<summary>model fingerprint (" in page and "endpoint" not in glance

    # numbers and words as a person reads them; the fix marked at its turn; each title its level
    assert "score: 0.33<" in page and "score: 0.333333" not in page
    assert " 1 turns" not in page and " 1 turn ·" in page
    assert 'class="turn fixed"' in page and "the fix landed" in page
    # rounds numbered as the cassettes name them (cron-stopped.r0.h2.jsonl is round 0), and a
    # round's levels in order, level 0 first, although its folder lists x.r0.h1 before x.r0
    assert "cron-stopped · round 0 · hint level 0 ·" in page and "round 1" not in page
    assert "hint level 2 · qwen2.5-coder-1.5b · json" in page
    titles = [page.index(f"cron-stopped · round 0 · hint level {lv} ·") for lv in range(3)]
    assert titles == sorted(titles)
    assert "<th>r0</th>" in page and "<th>r1</th>" not in page  # the heat map's one round
    # pass@k titled with its k: one run per scenario, so k = 1, never a second "pass@1"
    assert "<th>pass@k (k=1)</th>" in glance and "<th>pass@1</th>" not in glance


def test_counts_are_plural() -> None:
    from runner.app.html_report.fields import plural

    assert (plural(1, "turn"), plural(2, "turn"), plural(0, "turn")) == ("1 turn", "2 turns", "0 turns")


def test_a_bench_report_is_refreshed_at_most_every_n_seconds_and_always_at_the_end(
        tmp_path: Path) -> None:
    import logging

    source = ORACLE / "rogue-port-80.jsonl"
    ep = Episode.from_dict(Cassette.load(source).verdict or {})
    target = layout.cassette_path(tmp_path, ep.scenario, ep.round, ep.hint_level)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    write_results(tmp_path, {}, [ep])
    now = [100.0]
    report = html_report.Refresher(tmp_path, logging.getLogger("test"), every=10.0,
                                   clock=lambda: now[0])
    page = tmp_path / html_report.REPORT_NAME

    def written() -> int:
        return page.stat().st_mtime_ns if page.exists() else 0

    assert report.flush() is None and not page.exists()  # nothing ended yet: nothing to write
    assert report.done() == page and report.writes == 1  # the first episode: at once
    first = written()
    for t in (101.0, 105.0, 109.9):  # episodes within 10 s of that write: none rewrites it
        now[0] = t
        assert report.done() is None
    assert report.writes == 1 and written() == first
    now[0] = 110.0
    assert report.done() == page and report.writes == 2  # 10 s on: rewritten
    now[0] = 111.0
    assert report.done() is None and report.pending
    assert report.flush() == page and report.writes == 3 and not report.pending  # stopped early
    assert report.flush() is None and report.writes == 3  # nothing new since
    now[0] = 112.0
    assert report.final() == page and report.writes == 4  # the end: always
    assert "rogue-port-80" in page.read_text(encoding="utf-8")


def test_the_ladder_is_a_figure_of_its_own_from_the_rounds_assists(tmp_path: Path) -> None:
    """Solved with at most k hints, k = 0..3: the archived 1.5B ladder solved 2, 4, 6, 9 of 15."""
    pytest.importorskip("matplotlib")
    from runner.app.html_report.plots import ladder_curve, plots

    archive = repo_root() / "recordings" / "archive" / "2026-12-04-before-validity"
    big, small = (html_report.runs_from_cassettes(sorted((archive / f"{m}-json").glob("*.jsonl")))
                  for m in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"))
    assert [round(x * 15) for x in ladder_curve(big[0])] == [2, 4, 6, 9]
    assert ladder_curve(small[0]) == [0.0, 0.0, 0.0, 0.0]
    figures = plots([*big, *small])
    assert figures is not None
    assert "The ladder: rounds solved with at most k hints" in [p.title for p in figures]
    # A run without hints has no ladder to draw.
    oracle = html_report.runs_from_cassettes([repo_root() / "recordings" / "oracle" / "nginx-stopped.jsonl"])
    assert ladder_curve(oracle[0]) == [1.0]
    assert "The ladder: rounds solved with at most k hints" not in [p.title for p in plots(oracle) or []]


# --- the repair score, unsafe fixes and the state diff's findings -------------------------------

HOSTILE_ITEM = '<script>alert(1)</script>\x1b]0;owned\x07 tcp 0.0.0.0:4444 "onmouseover=x'


def _judged_cassette(tmp_path: Path, source: Path, **verdict: object) -> Path:
    """A copy of a committed cassette whose verdict line says what rules 3 judged (``verdict``
    merged in): the page reads it as it reads any cassette handed over."""
    lines = source.read_text().splitlines()
    last = json.loads(lines[-1])
    assert last["type"] == "verdict"
    last.update(verdict)
    out = tmp_path / source.name
    out.write_text("\n".join([*lines[:-1], json.dumps(last)]) + "\n")
    return out


def test_the_repair_score_and_unsafe_fixes_get_a_column_a_filter_and_the_findings_a_table(
        tmp_path: Path) -> None:
    finding = {"check": "listening", "item": HOSTILE_ITEM, "detail": "<b>new</b> listener",
               "severity": "flag", "source": "the kernel's socket table"}
    judged = _judged_cassette(tmp_path, ORACLE / "rogue-port-80.jsonl", symptom_fixed=True,
                              findings=[finding], flags=["left-behind"], unsafe_fix=True)
    page = html_report.render(html_report.runs_from_cassettes([judged]))
    # the columns: repair (the oracle repaired all of it) and unsafe fix
    assert '<th class="num">repair</th>' in page and '<th class="num">unsafe fix</th>' in page
    assert '<td class="num">1.00</td><td class="num">yes</td>' in page
    # the filter offers what is there, by fixed words, and the episode carries its value
    assert '<select id="f-unsafe"><option value="">any</option><option value="yes">fixed ' \
           'unsafely</option></select>' in page
    assert 'data-unsafe="yes"' in page and 'data-repair="1.000000"' in page
    # the finding is listed in the detail view, its text escaped and stripped of escapes
    assert "The state diff: what the agent left on the machine" in page
    assert "<script>alert" not in page and "\x1b" not in page and "\x07" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;b&gt;new&lt;/b&gt;" in page
    assert "the kernel&#39;s socket table" in page
    assert "<p class=\"muted\">unsafe fix: yes</p>" in page and "<p class=\"muted\">repair: 1.00" in page
    # beside it, the committed noop and oracle over the same scenario
    assert "noop repair 0.00, pass@1 0.00" in page and "oracle repair 1.00, pass@1 1.00" in page
    # a run of rules 2 was never judged: the filter says so, the cell is a dash, not "no"
    old = html_report.render(html_report.runs_from_cassettes([LIVE_JSON / "rogue-port-80.r0.jsonl"]))
    assert '<option value="unjudged">not judged (before rules 3)</option>' in old
    assert 'data-unsafe="unjudged"' in old and '<th class="num">unsafe fix</th>' not in old
    assert "The state diff:" not in old


# --- verify's report ---------------------------------------------------------------------------

def test_a_verify_report_leads_with_its_own_table_not_compares_prose(tmp_path: Path) -> None:
    """verify's run directory holds a noop, an oracle and scripted runs: reported as runs side
    by side, the page opened with compare's "oracle against noop" verdict, which answers
    nothing verify asks. It leads with verify's table instead: each scenario's six checks, as
    the terminal prints them, and no compare verdict nor statistics of the agents."""
    from runner.app.verify import CHECKS, SHORTCUTS, ShortcutRun, Verification, table_rows

    scenario = "ssh-stopped"
    cassettes = [ORACLE / f"{scenario}.jsonl", ORACLE / "noop" / f"{scenario}.jsonl",
                 *sorted((ORACLE / "shortcuts" / scenario).glob("*.jsonl"))]
    rejected = [ShortcutRun(f"s{i}", "restart", True, "fail", "") for i in range(2)]
    good = Verification(scenario, checks={**dict.fromkeys(CHECKS, True), SHORTCUTS: False},
                        seconds=12.5,
                        shortcuts=[*rejected, ShortcutRun("s2", "restart", False, "pass", "")])
    bad = Verification("cron-stopped", checks={**dict.fromkeys(CHECKS, True),
                                               "noop fails": False, "alternatives pass": None},
                       problems=["noop fails: the noop agent passed"])
    headers, rows = table_rows([good, bad])
    checks = html_report.ChecksTable(headers, rows, [good.valid, bad.valid])
    run_dir = tmp_path / "verify"
    run_dir.mkdir()
    out = html_report.refresh(run_dir, logging.getLogger("test"), cassettes=cassettes,
                              checks=checks)
    assert out == run_dir / "report.html"
    page = out.read_text(encoding="utf-8")
    table = page[page.index('id="verify"'):page.index('id="glance"')]
    assert "Verify: 0 of 2 scenarios valid</h2>" in table
    assert "".join(f"<th>{h}</th>" for h in ["scenario", *CHECKS]) in table
    # each mark as the terminal prints it, coloured by what it says; the first row is linked
    # to its scenario's first trajectory on the page
    assert '<a href="#run0-ep0">ssh-stopped</a>' in table
    assert '<td class="mark-ok">ok</td>' in table and '<td class="mark-fail">FAIL:2/3</td>' in table
    assert '<td class="mark-fail">FAIL</td>' in table and '<td class="mark-none">none</td>' in table
    assert table.count('<span class="tag unsafe">invalid</span>') == 2
    assert "noop fails: the noop agent passed" in table
    # no compare verdict, no statistics, no reference line: only each agent's verdict counts
    glance = page[page.index('id="glance"'):page.index('id="overview"')]
    assert " against " not in glance and "verdict-box" not in glance
    assert "pass@1" not in glance and "reference, the committed runs" not in glance
    assert "1 pass</span>" in glance and "noop · tools" in glance
    # a report with no checks is as before: compare's words at the top
    plain = html_report.write_cassette_report(cassettes, tmp_path / "plain.html").read_text()
    assert 'id="verify"' not in plain and "verdict-box" in plain
