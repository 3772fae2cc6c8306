"""A live run end to end: real llama-server, real model, real VM, then replayed both ways."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from runner.app.episodes import RunOptions, run_one
from runner.app.replay import replay_one
from runner.backends.llama import LlamaServer, ensure_llama_server, fetch_model, llama_fingerprint
from runner.backends.openai import OpenAIModel
from runner.core.cassette import Cassette
from runner.core.paths import repo_root
from runner.core.protocol import get_protocol
from runner.core.spec import Budget, load_spec

pytestmark = [pytest.mark.model, pytest.mark.vm]
# The 1.5B acts on turn 1 here; the 0.5B at temperature 0 finishes at once, which would leave
# nothing executed in the guest to check.
MODEL = "qwen2.5-coder-1.5b"


def test_live_run_is_recorded_and_replays(tmp_path: Path) -> None:
    scenario = load_spec(repo_root() / "specs" / "rogue-port-80.yaml")
    scenario = dataclasses.replace(scenario, budget=Budget(turns=3, seconds=300, command_timeout=15))
    binary = ensure_llama_server()
    gguf = fetch_model(MODEL)
    cassette = tmp_path / "live.jsonl"
    with LlamaServer(binary, gguf, tmp_path / "llama.log") as server:
        model = OpenAIModel(server.endpoint, MODEL, max_tokens=200,
                            extra_fingerprint=llama_fingerprint(server, binary, gguf))
        ep = run_one(scenario, model, get_protocol("json"), "test", RunOptions(accel="auto"),
                     cassette)
    assert ep.verdict in ("pass", "fail"), ep.reason
    assert ep.turns >= 1 and ep.turns <= 3
    assert ep.commands + ep.violations >= 1 and ep.tokens_in > 0

    cas = Cassette.load(cassette)
    assert cas.header["model"]["model_sha256"].startswith("cc324af070c2")
    assert cas.header["protocol"]["name"] == "json"
    kinds = [e["type"] for e in cas.events]
    assert kinds.count("model") == ep.turns and kinds[-1] == "verdict"
    execs = [e for e in cas.events if e["type"] == "guest" and e["op"] == "exec"]
    assert len(execs) == ep.commands

    # Offline, guest and clock come from the cassette too: the very same episode, verdict included.
    offline = replay_one(cassette, offline=True)
    assert offline.same and offline.recorded.split()[0] == ep.verdict.value, offline
    assert offline.turns == ep.turns, offline
    # Online, the recorded replies drive a fresh real VM, whose PIDs and timings differ (hence
    # lenient): the run must still be scored, and every recorded model turn served, no more
    # (one more would have run the cassette dry: an infra-error) and no fewer.
    online = replay_one(cassette, offline=False, lenient=True)
    assert online.replayed.split()[0] in ("pass", "fail"), online
    assert online.turns == ep.turns, online
