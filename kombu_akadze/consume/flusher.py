"""A deadline for buffered outcomes of a client that neither drains nor runs an event loop (basic_get)."""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable

logger = logging.getLogger("kombu_akadze")

_ARMED: weakref.WeakSet[DelayedFlush] = weakref.WeakSet()


class DelayedFlush:
    """Calls *flush* on its own thread once *delay* seconds after the first arm() since the last call.

    A kombu client that gets messages one by one writes its acks with its next get (one round trip for
    both) or, when no get follows in time, here. arm() while armed only takes a lock: the thread wakes
    once per delay at most, not once per ack. The thread starts at the first arm() (again in a forked
    child) and ends with stop(); at interpreter exit what is still armed is flushed on the main thread.
    """

    def __init__(self, flush: Callable[[], None], delay: float) -> None:
        self._flush = flush
        self.delay = delay
        self._cond = threading.Condition()
        self._due: float | None = None
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    @property
    def armed(self) -> bool:
        return self._due is not None

    def arm(self) -> None:
        with self._cond:
            if self._stopped or self._due is not None:
                return
            self._due = time.monotonic() + self.delay
            _ARMED.add(self)
            if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="akadze-outcomes", daemon=True)
                self._thread.start()
            else:
                self._cond.notify()

    def stop(self) -> None:
        """No more flushes from the thread (the owner writes what is left itself)."""
        with self._cond:
            self._stopped = True
            self._due = None
            self._cond.notify()
        _ARMED.discard(self)

    def fire(self) -> None:
        """Flush now, on this thread, if armed."""
        with self._cond:
            if self._due is None or self._pid != os.getpid():  # a forked child never writes the parent's
                return
            self._due = None
        self._call()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and (self._due is None or self._due > time.monotonic()):
                    self._cond.wait(None if self._due is None else self._due - time.monotonic())
                if self._stopped:
                    return
                self._due = None
            self._call()

    def _call(self) -> None:
        try:
            self._flush()
        except Exception:  # the outcomes stay buffered: the next get, flush or heartbeat retries them
            logger.exception("kombu-akadze: writing buffered outcomes failed; they are retried")


@atexit.register
def _flush_armed_at_exit() -> None:
    for flusher in list(_ARMED):
        flusher.fire()
