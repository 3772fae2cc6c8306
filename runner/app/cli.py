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

from runner import __version__
from runner.app import (
    atif,
    bench_setup,
    cache,
    doctor,
    logs,
    mcp_server,
    results,
    runs_report,
    scaffold,
    verify_run,
)
from runner.app.bench import resume_scenarios
from runner.app.bench_setup import BenchFlags
from runner.app.cliparse import Parser, UsageError, check_range, parse_jobs
from runner.app.compare import compare_runs, render_comparisons
from runner.app.doctor import DEFAULT_IMAGE
from runner.app.episodes import RunOptions
from runner.app.executors import ExecutorKind
from runner.app.perf import measure, render
from runner.app.ray_executor import JOIN_TIMEOUT
from runner.app.replay import replay_table
from runner.app.report import FORMATS, pass_at, render_rows, render_table
from runner.app.scenarios import listing, one_spec, selected, specs_dir, validation
from runner.app.signals import Interrupted
from runner.backends.cachedir import cache_root
from runner.backends.images import build_image, list_images
from runner.backends.llama import DEFAULT_CTX_SIZE, DEFAULT_MODEL, ensure_llama_server, fetch_model
from runner.core.cassette import RecordMode
from runner.core.errors import InfraError, InvalidInput, RootbenchError
from runner.core.outcomes import Verdict
from runner.core.protocol import CHOICES
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


# --- argument groups --------------------------------------------------------------------------

def _vm_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--accel", choices=("auto", "kvm", "tcg"), default="auto",
                   help="accelerator (auto: KVM when usable, else TCG)")
    p.add_argument("--transport", choices=("serial", "ssh"), default="serial",
                   help="guest channel for the agent's commands")


def _format_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=FORMATS, default="github",
                   help="github or plain tables, or one JSON document on stdout")


def _agent_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--agent", default="model", metavar="AGENT",
                   help="who acts: model, oracle (the scenario's solution), noop (nobody), or "
                        "an agent of yours: FILE.py:Class, package.module:Class or an installed "
                        "agent's name (docs/agents.md)")
    p.add_argument("--model", action="append", metavar="NAME",
                   help=f"named model (default {DEFAULT_MODEL}); several: a matrix, one model "
                        "server at a time")
    p.add_argument("--model-file", help="any GGUF file to serve with llama-server")
    p.add_argument("--endpoint", help="an OpenAI-compatible server already running (nothing is started)")
    p.add_argument("--llama-server", help="your own llama-server binary")
    p.add_argument("--protocol", action="append", choices=CHOICES,
                   help="how the model acts (default auto); several: a matrix")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature, 0 to 2 (0: always the most likely token)")
    p.add_argument("--seed", type=int, default=0,
                   help="the model server's sampling seed (round r of --repeat uses SEED+r)")
    p.add_argument("--max-tokens", type=int, default=512,
                   help="most tokens the model may write in one reply")
    p.add_argument("--ctx-size", type=int, default=DEFAULT_CTX_SIZE,
                   help="context window in tokens (a run that outgrows it ends as stop=context)")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs per scenario, round r with seed SEED+r (reports pass@1, pass@N; "
                        "needs --temperature above 0 to mean anything)")
    p.add_argument("--hints", type=int, action="append", metavar="K",
                   help="give every scenario's task its first K hints (capped at the hints it "
                        "has); several: a matrix")
    p.add_argument("--ladder", action="store_true",
                   help="run each scenario at hint level 0, then one level higher after each "
                        "failure until it passes or the hints run out (the table's assist column)")
    p.add_argument("--track-fix", action=argparse.BooleanOptionalAction, default=True,
                   help="re-run the success probes after each agent command, for fixed_at and "
                        "regressed (default on; a probe round per command, 0.4-0.7 s on TCG, "
                        "2-6%% of a model episode; not taken from the agent's time budget)")
    _format_arg(p)
    p.add_argument("--runs-dir", default="runs", help="where run directories are made")
    _jobs_arg(p, "episodes at once, each in its own VM (auto: from cores, free memory and the "
                 "model server's slots); our llama-server gets as many slots")
    p.add_argument("--executor", choices=[k.value for k in ExecutorKind], default="local",
                   help="where episodes run: this host, or a Ray cluster (pip install "
                        "'rootbench[ray]'; nodes declare a 'vm' resource)")
    p.add_argument("--ray-address", metavar="HOST:PORT|auto",
                   help="with --executor ray: the cluster's head (its GCS address), or auto: the "
                        "cluster running on this machine, found as Ray's own tools find it "
                        "(default: the RAY_ADDRESS environment variable)")
    p.add_argument("--ray-timeout", type=float, metavar="SECONDS",
                   help=f"with --executor ray: how long joining the cluster may take before it "
                        f"is an infrastructure error (default {JOIN_TIMEOUT:.0f})")
    p.add_argument("--record-to", help="also copy every cassette into this directory")
    p.add_argument("--record-mode", choices=[m.value for m in RecordMode], default="all",
                   help="with --record-to: all runs everything live; once replays the scenarios "
                        "that already have a cassette there; none replays only")
    _vm_args(p)


def _paths_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", metavar="PATH|ID",
                   help="spec files, folders of them, or bundled scenario ids (default: the "
                        "bundled specs/, or $ROOTBENCH_SPECS)")


def _selection_args(p: argparse.ArgumentParser, bench: bool = False) -> None:
    """``--only``, ``--tags``, ``--difficulty``, ``--exclude``, ``--limit`` (and for a bench
    ``--all``): which scenarios of the paths (runner/core/selection.py)."""
    if bench:
        p.add_argument("--all", action="store_true",
                       help="every scenario (the whole suite), not the default subset a bench "
                            "that names no scenario runs (docs/running.md, 'The default bench')")
    p.add_argument("--only", nargs="+", action="extend", metavar="ID",
                   help="only these scenario ids, or shell-style globs of ids ('cron-*'), in "
                        "this order; a spec file is given as a path, not here")
    p.add_argument("--tags", nargs="+", action="extend", metavar="TAG",
                   help="only scenarios with any of these tags (e.g. easy-tier; comma-separated "
                        "or several)")
    p.add_argument("--difficulty", nargs="+", action="extend", metavar="TIER",
                   help="only scenarios of any of these measured tiers (easy, medium, hard, "
                        "unmeasured: what the bundled models did, not the spec's label; "
                        "comma-separated or several)")
    p.add_argument("--exclude", nargs="+", action="extend", metavar="ID",
                   help="leave out these scenario ids or globs of ids")
    p.add_argument("--limit", type=int, metavar="N",
                   help="only the first N scenarios left by the paths and the other filters")


def _jobs_arg(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--jobs", default=None, metavar="N|auto", help=f"{what} (default 1)")


def _parser() -> argparse.ArgumentParser:
    ap = Parser(prog="rootbench", description=(
        "Can this model fix a broken Linux server? Boots a throw-away QEMU VM, breaks it, "
        "hands a model a root shell, and checks the result with probes."))
    ap.add_argument("--version", action="version", version=f"rootbench {__version__}")
    ap.add_argument("-q", "--quiet", action="store_true", help="progress lines off (warnings only)")
    ap.add_argument("-v", "--verbose", action="store_true", help="more detail in progress lines")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("validate", help="check scenario files against the schema")
    p.add_argument("paths", nargs="*", help="spec files or directories (default specs/)")

    p = sub.add_parser("new", help="write a commented skeleton of a new scenario that validates "
                                   "(docs/scenarios.md)")
    p.add_argument("id", metavar="ID", help="the new scenario's id: lower-case letters, digits, '-'")
    p.add_argument("--image", required=True, metavar="IMAGE",
                   help="the image recipe its VM is built from (images/IMAGE.yaml), e.g. "
                        f"{DEFAULT_IMAGE}")
    p.add_argument("--out", metavar="FILE",
                   help="where the skeleton goes (default specs/ID.yaml); an existing file is "
                        "never replaced")

    p = sub.add_parser("list", help="list the scenarios: label, measured tier, in the default "
                                    "bench or not")
    _paths_arg(p)
    _selection_args(p)
    _format_arg(p)

    p = sub.add_parser("run", help="run one scenario")
    p.add_argument("spec", metavar="SPEC|ID", help="a spec file, or a bundled scenario's id")
    _agent_args(p)

    p = sub.add_parser("bench", help="run the default subset (--all: every scenario) and print "
                                     "the table")
    _paths_arg(p)
    _selection_args(p, bench=True)
    p.add_argument("--resume", metavar="RUNDIR", help="finish what is missing in a run directory")
    p.add_argument("--retry-infra", type=int, default=0, metavar="N",
                   help="re-run infra-error runs up to N times")
    _agent_args(p)

    p = sub.add_parser("mcp", help="serve one scenario to an outside agent as an MCP server "
                                   "(stdio, or streamable HTTP with --http); docs/agents.md")
    p.add_argument("spec", metavar="SPEC|ID", help="a spec file, or a bundled scenario's id")
    p.add_argument("--http", metavar="[HOST:]PORT",
                   help="serve streamable HTTP at http://HOST:PORT/mcp (default: stdio); every "
                        "request must carry the token the server prints once on stderr")
    p.add_argument("--http-remote", action="store_true",
                   help="let --http listen on an address other than loopback (warns: the root "
                        "shell is then reachable from other machines, to whoever has the token)")
    p.add_argument("--http-token-file", metavar="FILE",
                   help="write the --http token to FILE (mode 0600) instead of printing it")
    p.add_argument("--hints", type=int, default=0, metavar="K",
                   help="give the task the scenario's first K hints")
    p.add_argument("--track-fix", action=argparse.BooleanOptionalAction, default=True,
                   help="re-run the success probes after each command (fixed_at, regressed)")
    p.add_argument("--runs-dir", default="runs", help="where the run directory is made")
    _vm_args(p)

    p = sub.add_parser("replay", help="replay recorded cassettes and compare verdicts")
    p.add_argument("paths", nargs="+", help="cassettes or directories of them")
    p.add_argument("--offline", action="store_true",
                   help="serve the guest from the cassette too (no VM, no model)")
    p.add_argument("--lenient", action="store_true",
                   help="go on when a request differs from the recording")
    p.add_argument("--allow-spec-changes", action="store_true",
                   help="replay a cassette whose spec changed since it was recorded (from the "
                        "recorded spec), instead of reporting it spec-changed")
    p.add_argument("--specs", action="append", metavar="DIR",
                   help="where today's specs are, to check the recorded ones against "
                        "(default: $ROOTBENCH_SPECS, else the bundled specs/; may be given several times)")
    _format_arg(p)
    _vm_args(p)

    p = sub.add_parser("verify", help="prove scenarios valid on real VMs (noop fails, oracle "
                                      "passes, every shortcut fails)")
    _paths_arg(p)
    _selection_args(p)
    p.add_argument("--record-to", default="recordings/oracle",
                   help="where the oracle cassettes go (default recordings/oracle); the noop "
                        "run's goes to noop/<scenario-id>.jsonl and each shortcut's to "
                        "shortcuts/<scenario-id>/<shortcut>.jsonl under it")
    _jobs_arg(p, "scenarios verified side by side, each in its own child process and VM "
                 "(auto: from cores and free memory)")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="run the checks N times; a scenario whose tries disagree is flaky (invalid)")
    p.add_argument("--shortcuts", choices=("run", "recorded"), default="run",
                   help="run: each shortcut as a scripted agent on a real VM (and record it); "
                        "recorded: prove each from its cassette under --recorded-from, which "
                        "must be of this very spec and replay offline to fail (fast: make test)")
    p.add_argument("--noop", choices=("run", "recorded"), default="run",
                   help="run: the noop agent on a real VM (and record it); recorded: prove "
                        "'noop fails' from its cassette under --recorded-from (same rules as "
                        "--shortcuts recorded), and the baseline and 'fault lands' from the "
                        "oracle's own run (make test)")
    p.add_argument("--alternatives", choices=("run", "recorded"), default="run",
                   help="run: each valid alternative fix (the spec's alternatives:) as a scripted "
                        "agent on a real VM, which must pass; recorded: prove each from its "
                        "cassette under --recorded-from (alternatives/<scenario-id>/<name>.jsonl)")
    p.add_argument("--oracle", choices=("run", "changed"), default="run",
                   help="run: the oracle of every scenario live on a real VM; changed: prove it "
                        "from its recording under --recorded-from when the spec, the judging "
                        "rules, the image recipe and the guest helper are all as recorded, and "
                        "run live only the others and a --sample that rotates daily (make test)")
    p.add_argument("--sample", type=int, default=3, metavar="N",
                   help="with --oracle changed: how many scenarios still run live although "
                        "their recordings prove them (default 3; a window that moves each day)")
    p.add_argument("--max-live", type=int, default=None, metavar="N",
                   help="with --oracle changed: run live at most N of the scenarios whose "
                        "recordings no longer prove them (a window that moves daily); the rest "
                        "are deferred, reported apart, neither valid nor invalid (make test)")
    p.add_argument("--runs-dir", default="runs", metavar="DIR",
                   help="where verify's run directory (its report) is made (default runs)")
    p.add_argument("--recorded-from", "--shortcuts-from", dest="recorded_from",
                   default="recordings/oracle", metavar="DIR",
                   help="with --shortcuts/--noop recorded: where the recordings are "
                        "(shortcuts/<scenario-id>/<shortcut>.jsonl and noop/<scenario-id>.jsonl "
                        "under it; default recordings/oracle)")
    _format_arg(p)
    _vm_args(p)

    p = sub.add_parser("perf", help="measure speed figures")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="figures with their targets, or one JSON object on stdout")
    p.add_argument("--json", action="store_true",
                   help="deprecated spelling of --format json (still works, says so on stderr)")
    p.add_argument("--no-vm", action="store_true", help="skip the VM figures")
    p.add_argument("--no-model", action="store_true", help="skip the model figures")
    p.add_argument("--no-scale", action="store_true",
                   help="skip the --jobs 1 against --jobs 2 oracle benches")
    p.add_argument("--no-verify", action="store_true",
                   help="skip timing verify --jobs 2 of the whole suite (minutes)")
    p.add_argument("--model", default=None, help="named model for the model figures")
    p.add_argument("--model-only", action="store_true",
                   help="only the model's figures: its reference speed, beside an idle guest "
                        "and beside cpu-hog's and scratch-dir-full's faults (restored VMs), "
                        "three live episodes of the default bench beside the reference, "
                        "speculative decoding on a recorded run's requests, and the recorded "
                        "bench's throughput (about 45 minutes on 2 cores)")
    _vm_args(p)

    p = sub.add_parser("cache", help="what the per-user cache holds; --prune removes what is no longer used")
    p.add_argument("--prune", action="store_true",
                   help="remove builds the current inputs no longer name (old images, snapshots, models)")
    _format_arg(p)

    p = sub.add_parser("report", help="the table of a run directory, or an HTML report of runs")
    p.add_argument("paths", nargs="+", metavar="RUNDIR|CASSETTE",
                   help="run directories or recordings folders (folders of cassettes) side by "
                        "side and, with --html, loose cassettes")
    p.add_argument("--html", action="store_true",
                   help="write one self-contained HTML file (RUNDIR/report.html for one run "
                        "directory, else ./report.html) and print its path")
    p.add_argument("--out", metavar="FILE", help="with --html: where the report goes")
    _format_arg(p)

    p = sub.add_parser("export", help="write each run's trajectory in another format")
    p.add_argument("paths", nargs="+", metavar="RUNDIR|CASSETTE",
                   help="run directories or cassettes (directories are searched for *.jsonl)")
    p.add_argument("--format", choices=atif.FORMATS, default="atif",
                   help=f"atif: Harbor's Agent Trajectory Interchange Format ({atif.SCHEMA_VERSION})")
    p.add_argument("--out", metavar="DIR",
                   help="where the <run>/trajectory.json files go (default RUNDIR/atif for one "
                        "run directory, else ./atif)")

    p = sub.add_parser("compare", help="is run A better than run B? paired runs, intervals, "
                                       "an exact test (more runs: each against the first)")
    p.add_argument("run_a", metavar="RUN_A", help="a run directory or recordings folder (A)")
    p.add_argument("run_b", metavar="RUN_B", help="a run directory or recordings folder (B)")
    p.add_argument("more", nargs="*", metavar="RUN", help="more of them, each compared with A")
    _format_arg(p)

    p = sub.add_parser("results", help="the README's results block and the difficulty tiers "
                                       "measured from the committed live runs (no VM, no model)")
    p.add_argument("paths", nargs="*", metavar="LIVE_DIR",
                   help="run folders of the bundled models' ladder runs (default: every folder "
                        "under recordings/live/)")
    p.add_argument("--specs", action="append", metavar="DIR",
                   help="where the specs are (default: $ROOTBENCH_SPECS, else the bundled "
                        "specs/; may be given several times)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--write", metavar="FILE",
                      help="put the block between FILE's <!-- results:begin --> and "
                           "<!-- results:end --> lines (make results: README.md)")
    what.add_argument("--check", metavar="FILE",
                      help="exit 1 when FILE's block is not what the runs give, or a spec's "
                           "difficulty: hard was passed unaided by a bundled model (one line each)")

    p = sub.add_parser("image", help="guest images")
    isub = p.add_subparsers(dest="image_command", required=True, metavar="ACTION")
    b = isub.add_parser("build", help="build an image recipe from images/")
    b.add_argument("name", nargs="?", default=DEFAULT_IMAGE)
    b.add_argument("--force", action="store_true", help="rebuild even if cached")
    isub.add_parser("info", help="list built images")

    p = sub.add_parser("model", help="llama-server and models")
    msub = p.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    s = msub.add_parser("setup", help="build llama-server and fetch the default model")
    s.add_argument("--model", default=None)
    f = msub.add_parser("fetch", help="fetch a named model")
    f.add_argument("name")

    sub.add_parser("doctor", help="check that this machine can run rootbench")
    return ap


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
    address = mcp_server.parse_http(args.http, remote=args.http_remote) if args.http else None
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
            "export": cmd_export,
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
        args = _parser().parse_args(argv)
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
