"""Inspect AI's rootbench sandbox and task on real VMs: an oracle passes (and its log opens in
inspect view), a do-nothing model fails.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import quick_specs
from inspect_ai import eval as inspect_eval
from inspect_ai.log import EvalLog
from inspect_ai.model import ModelOutput, ModelUsage, get_model

from runner.app.inspect_ext import rootbench
from runner.app.replay import replay_one
from runner.backends.process import free_port
from runner.core.cassette import Cassette
from runner.core.paths import repo_root
from runner.core.spec import load_spec

ROOT = repo_root()


SCENARIO = "dir-missing-exec"


def _counted(output: ModelOutput) -> ModelOutput:
    # The mock model otherwise counts tokens with tiktoken, which fetches its tables online.
    output.usage = ModelUsage(input_tokens=10, output_tokens=5, total_tokens=15)
    return output


def _eval(tmp_path: Path, outputs: list[ModelOutput]) -> EvalLog:
    model = get_model("mockllm/model", custom_outputs=[_counted(o) for o in outputs])
    # A copy of the spec without the reboot re-check: the test is of Inspect's side.
    specs = quick_specs(tmp_path / "specs", [SCENARIO], "the Inspect sandbox")
    [log] = inspect_eval(rootbench(scenarios=SCENARIO, specs=str(specs), runs_dir=str(tmp_path / "runs")),
                         model=model, log_dir=str(tmp_path / "logs"), display="none")
    assert log.status == "success", log.error
    return log


@pytest.mark.vm
def test_the_oracle_as_bash_tool_calls_passes_and_the_log_opens_in_inspect_view(
        tmp_path: Path, image: Any) -> None:
    solution = list(load_spec(ROOT / "specs" / f"{SCENARIO}.yaml").solution)
    calls = [ModelOutput.for_tool_call("mockllm/model", "bash", {"command": c}) for c in solution]
    log = _eval(tmp_path, [*calls, ModelOutput.from_content("mockllm/model", "fixed")])
    [sample] = log.samples or []
    score = (sample.scores or {})["verdict"]
    assert score.value == {"verdict": "C", "score": 1.0} and score.answer == "pass", score
    meta = score.metadata or {}
    assert meta["stop"] == "finish" and meta["commands"] == len(solution) and meta["flags"] == []
    metrics = {s.name: s.metrics for s in log.results.scores} if log.results else {}
    assert metrics["verdict"]["accuracy"].value == 1.0
    # Inspect's own root probe is not an agent command: only the solver's reached the guest.
    cassette = Path(meta["cassette"])
    head = Cassette.load(cassette).header
    assert head["agent"] == "inspect" and head["model"]["task"] == "rootbench"
    out = replay_one(cassette, offline=True, specs=[tmp_path / "specs"])
    assert out.same and out.episode is not None and out.episode.commands == len(solution), out

    port = free_port()
    viewer = subprocess.Popen([sys.executable, "-m", "inspect_ai", "view", "--log-dir",
                               str(tmp_path / "logs"), "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                files = requests.get(f"http://127.0.0.1:{port}/api/log-files", timeout=5).json()
                break
            except requests.RequestException:
                assert time.monotonic() < deadline and viewer.poll() is None, "no viewer"
                time.sleep(0.5)
        [entry] = files["files"]
        assert entry["task"] == "rootbench" and entry["name"].endswith(Path(log.location).name)
        got = requests.get(f"http://127.0.0.1:{port}/api/logs/"
                           f"{urllib.parse.quote(entry['name'], safe='')}", timeout=30)
        assert got.status_code == 200 and got.json()["status"] == "success", got.text[:200]
    finally:
        viewer.terminate()
        viewer.wait(timeout=30)


@pytest.mark.vm
def test_a_model_that_does_nothing_fails(tmp_path: Path, image: Any) -> None:
    log = _eval(tmp_path, [ModelOutput.from_content("mockllm/model", "Looks fine to me.")])
    [sample] = log.samples or []
    score = (sample.scores or {})["verdict"]
    assert isinstance(score.value, dict)
    assert score.value["verdict"] == "I" and score.answer == "fail", score
    assert (score.metadata or {})["commands"] == 0
    assert "403" in (score.explanation or "")
