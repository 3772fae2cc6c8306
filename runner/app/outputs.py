"""Where a command writes: every output path checked before any work, and written like run files.

``report --html --out FILE`` and ``export --out DIR`` name paths the user
typed. A path that cannot be written (its folder is read-only or missing
behind a file, it already exists as the wrong kind of thing) is one line
and exit 2 *before* anything is read or rendered, never a crash after the
work is done. The check makes no folder and leaves no file behind: it finds
the nearest folder that exists and tries a throw-away file in it.

Every file rootbench writes, run files and what ``--write``/``--out`` name,
goes through :func:`atomic_write`, the one writer, by one rule: a new file gets
the mode any file the user makes gets (0666 less the umask), a file that is
there keeps its mode (a 0600 README stays 0600), and a symlink is refused,
never replaced by a file nor written through (rootbench writes the file it was
named; the folders on the way to it are followed).
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from runner.core.errors import InvalidInput

# Errors that mean "this path cannot be written" (the user's to fix), not "the machine broke".
PATH_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.EISDIR, errno.ENOTDIR,
                         errno.EEXIST, errno.ENOENT, errno.ENAMETOOLONG, errno.ELOOP})


def _kind(mode: int) -> str:
    return ("a directory" if stat.S_ISDIR(mode) else "a regular file" if stat.S_ISREG(mode)
            else "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or
            stat.S_ISBLK(mode) else "not a file")


def _probe_folder(start: Path, flag: str, target: Path) -> None:
    """The nearest existing folder above ``start`` must take a new file (tried, then removed)."""
    folder = start
    while True:
        try:
            st = folder.stat()
            break
        except FileNotFoundError:
            if folder.parent == folder:
                break
            folder = folder.parent
        except OSError as exc:
            raise InvalidInput(f"cannot be written: {exc.strerror or exc}", path=str(target),
                               field=flag) from None
    if not folder.is_dir():
        raise InvalidInput(f"cannot be written: {folder} is {_kind(st.st_mode)}, not a directory",
                           path=str(target), field=flag)
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".rootbench-probe-")
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise InvalidInput(f"cannot be written: {exc.strerror or exc} ({folder})",
                           path=str(target), field=flag) from None


def _stat_or_none(path: Path, flag: str) -> os.stat_result | None:
    """``path``'s stat, None when it does not exist yet (it will be made), or InvalidInput
    naming ``flag`` when it cannot even be looked at."""
    try:
        return path.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InvalidInput(f"cannot be written: {exc.strerror or exc}", path=str(path),
                           field=flag) from None


def _refuse_symlink(path: Path, flag: str | None) -> None:
    """InvalidInput when ``path`` itself is a symlink: the rule of :func:`atomic_write`."""
    if path.is_symlink():
        raise InvalidInput("is a symlink: rootbench writes no file through a link nor replaces "
                           "one (name the file it points to)", path=str(path), field=flag)


def check_file_target(path: Path, flag: str) -> Path:
    """``path`` may be written as a file: absent, or a regular file (it is replaced, keeping its
    mode); a symlink is refused (see :func:`atomic_write`)."""
    path = Path(path)
    _refuse_symlink(path, flag)
    st = _stat_or_none(path, flag)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise InvalidInput(f"exists and is {_kind(st.st_mode)}: give a file name", path=str(path),
                           field=flag)
    _probe_folder(path.parent if str(path.parent) else Path("."), flag, path)
    return path


def check_dir_target(path: Path, flag: str) -> Path:
    """``path`` may be written as a folder of files: absent (it is made) or a directory."""
    path = Path(path)
    st = _stat_or_none(path, flag)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise InvalidInput(f"exists and is {_kind(st.st_mode)}, not a directory", path=str(path),
                           field=flag)
    _probe_folder(path, flag, path)
    return path


def write_error(exc: OSError, path: Path, flag: str | None) -> InvalidInput | None:
    """An OSError while writing ``path`` as the one line it deserves, or None for a broken machine
    (a full disk is not bad input: it stays an OSError and exits 1)."""
    if exc.errno not in PATH_ERRNOS:
        return None
    return InvalidInput(f"cannot be written: {exc.strerror or exc}", path=str(exc.filename or path),
                        field=flag)


def _umask() -> int:
    """The process's umask, read without changing it (Linux says it in /proc), else set back."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: Path, text: str, flag: str | None = None) -> None:
    """Write ``text`` to ``path`` so readers see the old file or the new one, never half: the
    one writer of every file rootbench writes.

    * Mode: a new file gets the mode any new file gets (0666 less the umask), as cassettes
      do; a file that is there keeps its permission bits (a 0600 file stays 0600). The
      temporary file it is renamed from is made with them before a byte is written.
    * Symlinks: refused, by one rule for every target (``--write``, ``--out``, run files):
      ``path`` itself must not be a symlink, and is neither replaced by a file nor written
      through (a link in a shared folder would make it another user's file); the folders
      on the way to it are followed. :class:`InvalidInput` naming ``path`` and ``flag``.
    * Errors: with ``flag`` (a path the user typed), an OSError that means "this path cannot
      be written" is :class:`InvalidInput` (:func:`write_error`); a full disk stays an OSError.
    """
    path = Path(path)
    _refuse_symlink(path, flag)
    try:
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
        except FileNotFoundError:
            mode = 0o666 & ~_umask()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        if flag is not None and (bad := write_error(exc, path, flag)) is not None:
            raise bad from None
        raise
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and flag is not None \
                and (bad := write_error(exc, path, flag)) is not None:
            raise bad from None
        raise
