"""Vacuum fallback: on a server running with autovacuum off, live consumers vacuum the messages table."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from kombu_akadze.errors import AkadzeError
from kombu_akadze.store import Store

logger = logging.getLogger("kombu_akadze")

#: Dead rows that call for a VACUUM: migration 0004's autovacuum_vacuum_threshold for the table, so a
#: server without autovacuum gets the cadence autovacuum would have given it.
THRESHOLD = 5_000


class Vacuumer:
    """Runs VACUUM on its own session and thread, one at a time, when the maintenance pass reports
    enough dead rows that nothing else will vacuum (see the messages_unvacuumed pass).

    Why its own thread: a VACUUM of a big table takes longer than a heartbeat interval, and the
    heartbeat must not wait for it. Why at all: every message leaves two dead rows (claim, ack);
    with autovacuum off they pile up and every claim wades through them (docs/operations.md has the
    figures).
    """

    def __init__(self, make_store: Callable[[], Store], *, threshold: int = THRESHOLD) -> None:
        self._make_store = make_store
        self.threshold = threshold
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._warned = False
        self._closing = False

    def offer(self, unvacuumed: int) -> bool:
        """Start a VACUUM when *unvacuumed* reaches the threshold and none runs; True when one started."""
        if unvacuumed < self.threshold:
            return False
        with self._lock:
            if self._closing or (self._thread is not None and self._thread.is_alive()):
                return False
            if not self._warned:
                self._warned = True
                logger.warning(
                    "kombu-akadze: autovacuum is off on this PostgreSQL server; consumers vacuum the "
                    "messages table themselves after every %d dead rows (turn autovacuum on to leave it "
                    "to the server)",
                    self.threshold,
                )
            self._thread = threading.Thread(target=self._run, name="akadze-vacuum", daemon=True)
            self._thread.start()
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Start no more VACUUMs and wait up to *timeout* s for one in flight (one still running closes its
        session when done)."""
        with self._lock:
            self._closing = True
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        """One VACUUM on a session of its own, closed after it: a consumer holds two sessions in steady
        state, and VACUUM is rare."""
        store = self._make_store()
        try:
            store.messages_vacuum()
        except AkadzeError as exc:
            logger.warning("kombu-akadze vacuum of the messages table failed, next pass retries: %s", exc)
        finally:
            store.close()
