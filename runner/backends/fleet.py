"""Several sandboxes on one private network: the machines of a multi-machine scenario.

A :class:`Fleet` is a context manager like :class:`~runner.backends.sandbox.Sandbox`,
of which it holds one per machine, each restored from the snapshot variant
with a second NIC onto its own overlay, all on one :class:`~runner.backends.lan.Lan`
private to this fleet. The machines start side by side (a restore is mostly
waiting: for QEMU to map the template, for the guest to wake), so two
machines take about as long as one. Each machine's thread lives as long as
its QEMU: a QEMU dies with the *thread* that started it (``PR_SET_PDEATHSIG``
in :func:`~runner.backends.process.die_with_parent` is per thread), so the
thread that restored a machine waits until the fleet ends and tears it down. Leaving it tears every machine down
and the network with them, whatever happened; a machine that failed to
start takes the others down with it (the run is an ``infra-error``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from runner.backends.lan import Lan
from runner.backends.sandbox import Sandbox
from runner.core.guest import Guest
from runner.core.machines import Machine


class Fleet:
    """The machines of one scenario, ready, on their private network. Use as a context manager."""

    def __init__(self, machines: Sequence[Machine], *, accel: str = "auto",
                 transport: str = "serial", workdir: Path | str | None = None,
                 restore: str | None = None) -> None:
        self.machines = tuple(machines)
        self.accel, self.transport, self.workdir, self.restore = accel, transport, workdir, restore
        self.boxes: dict[str, Sandbox] = {}
        self.lan: Lan | None = None
        self.ready_s = 0.0  # entering to every machine ready (they start side by side)

    def __enter__(self) -> Fleet:
        t0 = time.monotonic()
        try:
            self._start()
        except BaseException:
            self._teardown()
            raise
        self.ready_s = round(time.monotonic() - t0, 3)
        return self

    def __exit__(self, *exc: object) -> None:
        self._teardown()

    def _start(self) -> None:
        self.lan = lan = Lan(len(self.machines)).__enter__()
        self.boxes = {m.name: Sandbox(m.image, accel=self.accel, transport=self.transport,
                                      workdir=self.workdir, restore=self.restore,
                                      lan=lan.port(m.index, m.mac)) for m in self.machines}
        self._stop = threading.Event()
        self._errors: dict[str, BaseException] = {}
        ready = {name: threading.Event() for name in self.boxes}
        self._threads = [threading.Thread(target=self._hold, args=(name, ready[name]), daemon=True,
                                          name=f"rootbench-machine-{name}") for name in self.boxes]
        for t in self._threads:
            t.start()
        for event in ready.values():
            event.wait()  # each start is bounded by its own deadlines
        for name in self.boxes:
            if name in self._errors:
                raise self._errors[name]

    def _hold(self, name: str, ready: threading.Event) -> None:
        """One machine's thread: restore it, say so, keep it until the fleet ends, tear it down."""
        box = self.boxes[name]
        try:
            box.__enter__()
        except BaseException as exc:  # noqa: BLE001 - handed to the fleet's thread, raised there
            self._errors[name] = exc
            return
        finally:
            ready.set()
        try:
            self._stop.wait()
        finally:
            box.__exit__(None, None, None)

    def _teardown(self) -> None:
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
            for t in self._threads:
                t.join(timeout=60)  # a QEMU's stop is bounded (QMP quit, then signals)
        for box in self.boxes.values():  # a thread that did not end in time: here, then
            with contextlib.suppress(Exception):
                box.__exit__(None, None, None)
        if self.lan is not None:
            self.lan.close()
            self.lan = None

    # observation
    def guests(self) -> dict[str, Guest]:
        """Each machine's guest, by name, in the spec's order."""
        return {name: box.guest for name, box in self.boxes.items()}

    def killed_externally(self) -> bool:
        return any(box.killed_externally() for box in self.boxes.values())

    def info(self) -> dict[str, Any]:
        """For the cassette header: the first machine's sandbox info (what a one-machine
        reader looks at), and every machine's, with its name and address, under ``machines``."""
        first = self.boxes[self.machines[0].name].info.to_dict()
        return {**first, "ready_s": self.ready_s,
                "machines": [{"name": m.name, "address": m.address,
                              **self.boxes[m.name].info.to_dict()} for m in self.machines]}
