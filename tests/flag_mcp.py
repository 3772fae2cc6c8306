"""``rootbench mcp`` on the flag guest: the real MCP server, transports and signals, no VM.

Run as a program (``python tests/flag_mcp.py SPEC RUNS [--http ADDR] [--http-remote]
[--http-token-file FILE]``), it is ``rootbench mcp`` with one difference: the
episode is played on a :class:`FlagGuest` (recorded to a real cassette by the
real loop) instead of a VM, handed to :func:`runner.app.mcp_server.run_server`
as its ``play``. Everything else (detaching over stdio, binding, the token, the
guard, the signals, the exit status) is the code ``rootbench mcp`` runs.

The guest understands ``sleep N`` too (it really sleeps), so a test can have a
command in flight when its client goes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flag_guest import FlagGuest

from runner.app import mcp_http, mcp_server
from runner.app.episodes import RunOptions, header
from runner.app.signals import Interrupted
from runner.core.cassette import CassetteWriter
from runner.core.clock import Clock
from runner.core.episode import Episode, run_episode
from runner.core.errors import InvalidInput
from runner.core.guest import CommandResult
from runner.core.model import Model
from runner.core.protocol import Protocol
from runner.core.recording import RecordingGuest, RecordingModel
from runner.core.spec import Scenario, load_spec


class SleepyFlagGuest(FlagGuest):
    """The flag guest, and ``sleep N`` takes N real seconds."""

    def exec(self, command: str, timeout: float, output_limit: int | None = None) -> CommandResult:
        if command.startswith("sleep "):
            time.sleep(min(float(command.split()[1]), timeout))
        return super().exec(command, timeout, output_limit)


def play(scenario: Scenario, model: Model, protocol: Protocol, reason: str, opts: RunOptions,
         cassette: Path, *, round_: int = 0, hint_level: int = 0) -> Episode:
    """What :func:`runner.app.episodes.run_one` does, on the flag guest instead of a VM."""
    with CassetteWriter(cassette) as writer:
        writer.write(header(scenario, model, protocol, reason, opts, round_, {},
                            hint_level=hint_level))
        ep = run_episode(scenario, RecordingGuest(SleepyFlagGuest(), writer),
                         RecordingModel(model, writer), protocol, Clock(writer), writer,
                         round_=round_, hint_level=hint_level, track_fix=opts.track_fix)
    ep.cassette = str(cassette)
    return ep


def main(argv: list[str]) -> int:
    import logging

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    p = argparse.ArgumentParser()
    p.add_argument("spec")
    p.add_argument("runs")
    p.add_argument("--http")
    p.add_argument("--http-remote", action="store_true")
    p.add_argument("--http-token-file")
    args = p.parse_args(argv)
    try:
        address = (mcp_http.parse_http(args.http, remote=args.http_remote)
                   if args.http else None)
        return mcp_server.run_server(
            load_spec(args.spec), RunOptions(), Path(args.runs), address=address, hint_level=0,
            command=[sys.executable, __file__, *argv],
            say=lambda line: print(line, file=sys.stderr, flush=True),
            token_file=Path(args.http_token_file) if args.http_token_file else None,
            play=play)
    except InvalidInput as exc:
        print(f"rootbench: {exc}", file=sys.stderr)
        return 2
    except Interrupted as exc:
        print(f"rootbench: interrupted (exit {exc.code})", file=sys.stderr)
        return exc.code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
