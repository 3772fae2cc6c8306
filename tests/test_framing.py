"""The command framing, without a VM: what the wrapper types and how a frame is read back.

The quoting is checked against a real bash (the same shell the guest runs):
whatever the text, bash must get back exactly its bytes, and the typed line
must hold nothing a terminal or the shell's history expansion would act on.
"""

from __future__ import annotations

import base64
import shlex
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runner.backends.framing import CHUNK_BYTES, framed_lines, parse_frame, quote_bytes

TEXT = st.text(st.characters(codec="utf-8"), max_size=300) | st.sampled_from(
    ["it's", "!!", "!$ ^a^b", "a\\nb", "\\", "'\"'", "$HOME `id` $(id)", "\x03\x04\x1b[2J", "\t\n\r"])


@settings(max_examples=300, deadline=None)
@given(TEXT)
def test_a_quoted_command_reaches_bash_byte_for_byte(text: str) -> None:
    data = text.encode("utf-8", errors="surrogateescape")
    quoted = quote_bytes(data)
    assert all(0x20 <= ord(c) < 0x7F for c in quoted)
    inner = quoted[2:-1]
    assert "'" not in inner.replace("\\x27", "") and "!" not in inner
    out = subprocess.run(["bash", "--noprofile", "--norc", "-c", f"printf %s {quoted}"],
                         capture_output=True, timeout=10).stdout
    assert out == data.replace(b"\0", b"")


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=600), st.integers(1, 500), st.integers(0, 255), st.booleans())
def test_a_frame_says_whether_the_output_was_cut(body: bytes, cap: int, rc: int, fired: bool) -> None:
    frame = (b"noise RB" + b"s1:" + base64.b64encode(body[: cap + 1])
             + b":%d:%d:RBs1 tail" % (rc, fired))
    r = parse_frame(frame, "s1", 0.1, cap)
    assert r is not None
    assert r.truncated == (len(body) > cap)
    assert r.output == body[:cap].decode("utf-8", errors="replace")
    # Whether the timeout fired is the wrapper's word, not a guess from the exit code.
    assert r.timed_out == fired and r.exit_code == (None if fired else rc)
    assert parse_frame(frame, "s2", 0.1, cap) is None


def _run_locally(lines: list[str], rb: Path) -> bytes:
    """The framed lines, run by a bash here with /run/rb pointed at a temp dir."""
    script = "\n".join(lines).replace("/run/rb", str(rb)) + "\n"
    return subprocess.run(["bash", "--noprofile", "--norc", "-s"], input=script.encode(),
                          capture_output=True, timeout=20).stdout


@pytest.mark.parametrize("clean", [True, False])
def test_the_framed_lines_run_in_a_local_bash(tmp_path: Path, clean: bool) -> None:
    command = "echo hi; echo 'it''s' >&2; exit 3"
    r = parse_frame(_run_locally(framed_lines(command, 10, 100, "abc", clean), tmp_path), "abc", 0.0, 100)
    assert r is not None and r.exit_code == 3 and r.output == "hi\nits\n" and not r.truncated
    assert {p.name for p in tmp_path.iterdir()} <= {"cwd"}  # no script or output file left


def test_a_long_command_is_typed_in_short_lines_and_runs_whole(tmp_path: Path) -> None:
    payload = "é!'x\\" * 3000
    command = f"printf %s {shlex.quote(payload)} | wc -c"
    lines = framed_lines(command, 10, 1000, "s", True)
    assert len(lines) > 10 and max(map(len, lines)) < 2400
    assert all(0x20 <= ord(c) < 0x7F for line in lines for c in line)
    r = parse_frame(_run_locally(lines, tmp_path), "s", 0.0, 1000)
    assert r is not None and r.output.strip() == str(len(payload.encode()))
    assert CHUNK_BYTES * 4 + 100 < 4096


def test_the_command_is_in_no_argv(tmp_path: Path) -> None:
    """``pkill -f`` must not find the shell that runs it (a real interactive shell is not found)."""
    command = "sleep 30 & pkill -f 'sleep 30'; echo survived"
    r = parse_frame(_run_locally(framed_lines(command, 10, 100, "s", True), tmp_path), "s", 0.0, 100)
    assert r is not None and r.output == "survived\n" and r.exit_code == 0


@pytest.mark.parametrize("clean", [True, False])
@pytest.mark.parametrize(("command", "code"), [("exit 124", 124), ("echo x; kill -9 $$", 137)])
def test_a_command_exiting_124_or_137_itself_did_not_time_out(tmp_path: Path, clean: bool,
                                                              command: str, code: int) -> None:
    """``timeout``'s own codes, returned by the command before its time: an exit code, not a timeout."""
    r = parse_frame(_run_locally(framed_lines(command, 5, 100, "s", clean), tmp_path), "s", 0.0, 100)
    assert r is not None and r.exit_code == code and not r.timed_out


@pytest.mark.parametrize(("command", "at_least"), [
    ("echo started; sleep 30", 1.0),
    ("trap '' TERM; echo started; sleep 30", 3.0),  # TERM ignored: KILLed 2 s later, rc 137
])
def test_a_command_the_timeout_stopped_timed_out(tmp_path: Path, command: str, at_least: float) -> None:
    t0 = time.monotonic()
    r = parse_frame(_run_locally(framed_lines(command, 1, 100, "s", False), tmp_path), "s", 0.0, 100)
    assert r is not None and r.timed_out and r.exit_code is None and r.output == "started\n"
    assert at_least <= time.monotonic() - t0 < at_least + 5


def test_without_a_readable_uptime_the_exit_code_alone_decides(tmp_path: Path) -> None:
    """No /proc (an agent may unmount it): 124 is then taken as the timeout, as before."""
    lines = [line.replace("/proc/uptime", str(tmp_path / "no-such-file"))
             for line in framed_lines("exit 124", 5, 100, "s", True)]
    r = parse_frame(_run_locally(lines, tmp_path), "s", 0.0, 100)
    assert r is not None and r.timed_out and r.exit_code is None
    r = parse_frame(_run_locally(framed_lines("exit 3", 5, 100, "s", True), tmp_path), "s", 0.0, 100)
    assert r is not None and r.exit_code == 3 and not r.timed_out
