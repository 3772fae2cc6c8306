"""Cassettes: every model reply, guest exchange and clock reading of a run.

A cassette is JSONL, one event per line, appended and flushed as things
happen, so a crash leaves a readable prefix. While a run is in progress the
file is ``NAME.jsonl.partial``; it is renamed to ``NAME.jsonl`` when the run
ends, so a complete cassette is never half-written.

Writing and reading live here; :mod:`runner.core.recording` wraps a real
guest and model to fill a cassette, and :mod:`runner.core.replay` serves
one back. The agent loop, the probes and the scoring are the same code in
every mode; only where answers come from changes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import stat
import threading
from enum import Enum
from pathlib import Path
from types import ModuleType
from typing import IO, Any

import jsonschema

from runner.core import layout
from runner.core.cassette_header import CassetteHeader, check_format, read_header
from runner.core.errors import InfraError, InvalidInput
from runner.core.model import ChatRequest
from runner.core.paths import contained, read_regular, schema_path

jsonschema_rs: ModuleType | None  # None without its wheel
try:  # compiled (Rust) validation of the same schema; jsonschema still describes what is wrong
    import jsonschema_rs
except ImportError:  # a platform without its wheel: the pure-Python validator alone, slower
    jsonschema_rs = None

MAX_CASSETTE_BYTES = 64 * 1024 * 1024  # the longest committed cassette is well under 1 MiB

# Environment variables whose values must never reach a cassette or a result.
SECRET_ENV_VARS = ("OPENAI_API_KEY", "ROOTBENCH_API_KEY", "LLAMA_API_KEY", "API_KEY")
_SECRET_KEYS = {"authorization", "api_key", "api-key", "x-api-key"}


class RecordMode(str, Enum):
    """As in vcrpy: how a bench with ``--record-to DIR`` uses the cassettes already in DIR."""

    ALL = "all"  # run everything live and record it afresh (the default)
    ONCE = "once"  # a scenario with a cassette in DIR is replayed from it; the rest run live
    NONE = "none"  # replay only: a scenario without a cassette in DIR is an error

    def __str__(self) -> str:
        return self.value


def digest(obj: Any) -> str:
    """A stable sha256 of any JSON-able value."""
    blob = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


def _secrets() -> list[str]:
    return [v for k in SECRET_ENV_VARS if (v := os.environ.get(k)) and len(v) >= 4]


def scrub(obj: Any, secrets: list[str] | None = None) -> Any:
    """Drop auth headers and blank out secret values anywhere in ``obj``."""
    secrets = _secrets() if secrets is None else secrets
    if isinstance(obj, dict):
        return {k: ("[scrubbed]" if str(k).lower() in _SECRET_KEYS else scrub(v, secrets))
                for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [scrub(v, secrets) for v in obj]
    if isinstance(obj, str):
        for s in secrets:
            obj = obj.replace(s, "[scrubbed]")
        return obj
    return obj


class UnrecordableEvent(InfraError):
    """An event JSON cannot hold (NaN, Infinity, an integer too long to write) was refused.

    Writing it would make the whole cassette unreadable to every strict JSON
    reader (ours included), losing what was recorded before it. The event is
    not written; the episode ends ``infra-error`` with this reason, and the
    cassette keeps every line before it.
    """


class CassetteWriter:
    """Appends events to ``path`` (as ``path.partial`` until :meth:`close`).

    Each event is written as strict JSON: a value JSON has no spelling for is
    :class:`UnrecordableEvent`, raised before anything of it is written.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.partial = self.path.with_name(self.path.name + ".partial")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = open(self.partial, "w", encoding="utf-8")  # noqa: SIM115
        self._secrets = _secrets()
        self.events = 0
        # The machines of a multi-machine run reboot side by side, each recording its reboot
        # from its own thread: one line at a time, never two interleaved.
        self._lock = threading.Lock()

    def write(self, event: dict[str, Any]) -> None:
        with self._lock:
            self._write(event)

    def _write(self, event: dict[str, Any]) -> None:
        if self._file is None:
            raise RuntimeError("cassette already closed")
        try:
            line = json.dumps(scrub(event, self._secrets), ensure_ascii=False, default=str,
                              allow_nan=False)
        except (ValueError, RecursionError) as exc:
            kind = event.get("type", "?") if isinstance(event, dict) else "?"
            raise UnrecordableEvent(f"a {kind!r} event was not recorded: it holds a value JSON "
                                    f"cannot hold ({str(exc)[:100]})") from None
        self._file.write(line + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self.events += 1

    def close(self) -> Path:
        """Finish the cassette: rename ``.partial`` into place."""
        if self._file is not None:
            self._file.close()
            self._file = None
            os.replace(self.partial, self.path)
        return self.path

    def __enter__(self) -> CassetteWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abandon()

    def abandon(self) -> None:
        """Stop writing but keep the ``.partial`` name: the run did not end, so the cassette is not complete."""
        if self._file is not None:
            self._file.close()
            self._file = None


class Cassette:
    """A cassette read back: the header, the verdict and the three replay streams.

    Only :meth:`load` makes one from a file, and it validates every line
    against ``schema/cassette.schema.json`` and the order of the events, so
    code that replays a cassette may index its fields without guarding each.
    :attr:`head` is the header typed, of whatever format the file has, with
    the fields an older format lacks filled in
    (:func:`~runner.core.cassette_header.read_header`); :attr:`header` is
    the line as recorded, for what must see it unchanged (a digest of it).
    """

    def __init__(self, path: Path, events: list[dict[str, Any]],
                 lines: list[int] | None = None) -> None:
        self.path = path
        self.events = events
        # The file's line of each event (blank lines are skipped), to name it in messages.
        self.lines = lines if lines is not None else list(range(1, len(events) + 1))
        # The header line as recorded: what a digest of the header is taken of. Read its
        # fields from ``head``, never from here: absent fields mean different things in
        # different formats, and only read_header knows which.
        self.header: dict[str, Any] = events[0] if events and events[0].get("type") == "header" else {}
        if not self.header:
            raise InvalidInput("not a rootbench cassette (no header line)", path=str(path))
        self.head: CassetteHeader = read_header(self.header, str(path), self.lines[0])
        self.verdict: dict[str, Any] | None = next(
            (e for e in reversed(events) if e.get("type") == "verdict"), None)

    @classmethod
    def load(cls, path: str | Path) -> Cassette:
        """Read and validate ``path``; anything wrong with it is one InvalidInput naming the line.

        The file must be a regular file of at most :data:`MAX_CASSETTE_BYTES`:
        a FIFO or a device named ``x.jsonl`` is refused before it is opened,
        so it can neither hang the reader nor feed it forever.
        """
        path = Path(path)
        where = str(path)
        raw = _read_regular(path)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"not UTF-8 text (byte {exc.start})", path=where,
                               line=raw.count(b"\n", 0, exc.start) + 1) from None
        events: list[dict[str, Any]] = []
        numbers: list[int] = []
        verdict_line = 0
        for lineno, line in enumerate(text.split("\n"), 1):  # not splitlines(): U+2028 etc. are data
            if not line.strip():
                continue
            event = _parse_event(line, where, lineno)
            kind = event["type"]
            if kind == "header" and events:
                raise InvalidInput("a second header: the header is the first line only",
                                   path=where, line=lineno, field="type")
            if kind != "header" and not events:
                raise InvalidInput(f"the first event is {kind!r}: a cassette starts with its "
                                   "header", path=where, line=lineno, field="type")
            if verdict_line:
                raise InvalidInput(f"a {kind!r} event after the verdict (line {verdict_line}): "
                                   "the verdict is the last line", path=where, line=lineno,
                                   field="type")
            if kind == "verdict":
                verdict_line = lineno
            events.append(event)
            numbers.append(lineno)
        return cls(path, events, numbers)

    def line_of(self, event: dict[str, Any]) -> int | None:
        """The file line ``event`` (one of :attr:`events`) was read from."""
        for e, n in zip(self.events, self.lines, strict=False):
            if e is event:
                return n
        return None

    def stream(self, kind: str) -> list[dict[str, Any]]:
        kinds = {"model": ("model", "model-error")}.get(kind, (kind,))
        return [e for e in self.events if e["type"] in kinds]


def _read_regular(path: Path) -> bytes:
    """The bytes of ``path``, a regular file of at most :data:`MAX_CASSETTE_BYTES` (the one
    reader of user-named files, :func:`runner.core.paths.read_regular`, says why not)."""
    return read_regular(path, MAX_CASSETTE_BYTES, what="cassette",
                        hint=" (a cassette is a .jsonl file)")


def _no_constants(name: str) -> Any:
    """JSON has no NaN or Infinity; Python's reader accepts them unless told not to."""
    raise ValueError(f"{name} is not a JSON value")


def _parse_event(line: str, where: str, lineno: int) -> dict[str, Any]:
    """One line as a schema-valid event, or InvalidInput naming the line and the field."""
    try:
        event = json.loads(line, parse_constant=_no_constants)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"invalid JSON: {exc.msg} (column {exc.colno})", path=where,
                           line=lineno) from None
    except ValueError as exc:  # NaN, Infinity, an integer too long to convert
        raise InvalidInput(f"invalid JSON: {str(exc)[:120]}", path=where, line=lineno) from None
    except RecursionError:
        raise InvalidInput("invalid JSON: nested too deeply", path=where, line=lineno) from None
    if not isinstance(event, dict):
        kind = "list" if isinstance(event, list) else type(event).__name__
        raise InvalidInput(f"an event is a JSON object, not a {kind}", path=where, line=lineno)
    if event.get("type") == "header":  # a format this code does not know: that, not its fields
        check_format(event, where, lineno)
    fast = _fast_verdict(event)
    if fast:
        return event
    try:
        error = jsonschema.exceptions.best_match(_validator().iter_errors(event))
    except RecursionError:
        raise InvalidInput("an event nested too deeply", path=where, line=lineno) from None
    if error is not None:
        message, field = _describe(error, event)
        raise InvalidInput(message, path=where, line=lineno, field=field)
    if fast is False:  # the two validators disagree: the stricter one decides
        raise InvalidInput("does not match the cassette schema", path=where, line=lineno)
    return event


def _fast_verdict(event: dict[str, Any]) -> bool | None:
    """The compiled validator's yes or no; None if there is none or it could not tell."""
    fast = _fast_validator()
    if fast is None:
        return None
    try:
        return bool(fast.is_valid(event))
    except Exception:  # noqa: BLE001 - whatever it cannot take, the pure-Python validator judges
        return None


def _describe(error: jsonschema.ValidationError, event: dict[str, Any]) -> tuple[str, str]:
    """The message and the field (``model.reply``, ``header.scenario.budget.turns``) of an error.

    A missing key is named as the field itself, so the user reads which key
    is missing where, not the object it is missing from.
    """
    path: list[Any] = list(error.absolute_path)
    message = error.message
    if (error.validator == "required" and isinstance(error.instance, dict)
            and isinstance(error.validator_value, list)):
        missing = [k for k in error.validator_value if k not in error.instance]
        if missing:
            path.append(missing[0])
            message = "required, but missing"
    kind = event.get("type")
    field = _dotted(path) if path == ["type"] or not isinstance(kind, str) else _dotted([kind, *path])
    if len(message) > 200:
        message = message[:200] + "..."
    return message, field or "type"


def _dotted(path: list[Any]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out


@functools.cache
def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(schema_path("cassette.schema.json").read_text("utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


@functools.cache
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(_schema())


@functools.cache
def _fast_validator() -> Any:
    """The compiled validator, or None without jsonschema-rs.

    Every line of every cassette is validated on load; the pure-Python validator
    takes ~0.3 ms an event, most of an offline replay's time, the compiled one
    ~100x less. It only says yes or no: a line it rejects is described by
    :func:`_validator`, whose messages name the field.
    """
    return None if jsonschema_rs is None else jsonschema_rs.validator_for(_schema())


def find_cassettes(paths: list[str | Path],
                   unreadable: list[tuple[Path, str]] | None = None) -> list[Path]:
    """Expand files and directories (recursively) into ``*.jsonl`` cassettes.

    Only the names are gathered: whether each is a readable cassette is for
    :meth:`Cassette.load` to say, one file at a time, so one bad file in a
    folder does not hide the good ones. A path named on the command line that
    does not exist is the user's typo, and an error at once.

    A folder that cannot be listed (no permission), or a file in a folder that
    is a link to outside it, is never skipped in silence: with ``unreadable``
    given, it is added there with the reason (the replay tables it and exits
    non-zero), else it is an InvalidInput. A path named itself is the user's
    choice, and taken as it is.
    """
    found: list[Path] = []
    problems: list[tuple[Path, str]] = []
    for p in map(Path, paths):
        try:
            is_dir = stat.S_ISDIR(os.stat(p).st_mode)
        except FileNotFoundError:
            if not p.is_symlink():
                raise InvalidInput("no such file or directory", path=str(p)) from None
            is_dir = False  # a dangling link: Cassette.load names it
        except OSError as exc:
            raise InvalidInput(f"cannot read: {exc.strerror or exc}", path=str(p)) from None
        if is_dir:
            here: list[Path] = []

            def failed(exc: OSError, top: Path = p) -> None:
                problems.append((Path(exc.filename or top),
                                 f"cannot list the folder: {exc.strerror or exc}"))

            for folder, _dirs, files in os.walk(p, onerror=failed):
                here += [Path(folder) / f for f in files if f.endswith(layout.SUFFIX)]
            for f in sorted(here):
                # A file the folder holds is the folder's only if it is inside it: a link
                # out of it (a contributed folder's ``x.jsonl -> ~/private/run.jsonl``)
                # would have an export share, and a replay read, a file of someone else's.
                if contained(f, p) is None:
                    problems.append((f, "a link to a file outside the folder named, not read "
                                        "(name that file itself to use it)"))
                else:
                    found.append(f)
        else:
            found.append(p)
    if problems:
        if unreadable is None:
            raise InvalidInput(problems[0][1], path=str(problems[0][0]))
        unreadable.extend(problems)
    elif not found:
        raise InvalidInput("no cassettes found", path=", ".join(map(str, paths)))
    return found


# --- requests: what a replay must match -------------------------------------------------

def request_record(request: ChatRequest) -> dict[str, Any]:
    """The digest of a request plus one digest per message, to locate a difference."""
    payload = request.payload()
    rest = {k: v for k, v in payload.items() if k != "messages"}
    return {
        "digest": digest(payload),
        "messages": [digest(m) for m in request.messages],
        "extras": digest(rest),
        "last": request.messages[-1] if request.messages else None,
    }


def first_difference(recorded: dict[str, Any], request: ChatRequest) -> str:
    now = request_record(request)
    if recorded.get("extras") != now["extras"]:
        return "the tools / response_format fields differ"
    old = recorded.get("messages", [])
    for i, (a, b) in enumerate(zip(old, now["messages"], strict=False)):
        if a != b:
            role = request.messages[i].get("role", "?")
            text = str(request.messages[i].get("content") or "")[:80]
            return f"message {i} ({role}) differs: now {text!r}"
    return f"the recording has {len(old)} messages, the run has {len(now['messages'])}"
