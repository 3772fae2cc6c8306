"""docs/ARCHITECTURE.md's module tables, and developers.md's concept table, held to the code.

A maintainer finds a concept's home from these tables, so a table that names
a removed function or misses a new module sends them to the wrong place
(issue #48 found seven such drifts that nothing checked). Each layer's
section (a heading naming its folder, ``## The core (`runner/core`)``) has a
table of ``| `module.py` | concept | public surface |``; here every row's
module must exist in that folder, every backticked name of its public
surface must be defined there, and every module in the folder must have a
row.

The modules are read with ``ast``, never imported: ``backends/guestd.py`` is
a text shipped into the guest and empties ``sys.path`` when imported, and
the optional extras (Ray, Inspect, MCP) need not be installed. A module's
names are its top-level functions, classes, assignments and ``__all__`` (a
package's re-exports); a class's are its methods, class-level assignments
(fields, Enum members), nested classes and ``self.x`` attributes. A module
with ``__all__`` has declared its public surface there, so its row may name
only what ``__all__`` holds.

How a backticked word of the public-surface cell is read:

- ``name``, ``name(args)``, ``name(args) -> T``: a name of the row's module
  (either module, for a row of two); the arguments are prose.
- ``Class.member``: a member of that class of the module.
- ``module.Name``, where ``module`` is not a name of the row's module but a
  module of ``runner/``: a name defined in that other module (for mentions
  such as "a ``guest.Guest``" that are not this module's own).
- Inside parentheses right after a class (``Guest`` (``exec``, ...)): a
  member of that class, or else a name of the module.
- Anything else (``--jobs 1``, ``$ROOTBENCH_SPECS``, ``schema/``, ``lan=``)
  is prose and not checked.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "runner"
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
DEVELOPERS = ROOT / "docs" / "developers.md"
LAYERS = ("core", "backends", "app")
NOT_MODULES = {"__init__.py", "__main__.py"}

_HEADING = re.compile(r"^#+ ")
_LAYER_HEADING = re.compile(r"^#+ .*\(`(runner/[\w/]+?)/?`\)\s*$")
_IDENTIFIER = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)(?:\(.*\))?(?:\s*->.*)?")
_TOKEN = re.compile(r"`([^`]*)`|\(|\)")


@dataclass(frozen=True)
class Row:
    """One table row: the folder its section names, the modules of its first cell, its last cell."""

    folder: Path
    line: int
    modules: tuple[str, ...]
    surface: str
    cells: int

    def where(self) -> str:
        return f"ARCHITECTURE.md:{self.line} ({', '.join(self.modules)})"


@dataclass
class Names:
    """What a module defines: its own names, and each of its classes' members."""

    top: set[str] = field(default_factory=set)
    members: dict[str, set[str]] = field(default_factory=dict)
    hidden: set[str] = field(default_factory=set)  # defined, but left out of the module's ``__all__``


def table_rows(text: str, root: Path = ROOT) -> list[Row]:
    """Every row of every table in a section whose heading names a folder of ``runner/``."""
    rows: list[Row] = []
    folder: Path | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if _HEADING.match(line):
            found = _LAYER_HEADING.match(line)
            folder = root / found.group(1) if found else None
            continue
        if folder is None or not line.startswith("|"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells[0] == "module" or set(cells[0]) <= {"-", ":"}:
            continue
        modules = tuple(re.findall(r"`([^`]+)`", cells[0]))
        rows.append(Row(folder, number, modules, cells[-1], len(cells)))
    return rows


def _targets(node: ast.AST) -> list[str]:
    """The plain names an assignment binds (``A = ...``, ``A, B = ...``, ``A: int = ...``)."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Tuple | ast.List):
        return [name for element in node.elts for name in _targets(element)]
    return []


def _class_members(node: ast.ClassDef) -> set[str]:
    members: set[str] = set()
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            members.add(item.name)
        elif isinstance(item, ast.Assign):
            members.update(name for target in item.targets for name in _targets(target))
        elif isinstance(item, ast.AnnAssign):
            members.update(_targets(item.target))
    for inner in ast.walk(node):
        if (isinstance(inner, ast.Attribute) and isinstance(inner.ctx, ast.Store)
                and isinstance(inner.value, ast.Name) and inner.value.id == "self"):
            members.add(inner.attr)
    return members


def module_names(path: Path) -> Names:
    """The names ``path`` defines at its top level (inside ``if``/``try`` too), read with ``ast``."""
    names = Names()
    exported: set[str] = set()
    body = list(ast.parse(path.read_text(encoding="utf-8"), str(path)).body)
    while body:
        node = body.pop(0)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.top.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.top.add(node.name)
            names.members[node.name] = _class_members(node)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            bound = [n for t in node.targets for n in _targets(t)] if isinstance(node, ast.Assign) else _targets(node.target)
            names.top.update(bound)
            if "__all__" in bound and isinstance(node.value, ast.List | ast.Tuple):
                exported.update(e.value for e in node.value.elts
                                if isinstance(e, ast.Constant) and isinstance(e.value, str))
        elif isinstance(node, ast.If | ast.Try):
            body.extend(node.body + node.orelse + getattr(node, "finalbody", []))
            body.extend(item for handler in getattr(node, "handlers", []) for item in handler.body)
    if exported:
        names.hidden = names.top - exported - {"__all__"}
        names.top |= exported
    return names


def _module_path(folder: Path, module: str) -> Path:
    """A row's module as a file: ``x.py`` itself, a package ``x/`` its ``__init__.py``."""
    return folder / module / "__init__.py" if module.endswith("/") else folder / module


def _other_module(root: Path, layer_folder: Path, stem: str) -> Path | None:
    """``runner/<layer>/<stem>.py`` for a ``stem.Name`` mention: this row's folder first, then every layer."""
    for folder in (layer_folder, *(root / "runner" / layer for layer in LAYERS)):
        for candidate in (folder / f"{stem}.py", folder / stem / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def mentions(surface: str) -> list[tuple[str | None, str]]:
    """Each backticked identifier of a cell, with the name whose parentheses it is inside (or None)."""
    found: list[tuple[str | None, str]] = []
    owners: list[str | None] = []
    last: tuple[str, int] | None = None  # the last identifier outside parentheses and where it ended
    for token in _TOKEN.finditer(surface):
        if token.group(0) == "(":
            before = surface[last[1]:token.start()] if last else "x"
            owners.append(last[0] if last and not before.strip() else None)
            continue
        if token.group(0) == ")":
            if owners:
                owners.pop()
            continue
        name = _IDENTIFIER.fullmatch(token.group(1).strip())
        if name is None:
            continue
        owner = next((o for o in reversed(owners) if o is not None), None)
        found.append((owner, name.group(1)))
        if not owners:
            last = (name.group(1), token.end())
    return found


def _check_name(row: Row, owner: str | None, name: str, defined: Names, root: Path) -> str | None:
    """Why ``name`` (in the parentheses of ``owner``) is not defined where the row says, or None."""
    if owner in defined.members and name in defined.members[owner]:
        return None
    if "." in name:
        head, member = name.split(".")
        if head in defined.members:
            return None if member in defined.members[head] else f"`{head}` has no member `{member}`"
        if head in defined.top:
            return None  # a constant's attribute, an enum member through a function: prose
        other = _other_module(root, row.folder, head)
        if other is None:
            return f"`{name}`: `{head}` is neither a name of this module nor a module of runner/"
        return None if member in module_names(other).top else f"`{name}`: no `{member}` in {other.relative_to(root)}"
    if name in defined.hidden:
        return f"`{name}` is defined but not in the module's `__all__`"
    if name in defined.top:
        return None
    if owner in defined.members:
        return f"`{name}` is neither a member of `{owner}` nor a name of the module"
    return f"`{name}` is not defined in the module"


def row_problems(text: str, root: Path = ROOT) -> list[str]:
    """Every row whose module is missing or whose public surface names something its module lacks."""
    problems: list[str] = []
    for row in table_rows(text, root):
        if not row.modules or row.cells != 3:
            problems.append(f"{row.where()}: not a `| module | concept | public surface |` row")
            continue
        paths = [_module_path(row.folder, module) for module in row.modules]
        missing = [module for module, path in zip(row.modules, paths, strict=True) if not path.is_file()]
        if missing:
            problems.append(f"{row.where()}: no {', '.join(missing)} in {row.folder.relative_to(root)}/")
            continue
        defined = Names()
        for path in paths:
            names = module_names(path)
            defined.top |= names.top
            defined.hidden |= names.hidden
            for cls, members in names.members.items():
                defined.members.setdefault(cls, set()).update(members)
        defined.hidden -= {n for p in paths for n in module_names(p).top - module_names(p).hidden}
        for owner, name in mentions(row.surface):
            why = _check_name(row, owner, name, defined, root)
            if why:
                problems.append(f"{row.where()}: {why}")
    return problems


def undocumented(text: str, root: Path = ROOT) -> list[str]:
    """Every module (and sub-package) of the three layers that no table of its folder has a row for."""
    rows: dict[Path, set[str]] = {}
    for row in table_rows(text, root):
        rows.setdefault(row.folder, set()).update(row.modules)
    problems: list[str] = []
    for layer in LAYERS:
        for path in sorted((root / "runner" / layer).rglob("*.py")):
            if path.name in NOT_MODULES:
                if path.name == "__init__.py" and path.parent.name not in LAYERS:
                    package = path.parent
                    if f"{package.name}/" not in rows.get(package.parent, set()):
                        problems.append(f"{package.relative_to(root)}/ has no row in the table of "
                                        f"{package.parent.relative_to(root)}/")
                continue
            if path.name not in rows.get(path.parent, set()):
                problems.append(f"{path.relative_to(root)} has no row in the table of {path.parent.relative_to(root)}/")
    return problems


def test_each_layer_has_its_table() -> None:
    """The sections are found (a renamed heading would otherwise make every check below vacuous)."""
    folders = {row.folder for row in table_rows(ARCHITECTURE.read_text(encoding="utf-8"))}
    expected = {RUNNER / layer for layer in LAYERS} | {RUNNER / "app" / "html_report"}
    assert folders == expected


def test_every_row_names_a_module_and_names_that_exist() -> None:
    problems = row_problems(ARCHITECTURE.read_text(encoding="utf-8"))
    assert not problems, "docs/ARCHITECTURE.md drifted from the code:\n" + "\n".join(problems)


def test_every_module_has_a_row() -> None:
    problems = undocumented(ARCHITECTURE.read_text(encoding="utf-8"))
    assert not problems, "modules missing from docs/ARCHITECTURE.md:\n" + "\n".join(problems)


def test_the_checks_catch_a_drift(tmp_path: Path) -> None:
    """A made-up layer: a wrong name, a wrong member, a missing module and an undocumented one are each named."""
    core = tmp_path / "runner" / "core"
    core.mkdir(parents=True)
    (core / "__init__.py").write_text("")
    (core / "guest.py").write_text("class Guest:\n    def exec(self) -> None:\n        self.alive = True\n")
    (core / "clock.py").write_text("__all__ = ['Clock']\nfrom x import Clock\nLIMIT: int = 3\n")
    (core / "new.py").write_text("")
    doc = ("## The core (`runner/core`)\n\n| module | concept | public surface |\n|---|---|---|\n"
           "| `guest.py` | the shell | `Guest` (`exec`, `alive`, `reboot`), `Guest.run`, `clock.Clock`, `on(x)` |\n"
           "| `clock.py` | time | `Clock`, `LIMIT`, `--jobs 1`, `$HOME` |\n"
           "| `gone.py` | removed | `x` |\n")
    assert row_problems(doc, tmp_path) == [
        "ARCHITECTURE.md:5 (guest.py): `reboot` is neither a member of `Guest` nor a name of the module",
        "ARCHITECTURE.md:5 (guest.py): `Guest` has no member `run`",
        "ARCHITECTURE.md:5 (guest.py): `on` is not defined in the module",
        "ARCHITECTURE.md:6 (clock.py): `LIMIT` is defined but not in the module's `__all__`",
        "ARCHITECTURE.md:7 (gone.py): no gone.py in runner/core/",
    ]
    assert undocumented(doc, tmp_path) == ["runner/core/new.py has no row in the table of runner/core/"]


def developers_problems(text: str, root: Path = ROOT) -> list[str]:
    """Files and folders named in developers.md's concept table that do not exist.

    A cell names a path from the checkout's top (``runner/core/spec.py``,
    ``images/*.yaml``) and then bare names in the folder of the last such
    path, or in a folder it named since (``html_report/`` (``view.py``)).
    """
    problems: list[str] = []
    in_table = False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("| concept |"):
            in_table = True
            continue
        if not line.startswith("|"):
            in_table = False
        if not in_table:
            continue
        folders: list[Path] = []
        for name in re.findall(r"`([^`]+)`", line.strip().strip("|").split("|")[-1]):
            if not re.search(r"\.\w+$|/$", name):
                continue
            if "/" in name.rstrip("/"):
                matches = list(root.glob(name.rstrip("/")))
                if name.startswith("runner/") and matches:
                    folders.append(matches[0] if name.endswith("/") else matches[0].parent)
            else:
                matches = [folder / name for folder in folders if (folder / name).exists()]
                if name.endswith("/") and matches:
                    folders.append(matches[0])
            if not matches:
                problems.append(f"developers.md:{number}: `{name}` does not exist")
    return problems


def test_the_developers_check_catches_a_missing_file(tmp_path: Path) -> None:
    (tmp_path / "runner" / "core").mkdir(parents=True)
    (tmp_path / "runner" / "core" / "spec.py").write_text("")
    table = ("| concept | where it lives |\n|---|---|\n"
             "| scenarios | `runner/core/spec.py`, `probes.py`, `schema/x.json`, `--flag` |\n")
    assert developers_problems(table, tmp_path) == [
        "developers.md:3: `probes.py` does not exist", "developers.md:3: `schema/x.json` does not exist"]


def test_developers_concept_table_names_files_that_exist() -> None:
    problems = developers_problems(DEVELOPERS.read_text(encoding="utf-8"))
    assert not problems, "docs/developers.md names files that do not exist:\n" + "\n".join(problems)


def test_developers_names_every_shared_test_helper() -> None:
    """The plain modules of ``tests/`` a test author is pointed to are all there is."""
    text = DEVELOPERS.read_text(encoding="utf-8")
    found = re.search(r"plain modules in\s+`tests/`\s+itself \(([^)]*)\)", text)
    assert found, "developers.md no longer lists the helpers in `tests/` (the sentence changed?)"
    named = set(re.findall(r"`([\w.]+\.py)`", found.group(1)))
    assert named == {path.name for path in (ROOT / "tests").glob("*.py")}
