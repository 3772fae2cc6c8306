"""Every scenario proves itself on real VMs, and verify catches scenarios that do not."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from runner.core.paths import repo_root


def _verify(*args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runner", "verify", "--jobs", "2", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=repo_root())


@pytest.mark.vm
def test_the_whole_suite_is_valid(tmp_path: Path) -> None:
    r = _verify("--record-to", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    specs = sorted((repo_root() / "specs").glob("*.yaml"))
    assert f"{len(specs)}/{len(specs)} scenarios valid" in r.stdout
    assert len(list(tmp_path.glob("*.jsonl"))) == len(specs)
    # verify ends by writing an HTML report of its noop and oracle episodes
    [line] = [ln for ln in r.stderr.splitlines() if ln.startswith("[verify] report: ")]
    page = Path(line.split(": ", 1)[1]).read_text()
    assert page.count('class="episode"') == 2 * len(specs)
    assert all(spec.stem in page for spec in specs)


BROKEN = {
    "fault-does-not-land": ("setup: ['true']\nsolution: ['true']\n", "fault lands"),
    "wrong-solution": ("setup: [systemctl stop nginx]\nsolution: ['echo not a fix']\n", "oracle passes"),
    "bad-invariant": ("setup: [systemctl stop nginx]\nsolution: [systemctl start nginx]\n"
                      "invariants: [{service: {name: no-such-unit, active: true}}]\n", "baseline"),
    "invariant-needs-the-fix": ("setup: [systemctl stop nginx]\nsolution: [systemctl start nginx]\n"
                                "invariants: [{port: {port: 80}}]\n", "noop fails"),
}


@pytest.mark.vm
def test_verify_names_the_failing_check(tmp_path: Path) -> None:
    for name, (extra, _check) in BROKEN.items():
        (tmp_path / f"{name}.yaml").write_text(textwrap.dedent(f"""\
            id: {name}
            title: broken on purpose
            image: debian-12-nginx
            task: The site is down.
            probes:
              - service: {{name: nginx, active: true}}
            """) + extra)
    r = _verify(str(tmp_path), "--record-to", str(tmp_path / "rec"))
    assert r.returncode == 1, r.stdout + r.stderr[-2000:]
    for name, (_extra, check) in BROKEN.items():
        line = next(ln for ln in r.stdout.splitlines() if ln.strip().startswith(f"{name}:"))
        assert check in line, line
    assert f"0/{len(BROKEN)} scenarios valid" in r.stdout


@pytest.mark.vm
def test_repeat_runs_the_checks_again_and_agreeing_tries_are_not_flaky(tmp_path: Path) -> None:
    r = _verify(str(repo_root() / "specs" / "nginx-stopped.yaml"), "--repeat", "2",
                "--record-to", str(tmp_path), "--format", "plain")
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("nginx-stopped"))
    assert row.split()[5:7] == ["2", "no"], row  # tries, flaky
    assert "try 2 of 2" in r.stderr and len(list(tmp_path.glob("*.jsonl"))) == 1


@pytest.mark.parametrize("tries,flaky,valid", [
    ([True, True, True], False, True),
    ([True, False, True], True, False),
    ([False, False], False, False),
])
def test_tries_that_disagree_are_flaky(tries: list[bool], flaky: bool, valid: bool) -> None:
    from runner.app.verify import CHECKS, Verification, merge

    runs = [Verification("s", checks={**dict.fromkeys(CHECKS, True), "oracle passes": ok})
            for ok in tries]
    merged = merge(runs)
    assert (merged.flaky, merged.valid, merged.tries) == (flaky, valid, len(tries))
    if flaky:
        assert merged.problems[0] == f"flaky: 'oracle passes' held in {sum(tries)} of {len(tries)} tries"
