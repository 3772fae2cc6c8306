"""How ``rootbench perf`` prints its figures: a missed target names the floor it measured."""

from __future__ import annotations

from runner.app.perf import FLOORS, TARGETS, render


def test_a_missed_target_names_its_floor_with_the_measured_figures() -> None:
    text = render({"restore_floor_ratio": 2.4, "restore_qemu_floor_ratio": 1.3,
                   "restore_qemu_s": 0.074, "restore_wake_s": 0.061})
    lines = text.splitlines()
    target = next(i for i, x in enumerate(lines) if x.strip().startswith("restore_floor_ratio:"))
    assert "MISSED" in lines[target]
    floor = lines[target + 1]  # right under the target it explains
    assert "floor: QEMU's own side of the restore is 1.3x the floor (0.074 s)" in floor
    assert "0.061 s, is the woken guest's first answer" in floor


def test_a_met_target_or_a_floor_without_its_figures_prints_no_floor() -> None:
    assert "floor:" not in render({"restore_floor_ratio": 1.5, "restore_qemu_floor_ratio": 1.3,
                                   "restore_qemu_s": 0.074, "restore_wake_s": 0.061})
    # Missed, but the figures that would explain it were not measured (e.g. --no-verify).
    text = render({"verify_per_scenario_s": 20.0})
    assert "MISSED" in text and "floor:" not in text


def test_every_floor_explains_a_target() -> None:
    assert set(FLOORS) <= set(TARGETS)


def test_the_names_line_up_however_long() -> None:
    lines = render({"a": 1, "busy_guest_gen_ratio_threads1_nice_off": 0.5, "restore_ready_s": 0.2}).splitlines()
    assert len({line.index(":") for line in lines}) == 1, lines
