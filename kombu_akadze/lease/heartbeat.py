"""The thread that keeps one consuming connection's leases alive, and runs the fleet's maintenance while it is
the elected consumer; it logs, never raises."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from typing import Protocol

from kombu_akadze.errors import AkadzeError
from kombu_akadze.lease import maintenance
from kombu_akadze.lease.compact import Compactor
from kombu_akadze.lease.vacuum import Vacuumer
from kombu_akadze.store import Store

logger = logging.getLogger("kombu_akadze")


class Pause(Protocol):
    """What the heartbeat's thread does between two beats (consume.listener.Listener: wait on LISTEN)."""

    def wait(self, timeout: float) -> None: ...
    def interrupt(self) -> None: ...


class _Sleep:
    def __init__(self) -> None:
        self._event = threading.Event()

    def wait(self, timeout: float) -> None:
        self._event.wait(timeout)
        self._event.clear()

    def interrupt(self) -> None:
        self._event.set()


class Heartbeat:
    """Marks one consumer alive every *interval* seconds on its own database session; between two beats
    its thread runs *pause* (the consumer's LISTEN wait, on the same session), or sleeps."""

    def __init__(
        self,
        *,
        store: Store,
        consumer_id: str,
        hostname: str,
        pid: int,
        interval: float,
        ttl: float,
        rescue_interval: float,
        max_attempts: int,
        queues: Callable[[], list[str]] = list,
        tracked: Callable[[], Collection[int] | None] = lambda: None,
        compactor: Compactor | None = None,
        vacuumer: Vacuumer | None = None,
        pause: Pause | None = None,
    ) -> None:
        self.store = store
        self.pause: Pause = pause if pause is not None else _Sleep()
        self.consumer_id = consumer_id
        self.hostname = hostname
        self.pid = pid
        self.interval = interval
        self.ttl = ttl
        #: How long a row held under our id and not tracked waits before the reconcile looks at it: a
        #: handoff whose notification was lost (the LISTEN session went between the park and the publish)
        #: comes back two beats after this, not after heartbeat_ttl. The two passes keep a notification
        #: or a claim reply still on its way out of it (those take milliseconds, and no pass runs while a
        #: claim is in flight).
        self.orphan_age = min(ttl, 2 * interval)
        self.rescue_interval = rescue_interval
        self.max_attempts = max_attempts
        self.queues = queues
        #: The ids the transport holds, or None while that cannot be said (a claim in flight).
        self.tracked = tracked
        #: Held under our id, claimed over ttl ago, not tracked at the last pass: id -> run_count.
        self._orphans: dict[int, int] = {}
        self.unstranded = 0
        self.compactor = compactor
        self.vacuumer = vacuumer
        self.beats = 0
        #: Maintenance passes this heartbeat ran (every consumer reconciles its own rows; the leader
        #: also runs the fleet's passes), and how many as the leader.
        self.rescues = 0
        self.led = 0
        #: Whether the last beat found this consumer the elected one (oldest alive).
        self.leader = False
        #: The consumed queues the last beat found a claimable message in (its owner claims, see on_beat).
        self.ready: tuple[str, ...] = ()
        self.last_ok = 0.0
        self._stop = threading.Event()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self.on_beat: Callable[[], None] | None = None
        #: Called after every attempt, successful or not (the owner may stop an idle heartbeat there).
        self.on_tick: Callable[[], None] | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def healthy(self) -> bool:
        """True while the last successful heartbeat is younger than the TTL."""
        return self.last_ok > 0 and time.monotonic() - self.last_ok < self.ttl

    def start(self) -> None:
        """Register the consumer (raising if the database refuses), then beat in the background."""
        self.beat(raise_errors=True)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"akadze-heartbeat-{self.consumer_id}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0, *, close: bool = True) -> None:
        """End the thread (waiting for a beat under way); *close*: also its session (False: the caller
        runs one more statement on it, then closes it)."""
        self._stop.set()
        self.pause.interrupt()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        self._thread = None
        if self.vacuumer is not None:
            self.vacuumer.close()
        if close:
            self.store.close()

    def beat(self, *, raise_errors: bool = False) -> bool:
        try:
            self.leader, self.ready = self.store.consumer_heartbeat(
                consumer_id=self.consumer_id, hostname=self.hostname, pid=self.pid, queues=self.queues(), ttl=self.ttl
            )
        except AkadzeError as exc:
            if raise_errors:
                raise
            logger.warning("kombu-akadze heartbeat of %s failed, will retry: %s", self.consumer_id, exc)
            return False
        self._beat_landed(rescue=False)
        return True

    def maintain(self) -> bool:
        """One transaction: the heartbeat; the reconcile of this consumer's own held rows with what the
        transport tracks; and, while this consumer is the elected one, the fleet's maintenance passes
        (see lease.maintenance). Every other consumer's periodic cost is the heartbeat and one lookup
        of its own held rows on messages_held_idx."""
        tracked = self.tracked()
        store = self.store
        counts: dict[str, int] | None = None
        unstranded = 0
        try:
            with store.transaction():
                self.leader, self.ready = store.consumer_heartbeat(
                    consumer_id=self.consumer_id,
                    hostname=self.hostname,
                    pid=self.pid,
                    queues=self.queues(),
                    ttl=self.ttl,
                )
                if tracked is not None:
                    unstranded = self._reconcile(tracked)
                if self.leader:
                    counts = maintenance.run_once(
                        store, ttl=self.ttl, max_attempts=self.max_attempts, consumer_id=self.consumer_id
                    )
        except AkadzeError as exc:
            logger.warning("kombu-akadze heartbeat/maintenance of %s failed, will retry: %s", self.consumer_id, exc)
            return False
        self.unstranded += unstranded
        maintenance.report_unstranded(unstranded, ttl=self.orphan_age)
        if counts is not None and self.vacuumer is not None:
            self.vacuumer.offer(counts.get("unvacuumed", 0))
        self._beat_landed(rescue=True)
        return True

    def _reconcile(self, tracked: Collection[int]) -> int:
        """Rows held under our id for over orphan_age that the transport does not hold go back to ready,
        attempt given back, once seen so at two passes in a row: a message moving between the transport's
        buffers as the ids were read is never mistaken for one nobody holds."""
        seen = self.store.lease_orphans(consumer_id=self.consumer_id, tracked=tracked, ttl=self.orphan_age)
        again = [(i, rc) for i, rc in seen.items() if self._orphans.get(i) == rc]
        released = self.store.message_release(again, owner=self.consumer_id) if again else set()
        self._orphans = {i: rc for i, rc in seen.items() if i not in released}
        return len(released)

    def _beat_landed(self, *, rescue: bool) -> None:
        self.last_ok = time.monotonic()
        with self._changed:
            self.beats += 1
            if rescue:
                self.rescues += 1
                self.led += self.leader
            self._changed.notify_all()
        if self.on_beat is not None:
            try:  # the owner's work (writing buffered outcomes) must never end the heartbeat thread
                self.on_beat()
            except Exception:
                logger.exception("kombu-akadze: work after the heartbeat of %s failed; beating on", self.consumer_id)

    def wait_for(self, predicate: Callable[[Heartbeat], bool], timeout: float) -> bool:
        """Block until *predicate(self)* holds (tests wait on beats and rescues, never sleep)."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self), timeout)

    def failing_for(self) -> float:
        """Seconds since the last successful heartbeat (0 while healthy beats land)."""
        return 0.0 if self.last_ok == 0 else time.monotonic() - self.last_ok

    def compact(self) -> None:
        """The compaction check (see compact.py), on the elected consumer's session right after a beat; logs,
        never raises."""
        if self.compactor is None:
            return
        try:
            self.compactor.check()
        except AkadzeError as exc:
            logger.warning("kombu-akadze compaction check failed, next one in %.0f s: %s", self.compactor.interval, exc)
        with self._changed:
            self._changed.notify_all()

    def _run(self) -> None:
        next_rescue = time.monotonic()
        next_compact = next_rescue + (self.compactor.interval if self.compactor else 0.0)
        failures = 0
        while True:
            now = time.monotonic()
            if now >= next_rescue:
                ok = self.maintain()
                next_rescue = now + self.rescue_interval
            else:
                ok = self.beat()
            if ok and self.leader and self.compactor is not None and now >= next_compact:
                self.compact()
                next_compact = time.monotonic() + self.compactor.interval
            failures = 0 if ok else failures + 1
            if self.on_tick is not None:
                self.on_tick()
            # After a failure retry sooner (backoff from 0.25 s), never later than the interval.
            delay = self.interval if failures == 0 else min(self.interval, 0.25 * 2 ** min(failures, 5))
            if self._stop.is_set():
                return
            self.pause.wait(delay)
            if self._stop.is_set():
                return
