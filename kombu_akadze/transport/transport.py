"""kombu-akadze transport: PostgreSQL as a kombu/Celery broker with leases, heartbeats and fenced acks.

Features
========
* Type: Virtual
* Supports Direct: Yes
* Supports Topic: Yes
* Supports Fanout: Yes (bindings live in PostgreSQL, shared by every process)
* Supports Priority: Yes (0-9, higher first)
* Supports TTL: Yes (x-message-ttl, per-message expiration, x-expires)

Delivery is at least once: a claimed message is *held* by its consumer, whose
heartbeat keeps the lease alive. Ack deletes the row, fenced on the
``run_count`` the message was claimed with; a consumer that missed its
heartbeat for ``heartbeat_ttl`` loses its messages to rescue, and its late acks
change nothing. A row leaves the table by a fenced ack, by an operator's
purge/delete, or by a rule the user declared on the queue (message TTL,
max-length overflow, queue expiry): the exits RabbitMQ has, each counted, and an
expired message is dead-lettered when the queue names a DLX. A message held by a
live consumer never leaves except by its own fenced outcome (or with its queue,
when an operator deletes it, as on RabbitMQ). Every other abnormal exit goes to
dead letters.

Connection String
=================
.. code-block::

    akadze://user:password@host:5432/dbname
    akadze://user:password@host:5432/dbname?sslmode=require&target_session_attrs=read-write
    akadze+postgresql://user:password@host:5432/dbname?sslmode=require
    akadze+postgresql://user@/dbname?host=/var/run/postgresql
    akadze+postgresql://user@a:5432,b:5432/dbname?target_session_attrs=read-write
    akadze://          (an embedded PostgreSQL, for demos and tests)
    akadze://u:p@h1/db;akadze://u:p@h2/db   (kombu failover; also alternates=[...])

``ssl`` (Celery's ``broker_use_ssl``) maps onto libpq: ``ca_certs``, ``certfile``, ``keyfile``
-> ``sslrootcert``, ``sslcert``, ``sslkey``; ``cert_reqs`` -> ``sslmode``. See docs/urls.md.

or ``broker_url = "postgresql://..."`` with
``broker_transport = "kombu_akadze.transport:Transport"``.

Transport Options
=================
* ``schema`` (str, default ``"akadze"``): schema holding the tables.
* ``auto_migrate`` (bool, default ``True``): apply pending migrations on connect.
* ``heartbeat_interval`` (float, default 5, seconds): consumer heartbeat period.
* ``heartbeat_ttl`` (float, default 30, seconds): silence after which a consumer is dead.
* ``rescue_interval`` (float, default 5, seconds): period of the maintenance round (each consumer's
  reconcile of its own rows; rescue, expiry, caps and DLX routing on the elected consumer only).
* ``compact_interval`` (float, default 300, seconds): period of the elected consumer's check for
  index space a drained backlog left behind (REINDEX of a small heap); 0: never.
* ``max_attempts`` (int, default 20): runs before a message goes to dead letters.
* ``queue_max_attempts`` (dict, default ``{}``): per-queue ``max_attempts``.
* ``poll_interval`` (float, default 1, seconds; alias ``polling_interval``): safety poll.
* ``listen`` (bool, default ``True``): a consumer whose claim comes back short parks on its
  queues and is woken by the next publish, on a LISTEN channel of its own (off: it polls;
  behind PgBouncer's transaction pooling only with ``listen_url``).
* ``listen_url`` (str, default ``""``: the broker URL): where a consumer's second session (its
  heartbeat, which also LISTENs) connects, in any form the broker URL takes; PostgreSQL itself
  when the command sessions go through PgBouncer.
  Its password is masked wherever kombu-akadze shows it (prefer ``~/.pgpass`` or ``PGPASSWORD``:
  Celery's ``report`` shows transport options as given).
* ``listen_poll_interval`` (float, default 10, seconds): check of an armed LISTEN session (the
  heartbeat, not this, claims what a lost wake-up left ready).
* ``event_route_cache`` (float, default 10, seconds): how long "no monitor bound to the event
  exchange" is remembered, so idle workers' heartbeat events cost no round trip.
* ``claim_batch`` (int, default 100): most messages per claim without a prefetch limit.
* ``connect_timeout`` (float, default 10, seconds): new-connection timeout.
* ``native_delay_threshold`` (float, default 60, seconds): far ETAs wait in the database.
* ``max_message_size`` (int, default 0 = no limit, bytes): largest body accepted.
* ``prepared_statements`` (bool, default ``True``): psycopg's server-side prepared statements
  (off by itself on a session that reaches PostgreSQL through a pooler such as PgBouncer).
* ``durable_acks`` (bool, default ``False``): acks and claims wait for the WAL flush (and any
  synchronous standby) like publishes; off, a server crash may make the last ~0.6 s of finished
  messages run again (never lost), as RabbitMQ's unconfirmed acks.
* ``transient_async`` (bool, default ``False``): a message published transient (``delivery_mode=1``)
  commits without waiting for the WAL flush; a server crash may lose those of its last ~0.6 s, as
  RabbitMQ loses transient messages at a restart. Off, every publish is durable.
* ``lock_timeout`` (float, default 5, seconds; 0: none): longest wait of any statement for a lock; a
  claim behind an operator's LOCK TABLE or a long REINDEX fails transiently (retried as a lost
  connection) instead of freezing the worker's event loop.
* ``statement_timeout`` (float, default 300, seconds; 0: none): longest run of any statement (the VACUUM
  fallback excepted); a backstop, far above any normal statement. Through a pooler neither is SET
  (it would stay on a shared server connection): set them on the role (docs/operations.md).
* ``idle_close`` (float, default 30, seconds; 0: never): the session of a connection that only
  publishes is closed after this long unused; the next publish reconnects.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from typing import Any

from kombu.exceptions import ChannelError
from kombu.exceptions import ConnectionError as KombuConnectionError
from kombu.transport import virtual
from kombu.utils.objects import cached_property

from kombu_akadze import embedded, polling
from kombu_akadze.consume.driver import HubDriver
from kombu_akadze.consume.flusher import DelayedFlush
from kombu_akadze.consume.listener import Listener
from kombu_akadze.consume.outcomes import KINDS
from kombu_akadze.consume.wakeups import Waker, jittered
from kombu_akadze.errors import AkadzeError, ConfigurationError, TransientDatabaseError
from kombu_akadze.lease.heartbeat import Heartbeat
from kombu_akadze.options import Options
from kombu_akadze.store import DRIVER_VERSION, ClaimedMessage, Store, migrate
from kombu_akadze.transport import exchanges, idle
from kombu_akadze.transport.channel import Channel as AkadzeChannel
from kombu_akadze.transport.claims import ClaimCycle
from kombu_akadze.transport.consumer import ConsumerLease
from kombu_akadze.transport.delivery import Deliverer
from kombu_akadze.transport.qos import QoS
from kombu_akadze.urls import adopt_parts, display_uri, dsn_for, listen_dsn

logger = logging.getLogger("kombu_akadze")

#: A draining kombu consumer writes buffered outcomes once this many wait, or the oldest is this old.
OUTCOME_BATCH = 64
OUTCOME_DELAY = 0.02


class Transport(virtual.Transport):
    """PostgreSQL transport; one instance per kombu connection. It wires the parts together: the store
    (sessions), the Deliverer (claim rounds, per-channel buffers), the ClaimCycle (the ack+claim
    statement), the ConsumerLease (heartbeat, LISTEN) and, under Celery, the event-loop driver."""

    Channel = AkadzeChannel
    can_parse_url = True
    default_port = 5432  # type: ignore[assignment]
    driver_type = "akadze"
    driver_name = "psycopg"
    polling_interval = 1.0

    implements = virtual.Transport.implements.extend(
        asynchronous=True,
        exchange_type=frozenset(["direct", "topic", "fanout"]),
        heartbeats=False,
    )

    connection_errors = (KombuConnectionError, TransientDatabaseError)  # type: ignore[assignment]
    channel_errors = (ChannelError,)

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        adopt_parts(client)  # conn.hostname/port/userid as amqp:// gives them
        self.options = Options.from_transport_options(client.transport_options)
        try:
            self._listen_dsn = listen_dsn(self.options.listen_url, client.ssl) if self.options.listen_url else ""
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        self.polling_interval = self.options.poll_interval
        self.consumer_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self.fenced_outcomes = 0
        #: Entities this connection declared already (exchanges, bindings), to skip repeats.
        self.declared: set[tuple[Any, ...]] = set()
        self._driver: HubDriver | None = None
        self._draining = False  # set once drain_events runs: outcomes may then wait for its flush
        #: Anyone else's outcomes (basic_get): with the next claim, or OUTCOME_DELAY s after the first.
        self._delayed_flush = DelayedFlush(self.flush_outcomes, OUTCOME_DELAY)
        self.waker = Waker()
        self.lease = ConsumerLease(
            options=self.options,
            consumer_id=self.consumer_id,
            new_store=self._new_store,
            on_wakeup=lambda: self.wake(ready=True),
            take=self._take_handoff,
            queues=self.consumed_queues,
            held=self._held_ids,
            holds_nothing=self._holds_nothing,
            on_beat=self._after_beat,
            looping=lambda: self._driver is not None,
            listening=lambda: self._draining or self._driver is not None,
        )

    # -- connection ---------------------------------------------------------

    @cached_property
    def dsn(self) -> str:
        """From the URL (``akadze://``, ``akadze+postgresql://``; libpq options in its query), or from
        kombu's attributes after a failover switch(), with Celery's broker_use_ssl as libpq TLS settings."""
        try:
            dsn = dsn_for(self.client)
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        return embedded.start() if dsn is None else dsn

    @cached_property
    def unbound_until(self) -> dict[str, float]:
        """Event exchange -> monotonic time until which it is known to have no bound queue, shared by this
        process's connections to the same schema (see exchanges.refresh_unbound)."""
        return exchanges.unbound_routes(self.dsn, self.options.schema)

    @property
    def listen_dsn(self) -> str:
        """Where the heartbeat session (which also LISTENs) connects: listen_url (PostgreSQL itself, when
        the broker URL is a pooler), with the broker's TLS settings where it sets none of its own; else
        the broker's DSN."""
        return self._listen_dsn or self.dsn

    @cached_property
    def store(self) -> Store:
        store = self._new_store("command")
        store.on_claim_landing = self._claim_landing
        idle.CLOSER.watch(self)
        return store

    def idle_close_after(self) -> float:
        return self.options.idle_close

    def close_idle_session(self) -> bool:
        """Close the command session if this connection only publishes (no consumer, no event loop, nothing
        held or buffered) and has not used it for idle_close seconds (called by idle.CLOSER's thread)."""
        store = self.__dict__.get("store")
        if store is None or self.lease.heartbeat is not None or self._driver is not None:
            return False
        try:
            if not self._holds_nothing():
                return False
        except RuntimeError:  # a buffer changed size as it was read: not idle
            return False
        return store.close_if_idle(self.options.idle_close)

    @cached_property
    def deliverer(self) -> Deliverer:
        return Deliverer(
            store=self.store,
            claim=self.claim,
            callbacks=self._callbacks,
            channels=lambda: list(self.channels),
            claim_batch=self.options.claim_batch,
            owner=self.consumer_id,
        )

    @cached_property
    def claims(self) -> ClaimCycle:
        return ClaimCycle(
            store=self.store,
            deliverer=self.deliverer,
            lease=self.lease,
            qoses=self._qoses,
            flush_outcomes=self.flush_outcomes,
            owner=self.consumer_id,
            ack_batch_delay=self.options.ack_batch_delay,
        )

    def _new_store(self, role: str) -> Store:
        """A session of this connection, bounded by lock_timeout and statement_timeout (the VACUUM
        fallback's has no statement limit: VACUUM of a big table legitimately takes longer)."""
        opts = self.options
        return Store(
            self.listen_dsn if role == "heartbeat" else self.dsn,
            schema=opts.schema,
            role=role,
            connect_timeout=opts.connect_timeout,
            prepared_statements=opts.prepared_statements,
            durable_acks=opts.durable_acks,
            lock_timeout=opts.lock_timeout,
            statement_timeout=0 if role == "vacuum" else opts.statement_timeout,
        )

    def establish_connection(self) -> Any:
        migrate.ensure(
            self.dsn,
            self.options.schema,
            auto_migrate=self.options.auto_migrate,
            connect_timeout=self.options.connect_timeout,
        )
        self.store.connection()
        return super().establish_connection()

    def close_connection(self, connection: Any) -> None:
        """Write the buffered outcomes, close the channels (held messages go back in place), stop the
        heartbeat and remove the consumer row. An error writing the outcomes is logged and the close goes
        on: skipped, the heartbeat would keep the leases of rows nobody will finish alive for as long as
        the process lives. An outcome that could not be written stays held until rescue (one more run)."""
        try:
            self.unregister_from_event_loop(connection, None)
            self._delayed_flush.stop()
            self.flush_outcomes()
        except Exception:
            logger.exception(
                "kombu-akadze: writing buffered outcomes at close failed; closing anyway (messages whose "
                "outcome was not written are rescued after heartbeat_ttl and run again)"
            )
        try:
            super().close_connection(connection)  # closes channels: held messages released in place
        finally:
            self.lease.stop(self.store)
            self.store.close()
            self.waker.close()  # a new one comes with the next establish_connection

    def as_uri(self, uri: str, include_password: bool = False, mask: str = "**") -> str:
        return display_uri(self.client, include_password=include_password, mask=mask)

    def driver_version(self) -> str:
        return DRIVER_VERSION

    def new_name(self) -> str:
        return uuid.uuid4().hex

    # -- what the connection's channels hold ----------------------------------

    def _channels(self) -> list[AkadzeChannel]:
        return list(self.channels)

    def _qoses(self) -> list[QoS]:
        return [qos for channel in self._channels() if (qos := channel.existing_qos()) is not None]

    def consumed_queues(self) -> list[str]:
        """Every queue a channel of this connection consumes (the heartbeat marks them in use)."""
        return list(dict.fromkeys(q for channel in self._channels() for q in channel.consumed_queues()))

    def _held_ids(self) -> set[int]:
        """Every row id this connection holds: claimed and buffered, delivered and unsettled, or with an
        outcome still to write (a buffer that changes size as it is read raises RuntimeError)."""
        ids: set[int] = set()
        for channel in self._channels():
            ids.update(m.id for m in list(channel.claimed))
        for qos in self._qoses():
            ids |= qos.held_ids()
        return ids

    def _holds_nothing(self) -> bool:
        """No queue consumed, no message claimed and unsettled, no outcome waiting to be written or being
        written (an ack in flight still holds its row: the idle stop's consumer_delete gives back what is
        held under its id, and beat that ack to the row, which then found it ready and changed nothing)."""
        if self.consumed_queues() or self.deliverer.buffered():
            return False
        return not any(qos.holds_unsettled() or qos.outcomes.tags() for qos in self._qoses())

    # -- outcomes and wake-ups ------------------------------------------------

    def outcome_flush_scheduled(self) -> bool:
        """Whether a buffered outcome will be written by someone else soon (False: write it now).

        With Celery's event loop the outcomes of one tick go out together, then a claim. A kombu
        consumer that drains (drain_events) flushes at its next claim, after OUTCOME_BATCH outcomes
        or OUTCOME_DELAY seconds, and its heartbeat thread at every beat. Anyone else (basic_get)
        writes its acks with its next get, or after OUTCOME_DELAY seconds on the DelayedFlush thread
        if no get comes first: one round trip per get+ack instead of two.
        """
        driver = self._driver
        if driver is not None and driver.running:
            driver.wake()
            return True
        if self._draining:
            self.waker.wake()
            return True
        self._delayed_flush.arm()
        return True

    def flush_outcomes(self, *, force: bool = True, kinds: tuple[str, ...] = KINDS) -> None:
        for qos in self._qoses():
            if force or qos.due(OUTCOME_BATCH, OUTCOME_DELAY):
                qos.flush(kinds)

    def flush_outcomes_and_wait(self) -> None:
        """Every outcome settled so far written, including those another thread is writing (waited for up
        to connect_timeout seconds each channel), before a statement that must come after them."""
        for qos in self._qoses():
            qos.flush_and_wait(self.options.connect_timeout)

    def _after_beat(self) -> None:
        """After every heartbeat: a queue it found a claimable message in makes the consuming loop claim
        (the heartbeat is the safety poll of a consumer that waits for wake-ups); outcomes of a kombu
        consumer that stopped draining, or that DelayedFlush could not write, reach the database within a
        beat (never under an event loop: its thread owns the claims)."""
        heartbeat = self.lease.heartbeat
        if heartbeat is not None and heartbeat.ready:
            self.deliverer.queues_may_be_ready(heartbeat.ready)  # only the windows of the queues it names
            self.wake(ready=True, anywhere=False)
        if heartbeat is not None and self.unbound_until:
            opts = self.options
            try:  # on the heartbeat's session, open anyway: Celery's event producer needs none of its own
                exchanges.refresh_unbound(
                    self.unbound_until, heartbeat.store, ttl=opts.event_route_cache, within=2 * opts.heartbeat_interval
                )
            except AkadzeError as exc:
                logger.debug("kombu-akadze: event route check on the heartbeat session failed: %s", exc)
        if self._draining or self._driver is None:
            self.flush_outcomes()

    def _take_handoff(self, message: ClaimedMessage, parked: bool) -> bool:
        """A message a publish handed over to this consumer (on the heartbeat's thread): buffered on the
        channel that consumes its queue, for the loop to deliver as if claimed, while that channel has a
        free slot. False: nobody here takes it now (the caller gives it back). A claim in flight as it
        lands was planned without it: that round may fill the window with one more than the prefetch
        count, as a message claimed the moment another is settled. No longer *parked* (the handoff took
        its last slot): the loop's next round claims for that window, and so parks again (with the next
        ack, in the same statement, when the window is full until then)."""
        for channel in self._channels():
            if channel.consuming() and message.queue in channel.consumed_queues():
                if self.deliverer.free_slots(channel) <= 0:
                    return False
                channel.claimed.append(message)
                if parked:
                    self.wake()
                else:
                    self._repark()
                return True
        return False

    def _repark(self) -> None:
        """A handoff took this consumer's last parked slot of a window: claim for it soon (it parks again)."""
        self.deliverer.anything_may_be_ready()
        driver = self._driver
        if driver is not None and driver.running:
            driver.repark()
        else:
            self.waker.wake()  # drain_events claims at every turn

    def wake(self, *, ready: bool = False, anywhere: bool = True) -> None:
        """Make the consuming loop run now (and claim, if *ready*: for every window, or *anywhere* False
        for those the caller opened with Deliverer.queues_may_be_ready)."""
        driver = self._driver
        if driver is not None and driver.running:
            driver.wake(ready=ready, anywhere=anywhere)
        else:
            self.waker.wake()

    def waker_wait(self, timeout: float) -> None:
        """Sleep up to *timeout*, returning early when an outcome frees a slot."""
        if polling.readable([self.waker.fileno()], max(timeout, 0.0)):
            self.waker.drain()

    # -- consuming ------------------------------------------------------------

    @property
    def heartbeat(self) -> Heartbeat | None:
        return self.lease.heartbeat

    @property
    def listener(self) -> Listener | None:
        return self.lease.listener

    def check_lease(self) -> None:
        self.lease.check()

    def claim(self, queues: list[str], limits: list[int]) -> list[ClaimedMessage]:
        return self.claims.claim(queues, limits)

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        """Celery's worker runs its event loop (asynloop): wake-ups come through the waker."""
        self.lease.ensure()
        assert self.lease.listener is not None
        if self._driver is not None:
            self._driver.stop()
        self._driver = HubDriver(
            hub=loop,
            listener=self.lease.listener,
            claims=self.claims,
            deliver_one=self.deliverer.deliver_one,
            buffered=self.deliverer.buffered,
            has_free_slot=self.deliverer.has_free_slot,
            on_ready=self.deliverer.anything_may_be_ready,
            poll_interval=self.options.poll_interval,
            listen_poll_interval=self.options.listen_poll_interval,
            waker=self.waker,
            check=self.lease.check,
        )
        self._driver.start()
        self.claims.on_retry = self._driver.claim_soon

    def unregister_from_event_loop(self, connection: Any, loop: Any) -> None:
        driver, self._driver = self._driver, None
        if driver is not None:
            driver.stop()

    def _claim_landing(self) -> None:
        """Another statement on the command session is about to wait for the claim in flight (see
        Store._land_in_flight): the loop stops watching that socket, and collects the outcome next tick."""
        driver = self._driver
        if driver is not None and driver.on_loop_thread():
            driver.unwatch_claim()
        self.waker.wake()

    def drain_events(self, connection: Any, timeout: float | None = None) -> None:  # type: ignore[override]
        """Deliver one message; else wait for a wake-up or an ack (the waker) or the safety poll, up to *timeout*."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._draining = True
        while True:
            self.lease.check()
            self.flush_outcomes(force=False)
            if self.deliverer.deliver_one():
                return
            self.deliverer.claim_round()  # writes the buffered acks in the claim's statement
            if self.deliverer.deliver_one():
                return
            listener = self.lease.listener
            armed = listener is not None and listener.armed
            wait = jittered(self.options.listen_poll_interval if armed else self.options.poll_interval)
            if self.claims.retry_delay is not None:
                wait = min(wait, self.claims.retry_delay)  # it could not park: no wake-up will come
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError()
                wait = min(wait, remaining)
            self.waker_wait(wait)  # a wake-up (LISTEN, on the heartbeat's thread) or an ack pokes the waker
