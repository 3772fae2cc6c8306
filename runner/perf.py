"""Speed figures (``rootbench perf``): measured, printed, never asserted by tests.

All VM figures come from one run on one machine, so the cold-boot to
restore ratio is honest. Model figures use the default model through the
same llama-server path a bench uses.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.errors import RootbenchError

Progress = Callable[[str], None]
IMAGE = "debian-12-nginx"
TARGETS = {  # key: (limit, "max"|"min"), from the issues
    "restore_ready_s": (1.0, "max"), "overlay_create_ms": (50.0, "max"),
    "command_rtt_ms": (10.0, "max"), "replay_offline_s": (5.0, "max"),
    "turn_overhead_ms": (5.0, "max"),
}


def _overlay_ms(progress: Progress) -> float:
    from runner.images import ensure_image
    from runner.vm import _overlay

    image = ensure_image(IMAGE, progress)
    times = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(7):
            t0 = time.monotonic()
            _overlay(image.base, Path(d) / f"o{i}.qcow2")
            times.append((time.monotonic() - t0) * 1000)
    return round(statistics.median(times), 1)


def _vm_figures(accel: str, progress: Progress) -> dict[str, Any]:
    from runner.vm import Sandbox

    out: dict[str, Any] = {"overlay_create_ms": _overlay_ms(progress)}
    progress("[perf] cold boot (no snapshot)")
    with Sandbox(IMAGE, accel=accel, snapshot=False, progress=progress) as box:
        out["cold_boot_s"] = round(box.shell_s, 2)
        out["accel"] = box.info["accel"]
    progress("[perf] snapshot restores")
    ready = []
    for _ in range(3):
        with Sandbox(IMAGE, accel=accel, progress=progress) as box:
            ready.append(box.shell_s)
            if not box.info["restored"]:
                out["restore_note"] = "restore failed; cold boot used"
            rtt = []
            for _ in range(20):
                t0 = time.monotonic()
                box.guest.exec("true", 10)
                rtt.append((time.monotonic() - t0) * 1000)
    out["restore_ready_s"] = round(statistics.median(ready), 3)
    out["command_rtt_ms"] = round(statistics.median(rtt), 1)
    return out


def _replay_figures(progress: Progress) -> dict[str, Any]:
    from runner.bench import replay_one
    from runner.cassette import find_cassettes
    from runner.paths import repo_root

    paths = find_cassettes([repo_root() / "recordings"])
    if not paths:
        return {"replay_offline_s": None, "turn_overhead_ms": None, "replay_cassettes": 0}
    t0 = time.monotonic()
    turns = 0
    for p in paths:
        o = replay_one(p, offline=True, progress=lambda _m: None)
        turns += max(o.turns, 1)
    total = time.monotonic() - t0
    return {"replay_offline_s": round(total, 3), "replay_cassettes": len(paths),
            "turn_overhead_ms": round(total * 1000 / turns, 3)}


def _model_figures(model_name: str | None, progress: Progress) -> dict[str, Any]:
    from runner.llama import measure_speed

    return measure_speed(model_name, progress)


def measure(*, vm: bool = True, model: bool = True, accel: str = "auto",
            model_name: str | None = None, progress: Progress = lambda _m: None) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    figures.update(_replay_figures(progress))
    if vm:
        figures.update(_vm_figures(accel, progress))
    if model:
        try:
            figures.update(_model_figures(model_name, progress))
        except (RootbenchError, ImportError) as exc:
            figures["model_note"] = f"model figures skipped: {str(exc).splitlines()[0][:160]}"
    return figures


def render(figures: dict[str, Any]) -> str:
    lines = []
    for key in sorted(figures):
        value = figures[key]
        target = TARGETS.get(key)
        note = ""
        if target and isinstance(value, int | float):
            limit, kind = target
            ok = value <= limit if kind == "max" else value >= limit
            note = f"  (target {'<=' if kind == 'max' else '>='} {limit}: {'ok' if ok else 'MISSED'})"
        lines.append(f"{key:>20}: {value}{note}")
    return "\n".join(lines)
