"""``rootbench rejudge PATH...``: recorded runs judged again on fresh VMs, their verdicts checked.

A published result is a folder of cassettes, and a cassette is a file anyone
can edit: its verdict line says ``pass`` because it was written so. Rejudging
does not trust that line. Each cassette's recorded model replies are served
again, in order, to the real agent loop against a *fresh* VM restored from the
image and broken by the scenario's own setup (the recorded scenario, as the
header holds it); the actions the loop takes are therefore the actions the
run took, and the machine they leave is judged by today's probes under the
run's own judging rules. The new verdict (with its flags) must equal the
recorded one: then the claim is **confirmed**. Anything else (another
verdict, a run that asked for a reply the cassette does not hold, an
unreadable file) is not.

This is a live replay (``rootbench replay --lenient`` without ``--offline``):
a command's output may differ from the recording (a PID, a timestamp), so the
requests the loop makes are not held to the recorded ones; the replies are.
What it cannot prove is that a model wrote those replies: only that these
actions, taken on this scenario, earn this verdict.

Each rejudge writes a record (``rejudged.json``: each cassette's sha256, the
recorded and new verdicts, when, on what harness and accelerator), by default
into the one run directory it was given, so ``rootbench view`` shows which runs
were re-judged and with what result.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner import __version__
from runner.app.outputs import atomic_write
from runner.app.replay import ReplayOutcome, replay_all, unreadable
from runner.backends.cachedir import file_sha256
from runner.core import layout
from runner.core.cassette import find_cassettes
from runner.core.errors import InvalidInput
from runner.core.outcomes import ReplayResult
from runner.core.rules import Rules
from runner.core.text import one_line

log = logging.getLogger("rootbench.rejudge")

RECORD_NAME = "rejudged.json"
COLUMNS = ("cassette", "scenario", "recorded", "rejudged", "confirmed", "note")


@dataclass(frozen=True)
class Rejudged:
    """One cassette judged again: the recorded verdict (with flags) and the new one."""

    cassette: str
    sha256: str  # of the cassette file as it was rejudged: which recording this confirms
    scenario: str
    recorded: str
    rejudged: str
    confirmed: bool
    note: str

    def to_dict(self) -> dict[str, Any]:
        return {"cassette": self.cassette, "sha256": self.sha256, "scenario": self.scenario,
                "recorded": self.recorded, "rejudged": self.rejudged,
                "confirmed": self.confirmed, "note": self.note}


def _digest(path: Path) -> str:
    """The cassette's sha256 (:func:`~runner.backends.cachedir.file_sha256`), or "" when it
    cannot be read (an unreadable cassette is still a row)."""
    try:
        return file_sha256(path)
    except OSError:
        return ""


def _verdict(text: str) -> str:
    """``pass`` of ``pass [left-behind]``: the verdict without its flags."""
    return text.split(" [", 1)[0]


def judged_again(outcome: ReplayOutcome, path: Path, *, other_rules: bool = False) -> Rejudged:
    """A live replay's outcome as a rejudgement: confirmed only when the replay reached a
    verdict and it (with its flags) is the recorded one. Judged by ``other_rules`` than the
    recording's, the verdict alone must match: a flag the newer rules raise (``left-behind``
    from the state diff) is news about the run, said in the note, not a verdict overturned."""
    reached = outcome.result in (ReplayResult.SAME, ReplayResult.DIFFERENT)
    if other_rules:
        confirmed = reached and _verdict(outcome.recorded) == _verdict(outcome.replayed)
    else:
        confirmed = reached and outcome.recorded == outcome.replayed
    note = outcome.note
    if other_rules and confirmed and outcome.recorded != outcome.replayed:
        note = f"same verdict, flagged now: {outcome.replayed}; {note}"
    elif reached and confirmed and outcome.result is ReplayResult.DIFFERENT:
        note = f"same verdict; {note}"  # a graded figure differs (a milestone, the score)
    return Rejudged(str(path), _digest(path), outcome.scenario, outcome.recorded,
                    outcome.replayed, confirmed, one_line(note, 400))


def default_record(words: Sequence[str]) -> Path:
    """Where the record goes when not asked: into the one run directory given (beside its
    results.json), else ``./rejudged.json``."""
    if len(words) == 1 and (Path(words[0]) / layout.RESULTS).is_file():
        return Path(words[0]) / RECORD_NAME
    return Path(RECORD_NAME)


def write_record(out: Path, rows: Sequence[Rejudged], *, accel: str, seconds: float,
                 rules: Rules | None = None) -> None:
    """The rejudgement's record, atomically: what was confirmed, of which files, when, how."""
    doc = {"rejudged_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "harness": __version__, "accel": accel, "seconds": round(seconds, 1),
           "rules": "each recording's own" if rules is None else int(rules),
           "confirmed": sum(r.confirmed for r in rows), "episodes": len(rows),
           "cassettes": [r.to_dict() for r in rows]}
    atomic_write(out, json.dumps(doc, indent=2) + "\n", "--out")


def read_record(path: Path) -> tuple[int, int] | None:
    """(confirmed, episodes) of a rejudgement record, or None when there is none or it cannot
    be read as one (a file handed over: any field may be anything)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    confirmed, episodes = doc.get("confirmed"), doc.get("episodes")
    if type(confirmed) is not int or type(episodes) is not int or not 0 <= confirmed <= episodes:
        return None
    return confirmed, episodes


def _line(cells: Sequence[str], fmt: str) -> str:
    if fmt == "plain":
        return "  ".join(cells)
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def rejudge(words: Sequence[str], *, fmt: str, jobs: int, accel: str, transport: str,
            record_to: Path | None, out: Callable[[str], None],
            err: Callable[[str], None], rules: Rules | None = None) -> int:
    """Rejudge every cassette under ``words``; print a row per cassette as it is decided and
    write the record. 0 when every verdict is confirmed, 1 when one is not, 2 when a cassette
    could not be read at all (bad input). With ``rules``, the same actions are judged by those
    rules instead of the recording's own: how many verdicts a change of the rules turns."""
    record = record_to or default_record(words)
    folders: list[tuple[Path, str]] = []
    paths = find_cassettes(list(words), unreadable=folders)
    if not paths and not folders:
        raise InvalidInput("no cassettes (*.jsonl) here to rejudge", path=", ".join(words))
    rows: list[Rejudged] = []
    unreadable_count = 0
    if fmt == "json":
        out("[")
    else:
        out(_line(COLUMNS, fmt))
        if fmt == "github":
            out("|" + "|".join("---" for _ in COLUMNS) + "|")

    def show(row: Rejudged) -> None:
        rows.append(row)
        if fmt == "json":
            out(("  " if len(rows) == 1 else ", ") + json.dumps(row.to_dict()))
        else:
            out(_line([row.cassette, row.scenario, row.recorded, row.rejudged,
                       "yes" if row.confirmed else "NO", row.note[:120]], fmt))

    for folder, why in folders:
        exc = InvalidInput(why, path=str(folder))
        err(f"rootbench: {exc}")
        unreadable_count += 1
        show(judged_again(unreadable(folder, exc), folder))
    t0 = time.monotonic()
    log.info("rejudging %d cassette%s on fresh VMs (%d at a time)", len(paths),
             "" if len(paths) == 1 else "s", jobs)
    with contextlib.closing(replay_all(paths, offline=False, lenient=True,
                                       allow_spec_changes=True, accel=accel,
                                       transport=transport, jobs=jobs, rules=rules)) as decided:
        for i, (path, done) in enumerate(zip(paths, decided, strict=True), 1):
            if done.error is not None:
                err(f"rootbench: {done.error}")
                unreadable_count += 1
            show(judged_again(done.outcome, path, other_rules=rules is not None))
            log.info("rejudged %d/%d: %s", i, len(paths), path.name)
    seconds = time.monotonic() - t0
    if fmt == "json":
        out("]")
    write_record(record, rows, accel=accel, seconds=seconds, rules=rules)
    confirmed = sum(r.confirmed for r in rows)
    if fmt != "json":
        out(f"\n{confirmed}/{len(rows)} recorded verdicts confirmed on fresh VMs "
            f"({seconds:.0f}s); record: {record}")
    if unreadable_count:
        return 2
    return 0 if confirmed == len(rows) else 1
