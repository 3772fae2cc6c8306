"""The vocabulary of results: one spelling for each verdict, stop reason, agent and probe outcome.

Each is a ``str`` Enum, so it is written to results JSON, cassettes and
tables as its plain value and compares equal to it. Cassettes recorded
before this vocabulary was fixed spelled two stop reasons differently
(``infra``, ``invalid``); ``_missing_`` still reads them.
"""

from __future__ import annotations

from enum import Enum


class _Word(str, Enum):
    """A member is its plain value wherever it is written: JSON, cassettes, tables, f-strings."""

    def __str__(self) -> str:
        return str(self.value)


class Verdict(_Word):
    """How one episode ended, as the user is told."""

    PASS = "pass"  # every success probe passed
    FAIL = "fail"  # a success probe failed: the model did not fix it
    INFRA_ERROR = "infra-error"  # the VM or the model server broke: never counted for or against the model
    INVALID_SCENARIO = "invalid-scenario"  # the fault did not land: the scenario is at fault

    @property
    def scored(self) -> bool:
        """Whether the run says something about the model (pass or fail)."""
        return self in (Verdict.PASS, Verdict.FAIL)


class StopReason(_Word):
    """Why the agent loop ended."""

    FINISH = "finish"  # the agent said it was done
    TURNS = "turns"  # the turn budget ran out
    SECONDS = "seconds"  # the time budget ran out
    CONTEXT = "context"  # the conversation outgrew the model's context window
    VM_DOWN = "vm-down"  # the agent shut the server down or crashed it
    INFRA_ERROR = "infra-error"  # the machinery broke
    INVALID_SCENARIO = "invalid-scenario"  # the loop never started: the fault did not land
    NOT_STARTED = ""  # the episode ended before the loop

    @classmethod
    def _missing_(cls, value: object) -> StopReason | None:
        return {"infra": cls.INFRA_ERROR, "invalid": cls.INVALID_SCENARIO}.get(str(value))


class Flag(_Word):
    """Something worth knowing about a run, beside its verdict."""

    UNSAFE = "unsafe"  # a forbidden command was run
    COLLATERAL = "collateral"  # an invariant broke
    VM_DOWN = "vm-down"  # the agent shut the server down
    CONTEXT_FULL = "context-full"  # the conversation outgrew the context window
    WEAKENED = "weakened"  # rules 3: the state diff found the machine left weaker (the run fails)
    LEFT_BEHIND = "left-behind"  # rules 3: the state diff found something left behind (flagged)


class Recheck(_Word):
    """A re-check after the post-check (spec keys ``recheck_after``, ``reboot``): the fix must last.

    An episode that failed one records which in ``Episode.failed_recheck``.
    """

    PAUSE = "pause"  # the probes again after ``recheck_after`` seconds of guest time
    REBOOT = "reboot"  # the probes again after a clean reboot of the guest


class AgentKind(_Word):
    """Who acted: a real model, the scenario's reference solution, nobody, or one of its shortcuts.

    ``scripted`` replays a spec's ``shortcuts:`` entry (commands that look
    like a fix and are not) as ``verify`` runs it; it is no ``--agent``
    choice, since a shortcut belongs to a scenario, not to a bench.
    """

    MODEL = "model"
    ORACLE = "oracle"
    NOOP = "noop"
    SCRIPTED = "scripted"
    PYTHON = "python"  # an agent class of the user's (--agent file.py:Name), through the bridge
    MCP = "mcp"  # an outside agent, an MCP client of `rootbench mcp`
    INSPECT = "inspect"  # an Inspect AI solver acting through the `rootbench` sandbox

    @classmethod
    def _missing_(cls, value: object) -> AgentKind | None:
        # Older results named the backend ("openai") or the replayer instead of the agent.
        return cls.MODEL if value in ("openai", "replay") else None

    @classmethod
    def from_fingerprint(cls, kind: object) -> AgentKind:
        """The agent behind a recorded model fingerprint (``kind`` names a backend for real models)."""
        try:
            return cls(kind)
        except ValueError:
            return cls.MODEL


class Decided(_Word):
    """What the agent loop made of one action of a model's reply: a cassette's ``decision``
    events say it, so a viewer reads what the loop did instead of parsing the reply again."""

    COMMAND = "command"  # a command it ran (or began to run)
    FINISH = "finish"  # the agent said it was done: the loop stopped there
    NONE = "none"  # nothing it could act on (a protocol violation): it sent a correction


class ProbeOutcome(_Word):
    """A probe's three outcomes: an error (the probe could not run) is never a fail."""

    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"


class ReplayResult(_Word):
    """How replaying one cassette ended; not a verdict, but whether the recording still holds.

    A run that diverges from its cassette is ``mismatch``, never a verdict:
    were it ``infra-error``, a cassette recorded as ``infra-error`` would
    replay as ``same`` whatever had changed.
    """

    SAME = "same"  # the replayed verdict and flags equal the recorded ones
    DIFFERENT = "different"  # replayed to its end, judged otherwise: verdict, flags or grades
    MISMATCH = "mismatch"  # the run asked for what the cassette does not hold: it diverged
    SPEC_CHANGED = "spec-changed"  # the scenario's spec file changed (or is gone) since recording
    UNREADABLE = "unreadable"  # not a valid cassette


class Tier(_Word):
    """A scenario's difficulty tier as measured from the bundled models' ladder runs
    (:func:`runner.core.tiers.measured_tier`); the first three are also the spellings of a
    spec's ``difficulty:`` label, so the two compare directly."""

    EASY = "easy"  # a bundled model passed it unaided (hint level 0)
    MEDIUM = "medium"  # passed, but only with hints
    HARD = "hard"  # no bundled model passed it at any hint level
    UNMEASURED = "unmeasured"  # some bundled model has no complete ladder of it
