"""One sandbox's private network: an Ethernet hub on unix datagram sockets, private to it.

Each machine's second NIC is a QEMU ``-netdev dgram`` whose two ends are unix
sockets in a 0700 directory of this sandbox: QEMU's own (``m<i>.sock``) and
the hub's port for it (``h<i>.sock``). The hub is a thread in the process
that owns the sandbox: every frame that arrives on one port is sent to every
other machine, as a hub (not a switch) does; each virtio NIC drops what is
not its own. Why this and not the alternatives QEMU 7.2 offers:

- ``-netdev socket,mcast=`` needs multicast on the host's loopback (often
  off in containers), and two sandboxes that picked the same group and port
  would silently share one network;
- ``-netdev dgram``/``stream`` point to point joins two machines only;
- a tap device or bridge needs root on the host and reaches the host.

Here nothing but these sockets is on the network: no host address, no route
out (each machine's first NIC stays QEMU's user network with ``restrict=on``),
and another sandbox's hub has other sockets in another private directory.
A frame is at most 64 KiB; a machine that is not reading loses frames, as a
real hub would drop them, and the hub never blocks on it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import shutil
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

from runner.backends.process import socket_dir

log = logging.getLogger("rootbench.vm")
MAX_FRAME = 65536


@dataclass(frozen=True)
class LanPort:
    """What one QEMU needs to join the network: its socket, the hub's, and the NIC's MAC."""

    local: Path  # QEMU binds this
    remote: Path  # QEMU sends here (the hub's port)
    mac: str

    def netdev(self) -> str:
        """The ``-netdev`` value (``id=lan``)."""
        return (f"dgram,id=lan,local.type=unix,local.path={self.local},"
                f"remote.type=unix,remote.path={self.remote}")


class Lan:
    """A hub with ``ports`` ports; a context manager (the thread and sockets end on exit)."""

    def __init__(self, ports: int) -> None:
        self.dir = socket_dir("rb-lan-")
        os.chmod(self.dir, 0o700)
        self.ports = ports
        self.frames = 0  # relayed so far (tests read it)
        self._socks: list[socket.socket] = []
        self._wake_r, self._wake_w = os.pipe()
        self._thread: threading.Thread | None = None
        try:
            for i in range(ports):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._socks.append(s)
                s.bind(str(self.hub_path(i)))
                s.setblocking(False)
        except BaseException:
            self.close()
            raise

    def hub_path(self, i: int) -> Path:
        return self.dir / f"h{i}.sock"

    def machine_path(self, i: int) -> Path:
        return self.dir / f"m{i}.sock"

    def port(self, i: int, mac: str) -> LanPort:
        return LanPort(self.machine_path(i), self.hub_path(i), mac)

    def __enter__(self) -> Lan:
        self._thread = threading.Thread(target=self._run, name="rootbench-lan", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        try:
            sel.register(self._wake_r, selectors.EVENT_READ, None)
            for i, s in enumerate(self._socks):
                sel.register(s, selectors.EVENT_READ, i)
            while True:
                for key, _mask in sel.select():
                    if key.data is None:
                        return
                    self._relay(key.data)
        except (OSError, ValueError) as exc:  # the sockets were closed under it: the end
            log.debug("lan hub stopped: %s", exc)
        finally:
            sel.close()

    def _relay(self, i: int) -> None:
        """Every frame waiting on port ``i``, to every other machine."""
        src = self._socks[i]
        while True:
            try:
                frame = src.recv(MAX_FRAME)
            except BlockingIOError:
                return
            self.frames += 1
            for j in range(self.ports):
                if j == i:
                    continue
                # Sent from j's own port: the one address machine j's socket may take frames
                # from, if QEMU connected it. Not there yet (still starting), gone, or its
                # queue full: lost, as on a hub.
                with contextlib.suppress(OSError):
                    self._socks[j].sendto(frame, str(self.machine_path(j)))

    def close(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")
            self._thread.join(timeout=5)
        self._thread = None
        for s in self._socks:
            s.close()
        self._socks = []
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._wake_r = self._wake_w = -1
        shutil.rmtree(self.dir, ignore_errors=True)
