"""What a bench must build before its episodes, built when the next episode needs it.

On a fresh 2-core machine a bench of the whole suite used to build every image and both
snapshot variants of each, one after the other, before the model server started (issue #47:
~43 minutes to the first verdict). Now a bench builds only what its next episode needs, in
the order its episodes run (:func:`runner.core.selection.build_order` puts the scenarios that
share the most builds first): the first image and its snapshot before the first episode, the
next image when its first episode comes. Each build says what it is and roughly how long
it takes, and how much building is left after it.

One build overlaps another: while rootbench builds llama-server (minutes of compiling), the
first episode's *image* is built beside it in a child process (mostly downloading and
unpacking packages). Its *snapshot* is not: that is a cold boot of a QEMU that runs 10 nice
levels below rootbench (the model first), which beside a compiler gets a tenth of a core and
could run out its boot timeout, so it waits until the compiler is done. Nothing is built
beside a running episode either, which would slow its model and could change its verdict.

The figures are rough, measured on a shared 2-core machine with TCG (issue #47); a build
that is already in the cache costs nothing and is not mentioned.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from runner.app.episodes import RunOptions
from runner.app.executors import ProcessPool, WorkerLost
from runner.app.progress import duration
from runner.backends.images import BUILD_TIMEOUT, ensure_image, find_image
from runner.backends.llama import cached_binary, native_wanted
from runner.backends.qemu import choose_accel
from runner.backends.snapshot import snapshot_dir
from runner.core.errors import RootbenchError
from runner.core.spec import Scenario
from runner.core.text import one_line

log = logging.getLogger("rootbench.bench")

Need = tuple[str, bool]  # an image, and whether its snapshot variant with the private-network NIC

# Rough seconds of each build on 2 cores under TCG (issue #47's fresh machine, shared with
# other work: upper figures): an image 247-383 s, its snapshot 88-177 s, the variant with the
# private-network NIC ~194 s; llama-server ~5 min on 2 idle cores (runner/backends/llama.py).
IMAGE_SECONDS = 300.0
SNAPSHOT_SECONDS = 130.0
LAN_SNAPSHOT_SECONDS = 190.0
LLAMA_SECONDS = 420.0
WAIT = 5.0  # seconds between looks at the image built beside llama-server


@dataclass(frozen=True)
class Build:
    """One thing to build, and about how long it takes."""

    what: str
    seconds: float


def needs_of(scenario: Scenario) -> list[Need]:
    """The builds one scenario restores from: its image's snapshot, or for several machines each
    image's private-network variant."""
    if scenario.machines:
        return sorted({(m.image, True) for m in scenario.machines})
    return [(scenario.image, False)]


def in_order(scenarios: Iterable[Scenario]) -> list[Need]:
    """Every need of ``scenarios``, each once, in the order their episodes first need it."""
    out: dict[Need, None] = {}
    for s in scenarios:
        for need in needs_of(s):
            out.setdefault(need, None)
    return list(out)


def missing(need: Need, accel: str) -> list[Build]:
    """What the cache lacks of ``need``: its image and its snapshot, its snapshot alone, or
    nothing. When that cannot be told (no QEMU, a recipe that does not load) nothing is
    claimed: the episode's own sandbox reports the problem."""
    name, lan = need
    snap = Build(f"the {'private-network ' if lan else ''}snapshot of {name}",
                 LAN_SNAPSHOT_SECONDS if lan else SNAPSHOT_SECONDS)
    try:
        image = find_image(name)
        if image is None:
            return [Build(f"image {name}", IMAGE_SECONDS), snap]
        ready = (snapshot_dir(image, choose_accel(accel), lan) / "snapshot.json").is_file()
    except (RootbenchError, OSError):
        return []
    return [] if ready else [snap]


def llama_missing(llama_server: str | None) -> bool:
    """Whether starting the model server builds llama-server first (no binary of the user's,
    none in the cache)."""
    return llama_server is None and not cached_binary(native_wanted()).is_file()


def _build_image(name: str) -> None:
    """A child process's job: the image ``name``, built if the cache lacks it."""
    ensure_image(name)


class Builds:
    """The bench's builds, made as its episodes come.

    ``prepare(needs, opts)`` makes what ``needs`` lack (a sandbox started and stopped once
    per need: image, snapshot, one restore); :meth:`ready` calls it before an episode of a
    need not yet prepared. :meth:`start_beside_llama` starts the first image's build in a
    child process while llama-server is built; :meth:`close` stops it if the bench ends first.
    """

    def __init__(self, needs: Sequence[Need], opts: RunOptions,
                 prepare: Callable[[list[Need], RunOptions], None]) -> None:
        self.needs, self.opts, self.prepare = list(needs), opts, prepare
        self.todo = {need: missing(need, opts.accel) for need in self.needs}
        self.prepared: set[Need] = set()
        self._beside: tuple[ProcessPool, str] | None = None

    def left(self) -> list[Build]:
        """What is still to build, in the order it will be."""
        return [b for need in self.needs if need not in self.prepared for b in self.todo[need]]

    def plan_text(self, llama: bool) -> str:
        """"about 12 min of building: image x, ..." for the bench's first line; "" if none."""
        todo = ([Build("llama-server", LLAMA_SECONDS)] if llama else []) + self.left()
        if not todo:
            return ""
        return (f"about {duration(sum(b.seconds for b in todo))} of building first, as the "
                f"episodes need it: {', '.join(b.what for b in todo)}")

    def start_beside_llama(self) -> None:
        """The first need's image, built in a child process while llama-server is built."""
        if not self.needs or not self.todo[self.needs[0]] or len(self.todo[self.needs[0]]) < 2:
            return  # the image is there (or cannot be told): nothing to overlap
        name = self.needs[0][0]
        pool = ProcessPool(1)
        pool.submit(("image", name), _build_image, (name,), timeout=BUILD_TIMEOUT + 60)
        self._beside = (pool, name)
        log.info("building image %s beside llama-server (about %s)", name,
                 duration(IMAGE_SECONDS))

    def _join_beside(self) -> None:
        if self._beside is None:
            return
        pool, name = self._beside
        t0 = time.monotonic()
        told = False
        while (done := pool.next_done(WAIT)) is None:
            if not told:
                log.info("waiting for image %s, built beside llama-server", name)
                told = True
        self._beside = None
        pool.close()
        if done.error is not None:
            why = one_line(str(done.error)) if not isinstance(done.error, WorkerLost) \
                else f"its build process was lost: {one_line(str(done.error))}"
            log.warning("image %s was not built beside llama-server (%s); trying again", name, why)
        elif told:
            log.info("image %s ready after %s more", name, duration(time.monotonic() - t0))

    def ready(self, scenario: Scenario) -> None:
        """Build what ``scenario``'s episode needs and is not built yet, saying what and how
        long it has left; a failed build is the episode's to report (it tries again)."""
        for need in needs_of(scenario):
            if need in self.prepared:
                continue
            if self.needs and need == self.needs[0] and self._beside is not None:
                self._join_beside()
                self.todo[need] = missing(need, self.opts.accel)  # the image may be there now
            steps = self.todo.get(need, [])
            if steps:
                after = [b for b in self.left() if b not in steps]
                log.info("building %s (about %s)%s", " and ".join(b.what for b in steps),
                         duration(sum(b.seconds for b in steps)),
                         f"; then about {duration(sum(b.seconds for b in after))} of building "
                         f"left, as later episodes need it" if after else "")
            self.prepare([need], self.opts)
            self.prepared.add(need)

    def close(self) -> None:
        """Stop a build still running beside llama-server (the bench ended or was interrupted)."""
        if self._beside is not None:
            self._beside[0].close()
            self._beside = None
