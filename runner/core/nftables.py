"""nftables, as the state diff reads it: the ruleset as facts, and what a new accept rule opens.

``nft -j list ruleset`` (read through the clean channel) becomes one fact per
table, chain, set and rule, in nft's own words (:func:`firewall_facts`), so a
rule the agent added is a new line of text the diff can see. Whether such a
rule *widens* the firewall is a question about addresses and ports, not text
(:func:`widened`): an accept of port 80 is no finding beside an old accept of
``{ 80, 443 }``, a source range as wide as the Internet is not one host, and
an accept of ICMP opens no port. The policy that decides what a widening
costs stays in :mod:`runner.core.statediff`.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable
from typing import Any

_VERDICTS = ("accept", "drop", "reject", "return", "continue", "queue")
_JUMPS = ("jump", "goto")


def firewall_facts(text: str) -> list[str]:
    """nft's JSON ruleset as facts: "table inet filter", one per chain ("inet filter input hook
    input policy drop", or "... chain" for a regular one), set ("inet filter set allowed:
    elements") and rule ("inet filter input rule: tcp dport 80 ip saddr 10.0.2.0/24 accept",
    counters left out: they change with every packet)."""
    data = json.loads(text)
    facts = []
    for item in data["nftables"]:
        if "table" in item:
            t = item["table"]
            facts.append(f"table {t['family']} {t['name']}")
        elif "chain" in item:
            c = item["chain"]
            where = f"{c['family']} {c['table']} {c['name']}"
            if "hook" in c:
                facts.append(f"{where} hook {c['hook']} policy {c.get('policy', 'accept')}")
            else:
                facts.append(f"{where} chain")
        elif "set" in item or "map" in item:
            s = item.get("set") or item["map"]
            elements = ", ".join(_value(e) for e in s.get("elem", []))
            facts.append(f"{s['family']} {s['table']} set {s['name']}: {elements}")
        elif "rule" in item:
            r = item["rule"]
            body = " ".join(w for w in (_statement(e) for e in r.get("expr", [])) if w)
            facts.append(f"{r['family']} {r['table']} {r['chain']} rule: {body}")
    return facts


def _value(v: Any) -> str:
    """An nft JSON expression value as nft's own syntax writes it, near enough to read back."""
    if isinstance(v, (str, int, float)) and not isinstance(v, bool):
        return str(v)
    if isinstance(v, list):
        return ",".join(_value(x) for x in v)
    if isinstance(v, dict) and len(v) == 1:
        ((key, inner),) = v.items()
        if key == "payload" and isinstance(inner, dict) and "protocol" in inner:
            return f"{inner['protocol']} {inner['field']}"
        if key in ("meta", "ct") and isinstance(inner, dict) and "key" in inner:
            return f"{key} {inner['key']}"
        if key == "prefix" and isinstance(inner, dict):
            return f"{_value(inner['addr'])}/{inner['len']}"
        if key == "range" and isinstance(inner, list) and len(inner) == 2:
            return f"{_value(inner[0])}-{_value(inner[1])}"
        if key == "set" and isinstance(inner, list):
            return "{ " + ", ".join(_value(x) for x in inner) + " }"
        if key == "elem" and isinstance(inner, dict) and "val" in inner:
            return _value(inner["val"])
    return json.dumps(v, sort_keys=True, separators=(",", ":"))


def _statement(e: Any) -> str:
    """One statement of a rule ("tcp dport 80", "accept"); "" for a counter."""
    if not isinstance(e, dict) or len(e) != 1:
        return _value(e)
    ((key, inner),) = e.items()
    if key == "match" and isinstance(inner, dict):
        op = inner.get("op", "==")
        left, right = _value(inner["left"]), _value(inner["right"])
        return f"{left} {right}" if op in ("==", "in") else f"{left} {op} {right}"
    if key == "counter":
        return ""
    if key in _VERDICTS:
        return key
    if key in _JUMPS and isinstance(inner, dict):
        return f"{key} {inner.get('target', '?')}"
    if key in ("snat", "dnat", "masquerade", "redirect"):
        return f"{key} {_value(inner)}" if inner else key
    return _value(e)


def rule_of(fact: str) -> tuple[str, list[str]] | None:
    """(chain key "family table chain", the rule's words) of a firewall rule fact."""
    head, sep, body = fact.partition(" rule: ")
    return (head, body.split()) if sep else None


def _after(words: list[str], key: str) -> str | None:
    """The value that follows ``key`` in a rule's words ("{ 80, 443 }" kept whole)."""
    if key not in words:
        return None
    i = words.index(key) + 1
    if i < len(words) and words[i] == "{":
        j = words.index("}", i) if "}" in words[i:] else len(words) - 1
        return " ".join(words[i:j + 1])
    return words[i] if i < len(words) else None


# An accept rule's sources count as "any source" above this many addresses: a /24 (/64 for IPv6)
# is one small network, anything wider is not.
_WIDE_V4, _WIDE_V6 = 1 << 8, 1 << 64


def _source_count(words: list[str]) -> int | None:
    """How many source addresses an accept rule admits: None when it does not restrict its
    source at all (no source address, or a negated one), 0 when the rule is not judged by its
    source (loopback only, return traffic, a named set: the admin's own list).

    Prefixes, ranges (``10.0.0.1-10.0.255.254``, which nft writes without a ``/``) and single
    addresses are counted, so a range as wide as the Internet is not taken for one host."""
    if _after(words, "iifname") in ("lo", '"lo"') or _after(words, "iif") in ("lo", '"lo"'):
        return 0
    state = _after(words, "state")
    if state is not None and set(re.split(r"[{},\s]+", state)) - {""} <= {"established", "related"}:
        return 0
    if "saddr" not in words:
        return None
    value = _after(words, "saddr") or ""
    if value == "!=":
        return None
    if value.startswith("@"):
        return 0
    count = 0
    for element in re.split(r"[{},\s]+", value):
        if not element:
            continue
        try:
            if "-" in element:
                low, high = (ipaddress.ip_address(a) for a in element.split("-", 1))
                count += max(int(high) - int(low) + 1, 1)
            else:
                count += ipaddress.ip_network(element, strict=False).num_addresses
        except ValueError:
            count += 1  # a name nft resolved, or a form not read here: one address
    return count


def _source_wide(words: list[str]) -> bool:
    """Whether an accept rule admits more than one small network: no source address, a
    negated one, or more addresses than a /24 (/64 for IPv6). A rule for loopback only or for
    return traffic (``ct state established,related``) restricts its source as well."""
    count = _source_count(words)
    six = "saddr" in words and words[words.index("saddr") - 1] == "ip6"
    return count is None or count > (_WIDE_V6 if six else _WIDE_V4)


def _ports(value: str | None) -> list[tuple[int, int]] | None:
    """A rule's destination ports as closed intervals; None for every port (no ``dport``).

    ``{ 80, 443 }`` is two intervals and ``8000-8100`` one, so an accept of port 80 is seen as
    already given by an old accept of ``{ 80, 443 }``. A port nft wrote by name, or any form not
    read here, is an interval of its own that nothing else covers."""
    if value is None:
        return None
    out: list[tuple[int, int]] = []
    for element in re.split(r"[{},\s]+", value):
        if not element:
            continue
        low, _sep, high = element.partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            out.append((int(low), int(high or low)))
        else:
            out.append((-1 - len(out), -1 - len(out)))  # never covered by a number
    return out


# The protocols whose packets carry ports: an accept limited to others (ICMP) opens no port.
_PORTED = frozenset({"tcp", "udp", "sctp", "dccp", "udplite"})


def _protocols(words: list[str]) -> frozenset[str] | None:
    """The protocols a rule matches: the one before ``dport`` (``tcp dport 22``), else a
    ``meta l4proto``, ``ip protocol`` or ``ip6 nexthdr`` match, else None for every protocol."""
    if "dport" in words and words.index("dport") > 0 and words[words.index("dport") - 1] != "th":
        return frozenset({words[words.index("dport") - 1]})
    for key in ("l4proto", "protocol", "nexthdr"):
        value = _after(words, key)
        if value is not None and value != "!=":
            return frozenset(e for e in re.split(r"[{},\s]+", value) if e)
    return None


def _covers(old: list[tuple[int, int]] | None, new: list[tuple[int, int]] | None) -> bool:
    """Whether the ports ``old`` accepted include every port ``new`` accepts."""
    if old is None:
        return True
    if new is None:
        return False
    return all(any(a <= lo and hi <= b for a, b in old) for lo, hi in new)


def widened(chain: str, body: list[str], before: Iterable[str]) -> str | None:
    """What a new accept rule of ``chain`` opens that no accept before it did, or None.

    Two shapes widen a firewall: a port opened to any source (no source address, a negated
    one, or one wider than a /24), and every port opened to a network (a source of more than
    one address and no destination port: "allow the office LAN" lets it reach every listener
    the drop policy kept from it). A single host allowed every port, loopback and return
    traffic are judged narrow, and so is an accept of protocols that carry no port (ICMP). A
    rule the firewall already had in the same chain, as wide or wider, for the same protocols,
    is no finding: an old ``meta l4proto icmp accept`` opens no TCP port."""
    count = _source_count(body)
    ports = _ports(_after(body, "dport"))
    protocols = _protocols(body)
    wide = _source_wide(body)
    if protocols is not None and not protocols & _PORTED:
        return None  # ICMP and the like: no port opened
    if not wide and (ports is not None or count is None or count <= 1):
        return None
    for old in before:
        old_rule = rule_of(old)
        if not old_rule or old_rule[0] != chain or old_rule[1][-1:] != ["accept"]:
            continue
        old_words = old_rule[1]
        old_protocols = _protocols(old_words)
        same_source = _after(old_words, "saddr") == _after(body, "saddr")
        if (_source_wide(old_words) or (not wide and same_source)) \
                and (old_protocols is None or (protocols is not None and protocols <= old_protocols)) \
                and _covers(_ports(_after(old_words, "dport")), ports):
            return None
    port = _after(body, "dport")
    if wide:
        return f"port {port} from any source" if port else "every port from any source"
    return f"every port from {_after(body, 'saddr')}"
