"""Strict YAML: duplicate keys refused, aliases refused, line numbers.

Every YAML file rootbench reads (scenario specs, image recipes) is a file a
user or a contributor hands over, so it is read strictly and every problem is
one :class:`~runner.core.errors.InvalidInput` naming the file and the line:

- an alias (``*name``, also as a merge ``<<: *name``) is refused, so no alias
  bomb can expand; an anchor alone is harmless and allowed;
- a key given twice in one mapping is refused (YAML would keep the last one
  silently);
- an integer whose value has more than :data:`MAX_INT_DIGITS` digits is
  refused (Python will not even print one: the crash would come later, far
  from the line);
- a number in exponent form without a dot (``1e9``) is a float, as YAML 1.2
  and every reader of a spec expect, not the string PyYAML's YAML 1.1 makes it;
- :func:`parse_yaml` also returns each field's line, for the messages the
  schema checks give later.

Why two parsers. PyYAML's pure-Python parser is the reference: it is where an
alias is caught at the line it is written on, and its messages are the ones
users see. It is also ~20 times slower than libyaml's (``yaml.CSafeLoader``),
which made re-reading the specs most of an offline replay's time. So a file is
parsed with libyaml first when PyYAML was built with it; the node tree it
composes has the same line numbers, and the same walk checks it (an alias
there is the anchored node met a second time). Whenever that fast path finds
anything wrong, or fails in any way, the file is parsed again with the
reference parser, which either words the error or, if libyaml alone stumbled,
gives the data: an error message never depends on which parser ran, and a
file libyaml cannot read is still read. ``tests/unit/test_spec.py`` checks
that both parsers give the same data and lines for every committed spec and
recipe and for generated texts.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from typing import Any

import yaml

from runner.core.errors import InvalidInput

# Python refuses to turn an integer of more digits than this into text or back
# (sys.get_int_max_str_digits, CVE-2020-10735): the default, fixed here so that
# whether a file is valid does not depend on PYTHONINTMAXSTRDIGITS.
MAX_INT_DIGITS = 4300
_INT_CEILING = 10 ** MAX_INT_DIGITS
_INT_TAG = "tag:yaml.org,2002:int"

Lines = dict[tuple[Any, ...], int]  # a field's path (keys and list indexes) -> its line, from 1


class _AliasRefused(yaml.MarkedYAMLError):
    """An alias, refused where it is written (the reference parser only)."""


class _ValueRefused(yaml.MarkedYAMLError):
    """A scalar its explicit tag cannot read (``!!bool maybe``, ``!!int x``), where it is written."""


# YAML 1.2's floats: PyYAML (YAML 1.1) wants a dot, so `within: 1e9` would be the string "1e9".
_FLOAT_12 = re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X)


def _resolvers() -> dict[Any, list[tuple[str, re.Pattern[str]]]]:
    """SafeLoader's implicit resolvers with YAML 1.2's float pattern in place of 1.1's.

    Both loaders take the same table, so both read every plain scalar as the same type.
    """
    table = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    for first in "-+.0123456789":
        table[first] = [(tag, rx) for tag, rx in table.get(first, [])
                        if tag != "tag:yaml.org,2002:float"]
        table[first].append(("tag:yaml.org,2002:float", _FLOAT_12))
    return table


def _construct_object(self: Any, node: yaml.Node, deep: bool = False) -> Any:
    """PyYAML's, but a value its tag cannot read is a marked error, not a bare
    KeyError or ValueError from deep in the constructor (both loaders use this)."""
    try:
        return yaml.constructor.BaseConstructor.construct_object(self, node, deep)
    except (yaml.YAMLError, RecursionError):
        raise
    except Exception:  # noqa: BLE001 - any constructor's own failure is this value's fault
        value = node.value if isinstance(node.value, str) else ""
        shown = value if len(value) <= 40 else value[:40] + "..."
        raise _ValueRefused(None, None, f"{shown!r} cannot be read as {node.tag}",
                            node.start_mark) from None


class _Loader(yaml.SafeLoader):
    """The reference: SafeLoader that refuses an alias at the line it is written on.

    (Composed, an alias is the anchored node itself, whose line is the anchor's.)
    """

    yaml_implicit_resolvers = _resolvers()
    construct_object = _construct_object

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _AliasRefused(None, None, "YAML anchors and aliases are not allowed "
                                            f"(an alias *{event.anchor})", event.start_mark)
        # types-PyYAML says index is an int; PyYAML also passes None and a mapping's key node
        return super().compose_node(parent, index)  # type: ignore[arg-type]


# libyaml's parser and composer with the same resolvers and constructors; None without libyaml.
_FastLoader: type[Any] | None = None
if getattr(yaml, "__with_libyaml__", False):
    _FastLoader = type("_FastLoader", (yaml.CSafeLoader,),
                       {"yaml_implicit_resolvers": _Loader.yaml_implicit_resolvers,
                        "construct_object": _construct_object,
                        "__doc__": "libyaml's SafeLoader with the reference's resolvers."})


def dotted(path: Iterable[Any]) -> str:
    """A field's path as messages name it: ``probes[1].http.status``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _alias(node: yaml.Node, path: tuple[Any, ...], where: str) -> InvalidInput:
    return InvalidInput("YAML anchors and aliases are not allowed", path=where,
                        line=node.start_mark.line + 1, field=dotted(path) or None)


def _check_int(loader: Any, node: yaml.ScalarNode, path: tuple[Any, ...], where: str) -> None:
    """An integer scalar Python can hold and print: at most :data:`MAX_INT_DIGITS` digits."""
    try:
        value = loader.construct_yaml_int(node)
    except Exception:  # noqa: BLE001 - not an integer (`!!int x`, construction refuses it at
        # its line), or one too long for this Python to read
        limit = sys.get_int_max_str_digits()
        if not limit or sum(ch.isdigit() for ch in node.value) <= limit:
            return
        value = _INT_CEILING
    if abs(value) >= _INT_CEILING:
        raise InvalidInput(f"an integer of over {MAX_INT_DIGITS} digits (if it is text, quote it)",
                           path=where, line=node.start_mark.line + 1, field=dotted(path) or None)


class _Differs(Exception):
    """The fast path met a construct where libyaml and PyYAML are known to read differently."""


# Text where the two parsers are known to differ, so the reference alone reads it: PyYAML
# refuses tabs in places libyaml takes them and a comment right after a block scalar's
# indicators (`>#`), and keeps a byte-order mark that libyaml drops.
_DIFFERS = re.compile("[\t\ufeff]|[|>][-+0-9]{0,2}#")


def _doubt(node: yaml.ScalarNode, flow: bool) -> bool:
    """Whether libyaml's reading of this scalar may not be PyYAML's (found by comparing them).

    Each parser places an empty plain scalar (``key:`` with no value, a lone
    ``---``) by its own rule, a line apart when a line break follows it; a bare
    ``!`` tag on one is an empty string to libyaml and null to PyYAML; and an
    empty block scalar may be one whose header only libyaml accepts (``>1#``); and
    PyYAML ends a plain scalar inside a flow collection at a ``?``, libyaml does not.
    Specs and recipes seldom hold any of these, so the reference reads those files.
    """
    if not node.value:
        return node.style in (None, "", "|", ">")
    return flow and not node.style and "?" in node.value


class _Walk:
    """Checks the composed tree before construction and notes each field's line.

    No node is met twice (an alias), no key twice in one mapping, no integer
    Python cannot print. With ``fast`` (libyaml composed the tree) a construct
    where the two parsers differ raises :class:`_Differs`.
    """

    def __init__(self, loader: Any, where: str, fast: bool) -> None:
        self.loader, self.where, self.fast = loader, where, fast
        self.lines: Lines = {}
        self.seen: set[int] = set()

    def node(self, node: yaml.Node, path: tuple[Any, ...], flow: bool = False) -> None:
        """``node`` (the value at ``path``, inside a flow collection or not) and all under it."""
        if id(node) in self.seen:
            raise _alias(node, path, self.where)
        self.seen.add(id(node))
        self.lines[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            keys: set[Any] = set()
            for key_node, value_node in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else repr(key_node)
                if key in keys:
                    raise InvalidInput(f"duplicate key {key!r}", path=self.where,
                                       line=key_node.start_mark.line + 1,
                                       field=dotted(path) or None)
                keys.add(key)
                self.key(key_node, path, flow or bool(node.flow_style))
                self.node(value_node, (*path, key), flow or bool(node.flow_style))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self.node(item, (*path, i), flow or bool(node.flow_style))
        elif isinstance(node, yaml.ScalarNode):
            self.scalar(node, path, flow)

    def key(self, node: yaml.Node, path: tuple[Any, ...], flow: bool) -> None:
        """A mapping's key, and everything under a complex one: met once, no line of its own."""
        if id(node) in self.seen:
            raise _alias(node, path, self.where)
        self.seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                self.key(key_node, path, flow or bool(node.flow_style))
                self.key(value_node, path, flow or bool(node.flow_style))
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                self.key(item, path, flow or bool(node.flow_style))
        elif isinstance(node, yaml.ScalarNode):
            self.scalar(node, path, flow)

    def scalar(self, node: yaml.ScalarNode, path: tuple[Any, ...], flow: bool) -> None:
        if self.fast and _doubt(node, flow):
            raise _Differs
        if node.tag == _INT_TAG:
            _check_int(self.loader, node, path, self.where)


def _parse(loader_class: type[Any], text: str, where: str) -> tuple[Any, Lines]:
    """One document with ``loader_class``; every problem is InvalidInput naming file and line."""
    fast = loader_class is not _Loader
    if fast and _DIFFERS.search(text):
        raise _Differs
    loader = None
    try:
        loader = loader_class(text)
        try:
            node = loader.get_single_node()
            if node is None:
                raise InvalidInput("the file is empty", path=where)
            walk = _Walk(loader, where, fast)
            walk.node(node, ())
            data = loader.construct_document(node)
        finally:
            loader.dispose()
    except (_AliasRefused, _ValueRefused) as exc:
        raise InvalidInput(str(exc.problem), path=where,
                           line=exc.problem_mark.line + 1 if exc.problem_mark else None) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        problem = exc.problem or exc.context or "invalid YAML"
        raise InvalidInput(f"YAML syntax error: {problem}", path=where, line=line) from None
    except yaml.YAMLError as exc:
        raise InvalidInput(f"YAML error: {str(exc).splitlines()[0]}", path=where) from None
    except RecursionError:
        raise InvalidInput("the YAML nests too deeply", path=where) from None
    except InvalidInput:
        raise
    except Exception as exc:  # noqa: BLE001 - PyYAML's own slip on hostile text (`"\UFFFFFFFF"`
        # is a ValueError from chr): still one line, at the line the reader had reached
        line = getattr(loader, "line", None)
        raise InvalidInput(f"YAML syntax error: {' '.join(str(exc).split())[:120]}", path=where,
                           line=line + 1 if isinstance(line, int) else None) from None
    return data, walk.lines


def parse_yaml(text: str, where: str, *, accelerated: bool = True) -> tuple[Any, Lines]:
    """Parse one YAML document strictly; return the data and a map from field path to line.

    ``where`` names the file in messages. With ``accelerated`` (the default)
    libyaml parses first when PyYAML has it, and the reference parser only
    when that finds a problem (see the module docstring); ``accelerated=False``
    is the reference alone.
    """
    if accelerated and _FastLoader is not None:
        try:
            return _parse(_FastLoader, text, where)
        except Exception:  # noqa: BLE001 - whatever it is, the reference parser words it
            pass
    return _parse(_Loader, text, where)
