"""Hostile model servers and bench flags (issue 27, round two): no crash, no hang, no data loss.

Every model server here is a real HTTP server on loopback (tests/badserver.py);
nothing needs a VM: the episode test serves the guest from a recorded cassette.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from badserver import OK, BadServer, bad_server
from conftest import Cli, CliResult, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.backends.openai import OpenAIModel, api_url, check_endpoint, server_props
from runner.core.cassette import Cassette, CassetteWriter, UnrecordableEvent
from runner.core.errors import InvalidInput, ModelServerError
from runner.core.model import ChatRequest
from runner.core.paths import repo_root


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, BadServer]]:
    """One bad server for a property test's many examples (each sets its behaviour)."""
    with bad_server(["ok"]) as pair:
        yield pair


REQ = ChatRequest(messages=[{"role": "user", "content": "hi"}])
ORACLE = repo_root() / "recordings" / "oracle" / "rogue-port-80.jsonl"


def _one_clean_line(r: CliResult, code: int, *fragments: str) -> None:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "unexpected error" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    for fragment in fragments:
        assert fragment in r.stderr, r.stderr


# --- 1. endpoint URLs ----------------------------------------------------------------------------

@pytest.mark.parametrize("endpoint", ["http://[::1", "http://[::1]:99999", "http://h:0",
                                      "http://h:-1", "http://host#frag", "http:// host",
                                      "http://[zz]/"])
def test_broken_endpoint_urls_are_one_line(endpoint: str) -> None:
    with pytest.raises(InvalidInput) as info:
        check_endpoint(endpoint)
    assert str(info.value).startswith("--endpoint: ") and "\n" not in str(info.value)


def test_broken_endpoint_url_on_the_command_line(cli: Cli, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    r = cli("bench", "--runs-dir", str(runs), "--endpoint", "http://[::1")
    _one_clean_line(r, 2, "--endpoint")
    assert not runs.exists()


_segment = st.text(st.characters(whitelist_categories=("Ll", "Nd"), whitelist_characters="-_."),
                   min_size=1, max_size=8).filter(lambda s: s not in (".", ".."))
_query = st.lists(st.tuples(st.text("abcxyz", min_size=1, max_size=5),
                            st.text("abc019=/?", max_size=8)), max_size=3)


@settings(max_examples=200, deadline=None)
@given(host=st.sampled_from(["127.0.0.1", "localhost", "[::1]", "api.example.com"]),
       port=st.none() | st.integers(1, 65535), path=st.lists(_segment, max_size=3),
       v1=st.booleans(), slash=st.booleans(), query=_query)
def test_api_path_goes_before_the_query(host: str, port: int | None, path: list[str], v1: bool,
                                        slash: bool, query: list[tuple[str, str]]) -> None:
    base = "/".join(["", *path, *(["v1"] if v1 else [])]) + ("/" if slash else "")
    qs = "&".join(f"{k}={v}" for k, v in query)
    endpoint = f"http://{host}{f':{port}' if port else ''}{base}{f'?{qs}' if qs else ''}"
    check_endpoint(endpoint)
    model = OpenAIModel(endpoint, "m")
    for api in ("v1/chat/completions", "props"):
        url = urlsplit(api_url(model.endpoint, api))
        given_ = urlsplit(endpoint)
        assert url.netloc == given_.netloc and url.query == given_.query
        assert url.path == "/".join(["", *path, api]), (endpoint, url)
    assert "?" not in json.dumps(model.fingerprint()), "the query (a key, maybe) is not recorded"


def test_the_server_sees_the_api_path_and_the_query() -> None:
    with bad_server(["ok"]) as (url, state):
        OpenAIModel(f"{url}/prefix/v1/?api-version=2024&key=k", "m").complete(REQ, 10)
        server_props(f"{url}/prefix?key=k", timeout=5)
    assert state.paths == ["/prefix/v1/chat/completions?api-version=2024&key=k",
                           "/prefix/props?key=k"]


# --- 2. /props of any JSON shape -----------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(body=st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                         lambda inner: st.lists(inner, max_size=3)
                         | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                         max_leaves=8).map(json.dumps)
       | st.sampled_from(["[1, 2]", "not json", "", "NaN", '{"total_slots": "x"}', "1" * 5000]))
def test_props_of_any_shape_is_a_dict(body: str, server: tuple[str, BadServer]) -> None:
    url, state = server
    state.props = body
    props = server_props(url, timeout=5)
    assert isinstance(props, dict)
    model = OpenAIModel(url, "m")
    assert model.template_supports_tools() in (True, False, None)


def test_jobs_auto_sizing_reads_props_of_any_shape(server: tuple[str, BadServer]) -> None:
    """``--jobs auto --endpoint`` sizes itself from /props; a list there is "the server does not
    say", not a crash."""
    from runner.app.agents import AgentChoice
    from runner.app.bench_setup import server_slots

    url, state = server
    for body, slots in (("[1, 2, 3]", None), ('{"total_slots": 4}', 4), ("7", None),
                        ('{"total_slots": true}', None), ('{"total_slots": 1e999}', None),
                        ('{"total_slots": [2]}', None), ("drip", None)):
        state.props = body
        assert server_slots([AgentChoice(endpoint=url)]) == slots, body


# --- 3. malformed usage: infra-error, nothing lost, no NaN in a cassette -------------------------

def _reply_with_usage(value: str) -> str:
    body = json.dumps(OK)
    return body.replace('"prompt_tokens": 10', f'"prompt_tokens": {value}')


HOSTILE_USAGE = ["NaN", "Infinity", "-Infinity", "1e400", "-5", '"12"', "1.5", "true",
                 "1" * 5000, str(2 ** 70), "[]"]


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.sampled_from(HOSTILE_USAGE) | st.integers().map(str)
       | st.floats(allow_nan=True, allow_infinity=True).map(
           lambda f: "NaN" if math.isnan(f) else "Infinity" if f == math.inf
           else "-Infinity" if f == -math.inf else repr(f))
       | st.text(max_size=6).map(json.dumps))
def test_usage_is_a_count_or_the_reply_is_refused(value: str, server: tuple[str, BadServer],
                                                  tmp_path: Path) -> None:
    """Whatever number (or not) a server puts in usage: a clean count in the reply, or one line."""
    url, state = server
    state.script = [f"raw:{_reply_with_usage(value)}"]
    try:
        reply = OpenAIModel(url, "m", retries=0).complete(REQ, 10)
    except ModelServerError as exc:
        assert "\n" not in str(exc) and ("prompt_tokens" in str(exc) or "JSON" in str(exc))
        assert len(str(exc)) < 300
        return
    tokens = reply.usage["prompt_tokens"]
    assert isinstance(tokens, int) and 0 <= tokens <= 2 ** 53
    path = tmp_path / "c.jsonl"
    with CassetteWriter(path) as w:  # what a recording writes, strict JSON read back
        w.write({"type": "header", "format": 1})
        w.write({"type": "x", "raw": reply.raw, "usage": reply.usage})
    json.loads(path.read_text().splitlines()[1], parse_constant=lambda c: pytest.fail(c))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 10 ** 5000],
                         ids=["nan", "inf", "-inf", "5000-digits"])
def test_the_cassette_writer_refuses_what_json_cannot_hold(bad: float, tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    with CassetteWriter(path) as w:
        w.write({"type": "header", "format": 1, "scenario": {}})
        with pytest.raises(UnrecordableEvent, match="'model' event was not recorded"):
            w.write({"type": "model", "usage": {"prompt_tokens": bad}})
        w.write({"type": "verdict", "verdict": "infra-error"})
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line) for line in lines)


@pytest.mark.parametrize("value", ["NaN", "-5", "1" * 5000, '"12"'],
                         ids=["nan", "negative", "5000-digits", "string"])
def test_malformed_usage_ends_the_episode_infra_error_and_keeps_the_cassette(
        value: str, tmp_path: Path) -> None:
    """An episode on a recorded guest (no VM) whose model server sends broken usage."""
    from runner.app.replay import load_replayable, replay_one
    from runner.core.clock import Clock
    from runner.core.episode import run_episode
    from runner.core.protocol import get_protocol
    from runner.core.recording import RecordingGuest, RecordingModel
    from runner.core.replay import ReplayGuest

    rep = load_replayable(ORACLE)
    path = tmp_path / "c.jsonl"
    with bad_server([f"raw:{_reply_with_usage(value)}"]) as (url, _state), \
            CassetteWriter(path) as writer:
        model = OpenAIModel(url, "m", retries=0)
        writer.write({"type": "header", "format": 1, "model": model.fingerprint(),
                      "scenario": rep.cassette.header["scenario"],
                      "spec_hash": rep.cassette.header.get("spec_hash"),
                      "protocol": {"name": "json"}, "track_fix": False,
                      "rules": int(rep.rules)})
        ep = run_episode(rep.scenario, RecordingGuest(ReplayGuest(rep.cassette), writer),
                         RecordingModel(model, writer),
                         get_protocol("json"), Clock(writer), writer, rules=rep.rules)
    assert ep.verdict == "infra-error" and "not JSON" in ep.reason or "prompt_tokens" in ep.reason
    assert "\n" not in ep.reason
    assert not path.with_name(path.name + ".partial").exists()
    cas = Cassette.load(path)  # strict: NaN would be refused here
    assert [e["type"] for e in cas.events].count("model-error") == 1
    assert cas.verdict is not None and cas.verdict["verdict"] == "infra-error"
    again = replay_one(path, offline=True)
    assert again.same, again


def test_count_usage_ignores_what_is_not_a_count() -> None:
    """A hand-edited cassette replayed with broken usage must not reach the verdict line."""
    from runner.core.episode import Episode, _Loop
    from runner.core.outcomes import AgentKind

    ep = Episode(scenario="s", agent=AgentKind.MODEL, model="m", protocol="json")
    loop = _Loop.__new__(_Loop)
    loop.ep = ep
    for usage in ({"prompt_tokens": math.nan}, {"prompt_tokens": -4}, {"prompt_tokens": "7"},
                  {"prompt_tokens": 10 ** 5000}, {"prompt_ms": math.inf}, {"prompt_tokens": True},
                  {"prompt_tokens": 3, "completion_tokens": 2, "prompt_ms": 1.5}):
        loop._count_usage(usage)
    assert (ep.tokens_in, ep.tokens_out, ep.prompt_ms) == (3, 2, 1.5)


# --- 4. one deadline for a whole reply -----------------------------------------------------------

@pytest.mark.parametrize("behaviour", ["drip-body", "drip-headers", "endless", "stall"])
def test_a_reply_is_bounded_by_one_deadline(behaviour: str) -> None:
    with bad_server([behaviour]) as (url, _state):
        t0 = time.monotonic()
        with pytest.raises(ModelServerError) as info:
            OpenAIModel(url, "m", retries=3).complete(REQ, 3)
        took = time.monotonic() - t0
    assert took < 4.5, f"{behaviour}: {took:.1f}s for a 3 s deadline"
    assert "\n" not in str(info.value) and info.value.out_of_time


def test_props_that_drip_is_bounded_too() -> None:
    with bad_server(["ok"]) as (url, state):
        state.props = "drip"
        t0 = time.monotonic()
        assert server_props(url, timeout=2) == {}
        assert time.monotonic() - t0 < 3.5


# --- 5. --resume holds to its run ----------------------------------------------------------------

THREE = ["rogue-port-80", "permission-403", "nginx-stopped"]


@pytest.fixture(scope="module")
def oracle_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(run directory, recordings) of a 3-scenario oracle bench, served from the recordings:
    no VM. The recordings hold every spec's cassette, so a resume that grew the run to every
    spec would replay them all (and be seen to)."""
    base = tmp_path_factory.mktemp("oracle-run")
    rec = base / "rec"
    shutil.copytree(ORACLE.parent, rec)
    r = run_cli("bench", "--agent", "oracle", "--only", *THREE, "--record-to", str(rec),
                "--record-mode", "once", "--runs-dir", str(base / "runs"), "--format", "json")
    assert r.returncode == 0, r.stderr[-2000:]
    [run] = (base / "runs").iterdir()
    return run, rec


def _episodes(run: Path) -> list[str]:
    return sorted(e["scenario"] for e in json.loads((run / "results.json").read_text())["episodes"])


def test_resume_keeps_the_runs_own_scenarios(cli: Cli, oracle_run: tuple[Path, Path]) -> None:
    run, rec = oracle_run
    r = cli("bench", "--agent", "oracle", "--resume", str(run), "--record-to", str(rec),
            "--record-mode", "once")
    assert r.returncode == 0, r.stderr[-2000:]
    assert _episodes(run) == sorted(THREE)
    assert len(json.loads((run / "run.json").read_text())["scenarios"]) == 3


@pytest.mark.parametrize("selection", [["--only", "rogue-port-80"],
                                       ["--only", *THREE, "cpu-hog"],
                                       ["specs/cpu-hog.yaml"]])
def test_resume_with_another_selection_is_refused(cli: Cli, oracle_run: tuple[Path, Path],
                                                   selection: list[str]) -> None:
    run, rec = oracle_run
    r = cli("bench", *selection, "--agent", "oracle", "--resume", str(run), "--record-to",
            str(rec), "--record-mode", "once")
    _one_clean_line(r, 2, "run.json", "scenarios", "3 scenario(s)")
    assert _episodes(run) == sorted(THREE)


@pytest.mark.parametrize("flags,field", [
    (["--agent", "noop"], "agent.kind"),
    (["--agent", "oracle", "--protocol", "text"], "options.protocol"),
    (["--agent", "oracle", "--hints", "1"], "options.hints"),
    (["--agent", "oracle", "--no-track-fix"], "options.track_fix"),
])
def test_resume_with_another_agent_is_refused(cli: Cli, oracle_run: tuple[Path, Path],
                                              flags: list[str], field: str) -> None:
    run, rec = oracle_run
    before = (run / "results.json").read_bytes()
    r = cli("bench", *flags, "--resume", str(run), "--record-to", str(rec),
            "--record-mode", "once")
    _one_clean_line(r, 2, field)
    assert (run / "results.json").read_bytes() == before


def test_resume_of_a_model_run_with_the_oracle_or_another_server_is_refused(
        cli: Cli, oracle_run: tuple[Path, Path], tmp_path: Path,
        server: tuple[str, BadServer]) -> None:
    """run.json of a model run (as a user may hand over): --agent oracle, or another endpoint."""
    run, rec = oracle_run
    model_run = tmp_path / "model-run"
    shutil.copytree(run, model_run)
    info = json.loads((model_run / "run.json").read_text())
    info["agent"].update(kind="model", endpoint="http://127.0.0.1:1", model="m")
    (model_run / "run.json").write_text(json.dumps(info))
    r = cli("bench", "--agent", "oracle", "--resume", str(model_run))
    _one_clean_line(r, 2, "agent.kind", "'model'")
    r = cli("bench", "--endpoint", server[0], "--model", "m", "--resume", str(model_run))
    _one_clean_line(r, 2, "agent.endpoint", "http://127.0.0.1:1")


# --- 6. every path written is checked before any work --------------------------------------------

SPEC = str(repo_root() / "specs" / "rogue-port-80.yaml")


@pytest.mark.parametrize("flag", ["--record-to", "--runs-dir"])
@pytest.mark.parametrize("where", ["file", "under-file", "proc"])
def test_unwritable_paths_are_refused_before_any_work(cli: Cli, flag: str, where: str,
                                                       tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    bad = {"file": a_file, "under-file": a_file / "sub" / "dir", "proc": Path("/proc/rootbench")}
    runs = tmp_path / "runs"
    args = {"--runs-dir": str(runs), flag: str(bad[where])}
    t0 = time.monotonic()
    r = cli("run", SPEC, "--agent", "oracle", "--record-mode", "all",
            *[x for kv in args.items() for x in kv], timeout=60)
    _one_clean_line(r, 2, flag)
    assert time.monotonic() - t0 < 30, "refused before any VM"
    assert not runs.exists()


def test_record_mode_once_to_an_unwritable_path_runs_nothing(cli: Cli, tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    r = cli("run", SPEC, "--agent", "oracle", "--record-mode", "once", "--record-to",
            str(a_file), "--runs-dir", str(tmp_path / "runs"), timeout=60)
    _one_clean_line(r, 2, "--record-to", "not a directory")
    assert not (tmp_path / "runs").exists()


# --- 7. flags checked first ----------------------------------------------------------------------

def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_endpoint_is_refused_before_any_vm(cli: Cli, tmp_path: Path) -> None:
    t0 = time.monotonic()
    r = cli("run", SPEC, "--endpoint", f"http://127.0.0.1:{_closed_port()}", "--model", "m",
            "--runs-dir", str(tmp_path / "runs"), timeout=60)
    _one_clean_line(r, 2, "--endpoint", "nothing answers")
    assert time.monotonic() - t0 < 20 and not (tmp_path / "runs").exists()


def test_an_endpoint_that_accepts_but_never_answers_is_refused_in_seconds(cli: Cli,
                                                                          tmp_path: Path) -> None:
    with socket.socket() as listener:  # connections queue in the backlog; nobody ever answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        t0 = time.monotonic()
        r = cli("run", SPEC, "--endpoint", f"http://127.0.0.1:{listener.getsockname()[1]}",
                "--model", "m", "--runs-dir", str(tmp_path / "runs"), timeout=60)
    _one_clean_line(r, 2, "--endpoint", "within 5s")
    assert time.monotonic() - t0 < 20 and not (tmp_path / "runs").exists()


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(-(2 ** 70), 2 ** 70) | st.sampled_from([-1, 0, 2 ** 32 - 2, 2 ** 32 - 1,
                                                                2 ** 32, 2 ** 63]),
       repeat=st.integers(1, 5))
def test_seed_is_range_checked(seed: int, repeat: int) -> None:
    from runner.app.bench_setup import BenchFlags, agent_choices

    flags = BenchFlags(agent="oracle", seed=seed, repeat=repeat)
    ok = 0 <= seed and seed + repeat - 1 <= 2 ** 32 - 2
    try:
        agent_choices(flags)
    except InvalidInput as exc:
        assert not ok and str(exc).startswith("--seed: ") and "4294967294" in str(exc)
        assert "\n" not in str(exc)
    else:
        assert ok


def test_a_refused_record_mode_none_leaves_no_run_directory(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    r = cli("bench", "--agent", "oracle", "--only", "rogue-port-80", "--record-to",
            str(tmp_path / "empty"), "--record-mode", "none", "--runs-dir",
            str(tmp_path / "runs"))
    _one_clean_line(r, 2, "--record-mode", "missing: rogue-port-80")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("script,fragments", [
    ("#!/bin/sh\nexit 1\n", ["(code 1)", "without writing a line"]),
    ("#!/bin/sh\necho 'loading model' >&2\necho 'error: failed to load model' >&2\nexit 3\n",
     ["(code 3)", "error: failed to load model", "loading model"]),
    ("#!/bin/sh\nkill -9 $$\n", ["signal 9"]),
])
def test_a_llama_server_that_exits_at_start_says_how(script: str, fragments: list[str],
                                                     tmp_path: Path) -> None:
    from runner.backends.llama import LlamaServer
    from runner.core.errors import InfraError

    binary = tmp_path / "llama-server"
    binary.write_text(script)
    binary.chmod(0o755)
    log = tmp_path / "logs" / "llama-server.log"
    log.parent.mkdir()
    log.write_text("an older run's line\n")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    with pytest.raises(InfraError) as info:
        LlamaServer(binary, model, log).start()
    text = str(info.value)
    assert "\n" not in text and all(f in text for f in fragments), text
    assert "older run" not in text and str(log) in text


def test_bin_false_as_llama_server() -> None:
    from runner.backends.llama import exit_detail

    assert "without writing a line" in exit_detail(1, Path("/nonexistent/log"))


# --- 8. every file a run writes gets the same mode -----------------------------------------------

@pytest.mark.parametrize("umask", [0o022, 0o027], ids=["022", "027"])
def test_every_file_a_run_writes_respects_the_umask(cli: Cli, umask: int, tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    shutil.copytree(ORACLE.parent, rec)
    before = os.umask(umask)  # this process's, for the one command: workers inherit it
    try:
        r = cli("bench", "--agent", "oracle", "--only", "rogue-port-80", "--record-to", str(rec),
                "--record-mode", "once", "--runs-dir", str(tmp_path / "runs"))
    finally:
        os.umask(before)
    assert r.returncode == 0, r.stderr[-2000:]
    [run] = (tmp_path / "runs").iterdir()
    files = [p for p in run.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"run.json", "results.json", "results.xml", "report.html",
            "rogue-port-80.r0.jsonl"} <= names, names
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in files}
    assert set(modes.values()) == {oct(0o666 & ~umask)}, modes
