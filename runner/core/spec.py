"""Scenarios: YAML files, validated strictly, turned into frozen dataclasses.

Every command that reads specs goes through :func:`load_spec`, so a bad file
is reported the same way everywhere: one line, ``file:line: field: message``,
as an :class:`~runner.errors.InvalidInput`. The loader never trusts its
input: size is capped, anchors and aliases are refused (no alias bombs),
duplicate keys are errors, and anything JSON Schema cannot say (a regex that
does not compile, a machine without its image) is checked in
:mod:`runner.core.spec_checks`; two specs with one id are refused here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from runner.core.errors import InvalidInput
from runner.core.machines import MAX_MACHINES, Access, Machine, name_problem
from runner.core.paths import image_dirs
from runner.core.patterns import compile_pattern
from runner.core.probes import KINDS, ProbeKind
from runner.core.rules import CURRENT_RULES, Rules
from runner.core.spec_checks import PROBE_KINDS, check_scenario, line_for
from runner.core.yamlfile import parse_yaml

MAX_SPEC_BYTES = 256 * 1024
MAX_RECHECK_AFTER = 600  # seconds: the longest pause a spec may ask (the schema says the same)


@dataclass(frozen=True)
class Budget:
    """What the agent may spend. Defaults are the published run's."""

    turns: int = 10
    seconds: float = 600
    command_timeout: float = 30
    output_limit: int = 4000


@dataclass(frozen=True)
class Probe:
    """One check of the guest's state: a name, an optional deadline, and what is checked.

    ``condition`` is one of the typed kinds in :mod:`runner.core.probes`, so
    the spec is read once, here, and the checks never dig in a mapping.
    ``within`` (seconds) lets a probe keep retrying while a fix settles.
    ``weight`` is how much the probe counts in a run's partial score: the
    part of a fix that matters most can weigh more than a side check.
    """

    condition: ProbeKind
    name: str
    within: float | None = None
    weight: float = 1.0  # the probe's share of the run's score (success probes only)
    machine: str | None = None  # the machine it asks (a multi-machine spec); None: the first

    @property
    def kind(self) -> str:
        """The spec key of the probe's kind (``command``, ``http``...)."""
        return self.condition.kind

    def to_dict(self) -> dict[str, Any]:
        """The probe as a cassette header stores it; the shape predates the typed kinds
        and is kept, so old cassettes load and new ones read the same. ``weight`` is
        written only when it is not the default, so a spec without weights records
        exactly the header it always did."""
        out: dict[str, Any] = {"kind": self.kind, "params": self.condition.to_params(),
                               "name": self.name, "within": self.within}
        if self.weight != 1.0:
            out["weight"] = self.weight
        if self.machine is not None:
            out["machine"] = self.machine
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Probe:
        """Read :meth:`to_dict`'s shape back; a damaged entry is a KeyError or TypeError."""
        if not isinstance(d, dict):
            raise TypeError(f"a probe must be a mapping, not {type(d).__name__}")
        within = d.get("within")
        if within is not None and (isinstance(within, bool) or not isinstance(within, int | float)):
            raise TypeError(f"probe 'within' must be a number, not {type(within).__name__}")
        name = d["name"]
        if not isinstance(name, str):
            raise TypeError(f"probe 'name' must be a string, not {type(name).__name__}")
        weight = d.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
            raise TypeError(f"probe 'weight' must be a positive number, not {weight!r}")
        machine = d.get("machine")
        if machine is not None and not isinstance(machine, str):
            raise TypeError(f"probe 'machine' must be a string, not {type(machine).__name__}")
        return cls(condition=KINDS[d["kind"]].from_params(d["params"]), name=name,
                   within=None if within is None else float(within), weight=float(weight),
                   machine=machine)


class ShortcutKind(str, Enum):
    """The kinds of not-a-fix a scenario is proven against (see docs/validity.md)."""

    SERVED_ELSEWHERE = "served-elsewhere"  # the expected answer comes from somewhere else
    STARTED_BY_HAND = "started-by-hand"  # the program runs, but not through its unit
    DOES_NOT_LAST = "does-not-last"  # passes once: a schedule that never fires, a dying process
    WIDENED_PERMISSIONS = "widened-permissions"  # more access than needed instead of the right fix
    RUN_AS_ROOT = "run-as-root"  # a daemon run as root instead of the right fix
    DELETED_NOT_REPAIRED = "deleted-not-repaired"  # deleting or disabling instead of repairing
    CLOBBERED_SYSTEM_FILE = "clobbered-system-file"  # a system file overwritten wholesale
    IMPOSTOR_PROGRAM = "impostor-program"  # another program under the expected name
    TAMPERED_TOOL = "tampered-tool"  # a tool the probes use replaced
    OTHER = "other"

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class Shortcut:
    """A named command sequence that looks like a fix and is not: ``verify`` proves it fails.

    A benchmark whose verdicts can be earned without the fix measures
    nothing, so each scenario carries its author's own adversarial review:
    every shortcut runs as a scripted agent on a real VM and must end
    ``fail``. ``why`` says, for the reader of the spec, what is still broken.
    """

    name: str
    kind: ShortcutKind
    why: str
    commands: tuple[str, ...]


@dataclass(frozen=True)
class Alternative:
    """Another correct fix, one a competent admin would choose: ``verify`` proves it passes.

    Shortcuts prove a scenario cannot be passed without the fix; alternatives
    prove its probes do not refuse a fix that is not the author's own (a
    systemd mount unit where the solution edits fstab, a cron line that logs
    its output). A probe that fails an alternative is too narrow, and the
    scenario is not valid until it is widened. ``why`` says why it is a fix.
    """

    name: str
    why: str
    commands: tuple[str, ...]


@dataclass(frozen=True)
class Lasting:
    """A spec's opt-out of the reboot re-check that rules 3 give every passing run, with why."""

    reboot: bool
    why: str


@dataclass(frozen=True)
class Allowance:
    """A fact the state diff (:mod:`runner.core.statediff`) would report that this scenario's
    fix may leave: ``check`` names the diff's check, ``item`` the fact (``*``: any), ``why``
    the reason, for the reader of the spec."""

    check: str
    item: str
    why: str


@dataclass(frozen=True)
class Milestone:
    """Evidence in the transcript that the agent found the cause: scored, never needed to pass.

    ``command_matches`` (an RE2 regex searched in each command the agent
    ran) and ``output_contains`` (a substring of a command's output as the
    agent saw it): at least one is set, and when both are, both must hold on
    the same command (it looked at the right thing, and saw it). Milestones
    tell apart two failed runs: one that never looked and one that found the
    cause but could not fix it.

    From :attr:`Rules.V2` on, ``output_contains`` ignores the output of a
    command whose own text holds the needle: ``echo 'Permission denied'``
    prints it without having seen anything. Under :attr:`Rules.V1` (older
    cassettes, which never give both fields) any output counts, as it did.
    """

    name: str
    command_matches: str | None = None
    output_contains: str | None = None

    def reached_by(self, command: str, output: str, rules: Rules = CURRENT_RULES) -> bool:
        """Whether one agent command (and the output it got back) is this milestone's evidence."""
        if self.command_matches is not None and \
                compile_pattern(self.command_matches).search(command) is None:
            return False
        if self.output_contains is None:
            return self.command_matches is not None
        if rules >= Rules.V2 and self.output_contains in command:
            return False  # the command printed the needle itself: no evidence of looking
        return self.output_contains in output

    def to_dict(self) -> dict[str, Any]:
        """The milestone as a cassette header stores it (only the fields it uses)."""
        out: dict[str, Any] = {"name": self.name}
        if self.command_matches is not None:
            out["command_matches"] = self.command_matches
        if self.output_contains is not None:
            out["output_contains"] = self.output_contains
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Milestone:
        """Read :meth:`to_dict`'s shape back; a damaged entry is a KeyError or TypeError."""
        if not isinstance(d, dict):
            raise TypeError(f"a milestone must be a mapping, not {type(d).__name__}")
        unknown = set(d) - {"name", "command_matches", "output_contains"}
        if unknown:
            raise TypeError(f"unknown milestone key {sorted(unknown)[0]!r}")
        values = [d.get("name"), d.get("command_matches"), d.get("output_contains")]
        if not isinstance(values[0], str) or any(v is not None and not isinstance(v, str)
                                                  for v in values[1:]):
            raise TypeError("a milestone's name and pattern must be strings")
        if values[1] is None and values[2] is None:
            raise TypeError("a milestone needs command_matches, output_contains or both")
        return cls(name=values[0], command_matches=values[1], output_contains=values[2])


@dataclass(frozen=True)
class Scenario:
    id: str
    title: str
    image: str
    task: str
    description: str | None = None
    tags: tuple[str, ...] = ()
    difficulty: str | None = None
    system_prompt: str | None = None
    budget: Budget = field(default_factory=Budget)
    setup: tuple[str, ...] = ()
    probes: tuple[Probe, ...] = ()
    invariants: tuple[Probe, ...] = ()
    solution: tuple[str, ...] = ()
    forbidden: tuple[str, ...] = ()
    path: str = ""
    spec_hash: str = ""
    # sha256 of what the spec says about judging: its parsed data without the prose a scripted
    # run never reads (PROSE_KEYS). A recording of the oracle, the noop, a shortcut or an
    # alternative still proves a spec whose task text alone was rewritten (runner.app.verify).
    judged_hash: str = ""
    hints: tuple[str, ...] = ()  # from vague to specific; level k gives the agent the first k
    milestones: tuple[Milestone, ...] = ()
    shortcuts: tuple[Shortcut, ...] = ()  # what looks like a fix and is not; ``verify`` runs each
    # Does the fix last? After a passing post-check, the probes run again after this many
    # seconds of guest time (None: no pause), then after a clean reboot (``reboot``).
    recheck_after: float | None = None
    reboot: bool = False
    # Under rules 3 every passing run is re-checked after a reboot; ``lasting`` is the spec's
    # opt-out (reboot False, with why). None: the default.
    lasting: Lasting | None = None
    allow: tuple[Allowance, ...] = ()  # state-diff facts this scenario's fix may leave
    alternatives: tuple[Alternative, ...] = ()  # other correct fixes; ``verify`` proves each
    # Several VMs on a private network (docs/machines.md); empty: one machine of ``image``,
    # as every spec before them. ``image`` is then the first machine's.
    machines: tuple[Machine, ...] = ()
    access: Access | None = None  # how the agent's shell reaches the others (with machines)
    agent_machine: str | None = None  # where the agent's shell is; None: the first machine
    setup_on: tuple[str | None, ...] = ()  # each setup command's machine; empty: all the first

    def setup_steps(self) -> list[tuple[str | None, str]]:
        """Each setup command with the machine it runs on (None: the first)."""
        on = self.setup_on or (None,) * len(self.setup)
        return list(zip(on, self.setup, strict=True))


HINTS_HEADING = "Hints:"


def task_text(scenario: Scenario, hint_level: int = 0) -> str:
    """The task as the agent is sent it at ``hint_level``: the spec's task, then the first k hints.

    Level 0 is the task exactly as written, so every run recorded before
    hints existed asks the model the same thing it did. A level above the
    number of hints is an error: a run must never claim more help than it had.
    """
    if not 0 <= hint_level <= len(scenario.hints):
        raise ValueError(f"hint level {hint_level} out of range: {scenario.id!r} has "
                         f"{len(scenario.hints)} hint(s)")
    if hint_level == 0:
        return scenario.task
    lines = "\n".join(f"- {h}" for h in scenario.hints[:hint_level])
    return f"{scenario.task}\n\n{HINTS_HEADING}\n{lines}"


# --- scenario construction ------------------------------------------------------------------

def _probes(items: list[dict[str, Any]]) -> tuple[Probe, ...]:
    """Build each validated probe mapping into its typed kind, named if the spec did not."""
    out = []
    for item in items:
        kind = next(k for k in item if k in PROBE_KINDS)
        condition = KINDS[kind].from_params(item[kind])
        within = item.get("within")
        out.append(Probe(condition=condition, name=item.get("name") or condition.describe(),
                         within=float(within) if within is not None else None,
                         weight=float(item.get("weight", 1.0)), machine=item.get("machine")))
    return tuple(out)


def scenario_from_text(text: str, where: str) -> Scenario:
    """Validate ``text`` (the contents of ``where``) and build the scenario."""
    data, lines = parse_yaml(text, where)
    check_scenario(data, lines, where)
    if "lasting" in data and data.get("reboot"):
        raise InvalidInput("lasting.reboot is false while reboot is true: say one", path=where,
                           line=line_for(lines, ("lasting",)), field="lasting")
    budget = Budget(**(data.get("budget") or {}))
    machines = tuple(Machine(name=m["name"], image=m["image"], index=i)
                     for i, m in enumerate(data.get("machines") or ()))
    steps = [(s.get("machine"), s["run"]) if isinstance(s, dict) else (None, s)
             for s in data["setup"]]
    return Scenario(
        id=data["id"], title=data["title"], task=data["task"],
        image=machines[0].image if machines else data["image"],
        description=data.get("description"), tags=tuple(data.get("tags") or ()),
        difficulty=data.get("difficulty"), system_prompt=data.get("system_prompt"),
        budget=budget, setup=tuple(c for _m, c in steps), probes=_probes(data["probes"]),
        invariants=_probes(data.get("invariants") or []), solution=tuple(data["solution"]),
        forbidden=tuple(data.get("forbidden") or ()), path=where,
        spec_hash=hashlib.sha256(text.encode()).hexdigest(), judged_hash=judged_hash(data),
        hints=tuple(data.get("hints") or ()),
        milestones=tuple(Milestone(name=m["name"], command_matches=m.get("command_matches"),
                                   output_contains=m.get("output_contains"))
                         for m in data.get("milestones") or ()),
        shortcuts=tuple(Shortcut(name=c["name"], kind=ShortcutKind(c["kind"]), why=c["why"],
                                 commands=tuple(c["commands"]))
                        for c in data.get("shortcuts") or ()),
        recheck_after=(float(data["recheck_after"]) if data.get("recheck_after") is not None
                       else None),
        reboot=bool(data.get("reboot", False)),
        lasting=Lasting(reboot=False, why=data["lasting"]["why"]) if "lasting" in data else None,
        allow=tuple(Allowance(check=a["check"], item=a["item"], why=a["why"])
                    for a in data.get("allow") or ()),
        alternatives=tuple(Alternative(name=a["name"], why=a["why"], commands=tuple(a["commands"]))
                           for a in data.get("alternatives") or ()),
        machines=machines, access=Access(data["access"]) if "access" in data else None,
        agent_machine=data.get("agent_machine"),
        setup_on=tuple(m for m, _c in steps) if any(m for m, _c in steps) else (),
    )


# What a scenario says to a reader or a model but never to a scripted run's judge: rewriting
# these (a leaky task told as a symptom, a better hint) leaves every verify proof standing.
PROSE_KEYS = frozenset({"title", "description", "task", "hints", "tags", "difficulty",
                        "system_prompt", "milestones"})
# What no run reads at all, a model's included: the agent is sent the task, the hints and the
# system prompt, and the judge reads the probes. A label corrected by measurement, a tag or a
# title reworded, leaves every recording of the spec standing (scenario_view leaves them out).
UNREAD_KEYS = frozenset({"title", "description", "tags", "difficulty"})
# Not part of what judges a run either: each shortcut's and alternative's recording is its own
# run, matched to its commands by their hash in the scripted agent's fingerprint.
SCRIPTS_KEYS = frozenset({"shortcuts", "alternatives"})


def judged_hash(data: dict[str, Any]) -> str:
    """sha256 of a spec's parsed data without :data:`PROSE_KEYS` and :data:`SCRIPTS_KEYS`
    (see ``Scenario.judged_hash``)."""
    judged = {k: v for k, v in data.items() if k not in PROSE_KEYS | SCRIPTS_KEYS}
    return hashlib.sha256(json.dumps(judged, sort_keys=True, ensure_ascii=False,
                                     default=str).encode("utf-8", "surrogatepass")).hexdigest()


def read_text(path: Path, limit: int = MAX_SPEC_BYTES) -> str:
    """The file as UTF-8 text, or InvalidInput naming why not."""
    where = str(path)
    try:
        if not path.is_file():
            raise InvalidInput("no such file" if not path.exists() else "not a regular file",
                               path=where)
        with path.open("rb") as fh:
            raw = fh.read(limit + 1)
    except OSError as exc:
        raise InvalidInput(f"cannot read: {exc.strerror}", path=where) from None
    if len(raw) > limit:
        raise InvalidInput(f"larger than {limit} bytes", path=where)
    if b"\x00" in raw:
        raise InvalidInput("binary data, not a YAML text file", path=where)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"not UTF-8 text (byte {exc.start})", path=where) from None


def load_spec(path: str | Path) -> Scenario:
    path = Path(path)
    return scenario_from_text(read_text(path), str(path))


def spec_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand directories to their ``*.yaml``/``*.yml`` files, sorted; keep files as given."""
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            out.extend(sorted(q for q in p.iterdir() if q.suffix in (".yaml", ".yml")))
        else:
            out.append(p)
    return out


def check_specs(paths: Iterable[str | Path]) -> list[tuple[Path, Scenario | None, InvalidInput | None]]:
    """Validate every file; also that ids are unique. One entry per file, in order.

    A wrong ``$ROOTBENCH_IMAGES`` is raised here, once, rather than charged to every file.
    """
    image_dirs()
    results: list[tuple[Path, Scenario | None, InvalidInput | None]] = []
    owner: dict[str, Path] = {}
    for path in spec_files(paths):
        try:
            scenario = load_spec(path)
        except InvalidInput as exc:
            results.append((path, None, exc))
            continue
        if scenario.id in owner:
            err = InvalidInput(f"duplicate id {scenario.id!r} (also in {owner[scenario.id]})",
                               path=str(path), field="id")
            results.append((path, None, err))
            continue
        owner[scenario.id] = path
        results.append((path, scenario, None))
    return results


def load_specs(paths: Iterable[str | Path]) -> list[Scenario]:
    """Every scenario under ``paths``; the first invalid one raises."""
    paths = list(paths)
    checked = check_specs(paths)
    if not checked:
        raise InvalidInput("no scenario files found", path=", ".join(str(p) for p in paths))
    for _path, _scenario, err in checked:
        if err is not None:
            raise err
    return [s for _p, s, _e in checked if s is not None]


# --- scenarios in cassette headers -----------------------------------------------------------

# What names a spec's file rather than what it asks of a run: left out when the scenario a
# cassette's header recorded is compared with today's.
FILE_KEYS = frozenset({"path", "spec_hash", "judged_hash"})


def scenario_view(header_scenario: Mapping[str, Any], leave_out: frozenset[str] = frozenset()) -> str:
    """A scenario as a cassette header records it (:func:`scenario_to_dict`), as canonical JSON
    without :data:`FILE_KEYS`, :data:`UNREAD_KEYS` and ``leave_out``.

    Two recorded scenarios with the same view ask the same of a run: a run
    replays from its header's scenario alone, so a spec whose text changed
    only in what no header holds (its shortcuts, its alternatives, comments,
    layout) still proves a recording of it. ``leave_out=PROSE_KEYS`` is the
    view of a scripted run, which never reads the task or the hints.
    """
    skip = FILE_KEYS | UNREAD_KEYS | leave_out
    return json.dumps({k: v for k, v in header_scenario.items() if k not in skip}, sort_keys=True,
                      ensure_ascii=False, default=str)


def ran_as_today(spec_hash: str | None, header_scenario: Mapping[str, Any], scenario: Scenario,
                 today: str | None = None) -> bool:
    """Whether a run whose cassette header records ``spec_hash`` and ``header_scenario`` ran
    ``scenario`` as its spec states it today: the same text, or a text that differs only where
    no run reads it (an alternative or a shortcut added, a comment). ``today`` is
    ``scenario_view(scenario_to_dict(scenario))`` when the caller already has it. A header
    with no spec hash was not made from a spec file: it did not run today's."""
    if spec_hash is None:
        return False
    if spec_hash == scenario.spec_hash:
        return True
    return scenario_view(header_scenario) == (today or scenario_view(scenario_to_dict(scenario)))


def scenario_to_dict(s: Scenario) -> dict[str, Any]:
    """The scenario as plain JSON, for a cassette header (replay needs no spec file).

    Probes are written by :meth:`Probe.to_dict`, in the shape cassettes have
    always had, not as ``asdict`` would spell the typed kinds. ``hints`` and
    ``milestones`` are written only when the spec has some, so a spec without
    them records exactly the header it did before they existed. ``shortcuts``
    are never written: a shortcut's run is a scripted agent whose commands
    the cassette records like any agent's.
    """
    out = dataclasses.asdict(dataclasses.replace(s, probes=(), invariants=(), milestones=(),
                                                 shortcuts=(), alternatives=(), machines=()))
    del out["alternatives"]  # an alternative's run, like a shortcut's, records its own commands
    # Judging keys of rules 3, written only when set: a spec without them records the header
    # it always did.
    if s.lasting is None:
        del out["lasting"]
    if not s.allow:
        del out["allow"]
    if not s.judged_hash:
        del out["judged_hash"]
    out["probes"] = [p.to_dict() for p in s.probes]
    out["invariants"] = [p.to_dict() for p in s.invariants]
    del out["milestones"], out["shortcuts"]  # a shortcut's run records its own commands
    if not s.hints:
        del out["hints"]
    if s.milestones:
        out["milestones"] = [m.to_dict() for m in s.milestones]
    # Written only when set, like hints: a spec without them records the header it always did.
    if out["recheck_after"] is None:
        del out["recheck_after"]
    if not s.reboot:
        del out["reboot"]
    # Machines, likewise: a scenario of one machine records the header it always did.
    del out["machines"], out["access"], out["agent_machine"], out["setup_on"]
    if s.machines:
        out["machines"] = [{"name": m.name, "image": m.image} for m in s.machines]
        out["access"] = s.access.value if s.access else None
        if s.agent_machine is not None:
            out["agent_machine"] = s.agent_machine
        if s.setup_on:
            out["setup_on"] = list(s.setup_on)
    return out


def _machines_from_dict(fields: dict[str, Any]) -> None:
    """The header's machines back as :class:`Machine` (in place); TypeError if damaged."""
    machines = fields.get("machines") or []
    if not isinstance(machines, list) or len(machines) > MAX_MACHINES:
        raise TypeError(f"machines must be a list of at most {MAX_MACHINES}")
    built = []
    for i, m in enumerate(machines):
        if not isinstance(m, dict) or not isinstance(m.get("name"), str) \
                or not isinstance(m.get("image"), str) or set(m) - {"name", "image"}:
            raise TypeError("a machine must be a mapping of name and image (strings)")
        if (why := name_problem(m["name"])) is not None:
            raise TypeError(why)
        built.append(Machine(name=m["name"], image=m["image"], index=i))
    fields["machines"] = tuple(built)
    names = {m.name for m in built}
    access = fields.get("access")
    try:
        fields["access"] = Access(access) if access is not None else None
    except ValueError:
        raise TypeError(f"access must be ssh or network, not {access!r}") from None
    agent = fields.get("agent_machine")
    setup_on = tuple(fields.get("setup_on") or ())
    if len(setup_on) not in (0, len(fields["setup"])):
        raise TypeError("setup_on must name one machine per setup command")
    for name in (agent, *setup_on, *(p.machine for p in (*fields["probes"], *fields["invariants"]))):
        if name is not None and name not in names:
            raise TypeError(f"no machine {name!r} in the header's machines")
    fields["setup_on"] = setup_on


def scenario_from_dict(d: dict[str, Any]) -> Scenario:
    """Rebuild the scenario a cassette was recorded with."""
    try:
        fields = dict(d)
        fields["budget"] = Budget(**fields["budget"])
        for key in ("probes", "invariants"):
            fields[key] = tuple(Probe.from_dict(p) for p in fields[key])
        for key in ("tags", "setup", "solution", "forbidden", "hints"):
            fields[key] = tuple(fields.get(key) or ())
        fields["milestones"] = tuple(Milestone.from_dict(m) for m in fields.get("milestones") or ())
        recheck = fields.get("recheck_after")
        if recheck is not None and (isinstance(recheck, bool) or not isinstance(recheck, int | float)
                                    or not 0 < recheck <= MAX_RECHECK_AFTER):
            raise TypeError(f"recheck_after must be seconds in (0, {MAX_RECHECK_AFTER}], "
                            f"not {recheck!r}")
        fields["recheck_after"] = None if recheck is None else float(recheck)
        if not isinstance(fields.get("reboot", False), bool):
            raise TypeError(f"reboot must be true or false, not {fields['reboot']!r}")
        lasting = fields.get("lasting")
        if lasting is not None:
            if not isinstance(lasting, dict) or lasting.get("reboot") is not False \
                    or not isinstance(lasting.get("why"), str) or set(lasting) - {"reboot", "why"}:
                raise TypeError("lasting must be {reboot: false, why: text}")
            fields["lasting"] = Lasting(reboot=False, why=lasting["why"])
        allow = fields.get("allow") or []
        if not isinstance(allow, list) or not all(
                isinstance(a, dict) and set(a) == {"check", "item", "why"}
                and all(isinstance(v, str) for v in a.values()) for a in allow):
            raise TypeError("allow must be a list of {check, item, why} (strings)")
        fields["allow"] = tuple(Allowance(**a) for a in allow)
        _machines_from_dict(fields)
        return Scenario(**fields)
    except (KeyError, TypeError) as exc:
        raise InvalidInput(f"the cassette's scenario is unreadable: {exc}",
                           field="header.scenario") from None
