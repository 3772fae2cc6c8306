"""What the committed recordings measured of each bundled scenario: its tier and its time.

The default bench's subset (:func:`runner.core.selection.default_subset`), ``--difficulty``,
``list``'s tier column and the "N episodes, about T" line before a bench all need, per
scenario, the tier measured from the bundled models' ladders (:mod:`runner.core.tiers`) and
how long an episode took. Both are facts of ``recordings/``, which only a checkout has, and
measuring them again reads a thousand cassettes (~15 s). So they are kept in one small file
beside the bundled specs, ``specs/measured.json``, which the wheel carries too, made from the
recordings by ``python -m runner.app.suite_facts --write`` and checked against them by a unit
test (``tests/unit/test_default_bench.py``), as the README's results block is.

A scenario the file does not know (one of the user's, or one added since) is
:attr:`~runner.core.outcomes.Tier.UNMEASURED` with no time: nothing is claimed of it. A file
that cannot be read is bad input naming it, never a silent "unmeasured" for the whole suite.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.core.errors import InvalidInput
from runner.core.outcomes import Tier
from runner.core.paths import Bundled, bundled

FILE_NAME = "measured.json"
FORMAT = 1
ORACLE = "oracle"  # the key of the oracle's times (each spec's solution, recordings/oracle)
NOOP = "noop"  # and of the noop agent's (recordings/oracle/noop)


@dataclass(frozen=True)
class Measured:
    """One scenario's facts: its measured tier; per agent (``oracle``, ``noop`` or a bundled
    model's name) the seconds its recorded episode at hint level 0 took; per bundled model the
    seconds its whole recorded hint ladder took (level 0 up to the first pass or the last)."""

    tier: Tier = Tier.UNMEASURED
    seconds: Mapping[str, float] = field(default_factory=dict)
    ladder_seconds: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"tier": self.tier.value, "seconds": dict(sorted(self.seconds.items())),
                "ladder_seconds": dict(sorted(self.ladder_seconds.items()))}


UNKNOWN = Measured()


def default_path() -> Path:
    """The bundled file (the checkout's ``specs/measured.json``, or the wheel's copy)."""
    return bundled(Bundled.SPECS) / FILE_NAME


def _seconds(value: object, where: str, path: Path) -> dict[str, float]:
    if not isinstance(value, dict):
        raise InvalidInput("must be a mapping of agent to seconds", path=str(path), field=where)
    out: dict[str, float] = {}
    for agent, secs in value.items():
        if isinstance(secs, bool) or not isinstance(secs, int | float) \
                or not math.isfinite(secs) or secs < 0:
            raise InvalidInput(f"must be seconds (a number from 0 up), not {secs!r}",
                               path=str(path), field=f"{where}.{agent}")
        out[str(agent)] = float(secs)
    return out


def parse(data: object, path: Path) -> dict[str, Measured]:
    """The file's content as facts by scenario id; anything malformed is InvalidInput naming
    the field."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InvalidInput(f"not a measured-scenarios file of format {FORMAT}", path=str(path),
                           field="format")
    scenarios = data.get("scenarios")
    if not isinstance(scenarios, dict):
        raise InvalidInput("must be a mapping of scenario id to its facts", path=str(path),
                           field="scenarios")
    out: dict[str, Measured] = {}
    for sid, facts in scenarios.items():
        where = f"scenarios.{sid}"
        if not isinstance(facts, dict):
            raise InvalidInput("must be a mapping", path=str(path), field=where)
        try:
            tier = Tier(facts.get("tier", Tier.UNMEASURED.value))
        except ValueError:
            raise InvalidInput(f"not a tier ({', '.join(t.value for t in Tier)}): "
                               f"{facts.get('tier')!r}", path=str(path),
                               field=f"{where}.tier") from None
        out[str(sid)] = Measured(tier, _seconds(facts.get("seconds", {}), f"{where}.seconds", path),
                                 _seconds(facts.get("ladder_seconds", {}),
                                          f"{where}.ladder_seconds", path))
    return out


def load(path: Path | None = None) -> dict[str, Measured]:
    """The facts of every scenario the file knows (default: the bundled file; none there, as in
    a checkout that lost it, is an empty mapping: every scenario unmeasured)."""
    path = path or default_path()
    if path == default_path():
        return dict(_load_default())
    return _read(path)


@functools.lru_cache(maxsize=1)
def _load_default() -> dict[str, Measured]:
    path = default_path()
    return _read(path) if path.is_file() else {}


def _read(path: Path) -> dict[str, Measured]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"cannot read: {exc.strerror or exc}", path=str(path)) from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InvalidInput(f"not JSON: {exc}", path=str(path)) from None
    return parse(data, path)


def tiers(facts: Mapping[str, Measured]) -> dict[str, Tier]:
    """The measured tier of each scenario the facts know."""
    return {sid: m.tier for sid, m in facts.items()}


def render(facts: Mapping[str, Measured], about: str) -> str:
    """The file's text: sorted by id, one scenario a line, so a change reads as a small diff."""
    lines = [f'  "about": {json.dumps(about)},', f'  "format": {FORMAT},', '  "scenarios": {']
    items = sorted(facts.items())
    for i, (sid, m) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        lines.append(f"    {json.dumps(sid)}: {json.dumps(m.to_dict())}{comma}")
    return "{\n" + "\n".join(lines) + "\n  }\n}\n"
