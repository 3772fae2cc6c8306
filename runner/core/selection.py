"""Which scenarios a command runs: ``--only`` ids or globs, ``--tags``, ``--limit``.

Kept apart from :mod:`runner.core.spec` (which reads files) because choosing
is about ids, never paths: a scenario id is ``[a-z0-9][a-z0-9-]*`` (the
schema's ``name``), so a word with a ``/`` or a ``.`` in it is a file, and
``--only`` refuses it in one line that names its id and the way to give a
file (as a path argument, which is where files go). Keeping the two apart
means ``--only specs/x.yaml`` can never silently select nothing, or
something else.

The filters compose in a fixed order: the scenarios the paths hold (in
their order), then ``--only`` (in the order the patterns are given, each
scenario once), then ``--tags`` (a scenario with any of the tags), then the
first ``--limit`` of what is left. A pattern or tag that matches nothing is
bad input, with the nearest known names offered, since a typo that silently
selected fewer scenarios would be a different benchmark.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from runner.core.errors import InvalidInput
from runner.core.spec import Scenario

GLOB_CHARS = frozenset("*?[")
SPEC_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class Selection:
    """What the user asked for; empty fields select everything."""

    only: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    limit: int | None = None

    @property
    def narrows(self) -> bool:
        """Whether anything is asked beyond "every scenario of the paths"."""
        return bool(self.only or self.tags or self.limit is not None)


def nearest(word: str, known: Iterable[str], n: int = 3) -> list[str]:
    """The known words nearest a mistyped one, best first (the one measure of "near" for ids,
    commands, flags and choices alike)."""
    return difflib.get_close_matches(word, list(known), n=n, cutoff=0.6)


def suggest(word: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the nearest known word, or nothing if none is near."""
    near = nearest(word, known)
    if not near:
        return ""
    return " (did you mean " + " or ".join(repr(n) for n in near) + "?)"


def split_words(values: Sequence[str] | None) -> list[str]:
    """Flag values as words: ``--tags a,b --tags c`` and ``--tags a b`` are the same."""
    return [w.strip() for v in values or () for w in v.split(",") if w.strip()]


def looks_like_path(word: str) -> bool:
    """Whether ``word`` names a file rather than an id: an id has no ``/`` and no ``.``
    (``[a-z0-9][a-z0-9-]*``), so a spec's name or anything that exists on disk is a path."""
    return "/" in word or word.endswith(SPEC_SUFFIXES) or Path(word).exists()


def _refuse_path(word: str, scenarios: Sequence[Scenario]) -> InvalidInput:
    """The one line for a file given where an id is expected, naming its id when it is known."""
    resolved = Path(word).resolve()
    owner = next((s.id for s in scenarios if s.path and Path(s.path).resolve() == resolved), None)
    if owner is None:
        stem = Path(word).stem
        owner = stem if any(s.id == stem for s in scenarios) else None
    its = f"its id is {owner!r}; " if owner else ""
    return InvalidInput(f"{word!r} is a path, not a scenario id ({its}spec files and folders "
                        "are path arguments: give them before --only, or without it)",
                        field="--only")


def pick_ids(scenarios: Sequence[Scenario], patterns: Sequence[str]) -> list[Scenario]:
    """The scenarios named by ``patterns`` (ids or shell-style globs), in the order asked.

    An id that is unknown, or a glob that matches nothing, is :class:`InvalidInput`
    naming the nearest ids; a path is refused (see :func:`_refuse_path`).
    """
    by_id = {s.id: s for s in scenarios}
    out: dict[str, Scenario] = {}
    for word in patterns:
        if looks_like_path(word):
            raise _refuse_path(word, scenarios)
        if GLOB_CHARS & set(word):
            matched = [s for s in scenarios if fnmatch.fnmatchcase(s.id, word)]
            if not matched:
                raise InvalidInput(f"no scenario id matches {word!r}", field="--only")
        elif word in by_id:
            matched = [by_id[word]]
        else:
            raise InvalidInput(f"no scenario with id {word!r}{suggest(word, by_id)}",
                               field="--only")
        for s in matched:
            out.setdefault(s.id, s)
    return list(out.values())


def pick_tags(scenarios: Sequence[Scenario], tags: Sequence[str],
              known: Iterable[str] | None = None) -> list[Scenario]:
    """The scenarios with any of ``tags``; a tag not in ``known`` (default: the tags of
    ``scenarios``) is bad input."""
    known = set(known) if known is not None else {t for s in scenarios for t in s.tags}
    for tag in tags:
        if tag not in known:
            hint = suggest(tag, known) or f" (known: {', '.join(sorted(known)) or 'none'})"
            raise InvalidInput(f"no scenario has the tag {tag!r}{hint}", field="--tags")
    wanted = set(tags)
    return [s for s in scenarios if wanted & set(s.tags)]


def choose(scenarios: Sequence[Scenario], selection: Selection) -> list[Scenario]:
    """``scenarios`` narrowed by ``selection`` (see the module's docstring for the order)."""
    chosen = list(scenarios)
    if selection.only:
        chosen = pick_ids(chosen, selection.only)
    if selection.tags:
        chosen = pick_tags(chosen, selection.tags, {t for s in scenarios for t in s.tags})
    if selection.limit is not None:
        if selection.limit < 1:
            raise InvalidInput(f"must be a number of scenarios from 1 up, not {selection.limit}",
                               field="--limit")
        chosen = chosen[:selection.limit]
    if not chosen:
        raise InvalidInput("no scenario has all of: the ids and the tags asked (each matches "
                           "some, but not the same ones)", field="--tags")
    return chosen
