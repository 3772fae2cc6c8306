"""The command channel without a VM: the request lines, the frame, and the guest helper run here.

The helper (:mod:`runner.backends.guestd`) is plain Python that runs the
same way on this host as in the guest: started the way the guests start it
(its text on stdin), over pipes, with its working directory pointed at a
temp dir. So every framing guarantee is checked here in milliseconds, and
again on real VMs by the conformance suite.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runner.backends.framing import (
    B64_CHUNK,
    FramedGuest,
    helper_command,
    helper_source,
    parse_frame,
    ping,
    request_text,
)
from runner.core.guest import CommandResult

TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=300) | st.sampled_from(
    ["it's", "!!", "!$ ^a^b", "a\\nb", "\\", "'\"'", "$HOME `id` $(id)", "\x03\x04\x1b[2J", "\t\n\r", "#RBP x"])


class LocalHelper:
    """The guest helper, started here as the SSH guest starts it (program text first on stdin)."""

    def __init__(self, rb: Path, root: Path | None = None) -> None:
        self.rb = rb  # the helper's folder (its /run/rb)
        # The folders its tamper check reads (the guest's are its /): this host's own /usr/sbin
        # and /usr/bin are none of the test's business, so an empty tree unless a test gives one.
        self.root = root or rb.with_name(rb.name + "-root")
        self.root.mkdir(exist_ok=True)
        src = helper_source()
        bootstrap = helper_command().split("-c ", 1)[1].strip("'")
        self.proc = subprocess.Popen(["python3", "-I", "-S", "-c", bootstrap, str(rb), str(self.root)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.stdin.write(src + ping("ready").encode())
        self.stdin.flush()
        assert self.stdout.readline() == b"RBSYNCready\n"
        self.n = 0

    def run(self, command: str, timeout: float = 10, clean: bool = False, cap: int = 1000) -> CommandResult:
        self.n += 1
        sentinel = f"s{self.n}"
        t0 = time.monotonic()
        self.stdin.write(request_text(command, timeout, cap, sentinel, clean).encode())
        self.stdin.flush()
        r = parse_frame(self.stdout.readline(), sentinel, time.monotonic() - t0, cap)
        assert r is not None
        return r

    def close(self) -> None:
        self.stdin.close()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def helper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalHelper]:
    h = LocalHelper(tmp_path_factory.mktemp("rb"))
    yield h
    h.close()


def test_the_helper_travels_safely_through_a_terminal() -> None:
    """Sent to a console shell as typed text: short lines of printable ASCII, nothing a tty acts on."""
    src = helper_source()
    assert src.endswith(b"\n")
    assert all(len(line) < 4000 for line in src.split(b"\n"))
    assert all(0x20 <= b < 0x7F or b == 0x0A for b in src)
    assert len(helper_command()) < 200 and "'" not in helper_command().split("-c ", 1)[1].strip("'")


@settings(max_examples=200, deadline=None)
@given(TEXT, st.booleans())
def test_a_request_is_short_lines_of_plain_ascii_holding_the_exact_bytes(text: str, clean: bool) -> None:
    lines = request_text(text * 40, 10, 100, "abc", clean).splitlines()
    head, chunks = lines[0].split(), lines[1:]
    assert head == ["#RBQ", "abc", "c" if clean else "a", "10", "100", str(len(chunks))]
    assert all(line.startswith("#RBD ") and len(line) <= B64_CHUNK + 5 for line in chunks)
    assert all(0x20 <= ord(c) < 0x7F for line in lines for c in line)
    sent = base64.b64decode("".join(line[5:] for line in chunks))
    assert sent == (text * 40).encode("utf-8", errors="surrogateescape")


@settings(max_examples=40, deadline=None)
@given(TEXT.filter(lambda t: "RBEOF" not in t))
def test_any_text_reaches_the_shell_byte_for_byte(helper: LocalHelper, text: str) -> None:
    r = helper.run(f"cat <<'RBEOF'\n{text}\nRBEOF", clean=True, cap=5000)
    assert r.exit_code == 0 and r.output == f"{text}\n"


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=600), st.integers(1, 500), st.integers(0, 255), st.sampled_from([0, 1, 2]))
def test_a_frame_says_whether_the_output_was_cut(body: bytes, cap: int, rc: int, outcome: int) -> None:
    frame = (b"noise RB" + b"s1:" + base64.b64encode(body[: cap + 1])
             + b":%d:%d:RBs1 tail" % (rc, outcome))
    r = parse_frame(frame, "s1", 0.1, cap)
    assert r is not None
    assert r.truncated == (len(body) > cap)
    assert r.output == body[:cap].decode("utf-8", errors="replace")
    # Whether the timeout fired is the helper's word, not a guess from the exit code.
    assert r.timed_out == (outcome == 1) and r.exit_code == (rc if outcome == 0 else None)
    assert parse_frame(frame, "s2", 0.1, cap) is None


@pytest.mark.parametrize("clean", [True, False])
def test_exit_code_and_merged_output_come_back_and_no_file_is_left(helper: LocalHelper, clean: bool,
                                                                   tmp_path: Path) -> None:
    r = helper.run("echo hi; echo 'it''s' >&2; exit 3", clean=clean)
    assert r.exit_code == 3 and r.output == "hi\nits\n" and not r.truncated and not r.timed_out
    rb = helper.rb
    assert {p.name for p in rb.iterdir()} <= {"cwd"}  # no script or output file left


def test_a_long_command_runs_whole(helper: LocalHelper) -> None:
    payload = "é!'x\\" * 3000
    r = helper.run(f"printf %s '{payload.replace(chr(39), chr(39) + chr(92) + chr(39) + chr(39))}' | wc -c")
    assert r.exit_code == 0 and r.output.strip() == str(len(payload.encode()))


def test_output_is_capped(helper: LocalHelper) -> None:
    r = helper.run("head -c 5000 /dev/zero | tr '\\0' x", cap=300)
    assert r.truncated and r.output == "x" * 300


def test_the_agents_directory_is_remembered_and_the_clean_channel_is_clean(helper: LocalHelper) -> None:
    assert helper.run("cd /tmp && export FOO=agent && alias ls=false").exit_code == 0
    assert helper.run("pwd; echo ${FOO:-unset}").output == "/tmp\nunset\n"
    r = helper.run("pwd; env | sort", clean=True)
    assert r.output.splitlines()[0] == "/"
    env = dict(line.split("=", 1) for line in r.output.splitlines()[1:] if "=" in line)
    assert env["PATH"] == "/usr/sbin:/usr/bin:/sbin:/bin" and "FOO" not in env
    helper.run("cd /")


def test_the_command_is_in_no_argv(helper: LocalHelper) -> None:
    """``pkill -f`` must not find the shell that runs it (a real interactive shell is not found)."""
    r = helper.run("sleep 30 & pkill -f 'sleep 30'; echo survived")
    assert r.output == "survived\n" and r.exit_code == 0


@pytest.mark.parametrize("clean", [True, False])
@pytest.mark.parametrize(("command", "code"), [("exit 124", 124), ("echo x; kill -9 $BASHPID", 137)])
def test_a_command_exiting_124_or_137_itself_did_not_time_out(helper: LocalHelper, clean: bool,
                                                              command: str, code: int) -> None:
    r = helper.run(command, timeout=5, clean=clean)
    assert r.exit_code == code and not r.timed_out


@pytest.mark.parametrize(("command", "at_least"), [
    ("echo started; sleep 30", 1.0),
    ("trap '' TERM; echo started; sleep 30", 3.0),  # TERM ignored: KILLed 2 s later
])
def test_a_command_the_timeout_stopped_timed_out(helper: LocalHelper, command: str, at_least: float) -> None:
    t0 = time.monotonic()
    r = helper.run(command, timeout=1)
    assert r.timed_out and r.exit_code is None and r.output == "started\n"
    assert at_least <= time.monotonic() - t0 < at_least + 5


def test_the_timeout_kills_the_commands_children_too(helper: LocalHelper, tmp_path: Path) -> None:
    marker = tmp_path / "child-survived"
    r = helper.run(f"(sleep 3; touch {marker}) & sleep 30", timeout=1)
    assert r.timed_out
    time.sleep(3.5)
    assert not marker.exists()


def test_a_command_that_kills_its_shell_loses_its_exit_code_not_the_channel(helper: LocalHelper) -> None:
    r = helper.run("echo before; kill -9 $$; echo after")
    assert r.exit_code is None and not r.timed_out
    assert r.output.startswith("before\nafter\n") and "exit code is unknown" in r.output
    assert helper.run("echo next").output == "next\n"


def test_a_command_learns_no_sentinel_and_cannot_wedge_the_helper(helper: LocalHelper) -> None:
    """Its script's path says nothing of the frame's sentinel; swapping its output file for a
    FIFO or a symlink neither blocks the helper nor is followed."""
    helper.n += 1
    sentinel = f"secret{helper.n}"
    helper.stdin.write(request_text('echo "$BASH_SOURCE"', 10, 1000, sentinel, False).encode())
    helper.stdin.flush()
    r = parse_frame(helper.stdout.readline(), sentinel, 0.0, 1000)
    assert r is not None and r.exit_code == 0 and sentinel not in r.output
    out = 'p=$BASHPID; o=$(readlink /proc/$p/fd/1); rm -f "$o"; '
    r = helper.run(out + 'mkfifo "$o"; echo lost', timeout=5)
    assert r.exit_code == 0 and "replaced its output file" in r.output and not r.timed_out
    r = helper.run(out + 'ln -s /etc/hostname "$o"', timeout=5)
    # Whether or not the swap is noticed, the file the link points at is never read back as output.
    assert Path("/etc/hostname").read_text().strip() not in r.output
    assert "replaced its output file" in r.output or r.output == ""
    assert helper.run("echo fine").output == "fine\n"


def test_stdin_is_empty_and_signals_python_ignores_are_restored(helper: LocalHelper) -> None:
    """``yes | head`` ends (SIGPIPE is back to its default) and ``cat`` reads nothing."""
    r = helper.run("yes | head -c 4; cat; echo end", timeout=10)
    assert r.output == "y\ny\nend\n" and not r.timed_out


def test_an_interrupt_abandons_the_command_in_hand(tmp_path: Path) -> None:
    """The host's ^C (SIGINT from the terminal) stops a stuck command; the helper listens again."""
    h = LocalHelper(tmp_path)
    try:
        h.stdin.write(request_text("sleep 60", 120, 100, "stuck", False).encode())
        h.stdin.flush()
        time.sleep(0.5)
        os.kill(h.proc.pid, signal.SIGINT)
        h.stdin.write(ping("back").encode())
        h.stdin.flush()
        assert h.stdout.readline() == b"RBSYNCback\n"
        assert h.run("echo alive").output == "alive\n"
    finally:
        h.close()


def _serve_once(status: int, body: bytes, headers: dict[str, str]) -> tuple[int, threading.Thread]:
    """A real HTTP server on loopback answering one GET."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    def answer_once() -> None:
        with server:
            server.handle_request()

    thread = threading.Thread(target=answer_once, daemon=True)
    thread.start()
    return server.server_address[1], thread


@pytest.mark.parametrize("status", [200, 301, 302, 404])
def test_a_host_side_request_keeps_the_body_of_every_answer_redirects_too(status: int) -> None:
    port, thread = _serve_once(status, b"moved to https://shop.internal/", {"Location": "https://x/"})
    result = FramedGuest({80: port}).host_http(80, "/", 5)
    thread.join(5)
    assert (result.status, result.body, result.error) == (status, "moved to https://shop.internal/", None)


def test_a_host_side_request_to_nothing_says_connection_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        result = FramedGuest({80: port}).host_http(80, "/", 5)
    assert (result.status, result.error) == (None, "ConnectionError")
    assert FramedGuest({}).host_http(8080, "/", 5).error == "guest port 8080 is not forwarded"


# --- the clean channel refuses to run on programs it cannot trust --------------------------------

def _md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def _tree(root: Path) -> None:
    """A merged-/usr guest's PATH folders as Debian has them: /usr/sbin/ip a link to
    /usr/bin/ip, awk a link through /etc/alternatives to mawk, and dpkg's md5sums of each
    package's own files (some in the old /bin spelling; /usr/sbin/grep listed but absent)."""
    for d in ("usr/sbin", "usr/bin", "etc/alternatives", "var/lib/dpkg/info"):
        (root / d).mkdir(parents=True)
    (root / "sbin").symlink_to("usr/sbin")
    (root / "bin").symlink_to("usr/bin")
    shipped = {"usr/bin/ip": "the real ip", "usr/bin/grep": "the real grep", "usr/bin/mawk": "the real mawk",
               "usr/bin/true": "the real true"}
    for name, text in shipped.items():
        (root / name).write_text(text)
    (root / "usr/sbin/ip").symlink_to("../bin/ip")
    (root / "etc/alternatives/awk").symlink_to("../../usr/bin/mawk")
    (root / "usr/bin/awk").symlink_to("../../etc/alternatives/awk")
    (root / "usr/bin/tool").write_text("a program no package lists")
    (root / "var/lib/dpkg/info/base.md5sums").write_text(
        f"{_md5('the real ip')}  bin/ip\n{_md5('the real grep')}  bin/grep\n"
        f"{_md5('the real mawk')}  usr/bin/mawk\n{_md5('the real true')}  bin/true\n"
        f"{_md5('grep as the package ships it')}  sbin/grep\n")


def _refused(h: LocalHelper, why: str) -> None:
    r = h.run("echo judged", clean=True)
    assert (r.exit_code, r.timed_out) == (126, False), r
    assert r.output == f"[rootbench: not run, tampered: {why}]", r.output  # nothing ran


def test_a_program_hidden_on_the_clean_path_or_a_preload_refuses_clean_commands(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _tree(root)
    h = LocalHelper(tmp_path / "rb", root)
    try:
        assert h.run("echo judged", clean=True).output == "judged\n"  # ip's link hides nothing
        # A liar named true in /usr/sbin: found before /usr/bin/true, no package file touched.
        (root / "usr/sbin/true").write_text("#!/bin/sh\nexit 0\n")
        _refused(h, "/usr/sbin/true hides /usr/bin/true")
        assert h.run("echo agent", clean=False).output == "agent\n"  # the agent's shell is not judged
        (root / "usr/sbin/true").unlink()
        # The same file under both names hides nothing; a package's own file, unchanged, neither.
        (root / "usr/sbin/mawk").symlink_to("../bin/mawk")
        assert h.run("echo judged", clean=True).exit_code == 0
        (root / "usr/sbin/mawk").unlink()
        (root / "usr/sbin/grep").write_text("grep as the package ships it")  # listed as sbin/grep
        assert h.run("echo judged", clean=True).exit_code == 0
        (root / "usr/sbin/grep").write_text("grep as root rewrote it")
        _refused(h, "/usr/sbin/grep is not the file its package installed")
        (root / "usr/sbin/grep").unlink()
        os.mkfifo(root / "usr/sbin/grep")  # a FIFO by the package's name: refused, never read
        _refused(h, "/usr/sbin/grep is not the file its package installed")
        (root / "usr/sbin/grep").unlink()
        assert h.run("echo judged", clean=True).exit_code == 0
        # Every program would load a library of root's choosing.
        (root / "etc/ld.so.preload").write_text("\n  \n")
        assert h.run("echo judged", clean=True).exit_code == 0  # blank: nothing preloaded
        (root / "etc/ld.so.preload").write_text("/usr/local/lib/liar.so\n")
        r = h.run("echo judged", clean=True)
        assert r.exit_code == 126 and "tampered: /etc/ld.so.preload" in r.output, r
    finally:
        h.close()


def test_a_program_rewritten_in_place_or_relinked_refuses_clean_commands(tmp_path: Path) -> None:
    """No new name, no hiding: the package's own file rewritten (in place, through a hard
    link), what a link leads to rewritten or swapped for another program, an unpackaged
    program changed. Put back as it was, each is trusted again; a new program hiding
    nothing is no one's business."""
    root = tmp_path / "root"
    _tree(root)
    h = LocalHelper(tmp_path / "rb", root)
    try:
        assert h.run("echo judged", clean=True).output == "judged\n"
        grep = root / "usr/bin/grep"
        grep.write_text("#!/bin/sh\nexit 0\n")
        _refused(h, "/usr/bin/grep is not the file its package installed")
        grep.write_text("the real grep")  # the same bytes again (a new mtime): trusted
        assert h.run("echo judged", clean=True).exit_code == 0
        os.link(grep, root / "hardlink")  # written through another name: the same inode changes
        with open(root / "hardlink", "r+b") as f:
            f.write(b"THE")
        _refused(h, "/usr/bin/grep is not the file its package installed")
        grep.write_text("the real grep")
        assert h.run("echo judged", clean=True).exit_code == 0
        # awk -> /etc/alternatives/awk -> mawk: the file at the end rewritten, then another
        # packaged program put at the end of the link.
        (root / "usr/bin/mawk").write_text("a liar")
        _refused(h, "/usr/bin/mawk is not the file its package installed")  # found by awk's link first
        (root / "usr/bin/mawk").write_text("the real mawk")
        assert h.run("echo judged", clean=True).exit_code == 0
        (root / "etc/alternatives/awk").unlink()
        (root / "etc/alternatives/awk").symlink_to("../../usr/bin/true")
        _refused(h, "/usr/bin/awk is not the program it was")
        (root / "etc/alternatives/awk").unlink()
        (root / "etc/alternatives/awk").symlink_to("../../usr/bin/mawk")
        assert h.run("echo judged", clean=True).exit_code == 0
        # A program no package lists, as it was at start: trusted until it changes.
        (root / "usr/bin/tool").write_text("rewritten")
        _refused(h, "/usr/bin/tool is not the program it was")
        (root / "usr/bin/tool").unlink()
        assert h.run("echo judged", clean=True).exit_code == 0  # gone: the shell finds none
        (root / "usr/bin/new-tool").write_text("a new program, hiding nothing")
        assert h.run("echo judged", clean=True).exit_code == 0
        # Swapped for the command's run and put back: seen as a change, the output not judged.
        swap = f"cp {grep} {root}/g && echo liar > {grep} && echo lied && cat {root}/g > {grep}"
        r = h.run(swap, clean=True)
        assert (r.exit_code, r.output) == (126, "[rootbench: not judged, tampered: /usr/bin/grep changed while "
                                                "the command ran]"), r
        assert h.run("echo judged", clean=True).output == "judged\n"  # as its package has it again
        # A command installing a program (a scenario's setup, a package's upgrade) is judged as usual.
        r = h.run(f"echo v1 > {root}/usr/sbin/exporter && echo v2 > {root}/usr/sbin/exporter && echo set", clean=True)
        assert (r.exit_code, r.output) == (0, "set\n"), r
        grep.unlink()
        grep.symlink_to("true")  # a packaged name now leading to another packaged program
        _refused(h, "/usr/bin/grep is not the file its package installed")
    finally:
        h.close()
    # A helper started after the tampering (as after a reboot) still knows the package's file.
    h = LocalHelper(tmp_path / "rb2", root)
    try:
        _refused(h, "/usr/bin/grep is not the file its package installed")
        grep.unlink()
        grep.write_text("the real grep")
        assert h.run("echo judged", clean=True).exit_code == 0
    finally:
        h.close()
