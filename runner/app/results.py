"""``rootbench results``: the README's results block and the measured difficulty tiers, from
the committed live runs and the specs alone (no VM, no model).

It reads every run folder given (default: each folder under ``recordings/live/``, one
bundled model's ladder run each) and the specs, then:

- per scenario, the tier measured by the rule of docs/validity.md
  (:func:`runner.core.tiers.measured_tier`), and which of them disagree with the spec's
  ``difficulty:`` label;
- the results block: per run, the overall figures of ``rootbench report``
  (:func:`runner.app.stats.summarize`, shown by :func:`runner.app.report.ci_text`: never
  recomputed here), the tier counts, and a breakdown by tag.

``--write FILE`` puts the block between :data:`BEGIN` and :data:`END` in FILE; ``--check FILE``
says in one line when FILE's block is not what the recordings give, and one line per scenario
whose label disagrees with its measured tier. A README cannot then drift from its recordings
unnoticed (``tests/unit/test_results.py`` runs the check on the committed one).

The run folders may be contributed, so what they hold is never trusted: a cassette that
results.json names is read only inside its run folder (:func:`runner.core.paths.contained`),
every name from a recording lands in the block as one escaped line
(:func:`runner.core.text.md_cell`), and the file ``--write``/``--check`` reads is a regular
file of a bounded size (:func:`runner.core.paths.read_regular`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.app.compare import Run, RunComparison, load_run, p_text, verdict_lines
from runner.app.html_report.fields import plural
from runner.app.outputs import atomic_write, check_file_target
from runner.app.paired import compare
from runner.app.reference import references
from runner.app.report import ci_text, unsafe_text
from runner.app.runs import shown_path
from runner.app.scenarios import specs_dir
from runner.app.stats import Summary, assists, hinted, summarize
from runner.backends.llama import MODELS
from runner.core.cassette import Cassette
from runner.core.episode import Episode
from runner.core.errors import InvalidInput
from runner.core.layout import CASSETTES, RESULTS
from runner.core.outcomes import Tier
from runner.core.paths import contained, default_spec_dirs, read_regular
from runner.core.spec import Scenario, check_specs, ran_as_today, scenario_to_dict, scenario_view
from runner.core.text import md_cell, md_code, one_line
from runner.core.tiers import measured_tier

BEGIN = "<!-- results:begin -->"
END = "<!-- results:end -->"
# The detail beside the README's block: the tier lists, the labels that differ, the per-tag table
# (docs/results.md). A file holds either block or both; --write and --check act on those it holds.
DETAIL_BEGIN = "<!-- results-detail:begin -->"
DETAIL_END = "<!-- results-detail:end -->"
MARKERS = ((BEGIN, END), (DETAIL_BEGIN, DETAIL_END))
DEFAULT_LIVE = Path("recordings/live")
MEASURED = (Tier.EASY, Tier.MEDIUM, Tier.HARD)
MAX_MARKDOWN_BYTES = 16 * 1024 * 1024  # the README is ~40 KB; a file past this is not one


@dataclass(frozen=True)
class ScenarioTier:
    """One spec, where it was read from, and its measured tier."""

    scenario: Scenario
    path: Path
    tier: Tier

    @property
    def differs(self) -> bool:
        """A measured tier that is not the spec's ``difficulty:`` label (unmeasured never is).
        Not an error: the label is the rule's, from the scenario's structure (what the first
        diagnostic shows, hops to the cause, faults that interact), which small models may find
        harder than it reads; the block lists these beside the measurement."""
        return self.tier is not Tier.UNMEASURED and self.scenario.difficulty != self.tier.value

    @property
    def disagrees(self) -> bool:
        """The label breaks the rule's measured cap: a scenario a bundled model passed unaided
        is at most medium (docs/validity.md), so "hard" with a measured "easy" is wrong."""
        return self.tier is Tier.EASY and self.scenario.difficulty == "hard"


@dataclass(frozen=True)
class Results:
    """What the block is made from: the runs (in the order given), every spec's tier, the
    bundled models the tiers are measured on, and episodes left out of the tiers because
    their cassette was recorded against another version of the spec."""

    runs: list[Run]
    tiers: list[ScenarioTier]
    models: tuple[str, ...]
    stale: int = 0

    def disagreements(self) -> list[ScenarioTier]:
        return [t for t in self.tiers if t.disagrees]


def live_dirs(paths: Sequence[str]) -> list[Path]:
    """The run folders named, else every folder directly under ``recordings/live/``."""
    if paths:
        return [Path(p) for p in paths]
    if not DEFAULT_LIVE.is_dir():
        raise InvalidInput("no such directory (name the run folders, or run from the checkout)",
                           path=str(DEFAULT_LIVE))
    found = sorted(p for p in DEFAULT_LIVE.iterdir() if p.is_dir())
    if not found:
        raise InvalidInput("no run folders in it", path=str(DEFAULT_LIVE))
    return found


def _specs(spec_dirs: Sequence[Path]) -> list[tuple[Scenario, Path]]:
    checked = check_specs(spec_dirs)
    if not checked:
        raise InvalidInput("no scenario files found", path=", ".join(map(str, spec_dirs)))
    for _path, _scenario, err in checked:
        if err is not None:
            raise err
    return [(s, p) for p, s, _e in checked if s is not None]


def _recorded_header(run: Run, ep: Episode) -> tuple[str, Mapping[str, Any]] | None:
    """The spec hash and the scenario in the header of the episode's cassette when the folder
    holds it (a recordings folder always does; a run directory under ``cassettes/``) and the
    header has a spec hash, else None.

    The cassette's name is the run folder's (results.json's ``cassette``): one that resolves
    outside the folder (``../x``, a symlink out of ``cassettes/``) is bad input and never
    opened, as the HTML report never opens it."""
    if not ep.cassette:
        return None
    for where in (run.path / ep.cassette, run.path / CASSETTES / ep.cassette):
        if not where.is_file():
            continue
        if contained(where, run.path) is None:
            raise InvalidInput(f"the cassette {one_line(ep.cassette, 120)!r} is outside the run "
                               "directory (not read)",
                               path=str(run.path / RESULTS) if (run.path / RESULTS).is_file()
                               else str(run.path), field="cassette")
        head = Cassette.load(where).head
        return (head.spec_hash, head.scenario) if head.spec_hash is not None else None
    return None


def gather(paths: Sequence[Path], spec_dirs: Sequence[Path]) -> Results:
    """Load the runs and the specs and measure every scenario's tier; bad input (a folder
    that is not a run, a spec that does not load, a run of a scenario no spec has) is
    :class:`InvalidInput` naming the file and field."""
    specs = _specs(spec_dirs)
    by_id = {s.id: s for s, _p in specs}
    views = {s.id: scenario_view(scenario_to_dict(s)) for s, _p in specs}  # what a run of each records
    for p in paths:
        if p.exists() and not p.is_dir():
            raise InvalidInput("not a run directory or a folder of cassettes (a file)", path=str(p))
    runs = [load_run(p) for p in paths]
    models = tuple(MODELS)
    # per scenario, per bundled model: one ladder (the episodes of one folder) per run folder
    ladders: dict[str, dict[str, list[list[Episode]]]] = {}
    stale = 0
    for run in runs:
        own: dict[tuple[str, str], list[Episode]] = {}
        for ep in run.episodes:
            spec = by_id.get(ep.scenario)
            if spec is None:
                where = run.path / ep.cassette if ep.cassette else run.path
                raise InvalidInput(f"a run of {one_line(ep.scenario, 80)!r}, which no spec under "
                                   f"{', '.join(map(str, spec_dirs))} has", path=str(where),
                                   field="scenario")
            if ep.model not in models:
                continue
            recorded = _recorded_header(run, ep)
            if recorded is not None and not ran_as_today(*recorded, spec, views.get(spec.id)):
                stale += 1
                continue
            own.setdefault((ep.scenario, ep.model), []).append(ep)
        for (scenario, model), eps in own.items():
            ladders.setdefault(scenario, {}).setdefault(model, []).append(eps)
    tiers = [ScenarioTier(s, p, measured_tier(ladders.get(s.id, {}), len(s.hints), models))
             for s, p in specs]
    return Results(runs=runs, tiers=tiers, models=models, stale=stale)


# --- the block ------------------------------------------------------------------------------

def _names(runs: Sequence[Run]) -> list[str]:
    """What each run's row is called: its model, or its label (model and protocol) when two
    runs would share a name; one line each, escaped for Markdown (:func:`md_cell`), since the
    names are the recordings' and land in table cells and sentences."""
    models = [md_cell(",".join(dict.fromkeys(ep.model for ep in r.episodes)) or r.label)
              for r in runs]
    return [m if models.count(m) == 1 else md_cell(r.label)
            for m, r in zip(models, runs, strict=True)]


def _solved(s: Summary) -> str:
    return "-" if s.solved is None else f"{s.solved} of {s.scored}"


def _model_row(name: str, o: Summary) -> list[str]:
    return [name, ci_text(o.pass_at_1, o.pass_at_1_ci), ci_text(o.mean_repair, o.mean_repair_ci),
            unsafe_text(o), _solved(o), ci_text(o.mean_assist, o.mean_assist_ci),
            ci_text(o.mean_score, o.mean_score_ci)]


def _model_table(results: Results) -> str:
    """Per run its overall row of ``report``, and under them the same row of the committed noop
    and oracle runs over the scenarios the runs ran (:mod:`runner.app.reference`): the repair
    score, the headline, is read against doing nothing (0) and the oracle (1)."""
    rows = [_model_row(name, summarize(run.episodes).overall)
            for name, run in zip(_names(results.runs), results.runs, strict=True)]
    ran = [ep.scenario for r in results.runs for ep in r.episodes if ep.verdict.scored]
    rows += [_model_row(f"{ref.name} (reference)", ref.summary) for ref in references(ran)]
    return _md(["model", "pass@1 at level 0 [95 % CI]", "repair score [95 % CI]",
                "unsafe fixes [95 % CI]", "solved with hints", "mean assist [95 % CI]",
                "mean score [95 % CI]"], rows)


def _compare_lines(results: Results) -> list[str]:
    """Each run after the first against the first, as ``rootbench compare`` tells it (its
    McNemar counts and p-values and its verdict lines, never recomputed here): prose beside the
    block that quoted p-values went stale as the runs grew, so the block carries them."""
    if len(results.runs) < 2:
        return []
    names = _names(results.runs)
    # the verdict lines name the runs by their labels, which are the recordings': escaped
    runs = [dataclasses.replace(r, label=md_cell(r.label)) for r in results.runs]
    first = runs[0]
    lines = ["", "`rootbench compare` of the first run with each other one (paired by "
                 "scenario, round and hint level):", ""]
    for name, run in zip(names[1:], runs[1:], strict=True):
        rc = RunComparison(first, run, compare(first.episodes, run.episodes))
        r = rc.result
        tests = [f"first tries, {r.pairs} pairs: only {names[0]} passed {r.a_only}, only "
                 f"{name} passed {r.b_only}, McNemar's exact p = {p_text(r.mcnemar_p)}"]
        if r.repair_p is not None:
            tests.append(f"repair scores, {r.repair_pairs} pairs: {names[0]} higher in "
                         f"{r.a_repair_better}, {name} higher in {r.b_repair_better}, exact sign "
                         f"test p = {p_text(r.repair_p)}")
        if r.unsafe_p is not None:
            tests.append(f"unsafe fixes, {r.unsafe_pairs} pairs judged on both sides: only "
                         f"{names[0]} {r.a_unsafe_only}, only {name} {r.b_unsafe_only}, "
                         f"McNemar's exact p = {p_text(r.unsafe_p)}")
        if r.solved_p is not None:
            tests.append(f"with hints, {r.solved_pairs} rounds, solved at any level: only "
                         f"{names[0]} {r.a_solved_only}, only {name} {r.b_solved_only}, "
                         f"p = {p_text(r.solved_p)}")
        lines += [f"- {line}" for line in (*tests, *verdict_lines(rc))]
    return lines


def _md(headers: list[str], rows: list[list[str]]) -> str:
    """A GitHub table in the README's compact form (``|---|``), every cell as given."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def tag_rows(results: Results) -> tuple[list[str], list[list[str]]]:
    """The per-area breakdown: per tag (most scenarios first), how many scenarios carry it, their
    measured tiers, and per run the rounds it passed unaided / solved at any hint level / ran
    of those scenarios (from :func:`assists`, as :func:`summarize` counts them; "-" for "with
    hints" when the run gave none)."""
    tags: dict[str, list[ScenarioTier]] = {}
    for t in results.tiers:
        for tag in t.scenario.tags:
            tags.setdefault(tag, []).append(t)
    headers = ["tag", "scenarios", *(tier.value for tier in (*MEASURED, Tier.UNMEASURED)),
               *(f"{n}: unaided / with hints / ran" for n in _names(results.runs))]
    rows = []
    for tag, members in sorted(tags.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        ids = {t.scenario.id for t in members}
        row = [md_cell(tag), str(len(members)),
               *(str(sum(t.tier is tier for t in members)) for tier in (*MEASURED, Tier.UNMEASURED))]
        for run in results.runs:
            # the assist of each round (stats.assists, as summarize counts them): 0 passed
            # unaided, k with k hints, None never
            helped = assists([ep for ep in run.episodes
                              if ep.scenario in ids and ep.verdict.scored]).values()
            if not helped:
                row.append("-")
                continue
            solved = sum(a is not None for a in helped) if hinted(run.episodes) else "-"
            row.append(f"{sum(a == 0 for a in helped)} / {solved} / {len(helped)}")
        rows.append(row)
    return headers, rows


def render_block(results: Results) -> str:
    """The text between the markers (without them): the model table, the tiers, the tags."""
    tiers = results.tiers
    counts = {tier: sum(t.tier is tier for t in tiers) for tier in Tier}
    folders = ", ".join(md_code(shown_path(r.path)) for r in results.runs)
    protocols = sorted({md_cell(ep.protocol, 60) for r in results.runs for ep in r.episodes})
    ladder = any(ep.hint_level for r in results.runs for ep in r.episodes)
    bundled = " and ".join(results.models)
    parts = [
        "<!-- Made by `rootbench results --write README.md` (`make results`) from the committed "
        "runs and specs/; `--check` fails when this block differs from them. Do not edit it. -->",
        "",
        f"From {folders} ({plural(len({ep.scenario for r in results.runs for ep in r.episodes}), 'scenario')}"
        f" run, protocol {', '.join(protocols) or '-'}{', hint ladder' if ladder else ''}); "
        "each row is the overall row of `rootbench report` on its folder, the last two those of "
        "the committed noop (runs no command) and oracle (each spec's solution) runs, "
        "`recordings/oracle/noop` and `recordings/oracle`. The repair score (the headline) "
        "counts only what the fault broke: 0 for doing nothing, 1 for the oracle; unsafe fixes "
        "are judged from rules 3 on ([docs/reports.md](docs/reports.md)):",
        "",
        _model_table(results),
        *_compare_lines(results),
        "",
        f"Difficulty tiers measured from the ladders of the bundled models ({bundled}), by the "
        "rule in [docs/validity.md](docs/validity.md): easy, a bundled model passed it unaided; "
        "medium, only with hints; hard, none passed it with every hint. "
        f"**{counts[Tier.EASY]} easy, {counts[Tier.MEDIUM]} medium, {counts[Tier.HARD]} hard; "
        f"{counts[Tier.UNMEASURED]} of {len(tiers)} scenarios unmeasured** "
        + ("(no complete ladder of every bundled model yet)." if counts[Tier.UNMEASURED] else
           "(each has a complete ladder of every bundled model).")
        + (f" {plural(results.stale, 'episode')} recorded against an older version of its spec "
           "left out." if results.stale else ""),
        "",
        "The scenarios of each tier, the labels that differ from the measured tier and the "
        "breakdown by area: [docs/results.md](docs/results.md#tiers-and-areas).",
    ]
    return "\n".join(parts) + "\n"


def render_detail(results: Results) -> str:
    """The text between the detail markers: each tier's scenarios, the labels that differ
    from the measured tier, and the per-tag table."""
    tiers = results.tiers
    parts = ["<!-- Made by `rootbench results --write docs/results.md` (`make results`) from the "
             "committed runs and specs/; `--check` fails when this block differs from them. Do "
             "not edit it. -->", ""]
    for tier in MEASURED:
        ids = [t.scenario.id for t in tiers if t.tier is tier]
        parts.append(f"- measured {tier.value}: {', '.join(ids) if ids else 'none'}")
    differ = [t for t in tiers if t.differs]
    parts.append("- the spec's `difficulty:` label (the rule's, from the scenario's structure) "
                 "differs from the measured tier: "
                 + ("; ".join(f"{t.scenario.id} ({t.scenario.difficulty or 'no label'}, measured "
                              f"{t.tier.value})" for t in differ) if differ else "none"))
    headers, rows = tag_rows(results)
    parts += ["", "Per area (each scenario counts under every tag it has; a run's cells count "
                  "rounds, one per scenario in a ladder run):", "", _md(headers, rows)]
    return "\n".join(parts) + "\n"


def disagreement_lines(results: Results) -> list[str]:
    """One line per scenario whose label breaks the measured cap, naming its file."""
    return [f"{shown_path(t.path)}: difficulty: {t.scenario.difficulty or '(none)'}, but a bundled "
            f"model passed it unaided (measured {t.tier.value}): at most medium"
            for t in results.disagreements()]


# --- the file with the markers -----------------------------------------------------------------

def _split(text: str, path: Path, begin: str = BEGIN,
           end: str = END) -> tuple[str, str, str]:
    """``text`` as (up to and with the begin marker's line, the block, from the end marker's
    line on); a file without exactly one of each marker, in order, is :class:`InvalidInput`."""
    lines = text.splitlines(keepends=True)
    begins = [i for i, ln in enumerate(lines) if ln.strip() == begin]
    ends = [i for i, ln in enumerate(lines) if ln.strip() == end]
    for marker, found in ((begin, begins), (end, ends)):
        if len(found) != 1:
            raise InvalidInput(f"needs exactly one line {marker} (found {len(found)})",
                               path=str(path), field=marker)
    (b,), (e,) = begins, ends
    if e < b:
        raise InvalidInput(f"{end} comes before {begin}", path=str(path), field=end)
    return "".join(lines[:b + 1]), "".join(lines[b + 1:e]), "".join(lines[e:])


def _read(path: Path) -> str:
    """The text of the file to edit or check: a regular file of at most
    :data:`MAX_MARKDOWN_BYTES`, checked before it is opened (``--write /dev/full`` is one line,
    not a read that never ends)."""
    raw = read_regular(path, MAX_MARKDOWN_BYTES)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"cannot read: not UTF-8 text (byte {exc.start})",
                           path=str(path)) from None


def _held(text: str) -> list[tuple[str, str]]:
    """The marker pairs ``text`` holds a begin line of; none is the README's pair (whose
    absence :func:`_split` then names)."""
    lines = {ln.strip() for ln in text.splitlines()}
    held = [(b, e) for b, e in MARKERS if b in lines or e in lines]
    return held or [(BEGIN, END)]


def written(path: Path, blocks: Mapping[str, str]) -> str:
    """``path``'s text with each block it has markers for (``blocks``: begin marker -> text)
    between them."""
    text = _read(path)
    for begin, end in _held(text):
        head, _old, tail = _split(text, path, begin, end)
        text = head + "\n" + blocks[begin] + "\n" + tail
    return text


def up_to_date_line(path: Path) -> str:
    """What ``results --check`` prints when the check passed: a check that says nothing on
    success cannot be told from one that checked nothing."""
    return f"{path}: the results block is up to date and no difficulty label breaks its cap"


def differing(path: Path, blocks: Mapping[str, str]) -> list[tuple[str, str]]:
    """The marker pairs of ``path`` whose block is not the one given (blank lines around it do
    not count)."""
    text = _read(path)
    out = []
    for begin, end in _held(text):
        _head, old, _tail = _split(text, path, begin, end)
        if old.strip("\n") != blocks[begin].strip("\n"):
            out.append((begin, end))
    return out


def command(paths: Sequence[str], specs: Sequence[str] | None, *, write: str | None,
            check: str | None, out: Callable[[str], None], err: Callable[[str], None]) -> int:
    """``rootbench results``: the block to ``out``, or written into (``write``) or checked
    against (``check``) a file, the specs read from the ``specs`` folders (default: the default
    spec folders). A label that breaks the measured cap (hard, yet passed unaided) is one line
    each to ``err``; with ``check`` it, or a block that differs, makes the exit 1. A ``write``
    target is checked before any work: one that cannot be written costs none."""
    if write:
        check_file_target(Path(write), "--write")
    spec_dirs = [specs_dir(d) for d in specs] if specs else default_spec_dirs()
    found = gather(live_dirs(paths), spec_dirs)
    blocks = {BEGIN: render_block(found), DETAIL_BEGIN: render_detail(found)}
    problems = disagreement_lines(found)
    if check:
        problems[:0] = [f"{check}: the block between {begin} and {end} is not what the runs "
                        "give (make results rewrites it)"
                        for begin, end in differing(Path(check), blocks)]
    for line in problems:
        err(f"rootbench: {line}")
    if check:
        if problems:
            return 1
        out(up_to_date_line(Path(check)))  # a check that passed says so
        return 0
    if write:
        target = Path(write)
        atomic_write(target, written(target, blocks), "--write")
        out(f"{target}: results written ({len(found.tiers)} scenarios, "
            f"{sum(t.tier is not Tier.UNMEASURED for t in found.tiers)} measured)")
        return 0
    out(blocks[BEGIN] + "\n" + blocks[DETAIL_BEGIN].rstrip("\n"))
    return 0
