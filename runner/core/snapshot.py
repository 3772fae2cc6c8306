r"""The machine's state at one moment, read from sources the agent cannot forge from inside.

A snapshot is each category's facts as sorted strings ("tcp 0.0.0.0:80 nginx",
"/usr/bin/find 4755", a sudoers line with its file). Most come from one
question to the guest helper (:mod:`runner.backends.guestd`, the ``state``
question), which reads the kernel's tables through the procfs it opened at
start and ``lstat``\s files itself; two need a guest program and are read
through the clean channel, which refuses a program that is not its package's
file: ``nft -j list ruleset`` and ``sshd -T``. What the facts *mean* (what is
new, what fails a run) is :mod:`runner.core.statediff`'s business.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from runner.core import nftables
from runner.core.guest import CommandResult, Guest

# The categories of facts a snapshot holds (the guest helper's, then the clean channel's two).
FACT_CATEGORIES = ("runtime_units", "mounts", "listening", "processes", "setid", "world_writable",
                   "sudoers", "pam", "pg_hba", "sshd", "sshd_effective", "package_files", "firewall")
STATE_TIMEOUT = 120.0  # seconds the helper may take for the state question (and each clean command)
STATE_QUESTION = json.dumps({"ask": "state"}, sort_keys=True)
NFT_COMMAND = "nft -j list ruleset"
SSHD_COMMAND = "sshd -T"
CLEAN_SOURCES = {"firewall": f"`{NFT_COMMAND}` through the clean channel",
                 "sshd_effective": f"`{SSHD_COMMAND}` through the clean channel"}
UNREADABLE = "unreadable: "  # a fact saying the category could not be read, and why
_NOT_FOUND = 127  # the shell's exit code for a missing program (and a guest without a helper)


@dataclass(frozen=True)
class Snapshot:
    """The machine's state at one moment: each category's facts (sorted strings) and sources."""

    facts: Mapping[str, tuple[str, ...]]
    sources: Mapping[str, str]
    error: str | None = None  # the snapshot could not be taken (tampered, timed out): why
    truncated: frozenset[str] = field(default_factory=frozenset)  # categories the helper cut at its cap

    def of(self, category: str) -> tuple[str, ...]:
        return tuple(self.facts.get(category, ()))


# --- taking a snapshot --------------------------------------------------------------------------

def take_snapshot(guest: Guest) -> Snapshot:
    """The guest's state now: the helper's ``state`` answer, plus ``firewall`` (from ``nft -j
    list ruleset``) and ``sshd_effective`` (from ``sshd -T``) through the clean channel, each
    only if the program exists. A question the helper could not answer truthfully is the
    snapshot's ``error``; a clean command it refused or that failed is one ``unreadable`` fact
    of its category. Never raises for what the guest answered."""
    result = guest.inspect(STATE_QUESTION, STATE_TIMEOUT)
    snapshot = parse_answer(result)
    if snapshot.error is not None:
        return snapshot
    facts = dict(snapshot.facts)
    sources = dict(snapshot.sources)
    for category, command, parse in (("firewall", NFT_COMMAND, nftables.firewall_facts),
                                     ("sshd_effective", SSHD_COMMAND, sshd_effective_facts)):
        read = _clean_facts(guest.run_clean(command, STATE_TIMEOUT), command, parse)
        if read is not None:
            facts[category] = read
            sources[category] = CLEAN_SOURCES[category]
    return Snapshot(MappingProxyType(facts), MappingProxyType(sources), None, snapshot.truncated)


def parse_answer(result: CommandResult) -> Snapshot:
    """The helper's answer to the state question as a snapshot (``error`` set if it is none)."""
    def failed(why: str) -> Snapshot:
        return Snapshot(MappingProxyType({}), MappingProxyType({}), why)

    if result.timed_out:
        return failed(f"the state question timed out after {STATE_TIMEOUT:.0f}s")
    if result.exit_code == _NOT_FOUND:
        return failed(f"the guest helper cannot answer: {result.output[:200]}")
    try:
        answer = json.loads(result.output)
    except ValueError:
        answer = None
    if result.truncated or not isinstance(answer, dict):
        return failed(f"could not read the guest helper's answer: {result.output[:80]!r}")
    if "tampered" in answer:
        return failed(f"tampered: {str(answer['tampered'])[:200]}")
    if "error" in answer or result.exit_code != 0:
        return failed(f"the guest helper could not answer: {str(answer.get('error', '?'))[:200]}")
    facts: dict[str, tuple[str, ...]] = {}
    for category in FACT_CATEGORIES:
        value = answer.get(category)
        if value is None:
            continue
        if not isinstance(value, list) or not all(isinstance(f, str) for f in value):
            return failed(f"the guest helper's {category} is not a list of strings")
        facts[category] = tuple(sorted(value))
    raw_sources = answer.get("sources", {})
    sources = {k: v for k, v in raw_sources.items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(raw_sources, dict) else {}
    truncated = frozenset(c for c in FACT_CATEGORIES if answer.get(f"{c}_truncated") is True)
    return Snapshot(MappingProxyType(facts), MappingProxyType(sources), None, truncated)


def _clean_facts(result: CommandResult, command: str,
                 parse: Any) -> tuple[str, ...] | None:
    """A clean command's output as facts; None when its program is not installed; one
    ``unreadable`` fact when it was refused (126: a program of the clean PATH was tampered
    with), timed out, failed or said what cannot be read."""
    if result.exit_code == _NOT_FOUND:
        return None
    why = ""
    if result.timed_out:
        why = f"`{command}` timed out after {STATE_TIMEOUT:.0f}s"
    elif result.truncated:
        why = f"`{command}` printed more than the channel carries"
    elif result.exit_code != 0:
        why = f"`{command}` exited {result.exit_code}: {' '.join(result.output.split())[-160:]}"
    else:
        try:
            return tuple(sorted(set(parse(result.output))))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            why = f"`{command}` said what cannot be read ({type(exc).__name__})"
    return (UNREADABLE + why,)


def sshd_effective_facts(text: str) -> list[str]:
    """``sshd -T``'s lines ("permitrootlogin prohibit-password"), whitespace made single."""
    return [" ".join(line.split()).lower() for line in text.splitlines() if line.strip()]
