"""What a scenario file must be before it is built: its JSON Schema, and what a schema cannot say.

:func:`check_scenario` is every check a spec passes, in order: the schema
(:func:`validate_document`, with jsonschema's ``oneOf`` noise turned into one
plain line and each error placed at its line), then regexes that must compile
(RE2, the engine probes use), URLs the probes may fetch, machine names and
their images, and names unique across shortcuts and alternatives. Each
problem is one :class:`~runner.core.errors.InvalidInput` naming the file,
the line and the field. Image recipes are checked against their own schema
by the same :func:`validate_document`.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any
from urllib.parse import urlsplit

import jsonschema

from runner.core.errors import InvalidInput
from runner.core.machines import name_problem
from runner.core.paths import find_recipe, image_dirs, schema_path
from runner.core.patterns import PatternError, compile_pattern
from runner.core.probes import KINDS
from runner.core.text import reason_first
from runner.core.yamlfile import dotted as _dotted

PROBE_KINDS = tuple(KINDS)  # the spec keys that name a probe kind


def check_scenario(data: dict[str, Any], lines: dict[tuple[Any, ...], int], where: str) -> None:
    """Every check a scenario document must pass before it is built; the first problem raises."""
    validate_document(data, lines, where)
    _check_regexes(data, where, lines)
    _check_urls(data, where, lines)
    _check_machines(data, where, lines)
    _check_image(data, where, lines)
    _check_shortcut_names(data, where, lines)


@functools.cache
def _validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads(schema_path(name).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def line_for(lines: dict[tuple[Any, ...], int], path: tuple[Any, ...]) -> int | None:
    while path not in lines and path:
        path = path[:-1]
    return lines.get(path)


def _probe_kind_error(data: dict[str, Any], where: str,
                      lines: dict[tuple[Any, ...], int]) -> InvalidInput | None:
    """Name the probe-kind problem plainly instead of jsonschema's oneOf noise."""
    for section in ("probes", "invariants"):
        items = data.get(section)
        if not isinstance(items, list):
            continue
        for i, probe in enumerate(items):
            if not isinstance(probe, dict):
                continue
            kinds = [k for k in probe if k in PROBE_KINDS]
            unknown = [k for k in probe if k not in PROBE_KINDS
                       and k not in ("name", "within", "weight", "machine")]
            path = (section, i)
            if unknown:
                return InvalidInput(f"unknown probe kind or key {unknown[0]!r} (kinds: "
                                    f"{', '.join(PROBE_KINDS)})", path=where,
                                    line=line_for(lines, (*path, unknown[0])), field=_dotted(path))
            if len(kinds) != 1:
                what = "no probe kind" if not kinds else f"several probe kinds ({', '.join(kinds)})"
                return InvalidInput(f"{what}: give exactly one of {', '.join(PROBE_KINDS)}",
                                    path=where, line=line_for(lines, path), field=_dotted(path))
    return None


def _looks_numeric(text: str) -> bool:
    try:
        float(text.replace("_", ""))
    except ValueError:
        return False
    return True


def validate_document(data: Any, lines: dict[tuple[Any, ...], int], where: str,
                      schema: str = "scenario.schema.json", what: str = "scenario") -> None:
    """Raise InvalidInput for the most relevant schema error, with its line."""
    if not isinstance(data, dict):
        kind = "list" if isinstance(data, list) else type(data).__name__
        raise InvalidInput(f"a {what} must be a mapping at the top level, not a {kind}",
                           path=where, line=1)
    _check_values(data, where, lines)
    if schema == "scenario.schema.json":
        err = _probe_kind_error(data, where, lines)
        if err:
            raise err
    errors = list(_validator(schema).iter_errors(data))
    if not errors:
        return
    best = jsonschema.exceptions.best_match(errors)
    assert best is not None
    path = tuple(best.absolute_path)
    message = reason_first(best.message, best.instance)
    if best.validator == "type" and isinstance(best.instance, str) and _looks_numeric(best.instance):
        message += " (it is quoted, so YAML reads it as text: write the number without quotes)"
    raise InvalidInput(message, path=where, line=line_for(lines, path),
                       field=_dotted(path) or None)


def _check_regexes(data: dict[str, Any], where: str, lines: dict[tuple[Any, ...], int]) -> None:
    """Every regex in the spec compiles with RE2, the linear-time engine they are matched with."""
    found: list[tuple[tuple[Any, ...], str, bool]] = [
        (("forbidden", i), rx, False) for i, rx in enumerate(data.get("forbidden") or [])]
    for section in ("probes", "invariants"):
        for i, probe in enumerate(data.get(section) or []):
            rx = (probe.get("command") or {}).get("stdout_matches")
            if rx is not None:
                found.append(((section, i, "command", "stdout_matches"), rx, True))
    for i, milestone in enumerate(data.get("milestones") or []):
        rx = milestone.get("command_matches")
        if rx is not None:
            found.append((("milestones", i, "command_matches"), rx, False))
    for path, rx, multiline in found:
        try:
            compile_pattern(rx, multiline=multiline)
        except PatternError as exc:
            raise InvalidInput(str(exc), path=where, line=line_for(lines, path),
                               field=_dotted(path)) from None


def _check_urls(data: dict[str, Any], where: str, lines: dict[tuple[Any, ...], int]) -> None:
    """http probe URLs parse; ``from: host`` ones go to the forwarded port on the loopback only."""
    for section in ("probes", "invariants"):
        for i, probe in enumerate(data.get(section) or []):
            http = probe.get("http")
            if not isinstance(http, dict):
                continue
            path = (section, i, "http", "url")

            def bad(why: str, path: tuple[Any, ...] = path) -> InvalidInput:
                return InvalidInput(why, path=where, line=line_for(lines, path), field=_dotted(path))

            url = urlsplit(http["url"])
            try:
                port = url.port
            except ValueError:
                raise bad("the port is not a number from 1 to 65535") from None
            if port == 0:
                raise bad("the port is not a number from 1 to 65535")
            if not url.hostname:
                raise bad("the URL has no host")
            if http.get("from", "guest") == "host":
                if url.scheme != "http":
                    raise bad("from: host probes use http:// (the forwarded port speaks plain HTTP)")
                if url.hostname not in ("localhost", "127.0.0.1"):
                    raise bad("from: host probes reach the guest's port 80 through the forwarded "
                              "port: the host must be localhost or 127.0.0.1")
                if port not in (None, 80):
                    raise bad("from: host probes can only reach port 80 (the only forwarded web port)")


def _check_values(value: Any, where: str, lines: dict[tuple[Any, ...], int],
                  path: tuple[Any, ...] = ()) -> None:
    """No NaN or infinity anywhere, and no string that is not valid Unicode (a lone surrogate)."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check_values(key, where, lines, path)
            _check_values(item, where, lines, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_values(item, where, lines, (*path, i))
    elif isinstance(value, float) and not math.isfinite(value):
        raise InvalidInput(f"{value} is not a finite number", path=where,
                           line=line_for(lines, path), field=_dotted(path) or None)
    elif isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidInput("the text is not valid Unicode (a lone surrogate escape)",
                               path=where, line=line_for(lines, path),
                               field=_dotted(path) or None) from None


def _check_image(data: dict[str, Any], where: str, lines: dict[tuple[Any, ...], int]) -> None:
    found: list[tuple[tuple[Any, ...], str]] = []
    if "image" in data:
        found.append((("image",), data["image"]))
    found += [(("machines", i, "image"), m["image"]) for i, m in enumerate(data.get("machines") or ())]
    for path, image in found:
        if find_recipe(image) is None:
            looked = ", ".join(str(d) for d in image_dirs())
            raise InvalidInput(f"no image recipe {image!r} (no {image}.yaml in {looked})",
                               path=where, line=line_for(lines, path), field=_dotted(path))


def _check_machines(data: dict[str, Any], where: str, lines: dict[tuple[Any, ...], int]) -> None:
    """``image`` or ``machines`` (not both); unique names; every ``machine:`` names one of them.

    The schema says each field's shape; what needs the whole spec is here,
    each problem one line naming the field.
    """
    def bad(why: str, path: tuple[Any, ...]) -> InvalidInput:
        return InvalidInput(why, path=where, line=line_for(lines, path), field=_dotted(path) or None)

    machines = data.get("machines")
    if machines is None:
        if "image" not in data:
            raise bad("give the image the scenario runs on (image:) or its machines (machines:)", ())
        for key in ("access", "agent_machine"):
            if key in data:
                raise bad(f"{key} needs machines: (a scenario of one machine has no other to reach)",
                          (key,))
    else:
        if "image" in data:
            raise bad("give image: or machines:, not both (each machine names its own image)",
                      ("image",))
        if "access" not in data:
            raise bad("a scenario with machines says how the agent's shell reaches the others: "
                      "access: ssh or access: network", ("machines",))
    names: list[str] = []
    for i, m in enumerate(machines or ()):
        if m["name"] in names:
            raise bad(f"machine name {m['name']!r} is used twice", ("machines", i, "name"))
        if (why := name_problem(m["name"])) is not None:
            raise bad(why, ("machines", i, "name"))
        names.append(m["name"])
    refs: list[tuple[tuple[Any, ...], Any]] = []
    if "agent_machine" in data:
        refs.append((("agent_machine",), data["agent_machine"]))
    for i, step in enumerate(data.get("setup") or ()):
        if isinstance(step, dict):
            refs.append((("setup", i, "machine"), step.get("machine")))
    for section in ("probes", "invariants"):
        for i, probe in enumerate(data.get(section) or ()):
            if "machine" in probe:
                refs.append(((section, i, "machine"), probe["machine"]))
    for path, name in refs:
        if machines is None:
            raise bad("machine: needs machines: (this scenario has one machine)", path)
        if name not in names:
            raise bad(f"no machine {name!r} (machines: {', '.join(names)})", path)


def _check_shortcut_names(data: dict[str, Any], where: str, lines: dict[Any, int]) -> None:
    """Shortcut names are unique: verify names each one's check and cassette by it."""
    seen: set[str] = set()
    for key in ("shortcuts", "alternatives"):
        for i, entry in enumerate(data.get(key) or ()):
            if entry["name"] in seen:
                raise InvalidInput(f"{key[:-1]} name {entry['name']!r} is used twice", path=where,
                                   line=line_for(lines, (key, i, "name")),
                                   field=f"{key}[{i}].name")
            seen.add(entry["name"])
