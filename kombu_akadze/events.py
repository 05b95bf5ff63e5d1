"""LISTEN/NOTIFY wake-ups: a consumer waits on its LISTEN session instead of sleeping a whole poll."""

from __future__ import annotations

import logging
import random
import select
import time

from kombu_akadze.errors import AkadzeError
from kombu_akadze.store import Store

logger = logging.getLogger("kombu_akadze")


def jittered(poll_interval: float) -> float:
    """Between half and all of the poll interval, so idle consumers do not poll in lockstep."""
    return poll_interval * random.uniform(0.5, 1.0)


class Listener:
    """One LISTEN session per consuming connection, re-armed after every reconnect."""

    def __init__(self, store: Store, *, enabled: bool) -> None:
        self.store = store
        self.enabled = enabled
        self.fd: int | None = None
        self.wakeups = 0

    def arm(self) -> int | None:
        """(Re)open the session and LISTEN; None when disabled or the database is unreachable."""
        if not self.enabled:
            return None
        if self.fd is None or not self.store.connected:
            try:
                self.fd = self.store.listen_start()
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
        """Block up to *timeout* seconds for a wake-up; True if one came."""
        fd = self.arm()
        if fd is None:
            time.sleep(max(timeout, 0.0))
            return False
        if self.drain():
            return True
        try:
            ready, _, _ = select.select([fd], [], [], max(timeout, 0.0))
        except (OSError, ValueError):
            self.fd = None
            return False
        return bool(ready) and bool(self.drain())

    def close(self) -> None:
        self.fd = None
        self.store.close()
