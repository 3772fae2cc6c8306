"""The ``rootbench`` command line: argparse in, exit codes out.

Exit codes: 0 success (a bench or run whose model failed its scenarios has
succeeded: the failures are its results); 1 the thing asked for did not hold
(an episode ended ``infra-error``, a replay differed, verify found an invalid
scenario, doctor found a problem); 2 invalid input (one line naming the file and field, never a
traceback); 130/143 interrupted by SIGINT/SIGTERM after tearing everything down.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import json
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from runner.app import (
    atif,
    bench_setup,
    cache,
    doctor,
    logs,
    mcp_http,
    mcp_server,
    rejudge,
    results,
    runs_index,
    runs_report,
    scaffold,
    verify_run,
)
from runner.app.bench import resume_scenarios
from runner.app.bench_setup import BenchFlags
from runner.app.cliargs import build_parser
from runner.app.cliparse import UsageError, check_range, parse_jobs
from runner.app.compare import compare_runs, render_comparisons
from runner.app.episodes import RunOptions
from runner.app.executors import auto_jobs
from runner.app.outputs import check_file_target
from runner.app.perf import measure, render
from runner.app.replay import replay_table
from runner.app.report import pass_at, render_rows, render_table
from runner.app.scenarios import listing, one_spec, selected, specs_dir, validation
from runner.app.signals import Interrupted
from runner.backends.cachedir import cache_root
from runner.backends.images import build_image, list_images
from runner.backends.llama import DEFAULT_MODEL, ensure_llama_server, fetch_model
from runner.core.errors import InfraError, InvalidInput, RootbenchError
from runner.core.outcomes import Verdict
from runner.core.rules import CURRENT_RULES
from runner.core.selection import Selection, split_words
from runner.core.spec import Scenario
from runner.core.text import printable

log = logging.getLogger("rootbench.cli")


def _out(text: str) -> None:
    """The command's answer, on stdout (progress goes to stderr through logging).

    Everything a command prints passes here or through :func:`_err`, the one
    place terminal output is cleaned: spec titles, guest output and model text
    are hostile and may hold escape sequences or lone surrogates.
    """
    print(printable(text), flush=True)


def _err(text: str) -> None:
    """One line for the user on stderr, cleaned like :func:`_out`."""
    print(printable(text), file=sys.stderr, flush=True)


# --- commands -----------------------------------------------------------------------------------

def _selection(args: argparse.Namespace) -> Selection:
    """The scenario selection flags, as asked (checked when applied: :func:`choose`). A bench
    that names no scenario runs the default subset, unless --all; one whose order nobody gave
    (no path, no --only) runs in the order that needs the fewest builds."""
    bench = args.command == "bench"
    return Selection(only=tuple(args.only or ()), tags=tuple(split_words(args.tags, "--tags")),
                     limit=args.limit,
                     difficulty=tuple(split_words(args.difficulty, "--difficulty")),
                     exclude=tuple(split_words(args.exclude, "--exclude")),
                     default=bench and not args.all and not args.paths,
                     build_order=bench and not args.paths)


def cmd_validate(args: argparse.Namespace) -> int:
    lines, bad = validation(args.paths)
    for line in lines:
        _out(line)
    return 2 if bad else 0


def cmd_new(args: argparse.Namespace) -> int:
    """A commented skeleton of scenario ID on IMAGE (runner/app/scaffold.py), and what next."""
    path = scaffold.write_new(args.id, args.image, Path(args.out) if args.out else None)
    _out(f"{path}: a skeleton of scenario {args.id} on {args.image} (a working example: cron "
         f"stopped); edit it, then `rootbench validate {path}` and `rootbench verify {path}`")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    _out(listing(args.paths, _selection(args), args.format))
    return 0


def _bench_flags(args: argparse.Namespace) -> BenchFlags:
    """The ``run`` and ``bench`` flags the bench's set-up reads, as given."""
    return BenchFlags(**{f.name: getattr(args, f.name) for f in dataclasses.fields(BenchFlags)})


def _bench(args: argparse.Namespace, flags: BenchFlags, scenarios: list[Scenario],
           resume: Path | None) -> int:
    """Run the bench; its table (and statistics with rounds or a ladder) is the answer, exit 1
    when an episode ended ``infra-error``."""
    episodes, run_dir = bench_setup.run(flags, scenarios, resume)
    _out(render_table(episodes, args.format, ladder=args.ladder))
    if args.format != "json" and (args.repeat > 1 or args.ladder):
        _out("")
        _out(pass_at(episodes, args.format))
    bench_setup.tell_where(run_dir)
    return 1 if any(e.verdict is Verdict.INFRA_ERROR for e in episodes) else 0


def cmd_run(args: argparse.Namespace) -> int:
    args.retry_infra = 0  # `run` has no --retry-infra; one scenario, one try
    flags = _bench_flags(args)
    bench_setup.agent_choices(flags)  # flags first: a bad flag is reported before the spec is read
    return _bench(args, flags, [one_spec(args.spec)], None)


def cmd_bench(args: argparse.Namespace) -> int:
    flags = _bench_flags(args)
    bench_setup.agent_choices(flags)  # flags first
    resume = bench_setup.resumed(args.resume)
    asked: list[Scenario] | None = None
    if resume is None or args.paths or _selection(args).narrows:
        asked = selected(args.paths, _selection(args))
    # A resume finishes the run's own scenarios (a different selection is refused).
    chosen = resume_scenarios(resume, asked) if resume is not None else asked
    assert chosen is not None
    return _bench(args, flags, chosen, resume)


def cmd_mcp(args: argparse.Namespace) -> int:
    """One scenario served to an MCP client; exit 0 once judged pass or fail, 1 otherwise, and
    130/143/129 once judged after SIGINT/SIGTERM/SIGHUP stopped the serving."""
    mcp_server.check_available()
    scenario = one_spec(args.spec)
    check_range(args.hints, "--hints", 0, 100)
    level = min(args.hints, len(scenario.hints))  # capped at the hints it has, as in a bench
    if not args.http and (args.http_remote or args.http_token_file):
        raise InvalidInput("needs --http", field="--http-remote" if args.http_remote
                           else "--http-token-file")
    address = mcp_http.parse_http(args.http, remote=args.http_remote) if args.http else None
    cache_root()
    opts = RunOptions(accel=args.accel, transport=args.transport, protocol="tools",
                      hints=level, track_fix=args.track_fix)
    return mcp_server.run_server(
        scenario, opts, Path(args.runs_dir), address=address, hint_level=level, say=_err,
        token_file=Path(args.http_token_file) if args.http_token_file else None,
        command=[sys.executable, "-m", "runner", *args.argv])


def cmd_replay(args: argparse.Namespace) -> int:
    """Replay each cassette and table the outcomes (:func:`~runner.app.replay.replay_table`)."""
    if not args.verbose:  # a replay re-tells every command of every cassette: only with -v
        logging.getLogger("rootbench.agent").setLevel(logging.WARNING)
    specs = [specs_dir(d) for d in args.specs] if args.specs else None
    return replay_table(args.paths, fmt=args.format, offline=args.offline, lenient=args.lenient,
                        allow_spec_changes=args.allow_spec_changes, accel=args.accel,
                        transport=args.transport, specs=specs, one_process=args.verbose,
                        out=_out, err=_err)


def cmd_verify(args: argparse.Namespace) -> int:
    jobs = parse_jobs(args.jobs)
    verify_run.check_numbers(args.repeat, args.sample, args.max_live, args.oracle == "changed")
    chosen = selected(args.paths, _selection(args))
    recorded = verify_run.recorded_dir(args.recorded_from, "recorded" in (
        args.shortcuts, args.noop, args.alternatives) or args.oracle == "changed")
    done = verify_run.run_verify(chosen, verify_run.VerifyOptions(
        jobs=jobs, repeat=args.repeat, accel=args.accel, transport=args.transport,
        record_to=Path(args.record_to) if args.record_to else None, recorded=recorded,
        noop_recorded=args.noop == "recorded", shortcuts_recorded=args.shortcuts == "recorded",
        alternatives_recorded=args.alternatives == "recorded", runs_dir=Path(args.runs_dir),
        oracle_changed=args.oracle == "changed", sample=args.sample, max_live=args.max_live))
    for text in verify_run.answer(done.results, args.format):
        _out(text)
    return 1 if verify_run.invalid(done.results) else 0


def cmd_perf(args: argparse.Namespace) -> int:
    if args.json:  # the old spelling: every other command says --format json
        _err("rootbench perf: --json is deprecated; use --format json")
        args.format = "json"
    figures = measure(vm=not args.no_vm, model=not args.no_model, accel=args.accel,
                      model_name=args.model, scale=not args.no_scale, verify=not args.no_verify,
                      harness=not args.model_only)
    _out(json.dumps(figures, sort_keys=True) if args.format == "json" else render(figures))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Tables of run directories, or with --html one HTML file of runs and loose cassettes."""
    paths = [Path(p) for p in args.paths]
    runs_report.check_paths(paths)  # every path, before anything is read or rendered
    if not args.html:
        _out(runs_report.tables(paths, args.format, args.out))
        return 0
    written = runs_report.html(paths, Path(args.out) if args.out else None)
    _out(json.dumps({"report": str(written)}) if args.format == "json" else str(written))
    return 0


def cmd_rejudge(args: argparse.Namespace) -> int:
    """Each recorded run judged again on a fresh VM (:mod:`runner.app.rejudge`)."""
    if not args.verbose:  # every command of every cassette again: only with -v
        logging.getLogger("rootbench.agent").setLevel(logging.WARNING)
    out = Path(args.out) if args.out else None
    if out is not None:
        check_file_target(out, "--out")
    jobs = parse_jobs(args.jobs)
    if jobs is None:
        jobs, why = auto_jobs()
        log.info("--jobs auto: %d (%s)", jobs, why)
    return rejudge.rejudge(args.paths, fmt=args.format, jobs=jobs,
                           accel=args.accel, transport=args.transport, record_to=out,
                           out=_out, err=_err,
                           rules=CURRENT_RULES if args.rules == "current" else None)


def cmd_view(args: argparse.Namespace) -> int:
    """RUNS_DIR/index.html: every run of the folder, its figures and a link to its report."""
    written = runs_index.write_index(Path(args.runs_dir), reports=not args.no_reports)
    _out(json.dumps({"index": str(written)}) if args.format == "json" else str(written))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Each run's trajectory as ATIF ``trajectory.json``; prints the files written."""
    for path in atif.export([Path(p) for p in args.paths], Path(args.out) if args.out else None):
        _out(str(path))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    paths = [Path(args.run_a), Path(args.run_b), *map(Path, args.more)]
    _out(render_comparisons(compare_runs(paths), args.format))
    return 0


def cmd_results(args: argparse.Namespace) -> int:
    """The results block (runner/app/results.py): printed, ``--write`` or ``--check``."""
    return results.command(args.paths, args.specs, write=args.write, check=args.check,
                           out=_out, err=_err)


def cmd_image(args: argparse.Namespace) -> int:
    if args.image_command == "build":
        built = build_image(args.name, force=args.force)
        _out(f"{built.name}: {built.base} (sha256 {built.sha256[:16]})")
        return 0
    images = list_images()
    if not images:
        _out("no images built yet (run `rootbench image build`)")
        return 0
    _out(render_rows(["name", "size MB", "sha256", "age h", "dir"],
                     [[i["name"], i["size_mb"], i["sha256"], i["age_hours"], i["dir"]] for i in images]))
    return 0


def cmd_model(args: argparse.Namespace) -> int:
    if args.model_command == "setup":
        binary = ensure_llama_server()
        path = fetch_model(args.model or DEFAULT_MODEL)
        _out(f"llama-server: {binary}\nmodel: {path}")
        return 0
    _out(str(fetch_model(args.name)))
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    for text in cache.listing(args.prune, args.format):
        _out(text)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    found = doctor.examine()
    for line in found.lines:
        _out(line)
    for p in found.problems:
        _out(f"problem: {p}")
    if not found.problems:  # a check that passed says so, in one line
        _out("no problem found: this machine can run rootbench")
    return 1 if found.problems else 0


COMMANDS = {"validate": cmd_validate, "new": cmd_new, "list": cmd_list, "run": cmd_run,
            "bench": cmd_bench,
            "replay": cmd_replay, "verify": cmd_verify, "perf": cmd_perf, "report": cmd_report,
            "view": cmd_view, "rejudge": cmd_rejudge, "export": cmd_export,
            "image": cmd_image, "model": cmd_model, "doctor": cmd_doctor, "cache": cmd_cache,
            "compare": cmd_compare, "mcp": cmd_mcp, "results": cmd_results}


def _crash_log(exc: BaseException) -> Path | None:
    """Write the traceback of an unexpected error to the cache's crash folder; its path, or None."""
    try:
        folder = cache_root() / "crashes"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
        path.write_text("".join(traceback.format_exception(exc)), encoding="utf-8")
        return path
    except Exception:  # noqa: BLE001 - reporting a crash must not crash
        return None


def _wants_json(argv: Sequence[str]) -> bool:
    """``--format json`` among the arguments (read before they are parsed, for argparse's errors)."""
    argv = list(argv)
    return any(a == "--format=json" or (a == "--format" and argv[i + 1:i + 2] == ["json"])
               for i, a in enumerate(argv))


def _fail(message: str, code: int, as_json: bool) -> int:
    """One line on stderr; with ``--format json`` also the one JSON document stdout promised,
    ``{"error": ..., "exit": ...}``, so a program reading stdout never gets nothing."""
    _err(f"rootbench: {message}")
    if as_json:
        print(json.dumps({"error": printable(message), "exit": code}), flush=True)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = _wants_json(argv)
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:  # the parser has printed its one line on stderr
        if as_json:
            print(json.dumps({"error": printable(exc.line), "exit": 2}), flush=True)
        raise
    args.argv = argv  # the command as given (``mcp`` runs it again), not sys.argv: main([...]) too
    as_json = getattr(args, "format", None) == "json" or getattr(args, "json", False)
    logs.setup(-1 if args.quiet else 1 if args.verbose else 0)
    try:
        return COMMANDS[args.command](args)
    except InvalidInput as exc:
        return _fail(str(exc), 2, as_json)
    except Interrupted as exc:
        return _fail(f"interrupted; everything torn down, results so far kept (exit {exc.code})",
                     exc.code, as_json)
    except KeyboardInterrupt:
        return _fail("interrupted", 130, as_json)
    except InfraError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return _fail(f"infrastructure error: {first}", 1, as_json)
    except RootbenchError as exc:
        return _fail(str(exc), 1, as_json)
    except BrokenPipeError:
        # The reader went away (`rootbench list | head`): nothing more can be said to it.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 1
    except OSError as exc:
        if exc.errno == 28:  # ENOSPC
            return _fail(f"the disk is full ({exc.filename or 'run directory'}); "
                         "results written so far are intact", 1, as_json)
        return _last_resort(exc, as_json)
    except Exception as exc:  # noqa: BLE001 - the last resort: one line, never a traceback
        return _last_resort(exc, as_json)


def _last_resort(exc: BaseException, as_json: bool = False) -> int:
    where = _crash_log(exc)
    detail = " ".join(str(exc).split())[:160] or type(exc).__name__
    return _fail(f"unexpected error ({type(exc).__name__}: {detail}); please report this"
                 + (f" with {where}" if where else ""), 1, as_json)


if __name__ == "__main__":
    sys.exit(main())
