"""Where rootbench's data lives, installed from a wheel or run from a checkout.

Two kinds of data, kept apart on purpose:

* **Package data**, read-only and shipped with the code: the JSON schemas
  (``schema/``), the image recipes (``images/``) and the bundled scenarios
  (``specs/``). A checkout keeps them at its top level, and an editable install
  or ``python -m runner`` reads them there in place (an edit shows at once); a
  wheel carries them inside the package as ``runner/_data/<name>/``
  (pyproject.toml maps them there), so ``rootbench`` works from any folder.
* **The user's**: their own scenarios (paths on the command line, ``--specs``,
  or ``$ROOTBENCH_SPECS``), their own image recipes (``$ROOTBENCH_IMAGES``,
  looked in before the bundled ones), and what runs write (``runs/``,
  ``recordings/``), relative to the working directory like any output.

And the one rule for a path that a *file* names (an image recipe's
``populate_from``, a results file's ``cassette``, a spec folder's entries):
it is resolved inside its root, every component, before anything reads,
writes or deletes there (:func:`contained`, :func:`resolve_in_root`). A name
in a file the user was handed is the file author's, not the user's, so it must
never reach a host file outside the folder it belongs to.
"""

from __future__ import annotations

import os
import re
import stat
from enum import Enum
from pathlib import Path, PurePosixPath

from runner.core.errors import InvalidInput

SPECS_ENV = "ROOTBENCH_SPECS"  # the default scenario folders, os.pathsep-separated
IMAGES_ENV = "ROOTBENCH_IMAGES"  # image recipe folders looked in before the bundled one

_PACKAGE = Path(__file__).resolve().parent.parent  # runner/
_INSTALLED = _PACKAGE / "_data"  # present only in a wheel's install


class Bundled(str, Enum):
    """The package data folders, by their name in a checkout."""

    SCHEMA = "schema"
    IMAGES = "images"
    SPECS = "specs"


def repo_root() -> Path:
    """The checkout (the folder that holds ``runner/``).

    Only for what exists in a checkout alone (the tests, the committed
    cassettes); installed from a wheel this is site-packages. Package data is
    found with :func:`bundled`.
    """
    return _PACKAGE.parent


def bundled(kind: Bundled) -> Path:
    """The folder of one kind of package data: the wheel's copy if installed, else the checkout's."""
    installed = _INSTALLED / kind.value
    return installed if installed.is_dir() else _PACKAGE.parent / kind.value


def schema_path(name: str) -> Path:
    """A JSON schema shipped with rootbench (``cassette.schema.json``, ...)."""
    return bundled(Bundled.SCHEMA) / name


def _env_dirs(var: str) -> list[Path]:
    """The folders an environment variable lists (os.pathsep-separated; empty entries skipped).

    A listed folder that is not one is bad input, named with the variable: a
    typo must not silently fall back to the bundled data.
    """
    dirs = [Path(part) for part in os.environ.get(var, "").split(os.pathsep) if part.strip()]
    for d in dirs:
        if not d.is_dir():
            raise InvalidInput("no such directory" if not d.exists() else "not a directory",
                               path=str(d), field=var)
    return dirs


def default_spec_dirs() -> list[Path]:
    """Where scenarios are read when none are named: ``$ROOTBENCH_SPECS``, else the bundled ones."""
    return _env_dirs(SPECS_ENV) or [bundled(Bundled.SPECS)]


def image_dirs() -> list[Path]:
    """Where image recipes are looked up, first match wins: ``$ROOTBENCH_IMAGES``, then the bundled."""
    return [*_env_dirs(IMAGES_ENV), bundled(Bundled.IMAGES)]


def find_recipe(name: str) -> Path | None:
    """The recipe file of image ``name`` (``<dir>/<name>.yaml`` in the first folder holding one).

    None for a name that is not a plain recipe name, so a spec's ``image`` never
    names a path.
    """
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name):
        return None
    for d in image_dirs():
        path = d / f"{name}.yaml"
        if path.is_file():
            return path
    return None


def recipe_names() -> list[str]:
    """Every image recipe name found, sorted (a name in two folders counts once)."""
    return sorted({p.stem for d in image_dirs() for p in d.glob("*.yaml")})


# --- paths that files name -------------------------------------------------------------------

MAX_SYMLINKS = 40  # Linux's own limit on the symlinks one path walk follows (then ELOOP)


def contained(path: str | Path, root: str | Path) -> Path | None:
    """``path`` with every symlink in it followed (``realpath``), when that is ``root`` or lies
    under it (``root`` resolved the same way); None otherwise.

    The one containment check of every path a recipe, spec, cassette or results file names:
    a lexical check (``..``) alone misses a symlink anywhere in the path, and a check of the
    last component alone misses one earlier (``srv -> /``). None too for what cannot be
    resolved: a symlink loop (realpath then leaves ``..`` unresolved), a name too long.
    """
    try:
        real = Path(os.path.realpath(path))
        top = Path(os.path.realpath(root))
    except (OSError, ValueError):  # a NUL byte, a name too long
        return None
    if ".." in real.parts:
        return None
    return real if real == top or real.is_relative_to(top) else None


def resolve_in_root(root: str | Path, name: str) -> Path | None:
    """``name``, a path as the system whose ``/`` is ``root`` sees it (``/var/run/x``), as
    the host path it names inside ``root``; None when it cannot be resolved there.

    Each component is looked at in turn and a symlink followed *as that system would*: an
    absolute target starts again at ``root`` (Debian's ``/var/run -> /run`` is
    ``root/run``, never the host's /run) and ``..`` stops at ``root`` (like a chroot). A
    component that does not exist yet is a plain name (and so is all below it). The result
    passes :func:`contained` as well, so what is returned is never outside ``root``; more
    than :data:`MAX_SYMLINKS` links, or an error looking, is None.
    """
    top = Path(os.path.realpath(root))
    todo = _components(name)
    here: list[str] = []  # the resolved components below ``top``: none is a symlink
    links = 0
    while todo:
        part = todo.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if here:
                here.pop()
            continue
        candidate = top.joinpath(*here, part)
        try:
            st = os.lstat(candidate)
        except FileNotFoundError:  # not there (yet): a plain name, and so is all below it
            here.append(part)
            continue
        except (OSError, ValueError):  # not a directory, no permission, a NUL byte
            return None
        if not stat.S_ISLNK(st.st_mode):
            here.append(part)
            continue
        links += 1
        if links > MAX_SYMLINKS:
            return None
        try:
            target = os.readlink(candidate)
        except OSError:
            return None
        if target.startswith("/"):
            here = []
        todo.extend(_components(target))
    return contained(top.joinpath(*here), top)


def _components(path: str) -> list[str]:
    """``path``'s components, last first (a stack), without its root: ``/`` or the ``//`` that
    POSIX lets a path start with (Linux reads it as ``/``). Joined to the root, a ``//`` left
    in would be the host's own ``/``, and the walk would look the rest up there."""
    return [p for p in reversed(PurePosixPath(path).parts) if p.strip("/")]


# --- files that users name -------------------------------------------------------------------

def read_regular(path: str | Path, limit: int, *, what: str = "file", hint: str = "") -> bytes:
    """The bytes of ``path``, which must be a regular file of at most ``limit`` bytes.

    Every file a user names (a cassette, the README ``results --write`` edits) is read here:
    ``stat`` comes first, so a FIFO (an open would wait for a writer forever) or a device
    such as /dev/zero or /dev/full (a read would never end, and the reader grew to 23 GB)
    is refused unopened; the open does not block and the descriptor is checked again, in
    case the name was swapped in between; and no more than ``limit + 1`` bytes are ever
    read, in case the file grew. Every refusal is :class:`InvalidInput` naming the file,
    worded with ``what`` (``no such cassette``) and ``hint`` after "not a regular file".
    """
    where = str(path)
    not_regular = f"not a regular file{hint}"
    too_large = f"larger than {limit} bytes: not a {what}" if what != "file" else \
        f"larger than {limit} bytes"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InvalidInput(f"no such {what}", path=where) from None
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"cannot read {what}: {getattr(exc, 'strerror', None) or exc}",
                           path=where) from None
    if not stat.S_ISREG(st.st_mode):
        raise InvalidInput(not_regular, path=where)
    if st.st_size > limit:
        raise InvalidInput(too_large, path=where)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InvalidInput(f"cannot read {what}: {exc.strerror or exc}", path=where) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidInput(not_regular, path=where)
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise InvalidInput(f"cannot read {what}: {exc.strerror or exc}", path=where) from None
    finally:
        os.close(fd)
    if size > limit:  # it grew after the stat
        raise InvalidInput(too_large, path=where)
    return b"".join(chunks)
