"""This connection as a consumer: its second session, where a thread beats (and runs the fleet's
maintenance while elected) and waits on LISTEN between beats; and the rule that a connection holding
nothing stops beating."""

from __future__ import annotations

import logging
import os
import socket
import threading
import weakref
from collections.abc import Callable
from multiprocessing import util as mp_util

from kombu_akadze.consume.adoption import Adoption
from kombu_akadze.consume.listener import Listener
from kombu_akadze.errors import AkadzeError, TransientDatabaseError
from kombu_akadze.lease.compact import Compactor
from kombu_akadze.lease.heartbeat import Heartbeat
from kombu_akadze.lease.vacuum import Vacuumer
from kombu_akadze.options import Options
from kombu_akadze.store import ClaimedMessage, Store, relay_key, wake_channel

logger = logging.getLogger("kombu_akadze")

#: Leases with a running heartbeat, for the exit hook below.
_BEATING: weakref.WeakSet[ConsumerLease] = weakref.WeakSet()


def _forget_at_exit() -> None:
    """At interpreter exit, forget the consumers this process never closed (see ConsumerLease.exit)."""
    for lease in list(_BEATING):
        lease.exit()


class ConsumerLease:
    """Started at the first claim, stopped at close or once idle. Thread-safe: claims run on the
    consuming thread, the heartbeat on its own."""

    def __init__(
        self,
        *,
        options: Options,
        consumer_id: str,
        new_store: Callable[[str], Store],
        on_wakeup: Callable[[], None],
        take: Callable[[ClaimedMessage, bool], bool],
        queues: Callable[[], list[str]],
        held: Callable[[], set[int]],
        holds_nothing: Callable[[], bool],
        on_beat: Callable[[], None],
        looping: Callable[[], bool],
        listening: Callable[[], bool],
    ) -> None:
        self.options = options
        self.consumer_id = consumer_id
        self._new_store = new_store
        self._on_wakeup = on_wakeup
        self._take = take
        self._queues = queues
        self._held = held
        self._holds_nothing = holds_nothing
        self._on_beat = on_beat
        self._looping = looping
        self._listening = listening
        self._lock = threading.Lock()
        #: Claim statements under way (guarded by _lock): their rows are not buffered yet, so neither
        #: the reconcile nor the idle stop may run meanwhile.
        self._claims_in_flight = 0
        self.heartbeat: Heartbeat | None = None
        self.listener: Listener | None = None
        #: Where publishers wake this consumer while it is parked on a queue (see store.wake_channel).
        self.channel = wake_channel(options.schema, consumer_id)
        #: The runs this consumer received, for adopting those it never did after a re-arm.
        self.adoption = Adoption()
        #: The heartbeat thread that is removing this consumer after it found it idle (see _stop_if_idle):
        #: stop() waits for it, so that nothing of this connection writes after its close.
        self._retiring: threading.Thread | None = None
        #: It parked at least once: a publish may have handed it a message (only then is there anything
        #: to adopt when its LISTEN is armed again).
        self._parked = False

    def ensure(self) -> None:
        """Register this connection as a consumer and start its heartbeat (raises if the database refuses)."""
        if self.heartbeat is not None and self.heartbeat.running:
            return
        with self._lock:
            if self.heartbeat is not None and self.heartbeat.running:
                return
            if self.listener is not None:
                self.listener.close()
            opts = self.options
            # One session for the heartbeat and LISTEN: listen_url's server when set (a pooler in front
            # of the command session cannot carry LISTEN).
            store = self._new_store("heartbeat")
            listener = Listener(
                store,
                channel=self.channel,
                enabled=opts.listen,
                on_wakeup=self._on_wakeup,
                on_handoff=lambda message, parked: self._handed(store, message, parked),
                on_armed=lambda: self._adopt(store),
                relay_key=relay_key(store.dsn, opts.schema) if opts.listen_relay else None,
            )
            heartbeat = Heartbeat(
                store=store,
                consumer_id=self.consumer_id,
                hostname=socket.gethostname(),
                pid=os.getpid(),
                interval=opts.heartbeat_interval,
                ttl=opts.heartbeat_ttl,
                rescue_interval=opts.rescue_interval,
                max_attempts=opts.max_attempts,
                queues=self._queues,
                tracked=self.tracked_ids,
                compactor=Compactor(store, interval=opts.compact_interval) if opts.compact_interval else None,
                vacuumer=Vacuumer(lambda: self._new_store("vacuum")),
                pause=listener,
            )
            heartbeat.on_beat = self._on_beat
            heartbeat.on_tick = lambda: self._stop_if_idle(heartbeat)
            try:
                listener.arm()  # before the first claim, which may park
                heartbeat.start()
            except BaseException:
                listener.close()
                store.close()
                raise
            self.heartbeat, self.listener = heartbeat, listener
            _BEATING.add(self)

    def _handed(self, store: Store, message: ClaimedMessage, parked: bool) -> None:
        """A message a publish handed over (on the heartbeat's thread): buffered for delivery if a channel
        of this connection consumes its queue and has a free slot, else given back at once on the
        heartbeat's session, as if never handed over (ready in place, run_count and attempt back). One whose
        run was adopted already (its notification read after the adoption's query) is dropped."""
        if not self.adoption.handed(message):
            logger.debug("kombu-akadze: handed-over message %d was adopted already", message.id)
            return
        if self._take(message, parked):
            return
        logger.debug("kombu-akadze: handed-over message %d has no free slot here: giving it back", message.id)
        try:
            store.message_refuse([message.tag], owner=self.consumer_id)
            self._on_wakeup()  # claim once a slot frees: nobody else may be parked to take it
        except AkadzeError as exc:
            logger.warning(
                "kombu-akadze: could not give back handed-over message %d (%s); the reconcile gives it back",
                message.id,
                exc,
            )

    def _adopt(self, store: Store) -> None:
        """LISTEN runs for this consumer again (on the heartbeat's thread): the rows held under its id that
        it never received were handed over while it did not (their notifications reached nobody), and are
        delivered now as handed over; with no free slot, or no channel consuming the queue any more, given
        back in place (message_release: a run whose claim raced this query keeps its number, so its late
        reply is told apart). What cannot be asked now is left to the reconcile."""
        if not self._parked:
            return
        try:
            held = self._held()
        except RuntimeError:  # a buffer moved as it was read: the reconcile covers this pass
            return
        try:
            found = store.lease_unseen(consumer_id=self.consumer_id, tracked=held)
        except AkadzeError as exc:
            logger.info("kombu-akadze: could not look for unread handoffs after re-arming LISTEN: %s", exc)
            return
        adopted = self.adoption.unseen(found)
        if not adopted:
            return
        logger.info("kombu-akadze: %d message(s) handed over while LISTEN was re-armed, delivered now", len(adopted))
        refused = [m.tag for m in adopted if not self._take(m, True)]
        if refused:
            try:
                store.message_release(refused, owner=self.consumer_id)
                self._on_wakeup()
            except AkadzeError as exc:
                logger.warning(
                    "kombu-akadze: could not give back %d adopted message(s) (%s); the reconcile gives them back",
                    len(refused),
                    exc,
                )

    def received(self, messages: list[ClaimedMessage]) -> list[ClaimedMessage]:
        """A claim's messages as the transport should buffer them: less any an adoption delivered first."""
        return self.adoption.claimed(messages)

    def park_channel(self) -> str | None:
        """The channel to park with when a claim comes back short: only for a connection that waits on
        its LISTEN session (an event loop, or drain_events) and while that session is armed. A client
        that only gets (basic_get), or polls without LISTEN, must not park: its rows would take the
        wake-ups meant for consumers that wait for them."""
        listener = self.listener
        if listener is None or not self._listening() or not listener.armed:
            return None
        self._parked = True
        return self.channel

    def may_claim(self) -> bool:
        """Whether a claim may run: the lease is registered and its last heartbeat is younger than the
        ttl (while heartbeats fail our leases may already be rescued: claim nothing until one lands)."""
        self.ensure()
        heartbeat = self.heartbeat
        return heartbeat is None or heartbeat.healthy()

    def claim_started(self) -> None:
        with self._lock:
            self._claims_in_flight += 1

    def claim_ended(self) -> None:
        with self._lock:
            self._claims_in_flight -= 1

    def tracked_ids(self) -> set[int] | None:
        """Every row id this connection holds, or None while a claim is in flight or the buffers moved as
        they were read. Runs on the heartbeat thread, whose reconcile gives back what this consumer holds
        and does not know."""
        if self._claims_in_flight:
            return None
        try:
            ids = self._held()
        except RuntimeError:  # a buffer changed size as it was read: no reconcile this pass
            return None
        return None if self._claims_in_flight else ids

    def check(self) -> None:
        """Raise a connection error once the heartbeat has failed for longer than heartbeat_ttl: our held
        messages are (or will be) rescued by others, so Celery should drop this connection and reconnect;
        late outcomes of those messages are fenced."""
        heartbeat = self.heartbeat
        ttl = self.options.heartbeat_ttl
        if heartbeat is not None and heartbeat.failing_for() > ttl:
            raise TransientDatabaseError(
                f"kombu-akadze: no heartbeat for {heartbeat.failing_for():.0f} s (heartbeat_ttl {ttl:.0f} s); "
                "giving up held messages and reconnecting"
            )

    def _stop_if_idle(self, heartbeat: Heartbeat) -> None:
        """A connection whose consumers were all cancelled (a Celery client after `inspect`, returned to
        its pool and never closed: Celery's app.close() only drops the pool) has no lease to keep: its
        heartbeat stops and its consumer row goes, instead of beating until the process exits. The next
        claim starts both again. Runs on the heartbeat thread after every beat, landed or failed (the
        database may be gone for good); never while a claim is in flight or an event loop consumes."""
        if not self._lock.acquire(blocking=False):
            return  # a claim or ensure() (whose first beat lands here) holds it: not idle
        try:
            if self.heartbeat is not heartbeat or self._claims_in_flight or self._looping():
                return
            if not self._holds_nothing():
                return
            self.heartbeat = None
            listener, self.listener = self.listener, None
            self._retiring = threading.current_thread()
        finally:
            self._lock.release()
        try:  # on the heartbeat's own session, which stop() closes: the command session may be closed by now
            heartbeat.store.consumer_unpark(consumer_id=self.consumer_id)
            heartbeat.store.consumer_delete(consumer_id=self.consumer_id)
        except AkadzeError as exc:
            logger.info("kombu-akadze: could not remove idle consumer %s: %s", self.consumer_id, exc)
        finally:
            heartbeat.stop()
            if listener is not None:
                listener.close()

    def exit(self, timeout: float = 2.0) -> None:
        """At the exit of a process that never closed this connection (a `celery inspect` or `celery
        call` client, a script that got a result: Celery drops its pool without closing it): the
        heartbeat stops and the consumer row goes if no message is held under it (checked in the same
        statement), so `akadze stats` does not count the process alive for heartbeat_ttl. A held message
        keeps the row and is rescued after heartbeat_ttl, as after a crash. Never in a forked child (the
        row is its parent's), never while a claim is in flight."""
        if not self._lock.acquire(timeout=timeout):
            return
        try:
            heartbeat = self.heartbeat
            if heartbeat is None or heartbeat.pid != os.getpid() or self._claims_in_flight:
                return
            self.heartbeat = None
        finally:
            self._lock.release()
        listener, self.listener = self.listener, None
        # The thread ends first (a beat after the delete would register the row again); its session stays
        # open for the delete, so that an exit costs no new connection. A heartbeat that has not landed
        # for heartbeat_ttl means the server is out of reach: the row expires there, the exit does not wait.
        heartbeat.stop(timeout, close=False)
        if listener is not None:
            listener.close()
        try:
            if heartbeat.healthy():
                heartbeat.store.consumer_unpark(consumer_id=self.consumer_id)
                heartbeat.store.consumer_delete_idle(consumer_id=self.consumer_id)
        except AkadzeError as exc:
            logger.info("kombu-akadze: could not remove consumer %s at exit: %s", self.consumer_id, exc)
        finally:
            heartbeat.store.close()

    def _wait_retiring(self, timeout: float) -> None:
        """Wait for an idle stop under way on the heartbeat's thread (its unpark and delete) to end."""
        retiring = self._retiring
        if retiring is not None and retiring is not threading.current_thread():
            retiring.join(timeout)

    def stop(self, store: Store) -> None:
        """At close: the heartbeat (and its LISTEN) stops and the consumer row goes (on *store*); an idle
        stop that took the heartbeat first is waited for, so that the close returns with nothing of this
        connection still writing (a schema dropped right after a close met its delete: a deadlock)."""
        with self._lock:  # exactly one of this and _stop_if_idle takes the heartbeat
            heartbeat, self.heartbeat = self.heartbeat, None
            listener, self.listener = self.listener, None
        if heartbeat is None:
            self._wait_retiring(5.0)
        if heartbeat is not None:
            heartbeat.stop()
        if listener is not None:
            listener.close()
        if heartbeat is not None:
            try:
                store.consumer_unpark(consumer_id=self.consumer_id)
                store.consumer_delete(consumer_id=self.consumer_id)
            except AkadzeError as exc:
                logger.warning("kombu-akadze: could not remove consumer %s at close: %s", self.consumer_id, exc)


# At exit after kombu's own hook (a multiprocessing finalizer of priority 1, which gives back what the
# channels still hold), so that what it gave back no longer keeps the row; never in another process.
mp_util.Finalize(None, _forget_at_exit, exitpriority=0)
