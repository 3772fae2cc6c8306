"""argparse as the command line needs it: one-line errors with "did you mean", defaults in help,
and the flag values argparse cannot check (ranges, ``--jobs N|auto``) refused in one line.

Python 3.11's argparse prints the whole usage (18 lines for ``bench``) above
every error, and has no ``suggest_on_error`` (3.14): a mistyped command or
flag is answered with a usage that does not say what was meant. This small
subclass keeps argparse (parsing, help, types) and changes only what is
said: the error is one line, ``PROG: error: MESSAGE``, exit 2, with the
nearest command, flag or choice offered (:func:`runner.core.registry.nearest`)
and where the full usage is (``PROG --help``).

:func:`check_range` and :func:`parse_jobs` are the checks the commands and
their set-up (runner/app/bench_setup.py, runner/app/verify_run.py) share, so
one flag is refused in the same words wherever it is read.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from runner.app.executors import MAX_JOBS
from runner.core.errors import InvalidInput
from runner.core.registry import nearest

_FLAG_OWNER = "_rootbench_flag_owner"  # namespace attribute: the (sub)parser left with extras
_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)$")
_UNRECOGNIZED = "unrecognized arguments: "


class UsageError(SystemExit):
    """argparse's exit 2 for bad arguments, with the one line that was printed."""

    def __init__(self, line: str) -> None:
        super().__init__(2)
        self.line = line


class DefaultsFormatter(argparse.HelpFormatter):
    """``(default: X)`` after an option's help when it has a default worth saying.

    Unlike :class:`argparse.ArgumentDefaultsHelpFormatter` it leaves out
    ``None`` and ``False`` (flags that are off, values computed later) and any
    help that already says its default in its own words.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (not action.option_strings or "default" in text or default is None
                or default is False or default is argparse.SUPPRESS
                or isinstance(default, list | tuple)):
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose errors are one line and suggest a fix.

    Sub-commands made with ``add_subparsers().add_parser`` are of this class
    too (argparse makes them with ``type(self)``), so each reports its own
    errors under its own prog (``rootbench bench: error: ...``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None,
                         ) -> tuple[argparse.Namespace, list[str]]:
        ns, extras = super().parse_known_args(args, namespace)
        if extras and not hasattr(ns, _FLAG_OWNER):
            # The innermost parser returns first: it is the one whose flags a typo was near.
            setattr(ns, _FLAG_OWNER, self)
        return ns, extras

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        ns, extras = self.parse_known_args(args, namespace)
        owner = getattr(ns, _FLAG_OWNER, self)
        if hasattr(ns, _FLAG_OWNER):
            delattr(ns, _FLAG_OWNER)
        if extras:
            misplaced = [w for w in extras if owner is not self and w in self._flags()]
            if misplaced:  # `rootbench bench -q`: a global option after the command
                owner.error(f"{misplaced[0]} is an option of {self.prog} itself: give it before "
                            f"the command ({self.prog} {misplaced[0]} ...)")
            owner.error(_UNRECOGNIZED + " ".join(extras))
        return ns

    def _flags(self) -> list[str]:
        """Every option string this parser knows (``--model``, ``-q``, ...)."""
        return [o for action in self._actions for o in action.option_strings]

    def explain(self, message: str) -> str:
        """``message`` with the nearest command, flag or choice added, when one is near."""
        if message.startswith(_UNRECOGNIZED):
            words = []
            for word in message[len(_UNRECOGNIZED):].split():
                near = _near_flags(word, self._flags()) if word.startswith("-") else []
                words.append(f"{word} (did you mean {' or '.join(near)}?)" if near else word)
            return _UNRECOGNIZED + " ".join(words)
        found = _CHOICE.search(message)
        if found:
            near = nearest(found.group(1), re.findall(r"'([^']*)'", found.group(2)), n=2)
            return message + (f"; did you mean {' or '.join(map(repr, near))}?" if near else "")
        return message

    def error(self, message: str) -> NoReturn:
        """One line on stderr, ``PROG: error: MESSAGE (see PROG --help)``, and exit 2
        (:class:`UsageError`, which carries the line for a ``--format json`` document)."""
        line = f"{self.prog}: error: {self.explain(message)} (see {self.prog} --help)"
        self._print_message(line + "\n", sys.stderr)
        raise UsageError(line)


def _near_flags(word: str, flags: list[str]) -> list[str]:
    """The known flags nearest a mistyped one (its ``=value`` left out)."""
    return nearest(word.split("=", 1)[0], flags, n=2)


def check_range(value: float, flag: str, low: int, high: int) -> None:
    """A number flag from ``low`` to ``high`` (NaN and infinity refused), else bad input."""
    if not math.isfinite(value) or not low <= value <= high:
        raise InvalidInput(f"must be a number from {low} to {high}, not {value!r}", field=flag)


def parse_jobs(value: str | None, flag: str = "--jobs") -> int | None:
    """``--jobs``: a number of episodes at once, or None for ``auto`` (sized later, said aloud)."""
    if value is None:
        return 1
    if value.strip().lower() == "auto":
        return None
    try:
        jobs = int(value)
    except ValueError:
        raise InvalidInput(f"must be a number from 1 to {MAX_JOBS} or auto, not {value!r}",
                           field=flag) from None
    check_range(jobs, flag, 1, MAX_JOBS)
    return jobs
