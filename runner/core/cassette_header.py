"""The cassette header, typed and versioned: what a run was, read the same way by every reader.

A cassette's first line says everything needed to replay its run without
the spec file: the scenario as recorded, the model's fingerprint, the
protocol, the hint level, fix tracking, the judging rules. The header grew
field by field (hints, fix tracking, rules, the seed), so a cassette
recorded before a field existed lacks it. :func:`read_header` is the one
place that knows what an absent field means in each format, so readers never
supply defaults of their own and cannot disagree about them.

Format versions (:data:`FORMAT_VERSION` is the one written today):

* **1**: every field but ``scenario`` may be absent. Absent ``hint_level``
  is 0, ``track_fix`` off, ``rules`` :attr:`~runner.core.rules.Rules.V1`,
  ``round`` 0, ``protocol`` ``tools``, ``spec_hash`` the scenario's own (or
  none), ``agent`` the one the model fingerprint names.
* **2**: the writer records every field; all but ``seed`` are required.

A format this code does not know (a newer rootbench wrote it) is refused
with one line naming the file and ``header.format``: guessing at what its
fields mean could judge the run by rules it never ran under.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from runner.core.errors import InvalidInput
from runner.core.outcomes import AgentKind
from runner.core.rules import Rules

FORMAT_VERSION = 2  # what a cassette written now says
KNOWN_FORMATS = (1, 2)

# Format 2's required fields (``seed`` is only there when the model has one).
_REQUIRED_V2 = ("format", "harness", "started_at", "scenario", "spec_hash", "image", "model",
                "agent", "protocol", "options", "round", "hint_level", "track_fix", "rules")


@dataclass(frozen=True)
class Harness:
    """Which program recorded the cassette (absent in format 1: both empty, unknown)."""

    name: str = ""
    version: str = ""


@dataclass(frozen=True)
class ProtocolChoice:
    """The protocol the model spoke and why it was chosen (absent in format 1: ``tools``)."""

    name: str = "tools"
    reason: str = ""


@dataclass(frozen=True)
class SandboxOptions:
    """How the sandbox was asked to run (the ``--accel``, ``--transport`` flags); empty: unknown."""

    accel: str = ""
    transport: str = ""


@dataclass(frozen=True)
class CassetteHeader:
    """A cassette's first line, read and upgraded to the current format's fields.

    ``format`` is the version the file says (1 for a cassette recorded
    before format 2), so a reader can tell an upgraded header; every other
    field holds what the file recorded or, where an older format lacks it,
    the value every run of that time had. ``scenario``, ``model`` and
    ``image`` are JSON objects as recorded: replay rebuilds the scenario with
    :func:`runner.core.spec.scenario_from_dict`, and a model fingerprint or
    sandbox description holds what its backend chose to record.
    """

    scenario: Mapping[str, Any]
    format: int = FORMAT_VERSION
    harness: Harness = field(default_factory=Harness)
    started_at: str | None = None  # ISO 8601, to the second; when the run's clock started
    spec_hash: str | None = None  # sha256 of the spec file; None: not made from one
    image: Mapping[str, Any] = field(default_factory=dict)  # the sandbox's description
    model: Mapping[str, Any] = field(default_factory=dict)  # the model's fingerprint
    agent: AgentKind = AgentKind.MODEL
    protocol: ProtocolChoice = field(default_factory=ProtocolChoice)
    options: SandboxOptions = field(default_factory=SandboxOptions)
    round: int = 0
    hint_level: int = 0  # how many of the scenario's hints the task carried
    track_fix: bool = False  # success probes re-run after each agent command; replay must too
    rules: Rules = Rules.V1  # the judging rules the run was judged by; replay uses the same
    seed: int | None = None  # the model's sampling seed for this round, when it has one

    @property
    def scenario_id(self) -> str:
        """The recorded scenario's id ("" when the header has none)."""
        value = self.scenario.get("id")
        return value if isinstance(value, str) else ""

    @property
    def model_name(self) -> str | None:
        """The name the model fingerprint records, if any."""
        value = self.model.get("name")
        return value if isinstance(value, str) else None

    @property
    def model_kind(self) -> AgentKind:
        """The agent behind the model fingerprint (a backend's name means a real model)."""
        return AgentKind.from_fingerprint(self.model.get("kind"))

    def to_event(self) -> dict[str, Any]:
        """The header as the cassette's first line, in the current format."""
        out: dict[str, Any] = {
            "type": "header", "format": FORMAT_VERSION,
            "harness": {"name": self.harness.name, "version": self.harness.version},
            "started_at": self.started_at, "scenario": dict(self.scenario),
            "spec_hash": self.spec_hash, "image": dict(self.image), "model": dict(self.model),
            "agent": self.agent.value,
            "protocol": {"name": self.protocol.name, "reason": self.protocol.reason},
            "options": {"accel": self.options.accel, "transport": self.options.transport},
            "round": self.round, "hint_level": self.hint_level, "track_fix": self.track_fix,
            "rules": int(self.rules),
        }
        if self.seed is not None:
            out["seed"] = self.seed
        return out


def read_header(raw: Mapping[str, Any], path: str, line: int = 1) -> CassetteHeader:
    """The header line ``raw`` of the cassette at ``path``, of any known format, as a
    :class:`CassetteHeader`.

    An older format is first upgraded (its absent fields filled with what
    they meant then), then every field is checked as the current format
    requires. Anything wrong is one InvalidInput naming ``path``, ``line``
    and the field (``header.format`` for a version this code does not know).
    """

    def bad(name: str, message: str) -> InvalidInput:
        return InvalidInput(message, path=path, line=line, field=f"header.{name}")

    version = check_format(raw, path, line)
    current = dict(raw)
    for upgrade in _UPGRADES[version - 1:]:
        current = upgrade(current)
    missing = [k for k in _REQUIRED_V2 if k not in current]
    if missing:
        raise bad(missing[0], f"required in cassette format {version}, but missing")
    return _parse(current, bad)


def check_format(raw: Mapping[str, Any], path: str, line: int = 1) -> int:
    """The header's format version, if this code reads it; else InvalidInput naming
    ``header.format``. The cassette reader asks this before checking the header's fields,
    so a newer cassette is refused for its version, not for a field it changed."""
    version = raw.get("format")
    if isinstance(version, int) and not isinstance(version, bool) and version in KNOWN_FORMATS:
        return version
    known = ", ".join(map(str, KNOWN_FORMATS))
    newer = " (a newer rootbench wrote it)" if isinstance(version, int) and \
        not isinstance(version, bool) and version > FORMAT_VERSION else ""
    shown = repr(version) if isinstance(version, int | float | type(None)) else _kind(version)
    raise InvalidInput(f"cassette format {shown} is unknown to this rootbench, which reads "
                       f"formats {known}{newer}", path=path, line=line, field="header.format")


def _v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """Format 1's absent fields as every run recorded then had them."""
    scenario = raw.get("scenario")
    model = raw.get("model")
    defaults: dict[str, Any] = {
        "harness": {}, "started_at": None, "image": {}, "model": {},
        "spec_hash": scenario.get("spec_hash") if isinstance(scenario, dict) else None,
        "agent": AgentKind.from_fingerprint(
            model.get("kind") if isinstance(model, dict) else None).value,
        "protocol": {}, "options": {}, "round": 0,
        "hint_level": 0,  # before hints existed every task was sent bare
        "track_fix": False,  # before fix tracking, the probes ran only at the end
        "rules": int(Rules.V1),  # the rules before the validity round
    }
    return {**defaults, **raw}


# _UPGRADES[n - 1] turns format n into format n + 1; format n runs _UPGRADES[n - 1:].
_UPGRADES: tuple[Callable[[dict[str, Any]], dict[str, Any]], ...] = (_v1_to_v2,)
assert len(_UPGRADES) == FORMAT_VERSION - 1


def _parse(raw: dict[str, Any], bad: Callable[[str, str], InvalidInput]) -> CassetteHeader:
    """A format-2 header dict checked field by field."""

    def obj(name: str, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise bad(name, f"must be an object, not {_kind(value)}")
        return value

    def string(name: str, value: Any) -> str:
        if not isinstance(value, str):
            raise bad(name, f"must be a string, not {_kind(value)}")
        return value

    def maybe_string(name: str, value: Any) -> str | None:
        return None if value is None else string(name, value)

    def count(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise bad(name, f"must be a whole number of at least 0, not {value!r}"[:200])
        return value

    def strings(name: str, value: Any, keys: tuple[str, ...], defaults: tuple[str, ...]
                ) -> tuple[str, ...]:
        found = obj(name, value)
        return tuple(string(f"{name}.{k}", found.get(k, d)) for k, d in zip(keys, defaults,
                                                                          strict=True))

    harness = Harness(*strings("harness", raw["harness"], ("name", "version"), ("", "")))
    protocol = ProtocolChoice(*strings("protocol", raw["protocol"], ("name", "reason"),
                                       ("tools", "")))
    options = SandboxOptions(*strings("options", raw["options"], ("accel", "transport"),
                                      ("", "")))
    try:
        agent = AgentKind(raw["agent"])
    except ValueError:
        known = ", ".join(a.value for a in AgentKind)
        raise bad("agent", f"{raw['agent']!r} is no agent this rootbench knows ({known})"[:300]
                  ) from None
    track_fix = raw["track_fix"]
    if not isinstance(track_fix, bool):
        raise bad("track_fix", f"must be true or false, not {_kind(track_fix)}")
    rules_value = raw["rules"]
    if isinstance(rules_value, bool) or not isinstance(rules_value, int):
        raise bad("rules", f"must be a whole number, not {_kind(rules_value)}")
    try:
        rules = Rules(rules_value)
    except ValueError:
        known = ", ".join(str(r.value) for r in Rules)
        raise bad("rules", f"rules {rules_value} are unknown to this rootbench (it knows "
                           f"{known})"[:300]) from None
    seed = raw.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise bad("seed", f"must be a whole number, not {_kind(seed)}")
    return CassetteHeader(
        format=raw["format"], harness=harness,
        started_at=maybe_string("started_at", raw["started_at"]),
        scenario=obj("scenario", raw["scenario"]),
        spec_hash=maybe_string("spec_hash", raw["spec_hash"]),
        image=obj("image", raw["image"]), model=obj("model", raw["model"]), agent=agent,
        protocol=protocol, options=options, round=count("round", raw["round"]),
        hint_level=count("hint_level", raw["hint_level"]), track_fix=track_fix, rules=rules,
        seed=seed)


def _kind(value: Any) -> str:
    """How a wrong value is named in a message: its JSON type, not its (hostile) content."""
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string",
             list: "a list", dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)
