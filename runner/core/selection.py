"""Which scenarios a command runs: the default bench's subset, ``--only`` ids or globs,
``--tags``, ``--difficulty``, ``--exclude``, ``--limit``, and the order a bench runs them in.

Kept apart from :mod:`runner.core.spec` (which reads files) because choosing
is about ids, never paths: a scenario id is ``[a-z0-9][a-z0-9-]*`` (the
schema's ``name``), so a word with a ``/`` or a ``.`` in it is a file, and
``--only`` refuses it in one line that names its id and the way to give a
file (as a path argument, which is where files go). Keeping the two apart
means ``--only specs/x.yaml`` can never silently select nothing, or
something else.

The filters compose in a fixed order: the scenarios the paths hold (in
their order); for a bench that names none (no path, no ``--only``, ``--tags``
or ``--difficulty``, no ``--all``) the default subset of them
(:func:`default_subset`); then ``--only`` (in the order the patterns are
given, each scenario once), then ``--tags`` (a scenario with any of the
tags), then ``--difficulty`` (any of the measured tiers), then ``--exclude``;
for a bench whose order nobody gave (no path, no ``--only``) the order that
needs the fewest builds first (:func:`build_order`); then the first
``--limit`` of what is left. A pattern, tag or tier that matches nothing is
bad input, with the nearest known names offered, since a typo that silently
selected fewer scenarios would be a different benchmark.

What is measured of a scenario (its tier, its recorded time) comes from
:mod:`runner.core.measured`, handed in: nothing here reads a file.
"""

from __future__ import annotations

import fnmatch
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from runner.core.errors import InvalidInput
from runner.core.measured import ORACLE, UNKNOWN, Measured
from runner.core.outcomes import Tier
from runner.core.registry import suggest
from runner.core.spec import Scenario

GLOB_CHARS = frozenset("*?[")
SPEC_SUFFIXES = (".yaml", ".yml")
AREA_MIN = 2  # scenarios that share a first tag before it is an area of the default subset


@dataclass(frozen=True)
class Selection:
    """What the user asked for; empty fields select everything.

    ``default``: a bench that names no scenario runs the default subset (:func:`default_subset`)
    rather than every scenario of the paths. ``build_order``: nobody gave an order, so the
    scenarios run in :func:`build_order`.
    """

    only: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    limit: int | None = None
    difficulty: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    default: bool = False
    build_order: bool = False

    @property
    def names(self) -> bool:
        """Whether the scenarios are named (by id, tag or tier): the default subset then yields."""
        return bool(self.only or self.tags or self.difficulty)

    @property
    def narrows(self) -> bool:
        """Whether anything is asked beyond "every scenario of the paths"."""
        return bool(self.names or self.exclude or self.limit is not None)


EMPTY = "names nothing (an empty value would filter nothing: give a word, or leave the flag out)"


def split_words(values: Sequence[str] | None, flag: str) -> list[str]:
    """Flag values as words: ``--tags a,b --tags c`` and ``--tags a b`` are the same.

    A flag given with no word in it (``--tags ''``, ``--tags ,``) is bad input naming
    ``flag``: taken as no filter it would silently select every scenario, the opposite of
    what narrowing asked for.
    """
    words = [w.strip() for v in values or () for w in v.split(",") if w.strip()]
    if values is not None and not words:
        raise InvalidInput(EMPTY, field=flag)
    return words


def looks_like_path(word: str) -> bool:
    """Whether ``word`` names a file rather than an id: an id has no ``/`` and no ``.``
    (``[a-z0-9][a-z0-9-]*``), so a spec's name or anything that exists on disk is a path."""
    return "/" in word or word.endswith(SPEC_SUFFIXES) or Path(word).exists()


def _refuse_path(word: str, scenarios: Sequence[Scenario], field: str = "--only") -> InvalidInput:
    """The one line for a file given where an id is expected, naming its id when it is known."""
    resolved = Path(word).resolve()
    owner = next((s.id for s in scenarios if s.path and Path(s.path).resolve() == resolved), None)
    if owner is None:
        stem = Path(word).stem
        owner = stem if any(s.id == stem for s in scenarios) else None
    its = f"its id is {owner!r}; " if owner else ""
    return InvalidInput(f"{word!r} is a path, not a scenario id ({its}spec files and folders "
                        f"are path arguments: give them before {field}, or without it)",
                        field=field)


def pick_ids(scenarios: Sequence[Scenario], patterns: Sequence[str],
             field: str = "--only") -> list[Scenario]:
    """The scenarios named by ``patterns`` (ids or shell-style globs), in the order asked.

    An id that is unknown, or a glob that matches nothing, is :class:`InvalidInput`
    naming the nearest ids and ``field``; a path is refused (see :func:`_refuse_path`).
    """
    by_id = {s.id: s for s in scenarios}
    out: dict[str, Scenario] = {}
    for word in patterns:
        if not word.strip():  # not a path (Path("") is the working directory): nothing at all
            raise InvalidInput(EMPTY, field=field)
        if looks_like_path(word):
            raise _refuse_path(word, scenarios, field)
        if GLOB_CHARS & set(word):
            matched = [s for s in scenarios if fnmatch.fnmatchcase(s.id, word)]
            if not matched:
                raise InvalidInput(f"no scenario id matches {word!r}", field=field)
        elif word in by_id:
            matched = [by_id[word]]
        else:
            raise InvalidInput(f"no scenario with id {word!r}{suggest(word, by_id)}",
                               field=field)
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


def pick_tiers(scenarios: Sequence[Scenario], words: Sequence[str],
               measured: Mapping[str, Measured]) -> list[Scenario]:
    """``--difficulty``: the scenarios whose *measured* tier (not the spec's ``difficulty:``
    label, which disagrees with measurement on most of the suite) is any of ``words``."""
    known = [t.value for t in Tier]
    for word in words:
        if word not in known:
            raise InvalidInput(f"no tier {word!r}{suggest(word, known)} (the measured tiers: "
                               f"{', '.join(known)})", field="--difficulty")
    wanted = {Tier(w) for w in words}
    return [s for s in scenarios if measured.get(s.id, UNKNOWN).tier in wanted]


def drop(chosen: Sequence[Scenario], patterns: Sequence[str],
         known: Sequence[Scenario]) -> list[Scenario]:
    """``--exclude``: ``chosen`` without the scenarios ``patterns`` name (ids or globs). Each
    pattern must name a scenario of ``known`` (all the paths hold), so a typo is refused as for
    ``--only``; one that names a scenario not chosen anyway is fine."""
    gone = {s.id for s in pick_ids(known, patterns, field="--exclude")}
    return [s for s in chosen if s.id not in gone]


def _oracle_seconds(s: Scenario, measured: Mapping[str, Measured]) -> float:
    return measured.get(s.id, UNKNOWN).seconds.get(ORACLE, math.inf)


def main_image(scenarios: Sequence[Scenario]) -> str | None:
    """The image most of ``scenarios`` run on (one machine each; ties: the first name), which
    is the one a fresh machine should build first: debian-12-nginx for the bundled suite."""
    counts = Counter(s.image for s in scenarios if not s.machines)
    if not counts:
        return None
    return min(counts, key=lambda image: (-counts[image], image))


def area(s: Scenario) -> str | None:
    """A scenario's area: its first tag (the specs list the part of the system first), if any."""
    return s.tags[0] if s.tags else None


def default_subset(scenarios: Sequence[Scenario], measured: Mapping[str, Measured]) -> list[Scenario]:
    """The default bench: one scenario per area and measured tier, the cheapest to run.

    The rule (docs/running.md, "The default bench"):

    1. an *area* is a first tag that at least :data:`AREA_MIN` of the scenarios share;
    2. only scenarios on one machine are candidates (a scenario on two machines restores two
       VMs and needs another snapshot variant built);
    3. the candidates are taken in this order: those on the :func:`main_image` first, then by
       the time their oracle's recorded episode took (the scenario's own cost: its setup, its
       waits and re-checks; a model's time would make the subset depend on that model), then
       by id;
    4. a candidate is picked when its (area, measured tier) pair is not yet covered.

    So every area shows each tier it has, once, on the cheapest scenario that shows it. The
    subset is returned in the order of ``scenarios``. A scenario with no recorded time comes
    after those with one. An unmeasured scenario is a tier of its own only in an area with no
    measured one: a new scenario of a new kind still gets a place, while an area whose
    measured scenarios already show its tiers is not made longer by the ones the bundled
    models have not run yet (runs of an older version of a spec do not measure it).
    """
    counts = Counter(a for s in scenarios if (a := area(s)) is not None)
    areas = {a for a, n in counts.items() if n >= AREA_MIN}
    image = main_image(scenarios)
    candidates = sorted((s for s in scenarios if not s.machines and area(s) in areas),
                        key=lambda s: (s.image != image, _oracle_seconds(s, measured), s.id))
    measured_areas = {area(s) for s in candidates
                      if measured.get(s.id, UNKNOWN).tier is not Tier.UNMEASURED}
    covered: set[tuple[str | None, Tier]] = set()
    picked: set[str] = set()
    for s in candidates:
        pair = (area(s), measured.get(s.id, UNKNOWN).tier)
        if pair[1] is Tier.UNMEASURED and pair[0] in measured_areas:
            continue
        if pair not in covered:
            covered.add(pair)
            picked.add(s.id)
    return [s for s in scenarios if s.id in picked]


def build_order(scenarios: Sequence[Scenario]) -> list[Scenario]:
    """``scenarios`` in the order that needs the fewest builds before each next episode.

    A scenario needs its image and that image's golden snapshot (a multi-machine one, each of
    its images' snapshot variant with a private-network NIC). Scenarios needing the same builds
    run together, the groups in this order: one machine before several; then the group of
    more scenarios first (the :func:`main_image` leads, so on a fresh machine the first verdict
    waits for one image and one snapshot only); then by image name. Within a group the given
    order is kept.
    """
    def group(s: Scenario) -> tuple[bool, tuple[str, ...]]:
        if s.machines:
            return True, tuple(sorted({m.image for m in s.machines}))
        return False, (s.image,)

    sizes = Counter(group(s) for s in scenarios)
    ranked = sorted(sizes, key=lambda g: (g[0], -sizes[g], g[1]))
    rank = {g: i for i, g in enumerate(ranked)}
    return sorted(scenarios, key=lambda s: rank[group(s)])  # stable: the given order within


def choose(scenarios: Sequence[Scenario], selection: Selection,
           measured: Mapping[str, Measured] | None = None) -> list[Scenario]:
    """``scenarios`` narrowed by ``selection`` (see the module's docstring for the order);
    ``measured`` (by scenario id) gives the tiers and times the default subset and
    ``--difficulty`` need (a scenario it lacks is unmeasured)."""
    measured = measured or {}
    chosen = list(scenarios)
    if selection.default and not selection.names:
        chosen = default_subset(chosen, measured)
    if selection.only:
        chosen = pick_ids(chosen, selection.only)
    if selection.tags:
        chosen = pick_tags(chosen, selection.tags, {t for s in scenarios for t in s.tags})
    if selection.difficulty:
        chosen = pick_tiers(chosen, selection.difficulty, measured)
    if selection.exclude:
        chosen = drop(chosen, selection.exclude, scenarios)
    if selection.build_order and not selection.only:
        chosen = build_order(chosen)
    if selection.limit is not None:
        if selection.limit < 1:
            raise InvalidInput(f"must be a number of scenarios from 1 up, not {selection.limit}",
                               field="--limit")
        chosen = chosen[:selection.limit]
    if not chosen:
        asked = [flag for flag, given in (("--only", selection.only), ("--tags", selection.tags),
                                          ("--difficulty", selection.difficulty),
                                          ("--exclude", selection.exclude)) if given]
        raise InvalidInput(f"no scenario has all of: {', '.join(asked) or 'the selection'} "
                           "(each matches some, but not the same ones)",
                           field=asked[-1] if asked else "--only")
    return chosen
