"""Input from an outside agent, bounded before any work is done on it: the one place that checks.

An outside agent (a Python agent, an MCP client, an Inspect solver) hands the
harness a command, maybe a timeout, and at the end a summary. Each of these is
checked here, once, at the agent's edge (:class:`~runner.core.agent_api.BridgeModel`
calls these functions before anything else looks at the value; the MCP server
may call them earlier still, on the raw arguments):

* a command is a ``str`` of at most :data:`MAX_COMMAND_CHARS` characters,
  encodable as UTF-8 (no lone surrogate such as ``"\\ud800"``, which the
  cassette, the JSON-RPC reply and the guest channel cannot carry) and with no
  NUL character (bash cannot run one);
* a timeout is a real number of seconds, finite and above zero (``1e400``
  arrives from JSON as infinity, ``float("nan")`` from Python: neither can be
  recorded, and the cassette's decision event would fail to write); above
  :data:`MAX_TIMEOUT` it is cut to it (the loop cuts it again to the
  scenario's ``command_timeout``, which the schema bounds by the same figure);
* a summary is a valid string of at most :data:`MAX_SUMMARY_CHARS` characters.

Anything else raises :class:`~runner.core.errors.AgentInputError` with a
one-line message for the agent: its mistake, answered as an error reply, and
the episode goes on (never ``infra-error``). The checks cost time linear in
the value's size, and the size is checked first.

Why these caps. A command travels base64-encoded over the guest channel and is
written three times to the cassette (the reply, its raw form, the decision),
whose reader refuses a file above 64 MiB; 256 KiB a command keeps a 20-turn
episode of the longest commands under 16 MiB, and a per-episode total
(:data:`MAX_EPISODE_COMMAND_CHARS`, kept by the bridge) keeps any episode's
commands under 24 MiB of cassette. It still lets Inspect's ``write_file``,
which puts the file on the command line base64-encoded, carry a file of
:data:`MAX_WRITE_FILE_BYTES` (189 KiB): every configuration file and script a
scenario asks for, and far more than ``read_file`` can return under an
output limit.
"""

from __future__ import annotations

import math
import re

from runner.core.errors import AgentInputError

MAX_COMMAND_CHARS = 256 * 1024  # characters in one command
MAX_EPISODE_COMMAND_CHARS = 8 * 1024 * 1024  # characters in all of one episode's commands
MAX_TIMEOUT = 3600.0  # seconds: the schema's largest command_timeout
MAX_SUMMARY_CHARS = 64 * 1024  # characters in a finish summary
# What the command around the file's base64 may take: Inspect's printf, the pipe, mkdir, a
# quoted path of up to PATH_MAX (4096) characters.
_WRITE_OVERHEAD = 8 * 1024
MAX_WRITE_FILE_BYTES = (MAX_COMMAND_CHARS - _WRITE_OVERHEAD) // 4 * 3  # base64: 4 chars per 3 bytes
_SURROGATE = re.compile("[\ud800-\udfff]")


def _plain(text: str) -> str:
    """``text`` as a plain ``str``: a subclass answers ``len``, ``strip`` and ``encode`` itself
    (one that says 1 would pass every bound), so the string it holds is what is checked, and
    what is recorded and run."""
    return text if type(text) is str else str.__str__(text)


def _valid_text(text: str, what: str) -> str:
    """``text`` if it encodes as UTF-8; else the one-line reason it cannot be carried."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        raise AgentInputError(
            f"{what} holds a lone surrogate (U+{code:04X}) at character {exc.start}: not valid "
            "Unicode text, so it cannot be run or recorded") from None
    return text


def bounded_command(text: object) -> str:
    """``text`` as a command an agent may run, or :class:`AgentInputError` saying why not.

    A non-empty ``str`` of at most :data:`MAX_COMMAND_CHARS` characters, valid
    UTF-8 once encoded, without NUL. Returned unchanged: what the agent sent is
    what is recorded and run.
    """
    if not isinstance(text, str):
        raise AgentInputError("the command must be a non-empty string")
    text = _plain(text)
    if not text.strip():
        raise AgentInputError("the command must be a non-empty string")
    if len(text) > MAX_COMMAND_CHARS:
        raise AgentInputError(
            f"the command is {len(text):,} characters long; at most {MAX_COMMAND_CHARS:,} are "
            "accepted (write a long script or file in parts)")
    _valid_text(text, "the command")
    if "\x00" in text:
        raise AgentInputError(f"the command holds a NUL character at {text.index(chr(0))}: "
                              "a shell cannot run it")
    return text


def bounded_timeout(value: object) -> float | None:
    """``value`` as a command's timeout in seconds (None stays None: the scenario's own limit).

    A real number (not a bool), finite and above zero, else
    :class:`AgentInputError`; above :data:`MAX_TIMEOUT` it is cut to
    :data:`MAX_TIMEOUT`. An ``int`` too large for a float is cut, not overflowed.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AgentInputError(f"the timeout must be a number of seconds, not "
                              f"{type(value).__name__}")
    if isinstance(value, int):
        value = int.__index__(value)  # the number itself, not a subclass's own comparisons
        if value <= 0:
            # A long one is not printed: past 4,300 digits Python will not make it text.
            shown = value if value > -10 ** 12 else "a negative number"
            raise AgentInputError(f"the timeout must be above zero seconds, not {shown}")
        return float(min(value, int(MAX_TIMEOUT)))
    value = float.__float__(value)  # the number itself, as for an int
    if not math.isfinite(value):
        raise AgentInputError(f"the timeout must be a finite number of seconds, not {value!r}")
    if value <= 0:
        raise AgentInputError(f"the timeout must be above zero seconds, not {value!r}")
    return min(float(value), MAX_TIMEOUT)


def bounded_summary(text: object) -> str:
    """``text`` as a finish summary: a string (may be empty) of at most
    :data:`MAX_SUMMARY_CHARS` characters, valid UTF-8; else :class:`AgentInputError`."""
    if not isinstance(text, str):
        raise AgentInputError(f"the summary must be a string, not {type(text).__name__}")
    text = _plain(text)
    if len(text) > MAX_SUMMARY_CHARS:
        raise AgentInputError(f"the summary is {len(text):,} characters long; at most "
                              f"{MAX_SUMMARY_CHARS:,} are accepted")
    return _valid_text(text, "the summary")


def carried_summary(text: object) -> str:
    """What the harness itself says as a summary on the agent's behalf (the value ``solve``
    returned, the exception it raised): never refused, since nobody is there to be told, so
    cut to :data:`MAX_SUMMARY_CHARS` and every lone surrogate replaced by U+FFFD."""
    text = text if isinstance(text, str) else str(text)
    return _SURROGATE.sub("\ufffd", text[:MAX_SUMMARY_CHARS])
