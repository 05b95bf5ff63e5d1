"""The wake-up side of a consumer's second session: between two heartbeats, its thread waits on that
session's LISTEN socket instead of sleeping, and hands each wake-up to the consumer.

One session per consumer thus does both jobs, the heartbeat and LISTEN (a worker holds two sessions:
this one and its command session). Everything here runs on the heartbeat's thread, except ``armed``
(read by the consuming thread before it parks) and ``interrupt`` (called by whoever stops the thread).
"""

from __future__ import annotations

import logging
import select
import time
from collections.abc import Callable
from typing import Protocol

from kombu_akadze.consume.wakeups import Waker
from kombu_akadze.errors import AkadzeError

logger = logging.getLogger("kombu_akadze")


class ListenSession(Protocol):
    """The session's LISTEN part (store.Store)."""

    @property
    def listening(self) -> bool: ...
    def listen_start(self, *, channel: str) -> int: ...
    def listen_notifies(self) -> list[str]: ...


class Listener:
    """LISTEN on one consumer's own wake-up channel, re-armed whenever its session was replaced."""

    def __init__(
        self,
        store: ListenSession,
        *,
        channel: str,
        enabled: bool,
        on_wakeup: Callable[[], None] = lambda: None,
    ) -> None:
        self.store = store
        #: This consumer's own wake-up channel: publishers notify it only while it is parked.
        self.channel = channel
        self.enabled = enabled
        #: Called on a wake-up, and when LISTEN is armed again after a lost session (wake-ups may have
        #: been missed meanwhile): the consumer claims.
        self.on_wakeup = on_wakeup
        self.fd: int | None = None
        self.wakeups = 0
        #: LISTEN sessions opened so far.
        self.sessions = 0
        self._interrupt = Waker()

    @property
    def armed(self) -> bool:
        """LISTEN runs on the session as it is now: a consumer may park and wait for a wake-up."""
        return self.fd is not None and self.store.listening

    def arm(self) -> int | None:
        """LISTEN again if the session is new (reconnected) or was lost; None when disabled or unreachable."""
        if not self.enabled:
            return None
        if self.armed:
            return self.fd
        rearm = self.sessions > 0
        try:
            self.fd = self.store.listen_start(channel=self.channel)
        except AkadzeError as exc:
            self.fd = None
            logger.warning("kombu-akadze LISTEN could not be armed, polling meanwhile: %s", exc)
            return None
        self.sessions += 1
        if rearm:
            self.on_wakeup()
        return self.fd

    def drain(self) -> int:
        """Hand the wake-ups that arrived (or were read by the session's other statements) to the
        consumer, without blocking; how many there were."""
        if self.fd is None:
            return 0
        try:
            names = self.store.listen_notifies()
        except AkadzeError as exc:
            logger.warning("kombu-akadze LISTEN session lost, re-arming: %s", exc)
            self.fd = None
            return 0
        if names:
            self.wakeups += len(names)
            self.on_wakeup()
        return len(names)

    def wait(self, timeout: float) -> None:
        """Wait *timeout* seconds (the heartbeat's pause), handing on wake-ups as they come; returns early
        on interrupt(). The session is re-armed first if it was lost, and a lost session seen meanwhile
        is not re-armed before the next wait: the heartbeat's backoff paces reconnects."""
        deadline = time.monotonic() + max(timeout, 0.0)
        self.arm()
        self.drain()  # what the heartbeat's statements read
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            fds = [self._interrupt.fileno(), *([] if self.fd is None else [self.fd])]
            try:
                ready, _, _ = select.select(fds, [], [], remaining)
            except (OSError, ValueError):  # the session's socket was closed under us
                self.fd = None
                continue
            if self._interrupt.fileno() in ready:
                self._interrupt.drain()
                return
            if ready:
                self.drain()

    def interrupt(self) -> None:
        """End the current wait() now (from any thread)."""
        self._interrupt.wake()

    def close(self) -> None:
        self.fd = None
        self._interrupt.close()
