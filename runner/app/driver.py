"""The one loop that feeds an executor: keep its slots busy, hand each result back, in this process.

A bench and ``verify`` both have work to run through an executor
(:mod:`runner.app.executors`: here, in child processes, or on Ray) and
results to gather in the driver, the only writer of the run directory. What
differs is what a piece of work is and what a result leads to; the loop
that keeps ``executor.slots`` jobs going and waits for the next result
against a deadline is this one, so a fix to it (an interrupted wait, a lost
worker) fixes both.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from runner.app.executors import Done, Executor

WAIT = 1.0  # seconds one wait for a result lasts before the loop looks again


@dataclass(frozen=True)
class Job:
    """One piece of work for the executor: ``fn(*args)``, to end within ``timeout`` seconds of
    starting; ``key`` names it in the :class:`~runner.app.executors.Done` that comes back."""

    key: Hashable
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    timeout: float


# Work waiting for a slot: called when one is free, it returns the job to run, or None when it
# needed no executor after all (a step replayed from its recording, done in the driver).
Start = Callable[[], "Job | None"]


def drive(executor: Executor, work: Iterable[Start],
          on_done: Callable[[Done], Job | None]) -> None:
    """Run ``work`` through ``executor``, at most ``executor.slots`` at once, in the order given.

    Each finished job is handed to ``on_done`` here, in the driver, as it
    comes back; what ``on_done`` returns (a ladder's next level) is submitted
    at once, ahead of work still waiting. ``on_done`` decides what an error
    means (a lost worker is an infra-error episode; anything else is raised
    and stops the loop). Returns when nothing is waiting or running.
    """
    waiting = deque(work)
    running: set[Hashable] = set()

    def submit(job: Job | None) -> None:
        if job is not None:
            executor.submit(job.key, job.fn, job.args, timeout=job.timeout)
            running.add(job.key)

    while waiting or running:
        while waiting and executor.free():
            submit(waiting.popleft()())
        if not running:
            continue
        done = executor.next_done(WAIT)
        if done is None:
            continue
        running.discard(done.key)
        submit(on_done(done))
