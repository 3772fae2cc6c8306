"""The scenarios a command is given: spec files, folders of them, or bundled scenario ids.

Every command that takes scenarios (``validate``, ``list``, ``run``,
``bench``, ``mcp``, ``verify``) and every ``--specs`` folder is resolved
here, so a word means the same scenario to each of them: a word that looks
like a path (:func:`~runner.core.selection.looks_like_path`) is a path,
anything else an id looked up in the default spec folders
($ROOTBENCH_SPECS, else the bundled specs/), as ``bench --only`` looks it
up. The selection flags then narrow the scenarios (runner/core/selection.py).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from runner.app.report import render_rows
from runner.core import measured
from runner.core.errors import InvalidInput
from runner.core.measured import UNKNOWN
from runner.core.paths import default_spec_dirs
from runner.core.selection import (
    SPEC_SUFFIXES,
    Selection,
    choose,
    default_subset,
    looks_like_path,
    pick_ids,
)
from runner.core.spec import Scenario, check_specs, load_specs


def spec_paths(paths: Sequence[str]) -> list[str | Path]:
    """The paths as given, or the default spec folders when none are."""
    return list(paths) if paths else list(default_spec_dirs())


def scenarios_of(words: Sequence[str], field: str) -> list[Scenario]:
    """The scenarios ``words`` name, each a spec file, a folder of them or a bundled scenario's
    id (default: every bundled one). An id is looked up as ``bench --only`` looks it up, in the
    default spec folders ($ROOTBENCH_SPECS, else the bundled specs/); a word is a path when it
    looks like one (:func:`~runner.core.selection.looks_like_path`). An unknown id is one line
    with the nearest ids; a spec file that is not there but whose name is a bundled id says so.
    """
    if not words:
        return load_specs(default_spec_dirs())
    out: dict[str, Scenario] = {}
    known: list[Scenario] | None = None
    for word in words:
        if looks_like_path(word):
            if not Path(word).exists() and Path(word).suffix in SPEC_SUFFIXES:
                known = known if known is not None else load_specs(default_spec_dirs())
                if any(s.id == Path(word).stem for s in known):
                    raise InvalidInput(f"no such file (the bundled scenario {Path(word).stem!r} "
                                       "is given by its id alone)", path=word, field=field)
            found = load_specs([word])
        else:
            known = known if known is not None else load_specs(default_spec_dirs())
            found = pick_ids(known, [word], field=field)
        for s in found:
            out.setdefault(s.id, s)
    return list(out.values())


def one_spec(word: str) -> Scenario:
    """``run`` and ``mcp``'s one scenario: a spec file or a bundled scenario's id."""
    found = scenarios_of([word], "SPEC")
    if len(found) != 1:
        raise InvalidInput(f"names {len(found)} scenarios; give one spec file or one id",
                           path=word, field="SPEC")
    return found[0]


def selected(paths: Sequence[str], selection: Selection) -> list[Scenario]:
    """The scenarios of the paths or ids (default: the bundled specs/), narrowed by the
    selection flags (runner/core/selection.py)."""
    return choose(scenarios_of(paths, "PATH"), selection, measured.load())


def specs_dir(name: str) -> Path:
    """A ``--specs`` folder: it must exist and be listable (it is where specs are looked up)."""
    path = Path(name)
    try:
        if not stat.S_ISDIR(path.stat().st_mode):
            raise InvalidInput("not a directory", path=name, field="--specs")
        with os.scandir(path) as listing:
            next(listing, None)
    except FileNotFoundError:
        raise InvalidInput("no such directory", path=name, field="--specs") from None
    except OSError as exc:
        raise InvalidInput(f"cannot list: {exc.strerror or exc}", path=name,
                           field="--specs") from None
    return path


def validation(paths: Sequence[str]) -> tuple[list[str], int]:
    """``validate``: one line per spec file (its error, or ``ok`` and its id) and the count
    line, and how many are invalid. No spec file at all is bad input, not "0 valid"."""
    results = check_specs(spec_paths(paths))
    if not results:
        raise InvalidInput("no scenario files found", path=", ".join(map(str, spec_paths(paths))))
    lines: list[str] = []
    bad = 0
    for path, scenario, err in results:
        if err is not None:
            bad += 1
            lines.append(str(err))
        else:
            assert scenario is not None
            lines.append(f"{path}: ok ({scenario.id})")
    lines.append(f"{len(results) - bad} valid, {bad} invalid")
    return lines, bad


def listing(paths: Sequence[str], selection: Selection, fmt: str) -> str:
    """``list``: the scenarios, the spec's ``difficulty:`` label beside the tier measured from the
    bundled models' ladders (runner/core/measured.py), and whether a bench that names no
    scenario runs it (``default``: the default subset of the scenarios listed' folders)."""
    scenarios = selected(paths, selection)
    facts = measured.load()
    everything = scenarios_of(paths, "PATH")
    default = {s.id for s in default_subset(everything, facts)}
    headers = ["id", "difficulty", "tier", "default", "tags", "turns", "title"]
    if fmt == "json":  # typed: no label is null, default a boolean, tags a list
        return json.dumps([dict(zip(headers, [
            s.id, s.difficulty, facts.get(s.id, UNKNOWN).tier.value, s.id in default,
            list(s.tags), s.budget.turns, s.title], strict=True)) for s in scenarios], indent=2)
    rows = [[s.id, s.difficulty or "-", facts.get(s.id, UNKNOWN).tier.value,
             "yes" if s.id in default else "-", ",".join(s.tags) or "-", s.budget.turns, s.title]
            for s in scenarios]
    return render_rows(headers, rows, fmt)
