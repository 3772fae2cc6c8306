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
import datetime as _dt
import importlib.util
import json
import logging
import math
import os
import shutil
import stat
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from runner import __version__
from runner.app import atif, html_report, logs, mcp_server, results, scaffold
from runner.app.agent_api import BUILTIN as BUILTIN_AGENTS
from runner.app.agent_api import AgentRef
from runner.app.agent_api import resolve as resolve_agent
from runner.app.agents import AgentChoice
from runner.app.bench import check_bench, resume_scenarios, run_bench
from runner.app.cache import entries, prune
from runner.app.cliparse import Parser, UsageError
from runner.app.compare import compare_runs, render_comparisons
from runner.app.episodes import RunOptions
from runner.app.executors import (
    MAX_JOBS,
    Executor,
    ExecutorKind,
    auto_jobs,
    make_local,
)
from runner.app.outputs import atomic_write, check_dir_target, check_file_target
from runner.app.perf import measure, render
from runner.app.plan import Arm, matrix
from runner.app.ray_executor import JOIN_TIMEOUT, RayExecutor, reachable, resolve_auto
from runner.app.replay import OutcomeTable, ReplayOutcome, replay_all, unreadable
from runner.app.report import FORMATS, pass_at, render_rows, render_table
from runner.app.runs import (
    is_recordings,
    load_episodes,
    load_results,
    new_run_dir,
    recorded_cassettes,
    results_file,
)
from runner.app.signals import Interrupted
from runner.app.verify import json_rows, table_rows
from runner.app.verify_run import VerifyOptions, run_verify
from runner.backends.cachedir import cache_root
from runner.backends.images import build_image, find_image, list_images
from runner.backends.llama import (
    DEFAULT_CTX_SIZE,
    DEFAULT_MODEL,
    MODELS,
    describe_setup,
    ensure_llama_server,
    fetch_model,
    model_threads,
)
from runner.backends.openai import check_endpoint, check_reachable, server_props
from runner.backends.process import guest_nice
from runner.backends.qemu import choose_accel, kvm_status, qemu_version
from runner.backends.snapshot import snapshot_dir
from runner.core import layout, measured
from runner.core.cassette import RecordMode, find_cassettes
from runner.core.episode import Episode
from runner.core.errors import InfraError, InvalidInput, RootbenchError
from runner.core.measured import UNKNOWN
from runner.core.outcomes import AgentKind, ReplayResult, Tier, Verdict
from runner.core.paths import default_spec_dirs
from runner.core.protocol import CHOICES
from runner.core.selection import (
    SPEC_SUFFIXES,
    Selection,
    choose,
    default_subset,
    looks_like_path,
    pick_ids,
    split_words,
)
from runner.core.spec import Scenario, check_specs, load_specs
from runner.core.text import printable

DEFAULT_IMAGE = "debian-12-nginx"
MAX_SEED = 2 ** 32 - 2  # llama-server's seeds are 32-bit; 2**32 - 1 asks it for a random one
RAY_ADDRESS_ENV = "RAY_ADDRESS"  # Ray's own variable for the cluster to use
REACH_TIMEOUT = 5.0  # seconds an --endpoint has to answer before any work starts
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

def _spec_paths(paths: Sequence[str]) -> list[str | Path]:
    return list(paths) if paths else list(default_spec_dirs())


def _scenarios_of(words: Sequence[str], field: str) -> list[Scenario]:
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


def _one_spec(word: str) -> Scenario:
    """``run`` and ``mcp``'s one scenario: a spec file or a bundled scenario's id."""
    found = _scenarios_of([word], "SPEC")
    if len(found) != 1:
        raise InvalidInput(f"names {len(found)} scenarios; give one spec file or one id",
                           path=word, field="SPEC")
    return found[0]


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


def _selected(args: argparse.Namespace) -> list[Scenario]:
    """The scenarios of the paths or ids (default: the bundled specs/), narrowed by the
    selection flags (runner/core/selection.py)."""
    return choose(_scenarios_of(args.paths, "PATH"), _selection(args), measured.load())


def cmd_validate(args: argparse.Namespace) -> int:
    results = check_specs(_spec_paths(args.paths))
    if not results:
        raise InvalidInput("no scenario files found", path=", ".join(map(str, _spec_paths(args.paths))))
    bad = 0
    for path, scenario, err in results:
        if err is not None:
            bad += 1
            _out(str(err))
        else:
            assert scenario is not None
            _out(f"{path}: ok ({scenario.id})")
    _out(f"{len(results) - bad} valid, {bad} invalid")
    return 2 if bad else 0


def cmd_new(args: argparse.Namespace) -> int:
    """A commented skeleton of scenario ID on IMAGE (runner/app/scaffold.py), and what next."""
    path = scaffold.write_new(args.id, args.image, Path(args.out) if args.out else None)
    _out(f"{path}: a skeleton of scenario {args.id} on {args.image} (a working example: cron "
         f"stopped); edit it, then `rootbench validate {path}` and `rootbench verify {path}`")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    """The scenarios: the spec's ``difficulty:`` label beside the tier measured from the bundled
    models' ladders (runner/core/measured.py), and whether a bench that names no scenario runs
    it (``default``: the default subset of the scenarios listed' folders)."""
    scenarios = _selected(args)
    facts = measured.load()
    everything = _scenarios_of(args.paths, "PATH")
    default = {s.id for s in default_subset(everything, facts)}
    headers = ["id", "difficulty", "tier", "default", "tags", "turns", "title"]
    if args.format == "json":  # typed: no label is null, default a boolean, tags a list
        _out(json.dumps([dict(zip(headers, [
            s.id, s.difficulty, facts.get(s.id, UNKNOWN).tier.value, s.id in default,
            list(s.tags), s.budget.turns, s.title], strict=True)) for s in scenarios], indent=2))
        return 0
    rows = [[s.id, s.difficulty or "-", facts.get(s.id, UNKNOWN).tier.value,
             "yes" if s.id in default else "-", ",".join(s.tags) or "-", s.budget.turns, s.title]
            for s in scenarios]
    _out(render_rows(headers, rows, args.format))
    return 0


def _number(value: float, flag: str, low: int, high: int) -> None:
    if not math.isfinite(value) or not low <= value <= high:
        raise InvalidInput(f"must be a number from {low} to {high}, not {value!r}", field=flag)


def _jobs(value: str | None, flag: str = "--jobs") -> int | None:
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
    _number(jobs, flag, 1, MAX_JOBS)
    return jobs


def _ray_address(args: argparse.Namespace) -> str | None:
    """``--executor ray``: Ray installed and its head answering, checked before any VM starts.

    The address is ``--ray-address``, else the ``RAY_ADDRESS`` environment
    variable (as for Ray's own tools); ``auto`` is resolved by Ray itself
    (:func:`~runner.app.ray_executor.resolve_auto`). The ``HOST:PORT`` it comes to is then checked to answer.
    """
    given = args.ray_address or os.environ.get(RAY_ADDRESS_ENV) or None
    if args.executor != ExecutorKind.RAY.value:
        for flag, value in (("--ray-address", args.ray_address), ("--ray-timeout", args.ray_timeout)):
            if value not in (None, ""):
                raise InvalidInput(f"{flag} is for --executor ray", field=flag)
        return None
    if args.ray_timeout is not None:
        _number(args.ray_timeout, "--ray-timeout", 1, 3600)
    if not given:
        raise InvalidInput("--executor ray needs --ray-address HOST:PORT (the head's address) "
                           f"or auto (the cluster running on this machine), or {RAY_ADDRESS_ENV}",
                           field="--ray-address")
    try:
        found = importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):  # a broken or blocked install is no install
        found = False
    if not found:
        raise InvalidInput("Ray is not installed: pip install 'rootbench[ray]'", field="--executor")
    if given.strip().lower() == "auto":
        address = resolve_auto(RAY_ADDRESS_ENV)
        logging.getLogger("rootbench.bench").info("--ray-address auto: %s", address)
    else:
        address = given
    reachable(address)
    args.ray_address = address  # resolved once: later checks of the same flags reuse it
    return address


def _choices(args: argparse.Namespace) -> list[AgentChoice]:
    """The agent flags, checked before any work is done (no image build, no VM, no server):
    one choice per ``--model`` (a matrix when there are several)."""
    agent, agent_ref = _agent_kind(args)
    models: list[str] = args.model or [DEFAULT_MODEL]
    if args.endpoint is not None:
        check_endpoint(args.endpoint)  # its form here; whether it answers, just before any work
    if args.model_file is not None:
        if not Path(args.model_file).is_file():
            raise InvalidInput("no such file", path=args.model_file, field="--model-file")
        if len(models) > 1:
            raise InvalidInput("--model-file is one model: give it alone, or several --model",
                               field="--model-file")
    elif agent is AgentKind.MODEL and args.endpoint is None:
        for model in models:
            if model not in MODELS:
                raise InvalidInput(f"unknown model {model!r} (known: {', '.join(MODELS)}; or give "
                                   "--model-file, or --endpoint for a server of your own)",
                                   field="--model")
    if agent is not AgentKind.MODEL:
        models = models[:1]  # scripted agents have no model: one arm per protocol
    if args.llama_server is not None:
        binary = Path(args.llama_server)
        if not binary.is_file() or not os.access(binary, os.X_OK):
            raise InvalidInput("not an executable file", path=args.llama_server,
                               field="--llama-server")
    _number(args.temperature, "--temperature", 0, 2)
    _number(args.max_tokens, "--max-tokens", 1, 1 << 20)
    _number(args.ctx_size, "--ctx-size", 512, 1 << 22)
    _number(args.repeat, "--repeat", 1, 10_000)
    # Round r samples with seed SEED+r; llama-server's seed is 32 bits and its largest value
    # (0xFFFFFFFF) means "random", so every round's seed must be below it.
    top = MAX_SEED - (args.repeat - 1 if 1 <= args.repeat <= 10_000 else 0)
    if not 0 <= args.seed <= top:
        rounds = f"; with --repeat {args.repeat} (seeds SEED to SEED+{args.repeat - 1}) at most " \
                 f"{top}" if top != MAX_SEED else ""
        raise InvalidInput(f"must be a number from 0 to {MAX_SEED} (llama-server's seeds are "
                           f"32-bit; {MAX_SEED + 1} asks it for a random one){rounds}, not "
                           f"{args.seed}", field="--seed")
    for hints in args.hints or [0]:
        _number(hints, "--hints", 0, 100)
    if args.ladder and any(args.hints or []):
        raise InvalidInput("--ladder climbs the hint levels itself: give --ladder or --hints K, "
                           "not both", field="--ladder")
    _number(getattr(args, "retry_infra", 0), "--retry-infra", 0, 100)
    if args.record_mode != RecordMode.ALL.value and not args.record_to:
        raise InvalidInput(f"--record-mode {args.record_mode} needs --record-to DIR",
                           field="--record-mode")
    _jobs(args.jobs)
    _ray_address(args)
    cache_root()  # a cache that cannot be used is bad input too, found before any work
    return [AgentChoice(kind=agent, endpoint=args.endpoint, model=model,
                        model_file=args.model_file, llama_server=args.llama_server,
                        temperature=args.temperature, seed=args.seed,
                        max_tokens=args.max_tokens, ctx_size=args.ctx_size,
                        agent_ref=agent_ref) for model in models]


def _agent_kind(args: argparse.Namespace) -> tuple[AgentKind, AgentRef | None]:
    """``--agent``: a built-in agent, or a user's agent class (imported now, so a missing file or
    name is one line and exit 2 before any VM starts)."""
    if args.agent in BUILTIN_AGENTS:
        return AgentKind(args.agent), None
    ref = resolve_agent(args.agent)
    for protocol in args.protocol or []:
        if protocol not in ("auto", "tools"):
            raise InvalidInput(f"a Python agent's actions are recorded as tool calls: --protocol "
                               f"{protocol} does not apply", field="--protocol")
    return AgentKind.PYTHON, ref


def _server_slots(choices: list[AgentChoice]) -> int | None:
    """An ``--endpoint`` server's parallel slots, if it says (llama-server's /props); else None."""
    endpoint = next((c.endpoint for c in choices if c.kind is AgentKind.MODEL and c.endpoint), None)
    if endpoint is None:
        return None
    slots = server_props(endpoint, timeout=3).get("total_slots")  # {} unless a JSON object
    if isinstance(slots, int) and not isinstance(slots, bool) and 0 < slots <= MAX_JOBS:
        return slots
    return None


def _executor(args: argparse.Namespace, choices: list[AgentChoice]) -> Executor:
    """The executor the flags ask for; ``--jobs auto`` sized here and said in one line."""
    jobs = _jobs(args.jobs)
    address = _ray_address(args) if hasattr(args, "executor") else None
    if address is not None:
        return RayExecutor(address, max_jobs=jobs if args.jobs is not None else None,
                           join_timeout=args.ray_timeout or JOIN_TIMEOUT)
    if jobs is None:
        serving = [c for c in choices if c.kind is AgentKind.MODEL and not c.endpoint]
        reserve = max((_model_mib(c) for c in serving), default=0)
        jobs, why = auto_jobs(server_slots=_server_slots(choices), reserve_mib=reserve,
                              model_threads=model_threads() if serving else 0)
        logging.getLogger("rootbench.bench").info("--jobs auto: %s", why)
    return make_local(jobs)


def _model_mib(choice: AgentChoice) -> int:
    """What a llama-server of this model holds in memory, roughly: the GGUF file, plus room."""
    size = (Path(choice.model_file).stat().st_size if choice.model_file
            else MODELS[choice.model].size)
    return size // (1 << 20) + 512


def _preflight(args: argparse.Namespace, choices: list[AgentChoice], scenarios: list[Scenario],
               arms: list[Arm], opts: RunOptions, resume: Path | None) -> None:
    """Everything a bench could be refused for, before any work: no run directory is made, no
    VM restored, no model asked until every path it writes is writable, a resume matches its
    run, every recording ``--record-mode none`` needs is there, and the endpoint answers."""
    guest_nice()  # $ROOTBENCH_GUEST_NICE is read by every VM start: a bad one is refused here
    model_threads()  # and $ROOTBENCH_MODEL_THREADS by every llama-server start
    if resume is not None:
        check_dir_target(resume, "--resume")
    else:
        check_dir_target(Path(args.runs_dir), "--runs-dir")
    record_to = Path(args.record_to) if args.record_to else None
    if record_to is not None:
        check_dir_target(record_to, "--record-to")
    check_bench(scenarios, arms, opts, resume=resume, record_to=record_to,
                record_mode=RecordMode(args.record_mode))
    if args.record_mode != RecordMode.NONE.value:  # none replays only: no server is asked
        for endpoint in dict.fromkeys(c.endpoint for c in choices
                                      if c.kind is AgentKind.MODEL and c.endpoint):
            check_reachable(endpoint, REACH_TIMEOUT)


def _bench(args: argparse.Namespace, scenarios: list[Scenario], resume: Path | None) -> int:
    choices = _choices(args)
    arms = matrix(choices, args.protocol or ["auto"], args.hints or [0])
    opts = RunOptions(accel=args.accel, transport=args.transport, protocol=arms[0].protocol,
                      repeat=args.repeat, hints=arms[0].hints, ladder=args.ladder,
                      track_fix=args.track_fix)
    _preflight(args, choices, scenarios, arms, opts, resume)
    label = choices[0].label() if len(arms) == 1 else "-".join(
        dict.fromkeys(c.label() for c in choices)) + "-matrix"
    # The executor first: a Ray cluster that cannot be joined leaves no empty run directory.
    with _executor(args, choices) as executor:
        run_dir = resume or new_run_dir(Path(args.runs_dir), label)
        logging.getLogger("rootbench.bench").info("run directory: %s", run_dir)
        if executor.slots > 1:
            logging.getLogger("rootbench.bench").info("%d episodes at once (%s)", executor.slots,
                                                       args.executor)
        episodes = run_bench(scenarios, choices[0], opts, run_dir, resume=resume is not None,
                             retry_infra=args.retry_infra,
                             record_to=Path(args.record_to) if args.record_to else None,
                             record_mode=RecordMode(args.record_mode), arms=arms,
                             executor=executor,
                             listeners=[html_report.Refresher(run_dir,
                                                              logging.getLogger("rootbench.bench"))])
    _out(render_table(episodes, args.format, ladder=args.ladder))
    if args.format != "json" and (args.repeat > 1 or args.ladder):
        _out("")
        _out(pass_at(episodes, args.format))
    # The path is progress, not the answer: with --format json stdout stays one JSON document.
    blog = logging.getLogger("rootbench.bench")
    blog.info("results: %s", run_dir / layout.RESULTS)
    if (run_dir / html_report.REPORT_NAME).is_file():  # the last line: what a person opens
        blog.info("report: %s", (run_dir / html_report.REPORT_NAME).resolve())
    if any(e.verdict is Verdict.INFRA_ERROR for e in episodes):
        return 1
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    args.retry_infra = 0  # `run` has no --retry-infra; one scenario, one try
    _choices(args)  # flags first: a bad flag is reported before the spec is even read
    scenario = _one_spec(args.spec)
    return _bench(args, [scenario], None)


def cmd_bench(args: argparse.Namespace) -> int:
    _choices(args)  # flags first
    resume = Path(args.resume) if args.resume else None
    if resume is not None:
        if not (resume / layout.RUN_INFO).is_file():
            raise InvalidInput("not a run directory (no run.json)", path=str(resume),
                               field="--resume")
        load_results(resume)  # a damaged results.json is reported before anything runs
    asked: list[Scenario] | None = None
    if resume is None or args.paths or _selection(args).narrows:
        asked = _selected(args)
    # A resume finishes the run's own scenarios (a different selection is refused).
    scenarios = resume_scenarios(resume, asked) if resume is not None else asked
    assert scenarios is not None
    return _bench(args, scenarios, resume)


def cmd_mcp(args: argparse.Namespace) -> int:
    """One scenario served to an MCP client; exit 0 once judged pass or fail, 1 otherwise, and
    130/143/129 once judged after SIGINT/SIGTERM/SIGHUP stopped the serving."""
    mcp_server.check_available()
    scenario = _one_spec(args.spec)
    _number(args.hints, "--hints", 0, 100)
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


def _specs_dir(name: str) -> Path:
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


def cmd_replay(args: argparse.Namespace) -> int:
    """Replay each cassette and table the outcomes; 0 only if every one is ``same``.

    One bad cassette does not stop the others: it is tabled ``unreadable``
    with its one-line reason (also on stderr) and makes the exit 2, as bad
    input does; any ``different``, ``mismatch`` or ``spec-changed`` makes it 1.
    """
    if not args.verbose:  # a replay re-tells every command of every cassette: only with -v
        logging.getLogger("rootbench.agent").setLevel(logging.WARNING)
    specs = [_specs_dir(d) for d in args.specs] if args.specs else None
    folders: list[tuple[Path, str]] = []  # folders that could not be listed: each is a row
    # A named path that does not exist is exit 2 at once; an unlistable subfolder is tabled.
    paths = find_cassettes(args.paths, unreadable=folders)
    outcomes: list[ReplayOutcome] = []
    # Each row is printed as soon as its cassette and every one before it are decided.
    table = OutcomeTable(args.format, [str(f) for f, _why in folders] + [str(p) for p in paths])
    _out(table.head())
    for folder, why in folders:
        exc = InvalidInput(why, path=str(folder))
        _err(f"rootbench: {exc}")
        outcomes.append(unreadable(folder, exc))
        _out(table.row(outcomes[-1]))
    t0 = time.monotonic()
    with contextlib.closing(replay_all(paths, offline=args.offline, lenient=args.lenient,
                                       allow_spec_changes=args.allow_spec_changes,
                                       accel=args.accel, transport=args.transport, specs=specs,
                                       jobs=1 if args.verbose else None)) as decided:
        for done in decided:  # -v: one process, so each cassette's progress lines stay together
            if done.error is not None:
                _err(f"rootbench: {done.error}")
            outcomes.append(done.outcome)
            _out(table.row(done.outcome))
    if (end := table.end()) is not None:
        _out(end)
    counts = {r: sum(o.result is r for o in outcomes) for r in ReplayResult}
    if args.format != "json":
        others = ", ".join(f"{n} {r.value}" for r, n in counts.items()
                           if n and r is not ReplayResult.SAME)
        _out(f"\n{counts[ReplayResult.SAME]}/{len(outcomes)} replayed verdicts equal the recorded "
             f"ones{f' ({others})' if others else ''} ({time.monotonic() - t0:.1f}s)")
    if counts[ReplayResult.UNREADABLE]:
        return 2
    return 0 if counts[ReplayResult.SAME] == len(outcomes) else 1


def cmd_verify(args: argparse.Namespace) -> int:
    jobs = _jobs(args.jobs)
    _number(args.repeat, "--repeat", 1, 20)
    _number(args.sample, "--sample", 0, 1000)
    if args.max_live is not None:
        _number(args.max_live, "--max-live", 1, 1000)
        if args.oracle != "changed":
            raise InvalidInput("goes with --oracle changed", field="--max-live")
    scenarios = _selected(args)
    recorded = Path(args.recorded_from)
    if ("recorded" in (args.shortcuts, args.noop, args.alternatives) or args.oracle == "changed") \
            and not recorded.is_dir():
        raise InvalidInput("not a directory", path=args.recorded_from, field="--recorded-from")
    if jobs is None:
        jobs, why = auto_jobs()
        logging.getLogger("rootbench.verify").info("--jobs auto: %s", why)
    done = run_verify(scenarios, VerifyOptions(
        jobs=jobs, repeat=args.repeat, accel=args.accel, transport=args.transport,
        record_to=Path(args.record_to) if args.record_to else None, recorded=recorded,
        noop_recorded=args.noop == "recorded", shortcuts_recorded=args.shortcuts == "recorded",
        alternatives_recorded=args.alternatives == "recorded", runs_dir=Path(args.runs_dir),
        oracle_changed=args.oracle == "changed", sample=args.sample,
        max_live=args.max_live))
    results = done.results
    if args.format == "json":
        _out(json.dumps(json_rows(results), indent=2))
    else:
        headers, rows = table_rows(results)
        _out(render_rows(headers, rows, args.format))
    deferred = [v for v in results if v.deferred]
    bad = [v for v in results if not v.valid and not v.deferred]
    if args.format != "json":
        checked = len(results) - len(deferred)
        more = (f"; {len(deferred)} deferred (stale recordings beyond --max-live: neither valid "
                "nor invalid today)" if deferred else "")
        _out(f"\n{checked - len(bad)}/{checked} scenarios valid{more}")
        for v in bad:
            _out(f"  {v.scenario}: {'; '.join(v.problems)}")
    return 1 if bad else 0


def cmd_perf(args: argparse.Namespace) -> int:
    if args.json:  # the old spelling: every other command says --format json
        _err("rootbench perf: --json is deprecated; use --format json")
        args.format = "json"
    figures = measure(vm=not args.no_vm, model=not args.no_model, accel=args.accel,
                      model_name=args.model, scale=not args.no_scale, verify=not args.no_verify,
                      harness=not args.model_only)
    _out(json.dumps(figures, sort_keys=True) if args.format == "json" else render(figures))
    return 0


def _table_and_statistics(episodes: list[Episode], fmt: str) -> str:
    """A run's table; for text, the statistics under it when some scenario ran more than once
    (rounds or hint levels), as ``bench`` printed them (JSON has them in the document)."""
    table = render_table(episodes, fmt, ladder=any(ep.hint_level for ep in episodes))
    once = len({(ep.scenario, ep.round, ep.hint_level) for ep in episodes}) == len(
        {ep.scenario for ep in episodes})
    if fmt == "json" or once:
        return table
    return f"{table}\n\n{pass_at(episodes, fmt)}"


def cmd_report(args: argparse.Namespace) -> int:
    """Tables of run directories, or with --html one HTML file of runs and loose cassettes.

    Every path is checked before anything is read or rendered: each run
    directory has a results file (else what is there instead is named), and
    the HTML file can be written where it goes.
    """
    paths = [Path(p) for p in args.paths]
    for path in paths:
        try:
            is_dir = stat.S_ISDIR(path.stat().st_mode)
        except FileNotFoundError:
            raise InvalidInput("no such file or directory", path=str(path)) from None
        except OSError as exc:
            raise InvalidInput(f"cannot read: {exc.strerror or exc}", path=str(path)) from None
        if is_dir and not is_recordings(path):
            results_file(path, "a run directory or a folder of cassettes")
    if not args.html:
        if args.out:
            raise InvalidInput("--out is where the HTML report goes: add --html", field="--out")
        loose = [p for p in paths if not p.is_dir()]
        if loose:
            raise InvalidInput("a cassette is reported with --html (the table needs a run "
                               "directory)", path=str(loose[0]))
        tables = [(p, _table_and_statistics(load_episodes(p)[1], args.format)) for p in paths]
        if len(tables) == 1:
            _out(tables[0][1])
        elif args.format == "json":
            _out(json.dumps({"runs": [{"run_dir": str(p), **json.loads(t)} for p, t in tables]},
                            indent=2))
        else:
            _out("\n\n".join(f"{p}\n\n{t}" for p, t in tables))
        return 0
    dirs = [p for p in paths if p.is_dir()]
    if args.out:
        out = check_file_target(Path(args.out), "--out")
    else:
        own = paths == dirs[:1] and not is_recordings(dirs[0])  # never into committed recordings
        out = dirs[0] / html_report.REPORT_NAME if own else Path(html_report.REPORT_NAME)
        check_file_target(out, "--out (default)")
    runs = [run for p in dirs for run in (html_report.runs_from_cassettes(recorded_cassettes(p))
                                          if is_recordings(p) else html_report.load_run_arms(p))]
    runs += html_report.runs_from_cassettes([p for p in paths if not p.is_dir()])
    title = "rootbench: " + (" vs ".join(p.name for p in dirs) if dirs and len(runs) == len(dirs)
                             else ", ".join(r.label for r in runs))
    written = html_report.write(runs, out, title, flag="--out")
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
    """The results block on stdout, or written into / checked against a file (``--write``,
    ``--check``). A label that breaks the measured cap (hard, yet passed unaided) is one line
    each on stderr; with ``--check`` it, or a block that differs, makes the exit 1."""
    if args.write:  # before any work: a target that cannot be written costs none
        check_file_target(Path(args.write), "--write")
    specs = [_specs_dir(d) for d in args.specs] if args.specs else default_spec_dirs()
    found = results.gather(results.live_dirs(args.paths), specs)
    block = results.render_block(found)
    problems = results.disagreement_lines(found)
    if args.check and results.differs(Path(args.check), block):
        problems.insert(0, f"{args.check}: the block between {results.BEGIN} and {results.END} "
                           "is not what the runs give (make results rewrites it)")
    for line in problems:
        _err(f"rootbench: {line}")
    if args.check:
        if problems:
            return 1
        _out(results.up_to_date_line(Path(args.check)))  # a check that passed says so
        return 0
    if args.write:
        target = Path(args.write)
        atomic_write(target, results.written(target, block), "--write")
        _out(f"{target}: results written ({len(found.tiers)} scenarios, "
             f"{sum(t.tier is not Tier.UNMEASURED for t in found.tiers)} measured)")
        return 0
    _out(block.rstrip("\n"))
    return 0


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
    listed = entries()
    removed = prune(listed) if args.prune else []
    kept = [e for e in listed if e not in removed]
    # JSON holds the size as a number; a table shows it with one decimal
    size = (lambda e: round(e.size / 1e6, 1)) if args.format == "json" else (
        lambda e: f"{e.size / 1e6:.1f}")
    rows = [[e.kind, e.path.name, size(e), e.state] for e in kept]
    rows += [[e.kind, e.path.name, size(e), "removed"] for e in removed]
    _out(render_rows(["kind", "entry", "MB", "state"], rows, args.format))
    if args.format != "json":
        stale = sum(e.size for e in kept if not e.in_use)
        _out(f"\ncache: {cache_root()}")
        if removed:
            _out(f"removed {len(removed)} stale entr{'y' if len(removed) == 1 else 'ies'}, "
                 f"{sum(e.size for e in removed) / 1e6:.0f} MB freed")
        elif stale:
            _out(f"{stale / 1e6:.0f} MB stale: `rootbench cache --prune` removes it")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    problems: list[str] = []
    lines: list[str] = []
    qemu = shutil.which("qemu-system-x86_64")
    if qemu:
        lines.append(f"qemu: {qemu} ({qemu_version()})")
        usable, why = kvm_status()
        lines.append(f"accelerator: {'kvm' if usable else 'tcg'} ({why})")
    else:
        problems.append("qemu-system-x86_64 is not installed (run `make setup`)")
    for tool in ("qemu-img", "mmdebstrap", "mkfs.ext4", "ssh", "ssh-keygen"):
        if not (shutil.which(tool) or Path(f"/usr/sbin/{tool}").exists()):
            problems.append(f"{tool} is not installed (run `make setup`)")
    try:
        img = find_image(DEFAULT_IMAGE)
        lines.append(f"image {DEFAULT_IMAGE}: {img.base if img else 'not built (make image)'}")
        if img and qemu:
            snap = snapshot_dir(img, choose_accel("auto"))
            lines.append(f"snapshot: {'present' if snap.is_dir() else 'not made yet (first run makes it)'}")
    except RootbenchError as exc:
        problems.append(str(exc))
    try:
        lines.extend(describe_setup())
    except RootbenchError as exc:
        problems.append(str(exc))
    root = cache_root()
    free_gb = shutil.disk_usage(root).free / 1e9
    lines.append(f"cache: {root} ({free_gb:.1f} GB free)")
    if free_gb < 3:
        problems.append(f"less than 3 GB free under {root}")
    for line in lines:
        _out(line)
    for p in problems:
        _out(f"problem: {p}")
    if not problems:  # a check that passed says so, in one line
        _out("no problem found: this machine can run rootbench")
    return 1 if problems else 0


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
