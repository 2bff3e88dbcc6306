"""One generation at a time: a queue served by a single worker thread.

Generation takes seconds to minutes on a CPU and uses the whole machine, so requests are not run
in parallel: each waits for the ones before it, and can see its place in the line, and may be
cancelled (a waiting job at once, the running one at its next progress report). Watchers wait
on ``wait_async`` until the job changes, which is how progress is streamed: on the event loop,
holding no thread, so hundreds of open streams cost the server nothing but memory.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("ksemstamp.serve")

Report = Callable[[dict[str, Any]], None]


class QueueFull(RuntimeError):
    """Too many generations are already waiting."""


class JobFailed(RuntimeError):
    """A generation ended with an error meant for the user (the message is shown as is)."""


class JobCancelled(RuntimeError):
    """Raised from a running job's progress report once it has been cancelled."""


FINISHED = ("done", "error", "cancelled")


@dataclass
class Job:
    """One generation request and what has become of it."""

    id: str
    params: dict[str, Any]
    state: str = "queued"  # queued / running / done / error / cancelled
    cancel_requested: bool = False
    progress: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    error: str | None = None
    version: int = 0
    created: float = field(default_factory=time.time)
    order: int = 0


class GenerationQueue:
    """Runs ``run(params, report)`` for one job at a time, in the order jobs were submitted.

    Args:
        run: does the work; calls ``report(progress)`` as it goes and returns the result dict.
            A ``JobFailed`` becomes the job's error message; any other exception is logged and
            shown as a generic failure (its message might hold anything).
        max_waiting: most jobs waiting behind the running one; more raise ``QueueFull``.
        keep: finished jobs kept for late watchers.
    """

    def __init__(
        self,
        run: Callable[[dict[str, Any], Report], dict[str, Any]],
        max_waiting: int = 8,
        keep: int = 50,
    ) -> None:
        self._run = run
        self.max_waiting = max_waiting
        self.keep = keep
        self._jobs: collections.OrderedDict[str, Job] = collections.OrderedDict()
        self._waiting: collections.deque[Job] = collections.deque()
        self._changed = threading.Condition()
        self._counter = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False
        # job id -> the event loops' waiters on it (see ``wait_async``)
        self._async_waiters: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = (
            collections.defaultdict(set)
        )

    # ------------------------------------------------------------------ public
    def submit(self, params: dict[str, Any]) -> dict[str, Any]:
        """Queue a job; returns its first snapshot."""
        with self._changed:
            if self._closed:
                raise QueueFull("the server is shutting down")
            if len(self._waiting) >= self.max_waiting:
                raise QueueFull(
                    f"{len(self._waiting)} generations are already waiting; try again later"
                )
            job = Job(id=uuid.uuid4().hex[:12], params=params, order=next(self._counter))
            self._jobs[job.id] = job
            self._waiting.append(job)
            self._forget_old()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._work, name="ksemstamp-generate", daemon=True
                )
                self._thread.start()
            self._notify()
            return self._snapshot(job)

    def snapshot(self, job_id: str) -> dict[str, Any] | None:
        """The job's state now, with its place in the line; ``None`` for an unknown id."""
        with self._changed:
            job = self._jobs.get(job_id)
            return None if job is None else self._snapshot(job)

    def wait(self, job_id: str, version: int, timeout: float) -> dict[str, Any] | None:
        """Block until the job is past ``version`` (or ``timeout`` s pass); its snapshot then."""
        with self._changed:
            job = self._jobs.get(job_id)
            if job is None:
                return None
            self._changed.wait_for(lambda: job.version > version or self._closed, timeout)
            return self._snapshot(job)

    async def wait_async(self, job_id: str, version: int, timeout: float) -> dict[str, Any] | None:
        """``wait`` for the event loop: the same answer, holding no thread while it waits."""
        waiter = (asyncio.get_running_loop(), asyncio.Event())
        with self._changed:
            job = self._jobs.get(job_id)
            if job is None:
                return None
            if job.version > version or self._closed:
                return self._snapshot(job)
            self._async_waiters[job_id].add(waiter)
        try:
            await asyncio.wait_for(waiter[1].wait(), timeout)
        except TimeoutError:
            pass
        finally:
            with self._changed:
                waiters = self._async_waiters[job_id]
                waiters.discard(waiter)
                if not waiters:
                    del self._async_waiters[job_id]
        return self.snapshot(job_id)

    def cancel(self, job_id: str) -> dict[str, Any] | None:
        """Cancel a job: a waiting one leaves the line at once; the running one stops at its
        next progress report. ``None`` for an unknown id; a finished job is left as it is."""
        with self._changed:
            job = self._jobs.get(job_id)
            if job is None:
                return None
            if job.state == "queued":
                self._waiting.remove(job)
                job.state, job.error = "cancelled", "cancelled before it started"
                for other in (job, *self._waiting):  # the ones behind it moved up
                    other.version += 1
            elif job.state == "running" and not job.cancel_requested:
                job.cancel_requested = True
                job.version += 1
            self._notify()
            return self._snapshot(job)

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called."""
        return self._closed

    def close(self) -> None:
        """Stop taking jobs; the worker ends after the running one."""
        with self._changed:
            self._closed = True
            self._notify()

    # ------------------------------------------------------------------ internals
    def _notify(self, job: Job | None = None) -> None:
        """Wake the watchers of ``job`` (of every job when ``None``): threads and event loops
        alike (``self._changed`` held)."""
        self._changed.notify_all()
        ids = list(self._async_waiters) if job is None else [job.id]
        for waiter_id in ids:
            for loop, event in self._async_waiters.get(waiter_id, ()):
                with contextlib.suppress(RuntimeError):  # a loop that has closed
                    loop.call_soon_threadsafe(event.set)

    def _report(self, job: Job, progress: dict[str, Any]) -> None:
        if job.cancel_requested:
            raise JobCancelled
        self._update(job, progress=progress)

    def _snapshot(self, job: Job) -> dict[str, Any]:
        running = any(j.state == "running" for j in self._jobs.values())
        position = None
        if job.state == "queued":
            position = 1 + next(i for i, j in enumerate(self._waiting) if j is job)
        return {
            "id": job.id,
            "state": job.state,
            "position": position,  # 1 = next to run
            "ahead": (position - 1 + running) if position else 0,
            "progress": job.progress,
            "result": job.result,
            "error": job.error,
            "cancel_requested": job.cancel_requested,
            "version": job.version,
        }

    def _forget_old(self) -> None:
        finished = [j for j in self._jobs.values() if j.state in FINISHED]
        for job in finished[: max(0, len(finished) - self.keep)]:
            del self._jobs[job.id]

    def _update(self, job: Job, **changes: Any) -> None:
        with self._changed:
            for name, value in changes.items():
                setattr(job, name, value)
            job.version += 1
            self._notify(job)

    def _work(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._waiting or self._closed)
                if self._closed:
                    return
                job = self._waiting.popleft()
                job.state = "running"
                job.version += 1
                # Every waiting job moved up one place.
                for other in self._waiting:
                    other.version += 1
                self._notify()
            try:
                result = self._run(job.params, lambda p, job=job: self._report(job, p))
            except JobCancelled:
                self._update(job, state="cancelled", error="cancelled while it ran")
            except JobFailed as err:
                self._update(job, state="error", error=str(err))
            except Exception:
                log.exception("generation %s failed", job.id)
                self._update(job, state="error", error="generation failed; see the server log")
            else:
                self._update(job, state="done", result=result)
