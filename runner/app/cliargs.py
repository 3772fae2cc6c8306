"""The command line's grammar: every command of ``rootbench``, its flags, their help and defaults.

Kept apart from :mod:`runner.app.cli`, which only dispatches what was parsed to
the app, so the ~300 lines of help text do not bury the commands. Argument
groups shared by several commands (an agent, a VM, a scenario selection) are
one function each here, so one flag reads the same wherever it is offered.
"""

from __future__ import annotations

import argparse

from runner import __version__
from runner.app import atif
from runner.app.cliparse import Parser
from runner.app.doctor import DEFAULT_IMAGE
from runner.app.executors import EXECUTORS
from runner.app.ray_executor import JOIN_TIMEOUT
from runner.app.report import FORMATS
from runner.backends.llama import DEFAULT_CTX_SIZE, DEFAULT_MODEL
from runner.core.cassette import RecordMode
from runner.core.protocol import CHOICES

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
    p.add_argument("--executor", choices=EXECUTORS.names(), default="local",
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


def build_parser() -> argparse.ArgumentParser:
    """Every command, its flags, their help and defaults: the whole grammar ``--help`` shows."""
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

    p = sub.add_parser("rejudge", help="judge recorded runs again on fresh VMs: each cassette's "
                                       "recorded actions replayed, its verdict checked")
    p.add_argument("paths", nargs="+", metavar="RUNDIR|CASSETTE",
                   help="run directories, recordings folders or cassettes")
    p.add_argument("--out", metavar="FILE",
                   help="where the record goes (default RUNDIR/rejudged.json for one run "
                        "directory, else ./rejudged.json)")
    p.add_argument("--rules", choices=("recorded", "current"), default="recorded",
                   help="judge each run by its recording's own judging rules (a claim checked), "
                        "or by today's (how many verdicts today's rules turn)")
    _jobs_arg(p, "cassettes rejudged at once, each on its own VM")
    _format_arg(p)
    _vm_args(p)

    p = sub.add_parser("view", help="an index page of every run in a folder (RUNS_DIR/index.html), "
                                    "with each run's figures and a link to its report")
    p.add_argument("runs_dir", nargs="?", default="runs", metavar="RUNS_DIR",
                   help="the folder your runs are in")
    p.add_argument("--no-reports", action="store_true",
                   help="do not write the reports that are missing or older than their results "
                        "first (their rows then have no link)")
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
