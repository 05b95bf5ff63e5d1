"""Claim statements off Celery's event loop: one in flight on a thread, its result collected on the loop."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class Claimer:
    """Runs one job at a time on its own thread and calls *wake* when it is done.

    The event loop submits an ack+claim statement and goes on handling pool results (whose acks
    ride along with the next claim) instead of waiting for the database; the job's result, or its
    exception, is collected on the loop. Why: with the statement on the loop, every task cost the
    worker a whole round trip plus a commit during which nothing else moved.
    """

    def __init__(self, wake: Callable[[], None], *, name: str = "akadze-claimer") -> None:
        self._wake = wake
        self._name = name
        self._cond = threading.Condition()
        self._job: Callable[[], Any] | None = None
        self._outcome: tuple[bool, Any] | None = None
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        """A job was submitted and its outcome not collected yet."""
        return self._busy

    def done(self) -> bool:
        with self._cond:
            return self._outcome is not None

    def submit(self, job: Callable[[], Any]) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("the claimer is closed")
            if self._busy:
                raise RuntimeError("a claim is already in flight; collect() it first")
            self._busy = True
            self._job = job
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify_all()
        time.sleep(0)

    def run_here(self, job: Callable[[], Any]) -> None:
        """Run *job* on the caller's thread and keep its outcome for collect(), as if submitted (no wake:
        the caller knows it is done). For a loop with nothing else to do, the hand-off only adds latency."""
        with self._cond:
            if self._busy:
                raise RuntimeError("a claim is already in flight; collect() it first")
            self._busy = True
        try:
            outcome: tuple[bool, Any] = (True, job())
        except BaseException as exc:  # noqa: BLE001  (raised by collect(), like a submitted job's)
            outcome = (False, exc)
        with self._cond:
            self._outcome = outcome
            self._cond.notify_all()

    def wait(self, timeout: float) -> bool:
        """Block up to *timeout* s for the job in flight; True when its outcome is there (or none runs)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._outcome is not None or not self._busy, timeout)

    def collect(self) -> Any:
        """The finished job's result; its exception is raised here, on the caller's thread."""
        with self._cond:
            if self._outcome is None:
                raise RuntimeError("no finished claim to collect")
            ok, value = self._outcome
            self._outcome = None
            self._busy = False
        if not ok:
            raise value
        return value

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._job is not None or self._closed)
                if self._job is None:
                    return
                job, self._job = self._job, None
            try:
                outcome: tuple[bool, Any] = (True, job())
            except BaseException as exc:  # noqa: BLE001  (handed to the loop thread, raised there)
                outcome = (False, exc)
            with self._cond:
                self._outcome = outcome
                self._cond.notify_all()
            self._wake()
