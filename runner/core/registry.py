"""Named extension points: one kind of thing a user picks by name, and one way to refuse a wrong name.

rootbench has five places where a word the user types picks an implementation:
probe kinds (a spec's ``command:``, ``http:``, ...), action protocols
(``--protocol``), bundled models (``--model``), executors (``--executor``) and
agents (``--agent``, whose installed ones come from an entry-point group).
Each is a :class:`Registry`: a read-only mapping from name to thing that says
what it holds (``what``), which field or flag picks from it (``field``), and
refuses an unknown name in one line of the same shape everywhere, with the
nearest names offered (:func:`suggest`) and the known
ones listed. ``--help`` and the docs list :meth:`Registry.names`, so a new
entry shows up in both; ``tests/unit/test_registry.py`` holds the docs to the
registries.

The registries live beside what they hold (a probe kind in
:mod:`runner.core.probes`, a model in :mod:`runner.backends.llama`, an executor
in :mod:`runner.app.executors`): the layers import only downwards, so there is
no one module that could import them all but the app's
(:mod:`runner.app.extensions`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator, Mapping
from typing import Generic, TypeVar

from runner.core.errors import InvalidInput

T = TypeVar("T")


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


class Registry(Mapping[str, T], Generic[T]):
    """Things of one kind by name, in the order given (the order help and docs list them)."""

    def __init__(self, what: str, field: str, items: Mapping[str, T], *,
                 also: tuple[str, ...] = ()) -> None:
        """``what``: what one entry is ("probe kind"); ``field``: the flag or spec field that
        names one ("--protocol"); ``also``: words the field accepts besides the entries
        (``auto``), listed with them but not entries."""
        self.what = what
        self.field = field
        self._items = dict(items)
        self.also = also

    def __getitem__(self, name: str) -> T:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def names(self) -> tuple[str, ...]:
        """Every word the field accepts: the entries, then the ``also`` words."""
        return (*self._items, *self.also)

    def unknown(self, name: str, *, path: str | None = None, line: int | None = None,
                field: str | None = None, hint: str = "") -> InvalidInput:
        """The one-line refusal of ``name``: ``unknown WHAT 'x' (did you mean 'y'?); known:
        a, b, c`` plus ``hint`` (another way to give one, say)."""
        known = ", ".join(self.names()) or "none"
        return InvalidInput(f"unknown {self.what} {name!r}{suggest(name, self.names())}; known: "
                            f"{known}{hint}", path=path, line=line, field=field or self.field)

    def get_or_refuse(self, name: str, *, hint: str = "") -> T:
        """The entry named ``name``, or :meth:`unknown`'s error raised."""
        if name not in self._items:
            raise self.unknown(name, hint=hint)
        return self._items[name]

    def __repr__(self) -> str:
        return f"Registry({self.what!r}, {list(self._items)!r})"
