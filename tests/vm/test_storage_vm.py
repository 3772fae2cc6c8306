"""An image with an extra disk (debian-12-storage) on real QEMU: the disk is attached and mounted
whichever way a sandbox comes up, each sandbox writes its own copy, and neither the disk's base
nor the snapshot's frozen overlay of it is ever written."""

from __future__ import annotations

import pytest
from conftest import assert_base_never_written, snapshot_hashes

from runner.backends.fleet import Fleet
from runner.backends.images import BuiltImage, ensure_image
from runner.backends.qemu import choose_accel
from runner.backends.sandbox import Sandbox
from runner.backends.snapshot import ensure_snapshot
from runner.core.guest import Guest
from runner.core.machines import Machine

pytestmark = pytest.mark.vm
UUID = "5e1d7a2c-4b3f-4c8e-9a61-0d2f7b9c3e15"  # images/debian-12-storage.yaml fixes it


@pytest.fixture(scope="module")
def storage() -> BuiltImage:
    """The storage image, built if the cache lacks it (~2 min the first time)."""
    return ensure_image("debian-12-storage")


def _mounted(guest: Guest) -> list[str]:
    r = guest.exec("findmnt -n -o SOURCE,UUID,FSTYPE /srv/data; cat /srv/data/site/index.html", 20)
    assert r.exit_code == 0, r.output
    return r.output.split()


def test_the_data_disk_is_mounted_and_private_to_each_sandbox(storage: BuiltImage,
                                                              no_new_qemu: None) -> None:
    accel = choose_accel("auto")
    snapshot = ensure_snapshot(storage, accel)
    frozen_before = snapshot_hashes(snapshot)
    assert "frozen-data.qcow2" in frozen_before
    with Sandbox(storage.name, accel=accel) as a, Sandbox(storage.name, accel=accel) as b:
        for box in (a, b):
            assert box.info.restore == "template", box.info.fallback
            assert _mounted(box.guest)[:3] == ["/dev/vdb", UUID, "ext4"]
            assert "field archive ok" in box.guest.host_http(80, "/", 20).body
            assert box.guest.exec("curl -fsS http://127.0.0.1:8081/health", 20).output.strip() == \
                "ingest ok: spool writable"
        # Each sandbox writes its own overlay of the disk: neither sees the other's write.
        assert a.guest.exec("echo from-a > /srv/data/site/mine && sync", 20).exit_code == 0
        r = b.guest.exec("cat /srv/data/site/mine 2>&1; echo from-b > /srv/data/site/mine && sync", 20)
        assert "No such file" in r.output
        assert a.guest.exec("cat /srv/data/site/mine", 20).output.strip() == "from-a"
        assert b.guest.exec("cat /srv/data/site/mine", 20).output.strip() == "from-b"
    # The other two ways up attach the disk too, fresh (the full state holds the same drives).
    for kwargs in ({"restore": "full-state"}, {"snapshot": False}):
        with Sandbox(storage.name, accel=accel, **kwargs) as box:
            assert box.info.restore == kwargs.get("restore", "cold"), box.info.fallback
            assert _mounted(box.guest)[:3] == ["/dev/vdb", UUID, "ext4"]
            assert box.guest.exec("test -e /srv/data/site/mine", 20).exit_code == 1
    assert snapshot_hashes(snapshot) == frozen_before


def test_a_machine_on_a_private_network_has_its_data_disk(storage: BuiltImage,
                                                          no_new_qemu: None) -> None:
    """A machine of a multi-machine scenario is restored from the snapshot variant with a second
    NIC (``-lan``): that variant attaches the extra disk too, one private overlay per machine."""
    pair = (Machine("web", storage.name, 0), Machine("spare", storage.name, 1))
    with Fleet(pair) as fleet:
        guests = fleet.guests()
        for name, guest in guests.items():
            assert fleet.boxes[name].info.restore == "template", fleet.boxes[name].info.fallback
            assert _mounted(guest)[:3] == ["/dev/vdb", UUID, "ext4"]
        assert guests["web"].exec("echo web > /srv/data/site/mine && sync", 20).exit_code == 0
        assert guests["spare"].exec("test -e /srv/data/site/mine", 20).exit_code == 1


def test_the_storage_base_disks_are_never_written(storage: BuiltImage, no_new_qemu: None) -> None:
    """The base-never-written check of tests/vm/test_vm.py, on an image with an extra disk."""
    assert storage.disks
    assert_base_never_written(storage)
