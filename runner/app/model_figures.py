"""The model's speed figures of ``rootbench perf`` (issue #30: the model first).

A bench's wall time on a small machine is the model's, so what matters is how close the model
runs to what the CPU gives it. Every figure here is measured in one run, turn by turn
interleaved, so the machine's drifting load falls on every condition alike:

- :func:`priority_figures`: the model's tokens/s with no guest (the reference), beside an idle
  guest, beside a guest running cpu-hog's or scratch-dir-full's fault (QEMU niced), and beside
  cpu-hog's with the nice off and at nice 19 (the A/B);
- :func:`live_bench_figures`: real episodes of the default bench in the same run as a
  reference, so the in-bench tokens/s is a share of what this machine gives now;
- :func:`speculative_figures`: speculative decoding (a draft model) against plain decoding on
  the very requests a committed run recorded, replayed offline: how many replies differ, and
  the tokens/s, say whether it could be the default;
- :func:`build_figures`: the native llama-server build against the portable one;
- :func:`recorded_bench_figures`: what the committed cassettes of the default bench say of its
  throughput (episodes per hour, wall time split into model, guest and harness).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from runner.app.episodes import RunOptions, run_one
from runner.app.replay import load_replayable, replay_loaded
from runner.backends.llama import (
    DEFAULT_MODEL,
    LlamaServer,
    cached_binary,
    ensure_llama_server,
    fetch_model,
    llama_fingerprint,
    model_threads,
)
from runner.backends.openai import OpenAIModel
from runner.backends.process import guest_nice
from runner.backends.sandbox import Sandbox
from runner.core.cassette import Cassette, find_cassettes
from runner.core.errors import RootbenchError
from runner.core.model import ChatRequest
from runner.core.paths import Bundled, bundled
from runner.core.protocol import BudgetLeft, JsonProtocol, get_protocol
from runner.core.replay import ReplyCheck
from runner.core.selection import pick_ids
from runner.core.spec import Scenario, load_specs
from runner.core.throughput import (
    WallSplit,
    episodes_per_hour,
    median_or_none,
    ratio,
    recorded_rates,
    split_wall_time,
    timing_rates,
)

log = logging.getLogger("rootbench.perf")
IMAGE = "debian-12-nginx"

# A turn shaped like a bench's: the JSON protocol's system prompt and a task, an answer and an
# observation (cached after the first request, as in a bench), then a new observation of about
# the size a bench turn adds (30-70 tokens) and a reply of the JSON action's size.
_TASK = "Users report the website on this server is down. Please fix it."
_ANSWER = '{"thought": "Check whether nginx is running.", "command": "systemctl status nginx"}'
_OBSERVATION = ("exit code 3\n\u25cf nginx.service - A high performance web server and a reverse "
                "proxy server\n     Loaded: loaded (/lib/systemd/system/nginx.service; enabled)\n"
                "     Active: inactive (dead) since Sat 2026-12-05 09:{:02d}:00 UTC")
PRIORITY_MAX_TOKENS = 48  # the JSON action is ~30-40 tokens: about a second of generation
# The conditions the model is timed in. "none": no guest running (the reference); "idle": a
# restored guest doing nothing; "cpu-hog" and "scratch-dir-full": a guest after that
# scenario's setup (its fault running: cpu-hog's keeps the guest's CPU busy), QEMU niced;
# "cpu-hog-nice-off": cpu-hog's guest with QEMU at rootbench's own priority, and
# "cpu-hog-nice-19" with QEMU as far below it as nice goes (the A/B on either side).
PRIORITY_CONDITIONS = ("none", "idle", "cpu-hog", "scratch-dir-full", "cpu-hog-nice-off",
                       "cpu-hog-nice-19")
# The figures' names: busy_guest_* is cpu-hog's guest (the name the figures had when a bare
# loop stood in for cpu-hog's fault).
_LABELS = {"none": "ref", "idle": "idle_guest", "cpu-hog": "busy_guest",
           "scratch-dir-full": "scratch_guest", "cpu-hog-nice-off": "busy_guest_nice_off",
           "cpu-hog-nice-19": "busy_guest_nice_19"}

# Rounds of one turn per condition, every other round in reverse order: the machine may be
# shared, and its other load drifts; interleaved turn by turn, the drift falls on every
# condition alike. The guests not being timed are stopped (SIGSTOP) meanwhile.
PRIORITY_ROUNDS = 4
# Timed again on a llama-server with one thread fewer than the bench's (see priority_figures).
FEWER_THREADS_CONDITIONS = ("none", "cpu-hog")


def _fault_and_nice(condition: str) -> tuple[str, int | None]:
    """A condition's scenario (or "idle") and the nice its QEMU gets: ``-nice-off`` is 0,
    ``-nice-N`` is N, none the default (:func:`~runner.backends.process.guest_nice`)."""
    fault, sep, nice = condition.partition("-nice-")
    if not sep:
        return condition, None
    return fault, 0 if nice == "off" else int(nice)


def _bench_turn(endpoint: str, model: str, turn: int, max_tokens: int = PRIORITY_MAX_TOKENS
                ) -> dict[str, float]:
    """One bench-shaped turn (see :data:`_OBSERVATION`) at temperature 0 with a fixed seed;
    llama-server's own ``timings`` of it. ``turn`` changes the last message, so its tokens are
    evaluated afresh and the shared prefix comes from the cache, as in a bench."""
    proto = JsonProtocol()
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": proto.system_prompt(None, BudgetLeft(10, 600))},
        {"role": "user", "content": _TASK}, {"role": "assistant", "content": _ANSWER},
        {"role": "user", "content": _OBSERVATION.format(turn % 60) + f"\n[turn {turn}]"}]
    # the bench's own client, one attempt: a failed timed turn is an error, not a retry
    server = OpenAIModel(endpoint, model, temperature=0.0, seed=0, max_tokens=max_tokens,
                         retries=0)
    reply = server.complete(proto.decorate(ChatRequest(messages=msgs)), timeout=300)
    timings = reply.raw.get("timings") or {}
    return {k: float(timings.get(k) or 0.0) for k in ("prompt_n", "prompt_ms", "predicted_n",
                                                       "predicted_ms")}


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process, all its threads, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _scenarios(ids: Sequence[str]) -> dict[str, Scenario]:
    return {s.id: s for s in pick_ids(load_specs([bundled(Bundled.SPECS)]), list(ids))}


def _guest_for(condition: str, accel: str, stack: contextlib.ExitStack,
               faults: dict[str, Scenario]) -> Sandbox:
    """A restored guest for a condition other than "none", with its scenario's setup run (the
    fault in place, as an episode's agent finds it), stopped (SIGSTOP) until timed; continued
    again before it is torn down."""
    fault, nice = _fault_and_nice(condition)
    box = stack.enter_context(Sandbox(IMAGE, accel=accel, nice=nice))
    scenario = faults.get(fault)
    if scenario is not None:
        for command in scenario.setup:
            r = box.guest.exec(command, 120)
            if r.exit_code != 0:
                raise RootbenchError(f"{scenario.id}'s setup failed in the guest: {r.output[:160]}")
    assert box.pid is not None
    pid = box.pid
    os.kill(pid, signal.SIGSTOP)
    stack.callback(os.kill, pid, signal.SIGCONT)  # runs before the sandbox's own exit
    return box


def priority_figures(accel: str = "auto", model_name: str | None = None,
                     conditions: tuple[str, ...] = PRIORITY_CONDITIONS,
                     rounds: int = PRIORITY_ROUNDS,
                     fewer_threads: tuple[str, ...] = FEWER_THREADS_CONDITIONS) -> dict[str, Any]:
    """The model's speed with no guest running, beside an idle guest, beside guests with
    cpu-hog's and scratch-dir-full's faults (QEMU at :func:`~runner.backends.process.guest_nice`)
    and beside cpu-hog's at the model's own priority, in one run on one llama-server with the
    bench's threads.

    The no-guest figures are the reference (the server's own timings on a fixed, bench-shaped
    turn). The idle guest's ratios are over the reference; a faulty guest's are over the idle
    guest's (what the fault costs the model, as the issue measures it). ``*_cpu`` is QEMU's
    CPU time over the wall time of its turns: how much of a core the guest got beside the
    model. ``fewer_threads``: the conditions also timed on a second server with one thread
    fewer (``threadsN_*``), interleaved with the rest: llama.cpp's threads wait for each other
    at every step, so on a machine with no core to spare one thread held up by another process
    holds up all of them, and fewer threads than cores can be the faster.
    """
    name = model_name or DEFAULT_MODEL
    binary = ensure_llama_server()
    gguf = fetch_model(name)
    faults = _scenarios(sorted({_fault_and_nice(c)[0] for c in conditions} - {"none", "idle"}))
    bench_threads = model_threads()
    fewer = bench_threads - 1
    plan = [(bench_threads, c) for c in conditions]
    plan += [(fewer, c) for c in fewer_threads if fewer >= 1 and c in conditions]
    turns_of: dict[tuple[int, str], list[dict[str, float]]] = {p: [] for p in plan}
    cpu: dict[tuple[int, str], list[float]] = {p: [] for p in plan}
    counter = 0
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        servers = {t: stack.enter_context(LlamaServer(binary, gguf, Path(tmp) / f"llama{t}.log",
                                                      threads=t))
                   for t in sorted({t for t, _ in plan}, reverse=True)}
        for server in servers.values():
            _bench_turn(server.endpoint, name, -1)  # the shared prefix into the cache, not timed
        boxes = {c: _guest_for(c, accel, stack, faults) for c in conditions if c != "none"}
        for r in range(rounds):
            log.info("model speed beside each guest, round %d of %d", r + 1, rounds)
            for threads, condition in plan if r % 2 == 0 else reversed(plan):
                pid = boxes[condition].pid if condition in boxes else None
                if pid:
                    os.kill(pid, signal.SIGCONT)
                    time.sleep(0.3)  # the guest running again before the model is asked
                t0, c0 = time.monotonic(), _cpu_seconds(pid) if pid else 0.0
                counter += 1
                turns_of[threads, condition].append(
                    _bench_turn(servers[threads].endpoint, name, counter))
                if pid:
                    cpu[threads, condition].append((_cpu_seconds(pid) - c0) / (time.monotonic() - t0))
                    os.kill(pid, signal.SIGSTOP)
        nice = {c: b.info.guest_nice for c, b in boxes.items()}
    rates: dict[tuple[int, str], tuple[float | None, float | None]] = {}
    for p, t in turns_of.items():
        measured = timing_rates(t)
        rates[p] = measured.prompt_tps, measured.gen_tps
    ref_prompt, ref_gen = rates.get((bench_threads, "none"), (None, None))
    out: dict[str, Any] = {"model": name, "model_threads": bench_threads,
                           "guest_nice": nice.get("cpu-hog", guest_nice()),
                           "ref_prompt_tps": ref_prompt, "ref_gen_tps": ref_gen,
                           "priority_turns": counter}
    for (threads, condition), (prompt, gen) in rates.items():
        prefix = "" if threads == bench_threads else f"threads{threads}_"
        label = prefix + _LABELS[condition]
        out[f"{label}_prompt_tps"], out[f"{label}_gen_tps"] = prompt, gen
        if condition != "none":
            against = "none" if condition == "idle" or (threads, "idle") not in rates else "idle"
            own_prompt, own_gen = rates[threads, against]
            out[f"{label}_prompt_ratio"] = ratio(prompt, own_prompt)
            out[f"{label}_gen_ratio"] = ratio(gen, own_gen)
            out[f"{label}_cpu"] = median_or_none(cpu[threads, condition])
        if prefix:  # against the bench's own threads in the same condition
            base = rates.get((bench_threads, condition), (None, None))[1]
            out[f"{label}_gen_vs_{bench_threads}_threads"] = ratio(gen, base)
    return out


# The default bench's episodes timed live beside a reference (live_bench_figures): one whose
# guest idles while the model thinks, and the two faults the issue names.
LIVE_SCENARIOS = ("nginx-stopped", "cpu-hog", "scratch-dir-full")


def live_bench_figures(accel: str = "auto", model_name: str | None = None,
                       scenario_ids: Sequence[str] = LIVE_SCENARIOS,
                       ref_turns: int = PRIORITY_ROUNDS) -> dict[str, Any]:
    """Real episodes of the default bench (the default model, the JSON protocol, no hints,
    through the bench's own episode code), and in the same run what the CPU gives the model
    on the very same requests with nothing else running: each episode's cassette replayed
    offline against a second, otherwise idle server with the same threads (no VM, no
    harness work between the turns). ``live_bench_*_share`` is the episodes' tokens/s over
    the replay's, both llama-server's own timings: what running inside a bench costs the
    model. A fixed bench-shaped turn on that server (``live_fixed_ref_*``, as
    :func:`priority_figures` times) says how much of the gap to it is the bench's longer
    contexts rather than the bench itself (``live_replayed_gen_vs_fixed_ref``).
    ``live_bench_episodes_per_hour`` and the ``live_bench_*_part`` split its wall time into
    model, guest and harness, as :func:`recorded_bench_figures` does for committed runs."""
    name = model_name or DEFAULT_MODEL
    binary = ensure_llama_server()
    gguf = fetch_model(name)
    scenarios = _scenarios(scenario_ids)
    opts = RunOptions(accel=accel)
    protocol = get_protocol("json")
    fixed: list[dict[str, float]] = []
    cassettes: dict[str, Path] = {}
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        server = stack.enter_context(LlamaServer(binary, gguf, Path(tmp) / "bench.log"))
        reference = stack.enter_context(LlamaServer(binary, gguf, Path(tmp) / "ref.log"))
        _bench_turn(reference.endpoint, name, -1)  # the shared prefix into the cache, not timed
        fixed += [_bench_turn(reference.endpoint, name, turn) for turn in range(ref_turns)]
        model = OpenAIModel(server.endpoint, name,
                            extra_fingerprint=llama_fingerprint(server, binary, gguf))
        for sid, scenario in scenarios.items():
            log.info("a live episode of %s with %s", sid, name)
            cassettes[sid] = Path(tmp) / f"{sid}.jsonl"
            ep = run_one(scenario, model, protocol, "perf", opts, cassettes[sid])
            out[f"live_{sid}_verdict"] = ep.verdict.value
        replayed = {sid: _asked_again({"replayed": reference}, name, [path])["replayed"]
                    for sid, path in cassettes.items()}
        events = {sid: Cassette.load(path).events for sid, path in cassettes.items()}
    for sid in cassettes:
        live, again = recorded_rates(events[sid]), timing_rates(c.timings for c in replayed[sid])
        out[f"live_{sid}_gen_tps"] = live.gen_tps
        out[f"live_{sid}_gen_share"] = ratio(live.gen_tps, again.gen_tps)
    bench = recorded_rates(e for found in events.values() for e in found)
    again = timing_rates(c.timings for found in replayed.values() for c in found)
    fixed_rates = timing_rates(fixed)
    splits = [split_wall_time(found) for found in events.values()]
    shares = sum(splits, WallSplit(0.0, 0.0, 0.0)).shares()
    out.update({"live_bench_episodes": len(cassettes), "live_bench_replies": bench.replies,
                "live_bench_prompt_tps": bench.prompt_tps, "live_bench_gen_tps": bench.gen_tps,
                "live_replayed_prompt_tps": again.prompt_tps,
                "live_replayed_gen_tps": again.gen_tps,
                "live_bench_prompt_share": ratio(bench.prompt_tps, again.prompt_tps),
                "live_bench_gen_share": ratio(bench.gen_tps, again.gen_tps),
                "live_fixed_ref_prompt_tps": fixed_rates.prompt_tps,
                "live_fixed_ref_gen_tps": fixed_rates.gen_tps,
                "live_replayed_gen_vs_fixed_ref": ratio(again.gen_tps, fixed_rates.gen_tps),
                "live_bench_episodes_per_hour": episodes_per_hour(s.wall for s in splits),
                "live_bench_model_part": shares["model"],
                "live_bench_guest_part": shares["guest"],
                "live_bench_harness_part": shares["harness"]})
    return out


# Speculative decoding: the bundled 0.5B drafts for the default 1.5B (one tokenizer).
DRAFT_MODEL = "qwen2.5-coder-0.5b"
# The committed cassettes replayed against two servers (the default bench's, hint level 0, the
# first of them by name): every recorded request asked again of each.
RECORDED_CASSETTES = 5


def _unaided_cassettes(folder: Path) -> list[Cassette]:
    """The cassettes under ``folder`` recorded at hint level 0 (a default bench's), by name."""
    paths = find_cassettes([folder]) if folder.is_dir() else []
    return [c for c in (Cassette.load(p) for p in paths) if c.head.hint_level == 0]


def _default_bench_cassettes(folder: Path, count: int) -> list[Path]:
    return [c.path for c in _unaided_cassettes(folder)[:count]]


def _asked_again(servers: Mapping[str, LlamaServer], model: str, paths: Sequence[Path]
                 ) -> dict[str, list[ReplyCheck]]:
    """Each cassette replayed offline once per server, in alternating order (the machine's
    drifting load falls on both alike), every recorded request asked again of that server with
    the recording's sampling: what each said, whether it was the recorded reply, its timings."""
    checks: dict[str, list[ReplyCheck]] = {k: [] for k in servers}
    for i, path in enumerate(paths):
        rep = load_replayable(path)
        sampling = dict(rep.cassette.head.model.get("sampling") or {})
        kinds = list(servers)
        for kind in kinds if i % 2 == 0 else kinds[::-1]:
            log.info("replaying %s against the %s server", path.name, kind)
            live = OpenAIModel(servers[kind].endpoint, model,
                               temperature=float(sampling.get("temperature", 0.0)),
                               seed=int(sampling.get("seed", 0)),
                               max_tokens=int(sampling.get("max_tokens", 512)))
            checks[kind].extend(replay_loaded(rep, offline=True, live=live).reply_checks)
    return checks


def _against(checks: Mapping[str, list[ReplyCheck]], base: str, other: str) -> dict[str, Any]:
    """``other``'s figures beside ``base``'s, on the same recorded requests: tokens/s, their
    ratios, how many replies each gave as recorded, and how many turns the two differ in (a
    turn one was asked and the other not counts as differing too)."""
    a, b = checks[base], checks[other]
    ra, rb = timing_rates(c.timings for c in a), timing_rates(c.timings for c in b)
    return {f"{other}_turns": len(b),
            f"{base}_same_as_recorded": sum(c.same for c in a),
            f"{other}_same_as_recorded": sum(c.same for c in b),
            f"{other}_differing_turns": abs(len(a) - len(b)) + sum(
                x.reply != y.reply for x, y in zip(a, b, strict=False)),
            f"{base}_prompt_tps": ra.prompt_tps, f"{base}_gen_tps": ra.gen_tps,
            f"{other}_prompt_tps": rb.prompt_tps, f"{other}_gen_tps": rb.gen_tps,
            f"{other}_prompt_ratio": ratio(rb.prompt_tps, ra.prompt_tps),
            f"{other}_gen_ratio": ratio(rb.gen_tps, ra.gen_tps)}


def speculative_figures(model_name: str | None = None, draft_name: str = DRAFT_MODEL,
                        count: int = RECORDED_CASSETTES,
                        folder: Path | None = None) -> dict[str, Any]:
    """Speculative decoding against plain decoding, on the very requests the default bench's
    committed run made: ``count`` cassettes replayed offline (their requests rebuilt exactly,
    digests checked) against a plain llama-server and one with ``draft_name`` as its draft.
    ``speculative_differing_turns`` must be 0 for the draft to be only about speed (its target
    in perf); measured, it is not: a batch of drafted tokens is checked with other arithmetic
    than one token at a time, which can tip a near-tie at temperature 0. The tokens/s are the
    servers' own timings of those turns."""
    name = model_name or DEFAULT_MODEL
    binary = ensure_llama_server()
    gguf, draft = fetch_model(name), fetch_model(draft_name)
    paths = _default_bench_cassettes(folder or BENCH_RECORDINGS, count)
    if not paths:
        return {"speculative_note": f"no hint-level-0 cassettes under {folder or BENCH_RECORDINGS}"}
    with tempfile.TemporaryDirectory() as tmp, \
            LlamaServer(binary, gguf, Path(tmp) / "plain.log") as plain, \
            LlamaServer(binary, gguf, Path(tmp) / "draft.log", draft=draft) as speculative:
        checks = _asked_again({"plain": plain, "speculative": speculative}, name, paths)
    spec = checks["speculative"]
    drafted = sum(float(c.timings.get("draft_n") or 0) for c in spec)
    accepted = sum(float(c.timings.get("draft_n_accepted") or 0) for c in spec)
    return {"speculative_draft": draft_name, "speculative_draft_max": speculative.draft_max,
            "speculative_cassettes": len(paths), **_against(checks, "plain", "speculative"),
            "speculative_acceptance": round(accepted / drafted, 3) if drafted else None}


def build_figures(model_name: str | None = None, count: int = RECORDED_CASSETTES,
                  folder: Path | None = None) -> dict[str, Any]:
    """The native llama-server build (``ROOTBENCH_LLAMA_NATIVE=1``, this CPU's own
    instructions) against the portable one, the bench's threads, on the requests of ``count``
    committed cassettes of the default bench (as :func:`speculative_figures`): its speed, and
    whether it gives the recorded replies (the recording was made with the portable build;
    another instruction set may round differently and pick another token at temperature 0).
    Measured only when the native build is in the cache (perf never starts a build)."""
    native = cached_binary(native=True)
    if not native.is_file():
        return {"native_note": "no native llama-server build in the cache "
                               "(ROOTBENCH_LLAMA_NATIVE=1 rootbench model setup builds it)"}
    name = model_name or DEFAULT_MODEL
    gguf = fetch_model(name)
    paths = _default_bench_cassettes(folder or BENCH_RECORDINGS, count)
    if not paths:
        return {"native_note": f"no hint-level-0 cassettes under {folder or BENCH_RECORDINGS}"}
    with tempfile.TemporaryDirectory() as tmp, \
            LlamaServer(ensure_llama_server(native=False), gguf, Path(tmp) / "portable.log") as portable, \
            LlamaServer(native, gguf, Path(tmp) / "native.log") as native_server:
        checks = _asked_again({"portable": portable, "native": native_server}, name, paths)
    return {"native_cassettes": len(paths), **_against(checks, "portable", "native")}


# The default ``make bench``: the default model, its default protocol, no hints.
BENCH_RECORDINGS = Path("recordings") / "live" / f"{DEFAULT_MODEL}-json"


def recorded_bench_figures(folder: Path = BENCH_RECORDINGS) -> dict[str, Any]:
    """What the default bench's committed live cassettes (hint level 0) say of its
    throughput: episodes per hour one at a time, the split of its wall time into model, guest
    and harness, and the model's tokens/s as llama-server timed them during the bench."""
    cassettes = _unaided_cassettes(folder)
    if not cassettes:
        return {"bench_note": f"no hint-level-0 cassettes under {folder}"}
    splits = [split_wall_time(c.events) for c in cassettes]
    total = sum(splits, WallSplit(0.0, 0.0, 0.0))
    shares = total.shares()
    rates = recorded_rates(e for c in cassettes for e in c.events)
    # Episode by episode: how far the model's speed moved within one bench (the machine's
    # other load moves it; see priority_figures on threads).
    per_episode = [g for g in (recorded_rates(c.events).gen_tps for c in cassettes) if g is not None]
    return {"bench_episodes": len(cassettes),
            "bench_gen_tps_range": [min(per_episode), max(per_episode)] if per_episode else None,
            "bench_episodes_per_hour": episodes_per_hour(s.wall for s in splits),
            "bench_wall_s": round(total.wall, 1),
            "bench_model_share": shares["model"], "bench_guest_share": shares["guest"],
            "bench_harness_share": shares["harness"],
            "bench_prompt_tps": rates.prompt_tps, "bench_gen_tps": rates.gen_tps}
