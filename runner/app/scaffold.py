"""``rootbench new ID --image IMAGE``: a commented skeleton of a scenario, ready to edit.

An author starting from a blank file had to assemble the keys from the
reference (docs/scenarios.md) and the schema, and met each mistake one
``validate`` at a time. The skeleton is a complete, working scenario (the
cron daemon stopped, so a job that refreshes a file every minute stops) on
the chosen image, with every key commented: ``rootbench validate`` accepts
it as written and ``rootbench verify`` can prove it, so the author replaces
a part at a time and always has a scenario that runs.

The skeleton is checked against the schema (:func:`scenario_from_text`)
before it is written, and never replaces a file: an id already used by a
bundled scenario, a bad id or an unknown image is one line, exit 2, with the
nearest correct word offered.
"""

from __future__ import annotations

import os
import re
import string
from pathlib import Path

from runner.core.errors import InvalidInput
from runner.core.paths import Bundled, bundled, find_recipe, recipe_names
from runner.core.registry import suggest
from runner.core.spec import scenario_from_text

ID_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]*")  # the schema's $defs/name
ID_MAX = 64  # its maxLength

# The skeleton, ``$id`` and ``$image`` filled in (``string.Template``: the YAML's own braces
# stay as they are; a literal dollar sign would be written ``$$``).
SKELETON = string.Template("""\
# $id: a rootbench scenario, written by `rootbench new $id --image $image`.
#
# As written it is a complete, working example on the image $image: the cron
# daemon is stopped, so a job that refreshes a file every minute stops running.
# `rootbench validate` accepts it and `rootbench verify` can prove it. Replace one
# part at a time with your own fault, keeping the shape. Every key is explained in
# docs/scenarios.md, the checks verify makes in docs/validity.md.
#
#   rootbench validate PATH   # the schema: file:line: field: message
#   rootbench verify PATH     # on real VMs: baseline, fault lands, noop fails, oracle
#                             # passes, every shortcut fails, every alternative passes

id: $id                       # [a-z0-9-], unique; the file's name without .yaml
title: Scheduled job stopped running     # one line: the symptom as the user sees it
description: >-               # for readers of the spec, never shown to the agent: cause and fix
  Example fault: the cron daemon was stopped (it is still enabled at boot), so a
  job that touches a file every minute no longer runs. One cause, one fix: start cron.
tags: [example]               # free words; `bench --tags` and `list --tags` select by them
difficulty: easy              # easy | medium | hard, by the rule in docs/validity.md
image: $image                 # the image recipe the VM is built from (images/$image.yaml)
task: |                       # what the user reports: the symptom, never the cause
  A file that a scheduled job refreshes every minute, /var/lib/example/stamp,
  has not changed for hours. Please fix it.
budget: {turns: 10, seconds: 600, command_timeout: 30, output_limit: 4000}   # optional: the defaults

setup:                        # the fault, as root, each command in a clean bash; each must exit 0
  - systemctl stop cron         # first: a running cron could fire the job between the lines below
  - printf '* * * * * root touch /var/lib/example/stamp\\n' > /etc/cron.d/example
  - mkdir -p /var/lib/example && touch -d '1 day ago' /var/lib/example/stamp

probes:                       # success: every one must pass at the end (the kinds: docs/scenarios.md)
  - name: cron is running
    service: {name: cron, active: true}
  - name: cron still starts at boot
    service: {name: cron, enabled: true}
  - name: the file was refreshed in the last two minutes
    command: {run: "find /var/lib/example/stamp -mmin -2 | grep -q ."}
    within: 150               # seconds to wait for it to pass: cron fires on the minute

invariants:                   # hold on the clean machine (verify checks) and must still hold at the end
  - name: ssh still running
    service: {name: ssh, active: true}

solution:                     # the reference fix: the oracle agent runs these commands
  - systemctl start cron

forbidden:                    # optional regexes (RE2), added to the built-in baseline; a match fails the run
  - 'crontab\\s+-r'

hints:                        # optional, from vague to specific (bench --hints K, --ladder)
  - Find out what is supposed to refresh the file every minute.
  - A job in /etc/cron.d/ does; check that the daemon that runs such jobs is running.

milestones:                   # optional: evidence the agent found the cause; scored, never needed to pass
  - name: found the job
    output_contains: "touch /var/lib/example/stamp"

shortcuts:                    # what looks like a fix and is not: verify proves each one fails
  - name: touch the file by hand
    kind: does-not-last       # one of the kinds in docs/scenarios.md ("Shortcut kinds")
    why: the file is fresh once and stale again in two minutes; the cron probe rejects it
    commands:
      - touch /var/lib/example/stamp
  - name: start the cron daemon by hand
    kind: started-by-hand
    why: the job runs, but cron.service stays inactive and nothing restarts the daemon; the service probe rejects it
    commands:
      - /usr/sbin/cron

alternatives:                 # optional: other correct fixes; verify proves each one passes
  - name: restart cron instead of starting it
    why: a restart of a stopped unit starts it; an admin may well type that
    commands:
      - systemctl restart cron
""")


def check_id(scenario_id: str) -> str:
    """``scenario_id`` when it is a scenario id the schema takes and no bundled scenario has;
    else InvalidInput (field ``ID``) with the id it may have meant."""
    if not (ID_PATTERN.fullmatch(scenario_id) and len(scenario_id) <= ID_MAX):
        fixed = re.sub(r"[^a-z0-9]+", "-", scenario_id.lower()).strip("-")[:ID_MAX].rstrip("-")
        meant = f" (did you mean {fixed!r}?)" if fixed else ""
        raise InvalidInput(f"{scenario_id!r} is not a scenario id: lower-case letters, digits "
                           f"and '-', not starting with '-', at most {ID_MAX} characters{meant}",
                           field="ID")
    if (bundled(Bundled.SPECS) / f"{scenario_id}.yaml").is_file():
        raise InvalidInput(f"{scenario_id!r} is a bundled scenario's id: give yours another "
                           f"(e.g. {scenario_id + '-2'!r})", field="ID")
    return scenario_id


def check_image(image: str) -> str:
    """``image`` when an image recipe of that name is found (``$ROOTBENCH_IMAGES``, then the
    bundled ``images/``), else InvalidInput (field ``--image``) naming the nearest ones."""
    if find_recipe(image) is None:
        known = recipe_names()
        raise InvalidInput(f"no image recipe {image!r}{suggest(image, known)}; the recipes: "
                           f"{', '.join(known)}", field="--image")
    return image


def skeleton(scenario_id: str, image: str) -> str:
    """The commented skeleton of scenario ``scenario_id`` on ``image``, checked against the
    schema as :func:`runner.core.spec.load_spec` checks a file (it raises if it is not valid)."""
    text = SKELETON.substitute(id=check_id(scenario_id), image=check_image(image))
    scenario_from_text(text, f"{scenario_id}.yaml")
    return text


def default_path(scenario_id: str) -> Path:
    """Where ``new`` writes without ``--out``: ``specs/<id>.yaml`` under the working folder."""
    return Path("specs") / f"{scenario_id}.yaml"


def write_new(scenario_id: str, image: str, out: Path | None = None) -> Path:
    """Write the skeleton to ``out`` (default :func:`default_path`) and return where.

    A file there already is never replaced: the author's own spec may be in it. The folder is
    made when missing (a fresh folder has no ``specs/`` yet). The file is created exclusively
    (``O_EXCL``), so a file made between the check and the write is not replaced either.
    """
    text = skeleton(scenario_id, image)
    flag = "--out" if out is not None else None
    path = out if out is not None else default_path(scenario_id)
    if path.is_symlink() or path.exists():
        raise InvalidInput("already exists: rootbench new never replaces a file (remove it, or "
                           "give --out another path)", path=str(path), field=flag)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        raise InvalidInput("already exists: rootbench new never replaces a file (remove it, or "
                           "give --out another path)", path=str(path), field=flag) from None
    except (NotADirectoryError, IsADirectoryError, PermissionError) as exc:
        raise InvalidInput(f"cannot be written: {exc.strerror or exc}", path=str(path),
                           field=flag) from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return path
