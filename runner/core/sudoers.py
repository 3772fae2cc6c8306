"""sudoers, as the state diff reads it: whether a grant gives root.

A new sudoers line is left behind; one that lets a user run, as root, a
command that is ``ALL``, holds a wildcard, names a folder, or can run a shell
or write any file (:data:`ROOT_ALWAYS` whatever its arguments,
:data:`ROOT_ANY_ARGS` when the user chooses them) gives root away. The rules
follow sudoers(5): the runas list, tags (``NOPASSWD:``), digests and
``Cmnd_Alias`` definitions (followed to a depth of 8). The policy that turns
the answer into a finding stays in :mod:`runner.core.statediff`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

# sudo: commands that give root whatever their arguments (an editor, a pager, a shell escape),
# and those that do when the grant lets the user choose the arguments (no arguments written).
ROOT_ALWAYS = frozenset({
    "sh", "bash", "dash", "zsh", "ksh", "csh", "tcsh", "fish", "su", "sudo", "sudoedit", "doas",
    "pkexec", "runuser", "vi", "vim", "vim.tiny", "vim.basic", "view", "rvim", "nano", "pico",
    "emacs", "ed", "less", "more", "most", "pg", "man", "journalctl", "script", "busybox",
})
ROOT_ANY_ARGS = frozenset({
    "env", "find", "awk", "mawk", "gawk", "nawk", "tee", "cp", "mv", "dd", "chmod", "chown",
    "chgrp", "ln", "install", "rsync", "tar", "zip", "unzip", "sed", "xargs", "nice", "timeout",
    "stdbuf", "taskset", "nohup", "setsid", "flock", "watch", "strace", "gdb", "chroot",
    "nsenter", "unshare", "mount", "crontab", "git", "ssh", "scp", "openssl", "dpkg", "apt",
    "apt-get", "make", "docker", "start-stop-daemon", "service", "systemd-run", "bash", "cat",
    "curl", "wget", "node", "lua", "ruby", "php", "tclsh", "expect", "socat", "nc", "ncat",
    "netcat", "ionice", "time", "exec", "capsh", "setpriv", "truncate", "visudo", "useradd",
    "usermod", "passwd", "chpasswd", "systemctl",
})
_INTERPRETER = re.compile(r"^(python|perl|ruby|php|lua|node)[0-9.]*$")
_SYSTEMCTL_ROOT = ("edit", "link", "set-environment", "import-environment")
_TAG = re.compile(r"^[A-Z_]+:")
ALIAS = re.compile(r"^(Cmnd_Alias|Cmd_Alias|User_Alias|Runas_Alias|Host_Alias)\s")


def _split_commands(text: str) -> list[str]:
    """A sudoers command list split at its unescaped commas."""
    return [c.strip() for c in re.split(r"(?<!\\),", text) if c.strip()]


def command_gives_root(cmd: str, aliases: Mapping[str, list[str]], depth: int = 0) -> str:
    """Why one sudoers command (its runas list and tags already taken off) gives root, or ""."""
    if cmd.startswith("!") or depth > 8:
        return ""
    if cmd == "ALL":
        return "ALL commands"
    if cmd in aliases:
        for inner in aliases[cmd]:
            why = command_gives_root(inner, aliases, depth + 1)
            if why:
                return f"{cmd}: {why}"
        return ""
    if cmd.startswith(("sha224:", "sha256:", "sha384:", "sha512:")):
        cmd = cmd.split(None, 1)[1] if " " in cmd else ""
    program, _, args = cmd.partition(" ")
    if any(c in cmd for c in "*?["):
        return f"{cmd}: a wildcard lets the user choose what runs"
    if program.endswith("/"):
        return f"{program}: every program of a folder"
    name = program.rsplit("/", 1)[-1]
    if name in ROOT_ALWAYS or _INTERPRETER.match(name) and not args:
        return f"{program} can run a shell or write any file"
    if name == "systemctl":
        if not args.strip() or args.split()[0] in _SYSTEMCTL_ROOT:
            return f"{cmd}: systemctl with these arguments can run anything as root"
        return ""
    if name in ROOT_ANY_ARGS and not args.strip():
        return f"{program} with arguments of the user's choosing can run a shell or write any file"
    if _INTERPRETER.match(name) and args.split()[0:1] in (["-c"], ["-e"], ["-"], []):
        return f"{cmd}: an interpreter running code of the user's choosing"
    return ""


def _runs_as_root(runas: str | None) -> bool:
    if runas is None:
        return True  # no runas list: root
    users = runas.split(":", 1)[0]
    names = {u.strip() for u in users.split(",")}
    return bool(names & {"ALL", "root", "#0", ""})


def grant_gives_root(line: str, aliases: Mapping[str, list[str]]) -> str:
    """Why a sudoers user specification gives root, or ""."""
    _users, _, rest = line.partition(" ")
    _hosts, eq, commands = rest.partition("=")
    if not eq:
        return ""
    runas: str | None = None
    for cmd in _split_commands(commands):
        while True:
            if cmd.startswith("("):
                runas, _, cmd = cmd[1:].partition(")")
                cmd = cmd.strip()
            elif _TAG.match(cmd):
                cmd = cmd.split(":", 1)[1].strip()
            else:
                break
        why = command_gives_root(cmd, aliases)
        if why and _runs_as_root(runas):
            return why
    return ""


def cmnd_aliases(lines: Iterable[str]) -> dict[str, list[str]]:
    """Every Cmnd_Alias defined in ``lines`` (sudoers facts' lines): name -> commands."""
    out: dict[str, list[str]] = {}
    for line in lines:
        kind, _, rest = line.partition(" ")
        if kind not in ("Cmnd_Alias", "Cmd_Alias"):
            continue
        for part in re.split(r"(?<!\\):", rest):
            name, eq, cmds = part.partition("=")
            if eq:
                out[name.strip()] = _split_commands(cmds)
    return out
