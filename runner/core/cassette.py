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

import hashlib
import json
import os
from enum import Enum
from pathlib import Path
from typing import IO, Any

from runner.core.errors import InvalidInput
from runner.core.model import ChatRequest

FORMAT_VERSION = 1

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


class CassetteWriter:
    """Appends events to ``path`` (as ``path.partial`` until :meth:`close`)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.partial = self.path.with_name(self.path.name + ".partial")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = open(self.partial, "w", encoding="utf-8")  # noqa: SIM115
        self._secrets = _secrets()
        self.events = 0

    def write(self, event: dict[str, Any]) -> None:
        if self._file is None:
            raise RuntimeError("cassette already closed")
        line = json.dumps(scrub(event, self._secrets), ensure_ascii=False, default=str)
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
    """A cassette read back: the header, the verdict and the three replay streams."""

    def __init__(self, path: Path, events: list[dict[str, Any]]) -> None:
        self.path = path
        self.events = events
        self.header: dict[str, Any] = events[0] if events and events[0].get("type") == "header" else {}
        if not self.header:
            raise InvalidInput("not a rootbench cassette (no header line)", path=str(path))
        if self.header.get("format") != FORMAT_VERSION:
            raise InvalidInput(f"cassette format {self.header.get('format')!r} is not "
                               f"{FORMAT_VERSION}", path=str(path), field="header.format")
        self.verdict: dict[str, Any] | None = next(
            (e for e in reversed(events) if e.get("type") == "verdict"), None)

    @classmethod
    def load(cls, path: str | Path) -> Cassette:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InvalidInput("no such cassette", path=str(path)) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"cannot read cassette: {exc}", path=str(path)) from None
        events = []
        for lineno, line in enumerate(text.split("\n"), 1):  # not splitlines(): U+2028 etc. are data
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InvalidInput(f"invalid JSON: {exc.msg}", path=str(path), line=lineno) from None
            if not isinstance(event, dict) or "type" not in event:
                raise InvalidInput("event is not an object with a 'type'", path=str(path),
                                   line=lineno)
            events.append(event)
        return cls(path, events)

    def stream(self, kind: str) -> list[dict[str, Any]]:
        kinds = {"model": ("model", "model-error")}.get(kind, (kind,))
        return [e for e in self.events if e["type"] in kinds]


def find_cassettes(paths: list[str | Path]) -> list[Path]:
    """Expand files and directories (recursively) into ``*.jsonl`` cassettes."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found.extend(sorted(p.rglob("*.jsonl")))
        elif p.exists():
            found.append(p)
        else:
            raise InvalidInput("no such file or directory", path=str(p))
    if not found:
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
