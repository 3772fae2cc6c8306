"""``specs/measured.json`` made again from the committed recordings (no VM, no model).

``python -m runner.app.suite_facts`` prints the file; ``--write`` writes it where the bundled
specs are, ``--check`` exits 1 (one line) when the committed file is not what the recordings
give. What it holds and why it is a file: :mod:`runner.core.measured`. The tiers are the ones
``rootbench results`` measures (:func:`runner.app.results.gather`, the rule of
docs/validity.md); the times are the ``seconds`` of each committed episode's verdict line:
the oracle's and the noop agent's from ``recordings/oracle``, each bundled model's first try
(round 0, hint level 0) and whole hint ladder from its folder under ``recordings/live``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from runner.app import results
from runner.app.runs import load_episodes
from runner.core import measured
from runner.core.episode import Episode
from runner.core.errors import InvalidInput
from runner.core.paths import default_spec_dirs
from runner.core.text import printable

ORACLE_DIR = Path("recordings/oracle")
ABOUT = ("Made by `python -m runner.app.suite_facts --write` from the committed recordings "
         "(recordings/live/*/, recordings/oracle/) and specs/: each scenario's measured tier and "
         "its episodes' recorded seconds. tests/unit/test_default_bench.py checks it against "
         "them. Do not edit it.")


def _first_try(episodes: Sequence[Episode]) -> dict[tuple[str, str], float]:
    """Per (scenario, model) the seconds of round 0 at hint level 0."""
    return {(e.scenario, e.model): round(e.seconds, 1) for e in episodes
            if e.round == 0 and e.hint_level == 0}


def _ladders(episodes: Sequence[Episode]) -> dict[tuple[str, str], float]:
    """Per (scenario, model) the seconds of round 0's whole ladder (every level it ran)."""
    out: dict[tuple[str, str], float] = {}
    for e in episodes:
        if e.round == 0:
            key = (e.scenario, e.model)
            out[key] = round(out.get(key, 0.0) + e.seconds, 1)
    return out


def gather(live: Sequence[Path], oracle: Path, specs: Sequence[Path]) -> dict[str, measured.Measured]:
    """Every spec's facts from the recordings; a spec with none is in the file all the same
    (unmeasured, no time), so the file lists the suite."""
    found = results.gather(live, specs)
    model_eps = [ep for run in found.runs for ep in run.episodes if ep.model in found.models]
    first, ladder = _first_try(model_eps), _ladders(model_eps)
    agents = {measured.ORACLE: oracle, measured.NOOP: oracle / "noop"}
    scripted = {name: {e.scenario: round(e.seconds, 1) for e in load_episodes(folder)[1]
                       if e.round == 0 and e.hint_level == 0}
                for name, folder in agents.items() if folder.is_dir()}
    out: dict[str, measured.Measured] = {}
    for t in found.tiers:
        sid = t.scenario.id
        seconds = {m: first[(sid, m)] for m in found.models if (sid, m) in first}
        seconds.update({a: by_id[sid] for a, by_id in scripted.items() if sid in by_id})
        out[sid] = measured.Measured(t.tier, seconds,
                                     {m: ladder[(sid, m)] for m in found.models
                                      if (sid, m) in ladder})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runner.app.suite_facts", description=__doc__)
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--write", action="store_true", help="write specs/measured.json")
    what.add_argument("--check", action="store_true",
                      help="exit 1 when specs/measured.json is not what the recordings give")
    args = ap.parse_args(argv)
    try:
        text = measured.render(gather(results.live_dirs([]), ORACLE_DIR, default_spec_dirs()),
                               ABOUT)
    except InvalidInput as exc:
        print(printable(f"suite_facts: {exc}"), file=sys.stderr)
        return 2
    target = measured.default_path()
    if args.write:
        target.write_text(text, encoding="utf-8")
        print(f"{target}: written")
        return 0
    if args.check:
        same = target.is_file() and target.read_text(encoding="utf-8") == text
        if not same:
            print(f"{target}: not what the recordings give (python -m runner.app.suite_facts "
                  "--write makes it again)", file=sys.stderr)
        return 0 if same else 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
