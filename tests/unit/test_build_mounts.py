"""An image build never deletes through a mount a recipe command left in its staging tree.

Recipe commands run as root on the host, so one can leave a bind mount inside the rootfs;
``rmtree`` would then delete the host's files through it (a real path does not show a
mount). A real bind mount, made in a private mount namespace of a child process (`unshare -m`,
so nothing on the host's own mount table changes), over a folder of files outside the staging
tree: the build's delete refuses in one line and those files are intact.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from runner.core.paths import repo_root


def test_a_mount_left_in_the_staging_tree_is_never_deleted_through(tmp_path: Path) -> None:
    outside = tmp_path / "host-home"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me\n")
    staging = tmp_path / "img.partial"
    (staging / "rootfs" / "srv" / "data").mkdir(parents=True)
    script = textwrap.dedent(f"""
        import subprocess, sys
        from pathlib import Path
        subprocess.run(["mount", "--bind", {str(outside)!r},
                        {str(staging / "rootfs" / "srv" / "data")!r}], check=True)
        from runner.backends.images import _delete_tree, _empty_inside
        from runner.core.errors import InfraError
        for attempt in (lambda: _delete_tree(Path({str(staging / "rootfs")!r})),
                        lambda: _empty_inside(Path({str(staging / "rootfs" / "srv")!r}),
                                              Path({str(staging)!r}))):
            try:
                attempt()
            except InfraError as exc:
                print("refused:", exc)
            else:
                print("deleted")
        """)
    r = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c", script],
                       capture_output=True, text=True, timeout=60, cwd=repo_root(), check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and all(ln.startswith("refused: refusing to delete") for ln in lines), r.stdout
    assert "is mounted inside it" in lines[0]
    assert (outside / "precious.txt").read_text() == "keep me\n"  # the host's file is intact
