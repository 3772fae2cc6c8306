"""``rootbench results``: the measured difficulty tiers, the per-tag breakdown and the README's
results block, from committed cassettes (no VM, no model).

The hand-made run folders are copies of committed ladder cassettes of the two bundled models,
a few levels left out where a test needs a ladder that is not complete."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from pathlib import Path

import pytest
from conftest import Cli

from runner.app import results
from runner.app.runs import episodes_from_recordings, write_results
from runner.core.episode import Episode
from runner.core.errors import InvalidInput
from runner.core.outcomes import AgentKind, Tier, Verdict
from runner.core.paths import repo_root
from runner.core.spec import load_specs
from runner.core.tiers import ladder_complete, measured_tier

LIVE = repo_root() / "recordings" / "live"
SMALL, LARGE = "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"
IDS = ("ssh-stopped", "cron-job-commented", "cron-stopped")
LEVELS = ("r0", "r0.h1", "r0.h2", "r0.h3")


# --- the rule, on episodes ------------------------------------------------------------------

def _ep(model: str, level: int, verdict: Verdict, rnd: int = 0) -> Episode:
    return Episode(scenario="s", agent=AgentKind.MODEL, model=model, protocol="json", round=rnd,
                   verdict=verdict, hint_level=level)


def _ladder(model: str, *verdicts: Verdict, rnd: int = 0) -> list[Episode]:
    return [_ep(model, level, v, rnd) for level, v in enumerate(verdicts)]


P, F, X = Verdict.PASS, Verdict.FAIL, Verdict.INFRA_ERROR
MODELS = (SMALL, LARGE)


def test_a_ladder_is_complete_up_to_its_first_pass_or_its_last_hint() -> None:
    assert ladder_complete(_ladder(LARGE, P), 3)
    assert ladder_complete(_ladder(LARGE, F, F, P), 3)
    assert ladder_complete(_ladder(LARGE, F, F, F, F), 3)
    assert not ladder_complete(_ladder(LARGE, F, F, F), 3)  # level 3 never ran
    assert not ladder_complete(_ladder(LARGE, F, F, F, F)[1:], 3)  # no level 0
    assert not ladder_complete(_ladder(LARGE, F, X, F, F), 3)  # level 1 says nothing
    assert not ladder_complete([], 3)
    # each round must be whole: the second round stopped after level 1
    assert not ladder_complete(_ladder(LARGE, F, P) + _ladder(LARGE, F, F, rnd=1), 3)


def test_the_tier_rule() -> None:
    never = {SMALL: [_ladder(SMALL, F, F, F, F)]}
    assert measured_tier({**never, LARGE: [_ladder(LARGE, P)]}, 3, MODELS) is Tier.EASY
    assert measured_tier({**never, LARGE: [_ladder(LARGE, F, F, P)]}, 3, MODELS) is Tier.MEDIUM
    assert measured_tier({**never, LARGE: [_ladder(LARGE, F, F, F, F)]}, 3, MODELS) is Tier.HARD
    # one bundled model with no complete ladder: nothing is claimed, even a pass unaided
    assert measured_tier({LARGE: [_ladder(LARGE, P)]}, 3, MODELS) is Tier.UNMEASURED
    assert measured_tier({SMALL: [_ladder(SMALL, F, F)], LARGE: [_ladder(LARGE, P)]}, 3,
                         MODELS) is Tier.UNMEASURED
    # a model that is not bundled counts for nothing
    assert measured_tier({**never, LARGE: [_ladder(LARGE, F, F, F, F)],
                          "big": [_ladder("big", P)]}, 3, MODELS) is Tier.HARD
    # one round unaided is enough for easy; fewer hints make a shorter ladder complete
    assert measured_tier({**never, LARGE: [_ladder(LARGE, F, F, F, F) + _ladder(LARGE, P, rnd=1)]},
                         3, MODELS) is Tier.EASY
    assert measured_tier({SMALL: [_ladder(SMALL, F, F)], LARGE: [_ladder(LARGE, F, P)]}, 1,
                         MODELS) is Tier.MEDIUM


# --- the command, on hand-made folders -------------------------------------------------------

# Where a scenario's model runs are kept, with the spec they ran: cron-job-commented's were
# archived when the audit hardened its cron probe (2026-12-07), and they still measure that spec.
ARCHIVED = {"cron-job-commented": repo_root() / "recordings" / "archive" / "2026-12-07-before-audit"}


def _copy(model: str, scenario: str, levels: tuple[str, ...], to: Path) -> None:
    folder = to / f"{model}-json"
    folder.mkdir(parents=True, exist_ok=True)
    source = ARCHIVED.get(scenario, LIVE)
    for level in levels:
        shutil.copy2(source / f"{model}-json" / f"{scenario}.{level}.jsonl", folder)


def _spec_of(scenario: str) -> Path:
    """The spec the scenario's runs were recorded against (the archived one, if archived)."""
    if scenario in ARCHIVED:
        return ARCHIVED[scenario] / "specs" / f"{scenario}.yaml"
    return repo_root() / "specs" / f"{scenario}.yaml"


@pytest.fixture
def small_suite(tmp_path: Path) -> tuple[Path, Path]:
    """Three specs and both models' runs of them: ssh-stopped passed unaided by the 1.5B,
    cron-job-commented never passed, cron-stopped passed by the 1.5B at level 2 but the 0.5B's
    ladder lacks its level 2 (so the ladder is not complete)."""
    specs = tmp_path / "specs"
    specs.mkdir()
    for i in IDS:
        shutil.copy2(_spec_of(i), specs)
    runs = tmp_path / "live"
    _copy(LARGE, "ssh-stopped", LEVELS[:1], runs)
    _copy(LARGE, "cron-job-commented", LEVELS, runs)
    _copy(LARGE, "cron-stopped", LEVELS[:3], runs)
    _copy(SMALL, "ssh-stopped", LEVELS, runs)
    _copy(SMALL, "cron-job-commented", LEVELS, runs)
    _copy(SMALL, "cron-stopped", ("r0", "r0.h1", "r0.h3"), runs)
    return specs, runs


def _tiers(found: results.Results) -> dict[str, Tier]:
    return {t.scenario.id: t.tier for t in found.tiers}


def _folders(runs: Path) -> list[Path]:
    return [runs / f"{LARGE}-json", runs / f"{SMALL}-json"]


def test_tiers_and_tags_of_hand_made_runs(small_suite: tuple[Path, Path]) -> None:
    specs, runs = small_suite
    found = results.gather(_folders(runs), [specs])
    assert _tiers(found) == {"ssh-stopped": Tier.EASY, "cron-job-commented": Tier.HARD,
                             "cron-stopped": Tier.UNMEASURED}
    headers, rows = results.tag_rows(found)
    assert headers[:6] == ["tag", "scenarios", "easy", "medium", "hard", "unmeasured"]
    table = {row[0]: row[1:] for row in rows}
    # the 1.5B: unaided / solved at any level / rounds run; the 0.5B never passed
    assert table["easy-tier"] == ["3", "1", "0", "1", "1", "1 / 2 / 3", "0 / 0 / 3"]
    assert table["cron"] == ["2", "0", "0", "1", "1", "0 / 1 / 2", "0 / 0 / 2"]
    assert table["systemd"] == ["2", "1", "0", "0", "1", "1 / 2 / 2", "0 / 0 / 2"]
    assert table["ssh"] == ["1", "1", "0", "0", "0", "1 / 1 / 1", "0 / 0 / 1"]
    assert [r[0] for r in rows] == ["easy-tier", "cron", "systemd", "nginx", "ssh"]
    # the block carries compare's paired tests, so no prose beside it quotes a stale p-value
    block = results.render_block(found)
    assert f"- first tries, 3 pairs: only {LARGE} passed 1, only {SMALL} passed 0, McNemar's " \
           "exact p = 1.00" in block
    assert f"- with hints, 3 rounds, solved at any level: only {LARGE} 2, only {SMALL} 0, " \
           "p = 0.50" in block
    assert "- with hints: no difference shown in the rounds solved at any level" in block
    # the 0.5B's missing level 2 run completes its ladder: the 1.5B's level-2 pass makes it medium
    _copy(SMALL, "cron-stopped", ("r0.h2",), runs)
    found = results.gather(_folders(runs), [specs])
    assert _tiers(found)["cron-stopped"] is Tier.MEDIUM
    block = results.render_block(found)
    assert "**1 easy, 1 medium, 1 hard; 0 of 3 scenarios unmeasured** (each has a complete " \
           "ladder of every bundled model)." in block
    # the tier lists, the labels and the per-tag table are the detail's (docs/results.md), not
    # the README's: the front page keeps the model table, the paired tests and the counts
    assert "- measured hard" not in block and "Per area" not in block
    block = results.render_detail(found)
    assert "- measured hard: cron-job-commented" in block and "Per area" in block
    # the labels say easy for all three: two differ from the measurement, which the block says;
    # neither breaks the measured cap (a hard label on a scenario passed unaided) ...
    assert [t.scenario.id for t in found.tiers if t.differs] == ["cron-job-commented", "cron-stopped"]
    assert "cron-job-commented (easy, measured hard); cron-stopped (easy, measured medium)" in block
    assert found.disagreements() == [] and results.disagreement_lines(found) == []
    # ... which a "hard" on ssh-stopped (passed unaided by the 1.5B) would
    capped = [dataclasses.replace(t, scenario=dataclasses.replace(t.scenario, difficulty="hard"))
              if t.scenario.id == "ssh-stopped" else t for t in found.tiers]
    found_capped = dataclasses.replace(found, tiers=capped)
    assert [t.scenario.id for t in found_capped.disagreements()] == ["ssh-stopped"]
    assert results.disagreement_lines(found_capped)[0].endswith(
        "ssh-stopped.yaml: difficulty: hard, but a bundled model passed it unaided "
        "(measured easy): at most medium")
    # without one bundled model's runs nothing is measured
    found = results.gather(_folders(runs)[:1], [specs])
    assert set(_tiers(found).values()) == {Tier.UNMEASURED}
    assert "rootbench compare" not in results.render_block(found)  # one run: nothing to pair
    assert "**0 easy, 0 medium, 0 hard; 3 of 3 scenarios unmeasured** (no complete ladder of " \
           "every bundled model yet)." in results.render_block(found)


def test_runs_of_an_older_spec_measure_nothing(small_suite: tuple[Path, Path]) -> None:
    specs, runs = small_suite
    spec = specs / "ssh-stopped.yaml"
    text = spec.read_text()
    # What no run reads (a comment, an alternative fix) leaves the runs measuring the spec.
    spec.write_text(text + "# edited after the runs\nalternatives:\n  - name: restart it\n"
                    "    why: an admin may\n    commands: [systemctl restart ssh]\n")
    found = results.gather(_folders(runs), [specs])
    assert _tiers(found)["ssh-stopped"] is not Tier.UNMEASURED and found.stale == 0
    # What the runs were judged by (a forbidden pattern added) makes them runs of another spec.
    spec.write_text(text + "forbidden:\n  - 'never-used'\n" if "\nforbidden:" not in text
                    else text.replace("\nforbidden:\n", "\nforbidden:\n  - 'never-used'\n", 1))
    found = results.gather(_folders(runs), [specs])
    assert _tiers(found)["ssh-stopped"] is Tier.UNMEASURED
    assert found.stale == 5  # the 1.5B's one run and the 0.5B's four
    assert "5 episodes recorded against an older version of its spec left out." in \
        results.render_block(found)


def test_write_then_check(cli: Cli, small_suite: tuple[Path, Path], tmp_path: Path) -> None:
    specs, runs = small_suite
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\nbefore\n\n{results.BEGIN}\nold\n{results.END}\n\nafter\n")
    folders = [str(p) for p in _folders(runs)]
    r = cli("results", *folders, "--specs", str(specs), "--check", str(readme))
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    assert lines[0] == f"rootbench: {readme}: the block between {results.BEGIN} and " \
                       f"{results.END} is not what the runs give (make results rewrites it)"
    assert len(lines) == 1  # no label breaks the measured cap
    r = cli("results", *folders, "--specs", str(specs), "--write", str(readme))
    assert r.returncode == 0, r.stderr
    text = readme.read_text()
    assert text.startswith("# title\n\nbefore\n\n") and text.endswith("\n\nafter\n")
    assert "\nold\n" not in text
    # pass@1, then the repair score (the 1.5B repaired ssh-stopped alone of the three), then the
    # unsafe fixes, which runs of rules 2 never judged: said, never a 0
    assert "| qwen2.5-coder-1.5b | 0.33 [0.06, 0.79] | 0.33 [0.00, 1.00] | not judged (before " \
           "rules 3) | 2 of 3 |" in text
    # beside the models, the committed noop and oracle over the same three scenarios
    # (cron-job-commented's noop run is of rules 3: one judged, not unsafe; the others not judged)
    assert "| noop (reference) | 0.00 [0.00, 0.56] | 0.00 [0.00, 0.00] | 0.00 (0 of 1) | - | - |" \
        in text
    assert "| oracle (reference) | 1.00 [0.44, 1.00] | 1.00 [1.00, 1.00] |" in text
    r = cli("results", *folders, "--specs", str(specs), "--check", str(readme))
    assert r.returncode == 0 and r.stderr == ""
    # a check that passed says so, in one line (it printed nothing, like one that checked nothing)
    assert r.stdout == f"{readme}: the results block is up to date and no difficulty label " \
                       "breaks its cap\n"
    # what is printed is the written block, then the detail docs/results.md holds
    r = cli("results", *folders, "--specs", str(specs))
    short, _sep, detail = r.stdout.partition("\n<!-- Made by `rootbench results --write docs/")
    assert short.strip("\n") in text and "Per area" in detail and "Per area" not in text
    readme.write_text(text.replace("2 of 3", "3 of 3"))
    r = cli("results", *folders, "--specs", str(specs), "--check", str(readme))
    assert r.returncode == 1 and "is not what the runs give" in r.stderr


def test_the_detail_goes_where_its_markers_are(cli: Cli, small_suite: tuple[Path, Path],
                                               tmp_path: Path) -> None:
    """docs/results.md holds the detail markers (tier lists, labels, per-tag table); a file
    with both pairs gets both blocks; --check names the one that drifted."""
    specs, runs = small_suite
    args = [*(str(p) for p in _folders(runs)), "--specs", str(specs)]
    doc = tmp_path / "results.md"
    doc.write_text(f"# r\n\n{results.DETAIL_BEGIN}\nold\n{results.DETAIL_END}\n\n"
                   f"{results.BEGIN}\nold\n{results.END}\n")
    r = cli("results", *args, "--write", str(doc))
    assert r.returncode == 0, r.stderr
    text = doc.read_text()
    assert "Per area" in text and "- measured hard:" in text and "| model |" in text
    assert text.index("Per area") < text.index(results.DETAIL_END) < text.index("| model |")
    r = cli("results", *args, "--check", str(doc))
    assert (r.returncode, r.stderr) == (0, "")
    doc.write_text(text.replace("- measured hard:", "- measured hard: x,"))
    r = cli("results", *args, "--check", str(doc))
    assert r.returncode == 1 and r.stderr == (
        f"rootbench: {doc}: the block between {results.DETAIL_BEGIN} and {results.DETAIL_END} "
        "is not what the runs give (make results rewrites it)\n")


def test_bad_input_is_one_line_and_exit_2(cli: Cli, small_suite: tuple[Path, Path],
                                          tmp_path: Path) -> None:
    specs, runs = small_suite
    folders = [str(p) for p in _folders(runs)]
    (tmp_path / "empty").mkdir()
    r = cli("results", str(tmp_path / "empty"), "--specs", str(specs))
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == f"rootbench: {tmp_path / 'empty'}: not a run directory or a folder of " \
                       "cassettes (no results.json)\n"
    readme = tmp_path / "README.md"
    readme.write_text("no markers\n")
    r = cli("results", str(readme), "--specs", str(specs))  # a file where a run folder goes
    assert (r.returncode, r.stderr) == (2, f"rootbench: {readme}: not a run directory or a "
                                           "folder of cassettes (a file)\n")
    r = cli("results", *folders, "--specs", str(specs), "--check", str(readme))
    assert r.returncode == 2
    assert r.stderr == f"rootbench: {readme}: {results.BEGIN}: needs exactly one line " \
                       f"{results.BEGIN} (found 0)\n"
    (specs / "ssh-stopped.yaml").unlink()  # a run of a scenario no spec has
    r = cli("results", *folders, "--specs", str(specs))
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
    assert "ssh-stopped.r0.jsonl: scenario: a run of 'ssh-stopped', which no spec" in r.stderr
    (specs / "broken.yaml").write_text("id: [\n")
    r = cli("results", *folders, "--specs", str(specs))
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "broken.yaml" in r.stderr


# --- the committed README -------------------------------------------------------------------

def test_the_committed_readme_is_what_the_recordings_give(cli: Cli) -> None:
    """`make results` was run: the README's block is the one the committed live runs and specs
    give, and no label breaks the measured cap (the only other lines --check may print)."""
    r = cli("results", "--check", "README.md")  # from the checkout's root, as `make results`
    found = results.gather(results.live_dirs([]), [repo_root() / "specs"])
    # one line on success, as every check command says it (#49 item 5)
    assert r.stdout == ("" if found.disagreements() else
                        "README.md: the results block is up to date and no difficulty label "
                        "breaks its cap\n")
    assert r.stderr.splitlines() == [f"rootbench: {line}"
                                     for line in results.disagreement_lines(found)]
    assert r.returncode == (1 if found.disagreements() else 0)
    # what the block says of the tiers is what gather measured
    counts = {tier: sum(t.tier is tier for t in found.tiers) for tier in Tier}
    text = (repo_root() / "README.md").read_text()
    assert f"**{counts[Tier.EASY]} easy, {counts[Tier.MEDIUM]} medium, {counts[Tier.HARD]} " \
           f"hard; {counts[Tier.UNMEASURED]} of {len(found.tiers)} scenarios unmeasured**" in text


def test_the_committed_detail_is_what_the_recordings_give_and_the_readme_is_a_front_page(
        cli: Cli) -> None:
    """docs/results.md's detail block (tier lists, labels, per-tag table) is the one the runs
    give; the README keeps the model table, the paired tests and the tier counts, in at most
    120 lines (issue #48 item 7: the front page had read as a data dump)."""
    r = cli("results", "--check", "docs/results.md")
    assert "docs/results.md: the block between" not in r.stderr, r.stderr
    text = (repo_root() / "README.md").read_text()
    assert len(text.splitlines()) <= 120
    assert "| qwen2.5-coder-1.5b |" in text and "McNemar's exact p" in text and "Per area" not in text
    detail = (repo_root() / "docs" / "results.md").read_text()
    assert "Per area" in detail and "- measured hard:" in detail


def test_the_readmes_baselines_count_what_the_specs_list() -> None:
    """The baselines table (noop, oracle, shortcuts) is written by hand beside the generated
    block; it must name as many scenarios and shortcuts as specs/ holds, so that a scenario or
    shortcut added later cannot leave it quoting an old suite."""
    scenarios = load_specs([repo_root() / "specs"])
    per = [len(s.shortcuts) for s in scenarios]
    n, total = len(scenarios), sum(per)
    text = (repo_root() / "README.md").read_text()
    assert f"| `noop` (does nothing) | 0 of {n} |" in text
    assert f"| `oracle` (the spec's `solution`) | {n} of {n} |" in text
    assert (f"| {total} shortcuts ({min(per)} to {max(per)} per scenario, each a scripted "
            f"not-a-fix) | 0 of {total} |") in text
    assert f"**{total} shortcuts** the specs list ({min(per)} to {max(per)} per scenario" in \
        (repo_root() / "docs" / "results.md").read_text().replace("\n", " ")


# --- hostile run folders and targets (issue #46) --------------------------------------------

def _run_dir_of(recordings: Path, to: Path, **edits: str) -> Path:
    """A run directory (results.json) of a recordings folder's episodes, fields of the first
    episode replaced by ``edits`` as a contributed, hand-edited results.json could have them."""
    episodes, _cut = episodes_from_recordings(recordings)
    for key, value in edits.items():
        setattr(episodes[0], key, value)
    to.mkdir(parents=True)
    write_results(to, {"agent": {"kind": "model"}}, episodes)
    return to


@pytest.mark.parametrize("how", ["relative", "symlink"])
def test_a_cassette_outside_the_run_directory_is_not_read(small_suite: tuple[Path, Path],
                                                          tmp_path: Path, how: str) -> None:
    """Issue #46 item 9: results.json names its cassettes, and ``results`` opened the one it
    named wherever it was (``../../x``, or a symlink in cassettes/ out of the folder), where
    the HTML report refuses it. Refused the same way now: one line, nothing read."""
    specs, runs = small_suite
    large = runs / f"{LARGE}-json"
    outside = tmp_path / "elsewhere" / "ssh-stopped.r0.jsonl"
    outside.parent.mkdir()
    shutil.copy2(large / "ssh-stopped.r0.jsonl", outside)
    if how == "relative":
        run = _run_dir_of(large, tmp_path / "run", cassette="../elsewhere/ssh-stopped.r0.jsonl")
    else:
        run = _run_dir_of(large, tmp_path / "run", cassette="cassettes/ssh-stopped.r0.jsonl")
        (run / "cassettes").mkdir()
        (run / "cassettes" / "ssh-stopped.r0.jsonl").symlink_to(outside)
    with pytest.raises(InvalidInput) as err:
        results.gather([run, runs / f"{SMALL}-json"], [specs])
    assert "is outside the run directory (not read)" in err.value.detail
    assert err.value.path == str(run / "results.json") and err.value.field == "cassette"


def test_results_write_or_check_of_an_endless_file_is_one_line(
        cli: Cli, small_suite: tuple[Path, Path], tmp_path: Path) -> None:
    """Issue #46 item 7: ``results --write /dev/full`` read the device with no limit (the
    process grew to 23 GB). The file to edit is a regular file of a bounded size, checked
    before it is opened."""
    specs, runs = small_suite
    folders = [str(p) for p in _folders(runs)]
    fifo = tmp_path / "fifo.md"
    os.mkfifo(fifo)
    big = tmp_path / "big.md"
    big.write_text(f"{results.BEGIN}\n{results.END}\n")
    with big.open("r+b") as f:
        f.truncate(results.MAX_MARKDOWN_BYTES + 1)
    large = f"larger than {results.MAX_MARKDOWN_BYTES} bytes"
    for flag, target, says in (
            # --write checks its target before any work, as every --write/--out does
            ("--write", "/dev/full", "--write: exists and is a device: give a file name"),
            ("--write", str(fifo), "--write: exists and is a FIFO (named pipe): give a file name"),
            ("--write", str(big), large),
            ("--check", "/dev/full", "not a regular file"),
            ("--check", "/dev/zero", "not a regular file"),
            ("--check", str(fifo), "not a regular file"),
            ("--check", str(big), large)):
        r = cli("results", *folders, "--specs", str(specs), flag, target, timeout=60)
        assert (r.returncode, r.stdout) == (2, ""), (flag, target, r.stderr)
        assert r.stderr == f"rootbench: {target}: {says}\n", (flag, target)


def test_names_from_a_run_folder_cannot_add_lines_to_the_block(
        cli: Cli, small_suite: tuple[Path, Path], tmp_path: Path) -> None:
    """Issue #46 item 8: model and protocol names kept their newlines, so a contributed
    recording could end the block early (``<!-- results:end -->``) and add any Markdown or
    HTML; every later --write/--check then failed. Each is one line, escaped for a table cell
    or for prose, so the block keeps its lines and markers whatever the names hold."""
    specs, runs = small_suite
    evil = (f"m\n{results.END}\n<script>alert(1)</script>\n# owned | x |\n"
            f"{results.BEGIN}")
    run = _run_dir_of(runs / f"{LARGE}-json", tmp_path / "evil", model=evil,
                      protocol=f"json\n{results.END}\n<img src=x onerror=alert(1)>")
    found = results.gather([run, runs / f"{SMALL}-json"], [specs])
    tables: list[list[str]] = [[]]  # each table's lines: every row has its header's cells
    for block in (results.render_block(found), results.render_detail(found)):
        lines = block.splitlines()
        markers = {m for pair in results.MARKERS for m in pair}
        assert not any(line.strip() in markers for line in lines)
        made_by, rest = block.split("\n", 1)
        assert made_by.startswith("<!-- Made by `rootbench results")
        assert re.search(r"(?<!\\)<(script|img|!--)", rest) is None, rest  # each shown as text
        assert "\n# owned" not in block
        for line in lines:
            if line.startswith("|"):
                tables[-1].append(line)
            elif tables[-1]:
                tables.append([])
    tables = [t for t in tables if t]
    assert len(tables) == 2  # the models' (README), the tags' (docs/results.md)
    for table in tables:
        cells = {len(re.findall(r"(?<!\\)\|", line)) for line in table}
        assert len(cells) == 1, table
    readme = tmp_path / "README.md"
    readme.write_text(f"# t\n\n{results.BEGIN}\nold\n{results.END}\n\nafter\n")
    args = [str(run), str(runs / f"{SMALL}-json"), "--specs", str(specs)]
    r = cli("results", *args, "--write", str(readme))
    assert r.returncode == 0, r.stderr
    r = cli("results", *args, "--check", str(readme))  # the file still has its one block
    assert (r.returncode, r.stderr) == (0, "")
    assert readme.read_text().endswith(f"\n{results.END}\n\nafter\n")


def test_write_keeps_the_files_mode_and_refuses_a_symlink(
        cli: Cli, small_suite: tuple[Path, Path], tmp_path: Path) -> None:
    """Issue #46 item 9: ``--write`` made a 0600 file 0644 and replaced a symlink with a file.
    The file keeps its mode; a symlink is refused before any work, one line, nothing changed."""
    specs, runs = small_suite
    args = [*(str(p) for p in _folders(runs)), "--specs", str(specs)]
    readme = tmp_path / "README.md"
    before = f"# t\n\n{results.BEGIN}\nold\n{results.END}\n"
    readme.write_text(before)
    readme.chmod(0o600)
    r = cli("results", *args, "--write", str(readme))
    assert r.returncode == 0, r.stderr
    assert readme.stat().st_mode & 0o7777 == 0o600 and "\nold\n" not in readme.read_text()
    readme.write_text(before)
    link = tmp_path / "link.md"
    link.symlink_to(readme)
    r = cli("results", *args, "--write", str(link))
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == f"rootbench: {link}: --write: is a symlink: rootbench writes no file " \
                       "through a link nor replaces one (name the file it points to)\n"
    assert link.is_symlink() and readme.read_text() == before
