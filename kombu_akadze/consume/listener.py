"""The LISTEN session: a consumer waits on it for NOTIFY wake-ups instead of sleeping a whole poll."""

from __future__ import annotations

import logging
import select
import time

from kombu_akadze.consume.wakeups import Waker
from kombu_akadze.errors import AkadzeError, PermanentConnectionError
from kombu_akadze.store import Store

logger = logging.getLogger("kombu_akadze")


class Listener:
    """One LISTEN session per consuming connection, re-armed after every reconnect."""

    def __init__(self, store: Store, *, channel: str, enabled: bool, waker: Waker | None = None) -> None:
        self.store = store
        #: This consumer's own wake-up channel: publishers notify it only while it is parked.
        self.channel = channel
        self.enabled = enabled
        self.waker = waker
        self.fd: int | None = None
        self.wakeups = 0
        #: LISTEN sessions opened so far: a new session may get the closed one's fd number back.
        self.sessions = 0

    def arm(self) -> int | None:
        """(Re)open the session and LISTEN; None when disabled or the database is unreachable."""
        if not self.enabled:
            return None
        if self.fd is None or not self.store.connected:
            try:
                self.fd = self.store.listen_start(channel=self.channel)
                self.sessions += 1
            except PermanentConnectionError as exc:
                # listen_url refused for good (it never connected): re-arming at every poll would log the
                # same refusal each time; the consumer polls, as with listen=False, and says so once.
                self.fd = None
                self.enabled = False
                logger.error(
                    "kombu-akadze: LISTEN turned off for this connection, consumers poll instead (poll_interval) "
                    "until listen_url is fixed and the worker restarted: %s",
                    exc,
                )
            except AkadzeError as exc:
                self.fd = None
                logger.warning("kombu-akadze LISTEN could not be armed, polling meanwhile: %s", exc)
        return self.fd

    def drain(self) -> list[str]:
        """Queue names woken since the last call, without blocking."""
        if self.fd is None:
            return []
        try:
            names = self.store.listen_notifies()
        except AkadzeError as exc:
            logger.warning("kombu-akadze LISTEN session lost, re-arming: %s", exc)
            self.fd = None
            return []
        self.wakeups += len(names)
        return names

    def wait(self, timeout: float) -> bool:
        """Block up to *timeout* seconds for a wake-up (a NOTIFY, or the waker: an ack freed a slot)."""
        fd = self.arm()
        if fd is not None and self.drain():
            return True
        fds = [f for f in (fd, self.waker.fileno() if self.waker else None) if f is not None]
        if not fds:
            time.sleep(max(timeout, 0.0))
            return False
        try:
            ready, _, _ = select.select(fds, [], [], max(timeout, 0.0))
        except (OSError, ValueError):
            self.fd = None
            return False
        if self.waker is not None and self.waker.fileno() in ready:
            self.waker.drain()
            return True
        return bool(ready) and bool(self.drain())

    def close(self) -> None:
        self.fd = None
        self.store.close()
