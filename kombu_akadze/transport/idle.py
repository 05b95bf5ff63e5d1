"""Closing the session of a connection that only publishes once it sits unused for ``idle_close``
seconds: a prefork child that published a sub-task, or a web process between two requests, does not
keep a PostgreSQL backend for the rest of its life. The next publish reconnects."""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import Protocol


class Closable(Protocol):
    """A transport, as the closer sees it."""

    def idle_close_after(self) -> float: ...
    def close_idle_session(self) -> bool: ...


class IdleCloser:
    """One daemon thread per process looks at the watched transports a few times per ``idle_close``;
    it ends when none is left and starts again (in a forked child too) with the next one."""

    def __init__(self) -> None:
        self._transports: weakref.WeakSet[Closable] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def watch(self, transport: Closable) -> None:
        if transport.idle_close_after() <= 0:
            return
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's thread does not run here
                self._pid, self._thread = os.getpid(), None
                self._transports = weakref.WeakSet()
            self._transports.add(transport)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="akadze-idle-close", daemon=True)
                self._thread.start()

    def _period(self) -> float | None:
        """A quarter of the shortest idle_close watched, within 0.1-10 s; None once nothing is watched."""
        with self._lock:
            afters = [t.idle_close_after() for t in list(self._transports)]
            if not afters:
                self._thread = None
                return None
        return min(max(min(afters) / 4, 0.1), 10.0)

    def _run(self) -> None:
        while (period := self._period()) is not None:
            time.sleep(period)
            for transport in list(self._transports):
                transport.close_idle_session()


#: The process's closer.
CLOSER = IdleCloser()
