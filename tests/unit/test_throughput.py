"""Issue #30 without a VM or a model: the wall-time split and the token rates read from
cassettes, the ratios perf prints, the guest's nice value from setting to child process, and
``--jobs auto`` leaving the model its cores."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from runner.app.executors import MAX_JOBS, jobs_limits
from runner.app.model_figures import BENCH_RECORDINGS, recorded_bench_figures
from runner.app.perf import render
from runner.backends.llama import (
    DEFAULT_THREADS,
    NATIVE_ENV,
    NATIVE_OPTIONS,
    THREADS_ENV,
    LlamaServer,
    build_dir,
    cpu_flags_digest,
    model_threads,
    native_wanted,
)
from runner.backends.process import GUEST_NICE, GUEST_NICE_ENV, guest_nice, lowered
from runner.backends.sandbox import Sandbox
from runner.core.errors import InvalidInput
from runner.core.throughput import (
    TokenRates,
    WallSplit,
    episode_wall,
    episodes_per_hour,
    median_or_none,
    ratio,
    recorded_rates,
    split_wall_time,
    timing_rates,
)

REPO = Path(__file__).resolve().parents[2]


def _model(duration: float, timings: dict[str, float] | None = None) -> dict[str, Any]:
    raw: dict[str, Any] = {"choices": []}
    if timings is not None:
        raw["timings"] = timings
    return {"type": "model", "turn": 1, "reply": {"message": {}, "raw": raw, "usage": {},
                                                   "duration": duration, "attempts": []}}


def _guest(duration: object) -> dict[str, Any]:
    return {"type": "guest", "op": "exec", "input": {},
            "result": {"exit_code": 0, "output": "", "duration": duration}}


# A small hand-made episode: 20 s of phases, two model calls (6 s), three guest exchanges (4 s,
# one of them an HTTP probe that records no duration), clock readings in between.
EPISODE: list[dict[str, Any]] = [
    {"type": "header"},
    _guest(1.5), {"type": "clock", "t": 1.6},
    _model(2.5, {"prompt_n": 40, "prompt_ms": 500, "predicted_n": 30, "predicted_ms": 1000}),
    _guest(2.0), {"type": "clock", "t": 6.5},
    _model(3.5, {"prompt_n": 60, "prompt_ms": 1500, "predicted_n": 10, "predicted_ms": 1000}),
    _guest(0.5), {"type": "guest", "op": "http", "input": {}, "result": {"status": 200}},
    {"type": "verdict", "seconds": 19.0,
     "phases": {"restore": 1.0, "baseline": 1.0, "agent": 12.0, "probes": 6.0}},
]


def test_an_episode_splits_into_model_guest_and_harness() -> None:
    split = split_wall_time(EPISODE)
    assert split == WallSplit(wall=20.0, model=6.0, guest=4.0)  # phases, not `seconds`
    assert split.harness == 10.0
    assert split.shares() == {"model": 0.3, "guest": 0.2, "harness": 0.5}


def test_a_wall_time_without_phases_or_verdict() -> None:
    no_phases = [*EPISODE[:-1], {"type": "verdict", "seconds": 19.0}]
    assert episode_wall(no_phases) == 19.0
    assert split_wall_time(EPISODE[:-1]) == WallSplit(0.0, 6.0, 4.0)
    assert split_wall_time(EPISODE[:-1]).harness == 0.0  # never negative
    assert WallSplit(0.0, 0.0, 0.0).shares() == {"model": 0.0, "guest": 0.0, "harness": 0.0}


def test_hostile_durations_count_as_nothing() -> None:
    events = [_guest(float("nan")), _guest(-3.0), _guest(True), _guest("2"), _model(float("inf")),
              {"type": "verdict", "phases": {"agent": 5.0, "probes": "x"}}]
    assert split_wall_time(events) == WallSplit(5.0, 0.0, 0.0)


def test_episodes_per_hour_and_splits_add_up() -> None:
    assert episodes_per_hour([20.0, 40.0]) == 120.0
    assert episodes_per_hour([20.0, 40.0], jobs=2) == 240.0
    assert episodes_per_hour([]) is None and episodes_per_hour([0.0]) is None
    total = WallSplit(20.0, 6.0, 4.0) + WallSplit(10.0, 1.0, 1.0)
    assert total == WallSplit(30.0, 7.0, 5.0) and total.harness == 18.0


def test_token_rates_weigh_each_reply_by_its_tokens() -> None:
    rates = recorded_rates(EPISODE)
    assert rates.replies == 2
    assert rates.prompt_tps == 50.0  # 100 tokens in 2 s, not the mean of 80 and 40
    assert rates.gen_tps == 20.0  # 40 tokens in 2 s
    none = recorded_rates([_model(1.0), _guest(1.0)])
    assert none.replies == 0 and none.prompt_tps is None and none.gen_tps is None
    # perf's timed turns are the server's timings themselves: the same sums
    turns = [{"prompt_n": 80, "prompt_ms": 1000, "predicted_n": 30, "predicted_ms": 1500},
             {"prompt_n": 20, "prompt_ms": 1000, "predicted_n": 10, "predicted_ms": 500}]
    assert timing_rates(turns) == TokenRates(50.0, 20.0, 2)


def test_ratios_are_none_when_a_side_is_missing() -> None:
    assert ratio(27.0, 30.0) == 0.9 and ratio(1.0, 3.0, 3) == 0.333
    assert ratio(None, 3.0) is None and ratio(3.0, None) is None and ratio(3.0, 0.0) is None
    assert median_or_none([None, 0.5, 0.1, 0.2]) == 0.2 and median_or_none([None]) is None


def test_the_committed_default_bench_adds_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default bench's committed live cassettes: every hint-level-0 episode, shares that
    sum to one, and token rates llama-server recorded."""
    monkeypatch.chdir(REPO)  # perf reads recordings/ under the working directory, as `make perf` does
    figures = recorded_bench_figures()
    count = len([p for p in (REPO / BENCH_RECORDINGS).glob("*.jsonl") if ".h" not in p.name])
    assert figures["bench_episodes"] == count > 0
    shares = [figures[f"bench_{k}_share"] for k in ("model", "guest", "harness")]
    assert abs(sum(shares) - 1.0) < 0.01 and all(0 < s < 1 for s in shares)
    assert figures["bench_episodes_per_hour"] == round(count * 3600 / figures["bench_wall_s"], 1)
    assert figures["bench_prompt_tps"] > 0 and figures["bench_gen_tps"] > 0
    low, high = figures["bench_gen_tps_range"]  # the bench's rate is a weighted mean of its episodes'
    assert 0 < low <= figures["bench_gen_tps"] <= high
    assert "bench_note" in recorded_bench_figures(REPO / "no-such-folder")


def test_the_model_targets_print_ok_or_missed() -> None:
    text = render({"busy_guest_gen_ratio": 0.95, "busy_guest_prompt_ratio": 0.5,
                   "bench_gen_share": 0.5})
    assert "busy_guest_gen_ratio: 0.95  (target >= 0.9: ok" in text
    assert "busy_guest_prompt_ratio: 0.5  (target >= 0.9: MISSED" in text
    assert "bench_gen_share: 0.5\n" in text + "\n"  # across runs: printed, no target


def test_guest_nice_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert guest_nice({}) == GUEST_NICE == 10
    assert guest_nice({GUEST_NICE_ENV: " 0 "}) == 0 and guest_nice({GUEST_NICE_ENV: "19"}) == 19
    assert guest_nice({GUEST_NICE_ENV: ""}) == GUEST_NICE
    for bad in ("20", "-1", "ten", "1.5"):
        with pytest.raises(InvalidInput, match="from 0 .off. to 19") as err:
            guest_nice({GUEST_NICE_ENV: bad})
        assert err.value.field == GUEST_NICE_ENV
    monkeypatch.setenv(GUEST_NICE_ENV, "3")
    assert guest_nice() == 3 and Sandbox().nice == 3 and Sandbox(nice=0).nice == 0
    monkeypatch.setenv(GUEST_NICE_ENV, "loud")
    with pytest.raises(InvalidInput):  # refused before any VM starts
        Sandbox()


@pytest.mark.parametrize("step", [0, 4, 19])
def test_a_lowered_child_runs_that_many_levels_below_us(step: int) -> None:
    """A real child started as QEMU is: its nice is ours plus ``step``, as far as 19 allows."""
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    child = subprocess.Popen(["sleep", "30"], preexec_fn=lowered(step))
    try:
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == min(19, ours + step)
    finally:
        child.kill()
        child.wait(timeout=10)


def test_jobs_auto_leaves_the_model_its_cores() -> None:
    plenty = 64 * 1024
    assert jobs_limits(2, plenty)["cores"] == 2
    assert "cores the model leaves" not in jobs_limits(2, plenty)
    assert jobs_limits(2, plenty, model_threads=2)["cores the model leaves"] == 1  # never 0
    assert jobs_limits(8, plenty, model_threads=2)["cores the model leaves"] == 6
    limits = jobs_limits(8, 1024 + 3 * 512 + 100, reserve_mib=0, model_threads=2)
    assert limits["memory"] == 3 and min(limits.values()) == 3
    assert jobs_limits(4, plenty, server_slots=2)["the server's slots"] == 2
    assert jobs_limits(4, plenty)["the server's slots"] == MAX_JOBS


def test_a_native_build_is_keyed_by_the_cpu_flags() -> None:
    """Another CPU (another flag set, in any order) gets a build of its own; this one's key is
    stable, and the native build's folder is never the portable one's."""
    a = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f\nbugs\t\t: spectre\n"
    b = "processor\t: 0\nflags\t\t: avx512f avx2 sse2 fpu\nprocessor\t: 1\nflags\t\t: fpu\n"
    assert cpu_flags_digest(a) == cpu_flags_digest(b)  # a set: order and repeats do not count
    assert cpu_flags_digest(a) != cpu_flags_digest(a.replace(" avx512f", ""))
    assert cpu_flags_digest() == cpu_flags_digest(Path("/proc/cpuinfo").read_text())
    native = build_dir(native=True)
    assert native != build_dir() and f"-native-cpu{cpu_flags_digest()}-" in native.name
    assert NATIVE_OPTIONS[0] == "-DGGML_NATIVE=ON" and "-DGGML_AVX2=ON" not in NATIVE_OPTIONS
    assert native_wanted({NATIVE_ENV: "1"}) and native_wanted({NATIVE_ENV: " Yes"})
    assert not native_wanted({}) and not native_wanted({NATIVE_ENV: "0"})


def test_the_model_threads_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert model_threads({}) == DEFAULT_THREADS == 2 and model_threads({THREADS_ENV: "1"}) == 1
    for bad in ("0", "257", "two", "-1"):
        with pytest.raises(InvalidInput, match="from 1 to 256") as err:
            model_threads({THREADS_ENV: bad})
        assert err.value.field == THREADS_ENV
    monkeypatch.setenv(THREADS_ENV, "1")
    server = LlamaServer(Path("llama-server"), Path("m.gguf"), Path("log"))
    assert server.threads == 1  # what every llama-server rootbench starts is given (-t)
    assert LlamaServer(Path("llama-server"), Path("m.gguf"), Path("log"), threads=3).threads == 3
