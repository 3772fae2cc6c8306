"""``rootbench new ID --image IMAGE``: a commented skeleton that ``validate`` accepts as written.

Through the command line in this process (the ``cli`` fixture), from an empty
folder as a new author starts: ``new`` then ``validate`` on what it wrote; the
skeleton of every bundled image; and the refusals, each one line and exit 2
(an existing file, a bad id, an unknown image, a bundled scenario's id).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Cli, CliResult

from runner.app.scaffold import skeleton
from runner.core.paths import recipe_names
from runner.core.spec import load_spec


def _one_line_exit_2(r: CliResult) -> str:
    """The one line a refusal prints, checked to be one line, on stderr, exit 2, nothing else."""
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == "" and len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr
    return r.stderr.strip()


def test_new_then_validate_from_an_empty_folder(cli: Cli, tmp_path: Path) -> None:
    r = cli("new", "my-fault", "--image", "debian-12-nginx", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    written = tmp_path / "specs" / "my-fault.yaml"  # specs/ID.yaml, specs/ made
    assert r.stdout == (
        "specs/my-fault.yaml: a skeleton of scenario my-fault on debian-12-nginx (a working "
        "example: cron stopped); edit it, then `rootbench validate specs/my-fault.yaml` and "
        "`rootbench verify specs/my-fault.yaml`\n")
    r = cli("validate", "specs/my-fault.yaml", cwd=tmp_path)
    assert (r.returncode, r.stdout) == (0, "specs/my-fault.yaml: ok (my-fault)\n1 valid, 0 invalid\n")
    text = written.read_text(encoding="utf-8")
    assert text.startswith("# my-fault: a rootbench scenario, written by `rootbench new my-fault "
                           "--image debian-12-nginx`.")
    # commented: every top-level key says what it is on its own line
    keys = [line for line in text.splitlines() if line[:1].isalpha()]
    assert len(keys) >= 15 and all("#" in line for line in keys), [k for k in keys if "#" not in k]
    # a scenario verify has every check to make: invariants, shortcuts, an alternative
    s = load_spec(written)
    assert (s.id, s.image) == ("my-fault", "debian-12-nginx")
    assert s.invariants and len(s.shortcuts) >= 2 and s.alternatives and s.hints and s.milestones


@pytest.mark.parametrize("image", recipe_names())
def test_the_skeleton_of_every_bundled_image_validates(cli: Cli, tmp_path: Path,
                                                       image: str) -> None:
    out = tmp_path / "elsewhere" / f"x-{image}.yaml"
    r = cli("new", f"x-{image}", "--image", image, "--out", str(out))
    assert r.returncode == 0 and r.stdout.startswith(f"{out}: a skeleton of scenario"), r.stderr
    r = cli("validate", str(out))
    assert r.returncode == 0 and f"{out}: ok (x-{image})" in r.stdout, r.stdout
    assert out.read_text(encoding="utf-8") == skeleton(f"x-{image}", image)


def test_new_never_replaces_a_file(cli: Cli, tmp_path: Path) -> None:
    mine = tmp_path / "specs" / "my-fault.yaml"
    mine.parent.mkdir()
    mine.write_text("id: my-fault  # the author's own work\n")
    line = _one_line_exit_2(cli("new", "my-fault", "--image", "debian-12-nginx", cwd=tmp_path))
    assert line == ("rootbench: specs/my-fault.yaml: already exists: rootbench new never replaces "
                    "a file (remove it, or give --out another path)")
    assert mine.read_text() == "id: my-fault  # the author's own work\n"
    link = tmp_path / "link.yaml"  # a link to nothing is not written through either
    link.symlink_to(tmp_path / "nowhere.yaml")
    line = _one_line_exit_2(cli("new", "my-fault", "--image", "debian-12-nginx", "--out", str(link)))
    assert line.startswith(f"rootbench: {link}: --out: already exists")
    assert not (tmp_path / "nowhere.yaml").exists()
    line = _one_line_exit_2(cli("new", "my-fault", "--image", "debian-12-nginx",
                                "--out", str(tmp_path)))  # a folder where the file goes
    assert line.startswith(f"rootbench: {tmp_path}: --out: already exists")


@pytest.mark.parametrize(("args", "expected"), [
    (["My_Fault", "--image", "debian-12-nginx"],
     "rootbench: ID: 'My_Fault' is not a scenario id: lower-case letters, digits and '-', not "
     "starting with '-', at most 64 characters (did you mean 'my-fault'?)"),
    (["x" * 65, "--image", "debian-12-nginx"],
     f"rootbench: ID: '{'x' * 65}' is not a scenario id: lower-case letters, digits and '-', not "
     f"starting with '-', at most 64 characters (did you mean '{'x' * 64}'?)"),
    (["my-fault", "--image", "debian-12-ngnix"],
     "rootbench: --image: no image recipe 'debian-12-ngnix' (did you mean 'debian-12-nginx'"),
    (["my-fault", "--image", "../images/debian-12-nginx"],  # a recipe's name, never a path
     "rootbench: --image: no image recipe '../images/debian-12-nginx' (did you mean"),
    (["nginx-stopped", "--image", "debian-12-nginx"],
     "rootbench: ID: 'nginx-stopped' is a bundled scenario's id: give yours another "
     "(e.g. 'nginx-stopped-2')"),
])
def test_a_bad_id_or_image_is_one_line_with_what_was_meant(cli: Cli, tmp_path: Path,
                                                          args: list[str], expected: str) -> None:
    line = _one_line_exit_2(cli("new", *args, cwd=tmp_path))
    assert line.startswith(expected), line
    assert not (tmp_path / "specs").exists()  # nothing written, not even the folder


def test_the_image_is_required(cli: Cli, tmp_path: Path) -> None:
    line = _one_line_exit_2(cli("new", "my-fault", cwd=tmp_path))
    assert "the following arguments are required: --image" in line
