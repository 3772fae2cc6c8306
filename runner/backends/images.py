"""Guest images: YAML recipes in ``images/``, built into a per-user cache.

A build bootstraps Debian with ``mmdebstrap`` from the mirror the host's apt
already uses, makes an ext4 root with ``mkfs.ext4 -d`` (no loop mounts),
converts it to qcow2 and keeps the kernel and initrd beside it for direct
kernel boot. The result lives in ``cache/images/<name>-<key>/``, where the
key hashes the recipe and this module's build steps, so an edited recipe is
rebuilt and an unchanged one is reused. The base is read-only; its sha256 is
recorded so tests can prove no run ever wrote it.

A recipe may declare extra disks (``disks:``): each is an ext4 file system
made the same way, without root (``mke2fs -d`` fills it from a directory of
the built root, ``-U`` fixes its UUID so fstab and probes can name it), kept
read-only beside the root disk as ``disk-<name>.qcow2`` and attached after it,
in order (the first is ``/dev/vdb``). A recipe without ``disks:`` builds, keys
and boots exactly as before.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.backends.cachedir import cache_dir, file_lock, file_sha256
from runner.backends.process import run_child
from runner.core.errors import InfraError, InvalidInput
from runner.core.paths import contained, find_recipe, image_dirs, recipe_names, resolve_in_root
from runner.core.spec import read_text
from runner.core.spec_checks import validate_document
from runner.core.yamlfile import parse_yaml

log = logging.getLogger("rootbench.image")
BUILD_VERSION = 6  # bump when the build steps below change what an image contains
KERNEL_CMDLINE = "console=ttyS0 root=/dev/vda rw quiet net.ifnames=0 panic=-1 systemd.show_status=0"
BUILD_TIMEOUT = 3600.0
# The guest's hostname. The provisioning below writes it, and the serial guest
# recognises a fresh console shell by the prompt bash makes from it
# (``root@<hostname>:~# ``); one name here keeps the two in step.
GUEST_HOSTNAME = "rootbench"


@dataclass(frozen=True)
class DiskRecipe:
    """One extra disk as a recipe declares it (``disks:``, see schema/image.schema.json)."""

    name: str
    size_mib: int
    uuid: str  # fixed, so the guest's fstab and the probes can name the file system
    label: str | None = None
    fs: str = "ext4"
    populate_from: str | None = None  # a directory of the built root: its contents go on the disk


@dataclass(frozen=True)
class Recipe:
    name: str
    suite: str
    packages: tuple[str, ...]
    commands: tuple[str, ...]
    kernel_package: str
    disk_size: str
    memory_mib: int
    path: Path
    key: str  # hash of the recipe text and BUILD_VERSION
    disks: tuple[DiskRecipe, ...] = ()


@dataclass(frozen=True)
class ExtraDisk:
    """A built extra disk: a read-only qcow2 beside the root disk, attached after it in order."""

    name: str
    base: Path  # qcow2, read-only; every VM writes an overlay of its own
    sha256: str
    uuid: str
    label: str | None = None


@dataclass(frozen=True)
class BuiltImage:
    name: str
    dir: Path
    base: Path  # qcow2, read-only
    kernel: Path
    initrd: Path
    ssh_key: Path  # private key for root
    sha256: str
    memory_mib: int
    cmdline: str
    built_at: str
    disks: tuple[ExtraDisk, ...] = ()  # attached after the root disk, in this order
    recipe_key: str = ""  # the recipe's cache key it was built from ("" if not recorded)

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "sha256": self.sha256, "dir": str(self.dir),
                               "memory_mib": self.memory_mib, "built_at": self.built_at}
        if self.disks:  # an image without extra disks says exactly what it always said
            out["disks"] = [{"name": d.name, "sha256": d.sha256, "uuid": d.uuid} for d in self.disks]
        return out


def load_recipe(name: str) -> Recipe:
    """The recipe named ``name``: from ``$ROOTBENCH_IMAGES`` first, else the bundled one."""
    path = find_recipe(name)
    if path is None:
        known = ", ".join(recipe_names())
        where = ", ".join(str(d) for d in image_dirs())
        raise InvalidInput(f"no image recipe {name!r} in {where} (known: {known})", field="image")
    text = read_text(path)
    data, lines = parse_yaml(text, str(path))
    validate_document(data, lines, str(path), schema="image.schema.json", what="image recipe")
    if data["name"] != name:
        raise InvalidInput(f"name {data['name']!r} does not match the file name", path=str(path),
                           line=lines.get(("name",)), field="name")
    disks = _disk_recipes(data.get("disks") or [], str(path), lines)
    key = hashlib.sha256(f"{BUILD_VERSION}\n{text}".encode()).hexdigest()[:16]
    return Recipe(name=name, suite=data["suite"], packages=tuple(data["packages"]),
                  commands=tuple(data.get("commands") or ()),
                  kernel_package=data.get("kernel_package", "linux-image-cloud-amd64"),
                  disk_size=data.get("disk_size", "2G"), memory_mib=data.get("memory_mib", 256),
                  path=path, key=key, disks=disks)


def _disk_recipes(items: list[dict[str, Any]], where: str,
                  lines: dict[tuple[Any, ...], int]) -> tuple[DiskRecipe, ...]:
    """The schema-valid ``disks:`` entries, checked for what a schema cannot say: two disks
    with one name (one file), one UUID or one label (``UUID=``/``LABEL=`` would name either),
    one source directory, or a source that climbs out of the root (``..``)."""
    seen: dict[str, dict[str, int]] = {"name": {}, "uuid": {}, "label": {}, "populate_from": {}}
    out = []
    for i, item in enumerate(items):
        for key, firsts in seen.items():
            value = item.get(key)
            if value is None:
                continue
            if value in firsts:
                raise InvalidInput(f"{value!r} is also disk {firsts[value]}'s (each disk needs its own)",
                                   path=where, line=lines.get(("disks", i, key)),
                                   field=f"disks[{i}].{key}")
            firsts[value] = i
        source = item.get("populate_from")
        if source is not None and ".." in source.split("/"):
            raise InvalidInput("must name a directory inside the image, without '..'", path=where,
                               line=lines.get(("disks", i, "populate_from")),
                               field=f"disks[{i}].populate_from")
        out.append(DiskRecipe(name=item["name"], size_mib=item["size_mib"], uuid=item["uuid"],
                              label=item.get("label"), fs=item.get("fs", "ext4"),
                              populate_from=source))
    return tuple(out)


def image_dir(recipe: Recipe) -> Path:
    return cache_dir("images") / f"{recipe.name}-{recipe.key}"


def _read_built(d: Path) -> BuiltImage | None:
    meta = d / "image.json"
    if not meta.is_file():
        return None
    try:
        m = json.loads(meta.read_text())
        disks = tuple(ExtraDisk(name=x["name"], base=d / x["file"], sha256=x["sha256"],
                                uuid=x["uuid"], label=x.get("label")) for x in m.get("disks", []))
        return BuiltImage(name=m["name"], dir=d, base=d / "base.qcow2", kernel=d / "vmlinuz",
                          initrd=d / "initrd.img", ssh_key=d / "id_ed25519", sha256=m["sha256"],
                          memory_mib=int(m["memory_mib"]), cmdline=m["cmdline"],
                          built_at=m["built_at"], disks=disks,
                          recipe_key=str(m.get("recipe_key", "")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def find_image(name: str) -> BuiltImage | None:
    return _read_built(image_dir(load_recipe(name)))


def ensure_image(name: str) -> BuiltImage:
    """The built image for recipe ``name``; builds it first if the cache lacks it."""
    recipe = load_recipe(name)
    d = image_dir(recipe)
    built = _read_built(d)
    if built:
        return built
    with file_lock(d, f"image {name}"):
        built = _read_built(d)  # another process may have built it meanwhile
        if built:
            return built
        return _build(recipe, d)


def build_image(name: str, force: bool = False) -> BuiltImage:
    recipe = load_recipe(name)
    d = image_dir(recipe)
    with file_lock(d, f"image {name}"):
        built = _read_built(d)
        if built and not force:
            log.info("%s is already built (%s)", name, d)
            return built
        return _build(recipe, d)


def list_images() -> list[dict[str, Any]]:
    out = []
    for d in sorted(cache_dir("images").iterdir()):
        built = _read_built(d) if d.is_dir() else None
        if built is None:
            continue
        size = sum(p.stat().st_size for p in d.iterdir() if p.is_file())
        age_h = (time.time() - (d / "image.json").stat().st_mtime) / 3600
        out.append({"name": built.name, "dir": str(d), "size_mb": round(size / 1e6, 1),
                    "sha256": built.sha256[:16], "age_hours": round(age_h, 1),
                    "built_at": built.built_at})
    return out


# --- the build ---------------------------------------------------------------------------

def host_mirror() -> str:
    """The Debian mirror URI the host's apt uses (deb822 or one-line format)."""
    candidates: list[str] = []
    d = Path("/etc/apt/sources.list.d")
    files = sorted(d.glob("*.sources")) if d.is_dir() else []
    for f in files:
        for stanza in f.read_text(errors="replace").split("\n\n"):
            fields = {}
            for line in stanza.splitlines():
                if ":" in line and not line.lstrip().startswith("#"):
                    k, v = line.split(":", 1)
                    fields[k.strip().lower()] = v.strip()
            if "deb" in fields.get("types", "").split() and "security" not in fields.get("uris", ""):
                candidates.extend(fields.get("uris", "").split())
    one_line = [Path("/etc/apt/sources.list"), *sorted(d.glob("*.list"))] if d.is_dir() else []
    for f in one_line:
        if not f.is_file():
            continue
        for line in f.read_text(errors="replace").splitlines():
            m = re.match(r"\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line)
            if m and "security" not in m.group(1):
                candidates.append(m.group(1))
    for uri in candidates:
        if uri.startswith(("http://", "https://", "file:")):
            return uri.rstrip("/")
    raise InfraError("cannot find the host's Debian mirror in /etc/apt (needed to build images)")


def _need(tool: str) -> str:
    path = shutil.which(tool) or (f"/usr/sbin/{tool}" if Path(f"/usr/sbin/{tool}").exists() else None)
    if not path:
        raise InfraError(f"{tool} is not installed (run `make setup`)")
    return path


def _run(cmd: list[str], label: str, work: Path) -> None:
    """One build step; its output goes to ``work/build.log``, its last line shows as progress."""
    run_child(cmd, what=label, timeout=BUILD_TIMEOUT, log_file=work / "build.log", logger=log)


# An f-string only for the hostname: the script has no other braces.
_PROVISION = rf"""
set -e
R="$1"
echo {GUEST_HOSTNAME} > "$R/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 {GUEST_HOSTNAME}\n::1 localhost ip6-localhost ip6-loopback\n' > "$R/etc/hosts"
printf '/dev/vda / ext4 defaults,noatime 0 1\ntmpfs /run/rb tmpfs size=2m,mode=0700 0 0\n' > "$R/etc/fstab"
mkdir -p "$R/run/rb" "$R/etc/systemd/network"
# A root shell straight on the serial console: no getty, no login, no PAM
# session (agetty's autologin session ended by itself after restores).
cat > "$R/etc/systemd/system/rootbench-console.service" <<'EOF'
[Unit]
Description=rootbench root shell on ttyS0
After=systemd-user-sessions.service
[Service]
ExecStart=/bin/bash --login
WorkingDirectory=/root
Environment=HOME=/root TERM=vt220
StandardInput=tty-force
StandardOutput=tty
StandardError=tty
TTYPath=/dev/ttyS0
TTYReset=yes
Restart=always
RestartSec=0
[Install]
WantedBy=multi-user.target
EOF
ln -sf /dev/null "$R/etc/systemd/system/serial-getty@ttyS0.service"
mkdir -p "$R/etc/systemd/system/multi-user.target.wants"
ln -sf /etc/systemd/system/rootbench-console.service "$R/etc/systemd/system/multi-user.target.wants/rootbench-console.service"
cat > "$R/etc/systemd/network/10-wired.network" <<'EOF'
[Match]
Name=en* eth*
[Network]
DHCP=ipv4
EOF
chroot "$R" passwd -d root >/dev/null
mkdir -p "$R/root/.ssh" && chmod 700 "$R/root/.ssh"
cp "$2" "$R/root/.ssh/authorized_keys" && chmod 600 "$R/root/.ssh/authorized_keys"
printf 'UseDNS no\nPermitRootLogin prohibit-password\n' > "$R/etc/ssh/sshd_config.d/rootbench.conf"
echo 'kernel.printk = 1 4 1 3' > "$R/etc/sysctl.d/10-quiet-console.conf"
# Boot and shutdown cost under TCG (a judge's reboot re-check pays both): an initramfs with
# only the modules that mount the root (virtio over PCI; ext4 is built in) instead of
# MODULES=most (15 MB to 6 MB), and five early units off that have nothing to act on in this
# VM, each a process or two (~0.5 s a unit under TCG, where the one vCPU runs them all in
# turn): e2scrub_reap (e2scrub's LVM snapshots: no LVM), binfmt (no foreign binary formats),
# and the modprobe@ units of drm (no display), efi_pstore (no EFI) and dm_mod (no device mapper).
printf 'virtio_pci\nvirtio_blk\n' >> "$R/etc/initramfs-tools/modules"
sed -i 's/^MODULES=.*/MODULES=list/' "$R/etc/initramfs-tools/initramfs.conf"
chroot "$R" update-initramfs -u -k all >/dev/null
for u in e2scrub_reap systemd-binfmt modprobe@drm modprobe@efi_pstore modprobe@dm_mod; do
  ln -sf /dev/null "$R/etc/systemd/system/$u.service"
done
rm -f "$R/etc/machine-id" && : > "$R/etc/machine-id"
"""


def _build(recipe: Recipe, d: Path) -> BuiltImage:
    t0 = time.monotonic()
    mmdebstrap = _need("mmdebstrap")
    mkfs = _need("mkfs.ext4")
    qemu_img = _need("qemu-img")
    ssh_keygen = _need("ssh-keygen")
    mirror = host_mirror()
    log.info("building %s (%s) from %s; this takes a minute or two", recipe.name, recipe.suite, mirror)
    work = d.with_name(d.name + ".partial")
    if work.exists():
        _delete_tree(work)  # an earlier build's leftovers, unless a mount is still in them
    work.mkdir(parents=True)
    apt_cache = cache_dir("apt-archives") / recipe.suite
    apt_cache.mkdir(parents=True, exist_ok=True)
    rootfs = work / "rootfs"
    key = work / "id_ed25519"
    subprocess.run([ssh_keygen, "-q", "-t", "ed25519", "-N", "", "-C", f"rootbench-{recipe.name}",
                    "-f", str(key)], check=True, timeout=60, capture_output=True)
    os.chmod(key, 0o600)
    provision = work / "provision.sh"
    provision.write_text(_PROVISION)
    packages = ",".join((recipe.kernel_package, *recipe.packages))
    cmd = [mmdebstrap, "--variant=apt", "--format=directory",
           f"--include={packages}",
           "--aptopt=Acquire::Retries \"3\"",
           "--skip=download/empty", "--skip=essential/unlink",
           f"--setup-hook=mkdir -p \"$1/var/cache/apt/archives\" && "
           f"find '{apt_cache}' -maxdepth 1 -name '*.deb' -exec cp -t \"$1/var/cache/apt/archives/\" {{}} +",
           f"--customize-hook=sh {provision} \"$1\" {key}.pub"]
    for command in recipe.commands:
        cmd.append(f"--customize-hook=chroot \"$1\" sh -ec {shlex.quote(command)}")
    cmd += [f"--customize-hook=find \"$1/var/cache/apt/archives\" -maxdepth 1 -name '*.deb' "
            f"-exec cp -n -t '{apt_cache}' {{}} +",
            "--customize-hook=rm -f \"$1\"/var/cache/apt/archives/*.deb",
            recipe.suite, str(rootfs),
            f"deb {mirror} {recipe.suite} main",
            f"deb {mirror} {recipe.suite}-updates main"]
    _run(cmd, "mmdebstrap", work)
    # The built root is the recipe's: every path into it is resolved inside it, so a symlink a
    # recipe command made (/boot -> /, vmlinuz-x -> /etc/shadow) never reads a host file.
    boot = resolve_in_root(rootfs, "/boot")
    names = sorted(p.name for p in boot.iterdir()) if boot is not None and boot.is_dir() else []
    kernels = [k for n in names if n.startswith("vmlinuz-")
               and (k := resolve_in_root(rootfs, f"/boot/{n}")) is not None and k.is_file()]
    initrds = [i for n in names if n.startswith("initrd.img-")
               and (i := resolve_in_root(rootfs, f"/boot/{n}")) is not None and i.is_file()]
    if not kernels or not initrds:
        raise InfraError(f"the image has no kernel/initrd in /boot (is {recipe.kernel_package} right?)")
    shutil.copy2(kernels[-1], work / "vmlinuz")
    shutil.copy2(initrds[-1], work / "initrd.img")
    # The extra disks first: each takes its source directory's contents off the root.
    disks = [_build_disk(recipe, i, rootfs, work, mkfs, qemu_img) for i in range(len(recipe.disks))]
    raw = work / "root.raw"
    log.info("making the ext4 root (mkfs.ext4 -d)")
    _run([mkfs, "-q", "-F", "-L", "root", "-d", str(rootfs), str(raw), recipe.disk_size],
         "mkfs.ext4", work)
    base = work / "base.qcow2"
    _run([qemu_img, "convert", "-q", "-O", "qcow2", str(raw), str(base)], "qemu-img", work)
    raw.unlink()
    _delete_tree(rootfs)
    sha = file_sha256(base)
    os.chmod(base, 0o444)
    built_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    meta: dict[str, Any] = {"name": recipe.name, "recipe_key": recipe.key, "sha256": sha,
                            "memory_mib": recipe.memory_mib, "cmdline": KERNEL_CMDLINE,
                            "built_at": built_at, "mirror": mirror,
                            "build_seconds": round(time.monotonic() - t0, 1)}
    if disks:
        meta["disks"] = disks
    (work / "image.json").write_text(json.dumps(meta, indent=2) + "\n")
    shutil.rmtree(d, ignore_errors=True)
    work.rename(d)
    log.info("%s built in %.0fs: %s", recipe.name, time.monotonic() - t0, d)
    built = _read_built(d)
    assert built is not None
    return built


def _build_disk(recipe: Recipe, i: int, rootfs: Path, work: Path, mkfs: str,
                qemu_img: str) -> dict[str, Any]:
    """Extra disk ``i`` of ``recipe`` made in ``work``: ext4 by ``mke2fs -d`` (no root, no
    loop mount), its UUID and label fixed, filled from its source directory, which is then
    emptied on the root (it stays as the mount point, its owner and mode kept). Read-only;
    returns its entry for image.json."""
    disk = recipe.disks[i]
    source = None
    if disk.populate_from is not None:
        # Resolved inside the built root, every component (Debian's /var/run -> /run is the
        # image's /run): a symlink anywhere in it never reaches the host's folders.
        source = resolve_in_root(rootfs, disk.populate_from)
        if source is None or source == contained(rootfs, rootfs) or not source.is_dir():
            raise InvalidInput(f"{disk.populate_from} is not a directory in the built image (the "
                               "recipe's commands must make it, below /)", path=str(recipe.path),
                               field=f"disks[{i}].populate_from")
    raw = work / f"disk-{disk.name}.raw"
    log.info("making the extra disk %s (%s, %d MiB)", disk.name, disk.fs, disk.size_mib)
    _run([mkfs, "-q", "-F", "-t", disk.fs, "-U", disk.uuid, *(["-L", disk.label] if disk.label else []),
          *(["-d", str(source)] if source is not None else []), str(raw), f"{disk.size_mib}M"],
         f"mkfs.{disk.fs} ({disk.name})", work)
    name = f"disk-{disk.name}.qcow2"
    _run([qemu_img, "convert", "-q", "-O", "qcow2", str(raw), str(work / name)], "qemu-img", work)
    raw.unlink()
    if source is not None:
        _empty_inside(source, work)
    os.chmod(work / name, 0o444)
    return {"name": disk.name, "file": name, "sha256": file_sha256(work / name), "uuid": disk.uuid,
            **({"label": disk.label} if disk.label else {})}


def _mounts_under(root: Path) -> list[str]:
    """The mount points at or below ``root`` (its real path), from the kernel's own table."""
    real = os.path.realpath(root).rstrip("/") or "/"
    try:
        table = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return []
    found = []
    for line in table.splitlines():
        fields = line.split(" ")
        if len(fields) < 5:
            continue
        # the kernel escapes space, tab, newline and backslash in octal (\040)
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        if point == real or point.startswith(real + "/"):
            found.append(point)
    return found


def _delete_tree(path: Path) -> None:
    """``rmtree`` a folder of the build's own, never through a mount inside it.

    Recipe commands run as root on the host: one that leaves a bind mount in the rootfs (of
    the host's /home, say) would make ``rmtree`` delete the host's files through it, since a
    real path does not show a mount. The kernel's mount table does, so a mount at or below
    the folder stops the build with one line instead.
    """
    mounts = _mounts_under(path)
    if mounts:
        raise InfraError(f"refusing to delete {path}: {mounts[0]} is mounted inside it (a recipe "
                         "command left a mount behind; unmount it first)")
    shutil.rmtree(path)


def _empty_inside(folder: Path, staging: Path) -> None:
    """Delete what ``folder`` holds, which must lie inside the build's ``staging`` directory.

    The build's one delete of what a recipe names, and the last guard of the rule that a
    build never deletes outside its staging directory: the folder's real path is checked
    (:func:`contained`) whatever the caller resolved, and then the entries are removed
    without following a symlink (``rmtree`` does not, a link is unlinked).
    """
    real = contained(folder, staging)
    if real is None or real == contained(staging, staging):
        raise InfraError(f"refusing to empty {folder}: it is outside the build's staging "
                         f"directory {staging}")
    for child in real.iterdir():
        if child.is_dir() and not child.is_symlink():
            _delete_tree(child)
        else:
            child.unlink()


def base_sha256(image: BuiltImage) -> str:
    """Hash the base now (tests compare it with the recorded one)."""
    return file_sha256(image.base)


def disk_sha256s(image: BuiltImage) -> dict[str, str]:
    """Hash each extra disk's base now, by name (tests compare them with the recorded ones)."""
    return {d.name: file_sha256(d.base) for d in image.disks}
