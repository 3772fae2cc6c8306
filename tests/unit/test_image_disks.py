"""Extra disks of an image (``disks:`` in a recipe): the schema, the build of one disk with the
real tools (no VM, no root), the QEMU command line and the snapshot key."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Cli

from runner.backends.images import (
    BuiltImage,
    ExtraDisk,
    _build_disk,
    _empty_inside,
    _read_built,
    load_recipe,
)
from runner.backends.qemu import machine_digest, qemu_args
from runner.backends.snapshot import snapshot_dir, snapshot_files
from runner.core.errors import InfraError, InvalidInput, VMError

UUID = "5e1d7a2c-4b3f-4c8e-9a61-0d2f7b9c3e15"
RECIPE = """\
name: with-disk
suite: bookworm
packages: [nginx]
disks:
  - name: data
    size_mib: 16
    label: data
    uuid: 5e1d7a2c-4b3f-4c8e-9a61-0d2f7b9c3e15
    populate_from: /srv/data
"""


def _image(tmp_path: Path, *disks: ExtraDisk) -> BuiltImage:
    return BuiltImage(name="img", dir=tmp_path, base=tmp_path / "base.qcow2", kernel=tmp_path / "k",
                      initrd=tmp_path / "i", ssh_key=tmp_path / "key", sha256="0" * 64,
                      memory_mib=256, cmdline="console=ttyS0", built_at="", disks=disks)


def _args(image: BuiltImage, disks: tuple[Path, ...] = ()) -> list[str]:
    return qemu_args(image, Path("root.qcow2"), "tcg", None, Path("c"), Path("q"), {22: 1, 80: 2},
                     None, disks)


@pytest.mark.parametrize(("edit", "field", "says"), [
    (("size_mib: 16", "size_mib: 2"), "disks[0].size_mib", "less than the minimum"),
    (("size_mib: 16", "size_mib: '16'"), "disks[0].size_mib", "is not of type 'integer'"),
    (("uuid: 5e1d7a2c-4b3f-4c8e-9a61-0d2f7b9c3e15", "uuid: not-a-uuid"), "disks[0].uuid", "does not match"),
    (("label: data", "label: a-label-far-too-long"), "disks[0].label", "does not match"),
    (("populate_from: /srv/data", "populate_from: srv/data"), "disks[0].populate_from", "does not match"),
    (("populate_from: /srv/data", "populate_from: /srv/../etc"), "disks[0].populate_from", "without '..'"),
    (("label: data", "label: data\n    fs: btrfs"), "disks[0].fs", "is not one of ['ext4']"),
    (("label: data", "label: data\n    mount: /srv"), "disks[0]", "'mount' was unexpected"),
    (("    size_mib: 16\n", ""), "disks[0]", "'size_mib' is a required property"),
    (("populate_from: /srv/data\n", "populate_from: /srv/data\n  - name: data\n    size_mib: 8\n"
      "    uuid: 0e1d7a2c-4b3f-4c8e-9a61-0d2f7b9c3e15\n"), "disks[1].name", "also disk 0's"),
    (("populate_from: /srv/data\n", "populate_from: /srv/data\n  - name: logs\n    size_mib: 8\n"
      f"    uuid: {UUID}\n"), "disks[1].uuid", "also disk 0's"),
])
def test_a_bad_disks_entry_is_one_line_naming_the_file_and_field(
        cli: Cli, tmp_path: Path, edit: tuple[str, str], field: str, says: str) -> None:
    """A recipe's bad ``disks:`` is refused before any build: exit 2, one line, file and field."""
    old, new = edit
    assert old in RECIPE
    (tmp_path / "with-disk.yaml").write_text(RECIPE.replace(old, new, 1))
    r = cli("image", "build", "with-disk", env={"ROOTBENCH_IMAGES": str(tmp_path)})
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert str(tmp_path / "with-disk.yaml") in lines[0] and f" {field}: " in lines[0], lines[0]
    assert says in lines[0], lines[0]


def test_a_good_disks_entry_loads_with_its_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "with-disk.yaml").write_text(RECIPE)
    monkeypatch.setenv("ROOTBENCH_IMAGES", str(tmp_path))
    [disk] = load_recipe("with-disk").disks
    assert (disk.name, disk.size_mib, disk.uuid, disk.label, disk.fs, disk.populate_from) == \
        ("data", 16, UUID, "data", "ext4", "/srv/data")


def test_the_storage_recipe_mounts_its_disk_by_the_uuid_it_fixes() -> None:
    """The fstab line the recipe writes and the UUID the build gives the disk are one value:
    an edit of one without the other would boot a guest with /srv/data unmounted."""
    recipe = load_recipe("debian-12-storage")
    [disk] = recipe.disks
    fstab = [c for c in recipe.commands if "/etc/fstab" in c]
    assert fstab and f"UUID={disk.uuid} /srv/data ext4 " in fstab[0]
    assert disk.populate_from == "/srv/data"
    for name in ("debian-12-nginx", "debian-12-postgres", "debian-12-tls"):
        assert load_recipe(name).disks == ()


@pytest.mark.skipif(not (shutil.which("mkfs.ext4") or Path("/usr/sbin/mkfs.ext4").exists())
                    or not shutil.which("qemu-img"), reason="needs e2fsprogs and qemu-img (make setup)")
def test_an_extra_disk_is_built_from_its_directory_without_a_mount(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """mke2fs -d fills the disk from the built root's directory (no loop mount, no root needed);
    the UUID and label are the recipe's; the directory is left empty as the mount point; the
    disk is read-only and its sha256 is recorded."""
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "with-disk.yaml").write_text(RECIPE)
    monkeypatch.setenv("ROOTBENCH_IMAGES", str(tmp_path / "images"))
    recipe = load_recipe("with-disk")
    work = tmp_path / "work"
    rootfs = work / "rootfs"  # as the build has it: the root is built in the staging directory
    (rootfs / "srv/data/site").mkdir(parents=True)
    (rootfs / "srv/data/site/index.html").write_text("field archive ok\n")
    mkfs = shutil.which("mkfs.ext4") or "/usr/sbin/mkfs.ext4"
    entry = _build_disk(recipe, 0, rootfs, work, mkfs, str(shutil.which("qemu-img")))
    disk = work / "disk-data.qcow2"
    assert entry["file"] == disk.name and entry["uuid"] == UUID and entry["label"] == "data"
    assert (disk.stat().st_mode & 0o222) == 0
    assert list((rootfs / "srv/data").iterdir()) == []  # the mount point stays, empty
    raw = tmp_path / "check.raw"
    subprocess.run(["qemu-img", "convert", "-O", "raw", str(disk), str(raw)], check=True, timeout=60)
    head = subprocess.run(["dumpe2fs", "-h", str(raw)], capture_output=True, text=True, timeout=60).stdout
    assert f"Filesystem UUID:          {UUID}" in head and "Filesystem volume name:   data" in head
    assert "Block count:              16384" in head or "Block count:              4096" in head
    cat = subprocess.run(["debugfs", "-R", "cat /site/index.html", str(raw)], capture_output=True,
                         text=True, timeout=60)
    assert cat.stdout == "field archive ok\n"
    # image.json's entry reads back as the image's extra disk
    meta = {"name": "with-disk", "sha256": "0" * 64, "memory_mib": 256, "cmdline": "c",
            "built_at": "now", "disks": [entry]}
    (work / "image.json").write_text(json.dumps(meta))
    built = _read_built(work)
    assert built is not None and built.disks == (ExtraDisk("data", disk, entry["sha256"], UUID, "data"),)


def test_a_bad_populate_from_at_build_time_names_the_recipe_and_field(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from runner.core.errors import InvalidInput

    (tmp_path / "with-disk.yaml").write_text(RECIPE)
    monkeypatch.setenv("ROOTBENCH_IMAGES", str(tmp_path))
    (tmp_path / "rootfs" / "srv").mkdir(parents=True)
    with pytest.raises(InvalidInput) as err:
        _build_disk(load_recipe("with-disk"), 0, tmp_path / "rootfs", tmp_path, "mkfs.ext4", "qemu-img")
    assert err.value.field == "disks[0].populate_from" and err.value.path == str(tmp_path / "with-disk.yaml")


def test_extra_disks_follow_the_root_disk_in_order(tmp_path: Path) -> None:
    plain = _image(tmp_path)
    two = _image(tmp_path, ExtraDisk("data", tmp_path / "d.qcow2", "1" * 64, UUID),
                 ExtraDisk("logs", tmp_path / "l.qcow2", "2" * 64, UUID.replace("5", "6")))
    without = _args(plain)
    with_disks = _args(two, (Path("o-data.qcow2"), Path("o-logs.qcow2")))
    drives = [with_disks[i + 1] for i, a in enumerate(with_disks) if a == "-drive"]
    assert [d.split(",")[0] for d in drives] == ["file=root.qcow2", "file=o-data.qcow2", "file=o-logs.qcow2"]
    assert all(",if=virtio,format=qcow2," in d for d in drives)
    # Everything else is the command line of an image without extra disks.
    root = with_disks.index("-drive")
    assert with_disks[:root + 2] + with_disks[root + 6:] == without
    # A VM of an image with extra disks is never started without them (its saved state has them).
    with pytest.raises(VMError, match="has 2 extra disk"):
        _args(two, (Path("o-data.qcow2"),))
    with pytest.raises(VMError, match="has 0 extra disk"):
        _args(plain, (Path("o-data.qcow2"),))


def test_the_snapshot_key_changes_with_the_disks_and_only_then(tmp_path: Path) -> None:
    plain = _image(tmp_path)
    one = _image(tmp_path, ExtraDisk("data", tmp_path / "d.qcow2", "1" * 64, UUID))
    refilled = _image(tmp_path, ExtraDisk("data", tmp_path / "d.qcow2", "3" * 64, UUID))
    renamed = _image(tmp_path, ExtraDisk("store", tmp_path / "d.qcow2", "1" * 64, UUID))
    assert machine_digest(one, "tcg") != machine_digest(plain, "tcg")  # another drive: another machine
    assert machine_digest(one, "tcg") != machine_digest(renamed, "tcg")
    # ... and where the cache is does not matter
    moved = dataclasses.replace(one, disks=(dataclasses.replace(one.disks[0], base=Path("/x/d.qcow2")),))
    assert machine_digest(moved, "tcg") == machine_digest(one, "tcg")
    assert snapshot_files(plain) == ("frozen.qcow2", "template.ram", "device.state", "full.state")
    assert snapshot_files(one)[-1] == "frozen-data.qcow2"
    if shutil.which("qemu-system-x86_64"):  # the key names QEMU's version
        keys = {snapshot_dir(i, "tcg").name for i in (plain, one, refilled, renamed)}
        assert len(keys) == 4  # new contents alone (refilled) key a new snapshot too
        assert "-d" not in snapshot_dir(plain, "tcg").name.split("-c")[-1]
        assert snapshot_dir(one, "tcg", lan=True).name.endswith("-lan")


_TOOLS = pytest.mark.skipif(not (shutil.which("mkfs.ext4") or Path("/usr/sbin/mkfs.ext4").exists())
                            or not shutil.which("qemu-img"),
                            reason="needs e2fsprogs and qemu-img (make setup)")


def _disk_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                populate_from: str) -> tuple[Path, Path, Callable[[], dict[str, Any]]]:
    """A recipe whose one disk is filled from ``populate_from``, an empty built root and a work
    folder, and the call that builds the disk (the real tools, no VM)."""
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "with-disk.yaml").write_text(
        RECIPE.replace("populate_from: /srv/data", f"populate_from: {populate_from}"))
    monkeypatch.setenv("ROOTBENCH_IMAGES", str(tmp_path / "images"))
    recipe = load_recipe("with-disk")
    work = tmp_path / "work"
    rootfs = work / "rootfs"  # as the build has it: the root is built in the staging directory
    rootfs.mkdir(parents=True)
    mkfs = shutil.which("mkfs.ext4") or "/usr/sbin/mkfs.ext4"
    return rootfs, work, lambda: _build_disk(recipe, 0, rootfs, work, mkfs,
                                             str(shutil.which("qemu-img")))


@_TOOLS
@pytest.mark.parametrize("link", ["absolute", "relative"])
def test_a_symlink_earlier_in_populate_from_never_reaches_a_host_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, link: str) -> None:
    """Issue #46 item 1: the built root's ``/srv`` is a symlink out of it (a recipe command can
    make one; Debian's own /var/run -> /run is absolute). The build looked only at the last
    component, followed ``srv`` on the host, copied the host's folder onto the disk and then
    emptied it. Now the path is resolved inside the root: there is no ``/srv/data`` in the
    image, so the build stops before anything is read or deleted, the host folder untouched."""
    host = tmp_path / "host"
    (host / "data").mkdir(parents=True)
    (host / "data" / "precious.txt").write_text("a host file\n")
    rootfs, work, build = _disk_build(tmp_path, monkeypatch, "/srv/data")
    (rootfs / "srv").symlink_to(host if link == "absolute" else Path(os.path.relpath(host, rootfs)))
    with pytest.raises(InvalidInput) as err:
        build()
    assert err.value.field == "disks[0].populate_from"
    assert "not a directory in the built image" in err.value.detail
    assert (host / "data" / "precious.txt").read_text() == "a host file\n"
    assert not list(work.glob("disk-*"))  # no disk holds the host's files


@_TOOLS
def test_an_absolute_symlink_in_populate_from_is_followed_inside_the_image(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Debian's layout: ``/var/run -> /run``. ``populate_from: /var/run/data`` is the image's
    /run/data, as the guest sees it, never the host's: that folder fills the disk and is left
    empty; the symlink stays."""
    rootfs, work, build = _disk_build(tmp_path, monkeypatch, "/var/run/data")
    (rootfs / "run" / "data").mkdir(parents=True)
    (rootfs / "run" / "data" / "inside.txt").write_text("the image's file\n")
    (rootfs / "var").mkdir()
    (rootfs / "var" / "run").symlink_to("/run")
    entry = build()
    assert list((rootfs / "run" / "data").iterdir()) == []
    assert (rootfs / "var" / "run").is_symlink()
    raw = tmp_path / "check.raw"
    subprocess.run(["qemu-img", "convert", "-O", "raw", str(work / entry["file"]), str(raw)],
                   check=True, timeout=60)
    cat = subprocess.run(["debugfs", "-R", "cat /inside.txt", str(raw)], capture_output=True,
                         text=True, timeout=60)
    assert cat.stdout == "the image's file\n"


def test_populate_from_the_image_root_itself_is_refused(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A source that resolves to the root itself (``/srv/data -> /``) would empty the whole
    image onto a disk: refused like any source that is not a directory below the root."""
    rootfs, work, build = _disk_build(tmp_path, monkeypatch, "/srv/data")
    (rootfs / "srv").mkdir()
    (rootfs / "srv" / "data").symlink_to("/")
    (rootfs / "etc").mkdir()
    with pytest.raises(InvalidInput) as err:
        build()
    assert err.value.field == "disks[0].populate_from"
    assert (rootfs / "etc").is_dir()


def test_emptying_a_folder_outside_the_staging_directory_is_refused(tmp_path: Path) -> None:
    """The last guard of the build's one delete: whatever the caller resolved, a folder whose
    real path is not inside the build's staging directory is never emptied."""
    staging, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    staging.mkdir()
    (elsewhere / "sub").mkdir(parents=True)
    (elsewhere / "keep.txt").write_text("kept\n")
    (staging / "link").symlink_to(elsewhere)
    for target in (elsewhere, staging / "link", staging / "link" / "sub" / ".."):
        with pytest.raises(InfraError, match="outside the build's staging directory"):
            _empty_inside(target, staging)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep.txt", "sub"]
    (staging / "rootfs" / "mnt" / "sub").mkdir(parents=True)
    (staging / "rootfs" / "mnt" / "f").write_text("x")
    (staging / "rootfs" / "mnt" / "out").symlink_to(elsewhere)
    _empty_inside(staging / "rootfs" / "mnt", staging)
    assert list((staging / "rootfs" / "mnt").iterdir()) == []
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep.txt", "sub"]  # a link is unlinked
