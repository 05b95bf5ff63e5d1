"""Closing a connection whose buffered outcomes cannot be written: the close still happens (channels
closed, held messages released, heartbeat stopped, consumer row gone); after a channel closed under a
running task, an outcome another thread buffers while a failed write is being handled is never dropped."""

from __future__ import annotations

import contextlib
import logging
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kombu import Queue
from kombu.simple import SimpleQueue

from kombu_akadze.errors import AkadzeError
from kombu_akadze.integrations.testing import eventually
from kombu_akadze.store import NewMessage, Store, connect, sqlfiles

SQL = sqlfiles.parse_blocks(Path(__file__).with_name("inspect.sql").read_text())

#: Slow beats: after the first pass, nothing on the heartbeat thread writes outcomes during the test.
SLOW_BEATS = {"heartbeat_interval": 30, "heartbeat_ttl": 60, "rescue_interval": 30}


def _run(store: Store, name: str) -> Any:
    query = SQL[name].replace("{schema}", sqlfiles.quote_ident(store.schema))
    cur = store.connection().execute(query)
    return cur.fetchone() if cur.description else None


def _cancel_lock_waiters(store: Store) -> int:
    """Cancel the statements of this schema waiting for a row lock: the writer gets a transient error."""
    query = SQL["waiting_cancel"]
    row = store.connection().execute(query, {"quoted": sqlfiles.quote_ident(store.schema)}).fetchone()
    return int(row[0]) if row else 0


def _heartbeat_threads(consumer_id: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"akadze-heartbeat-{consumer_id}"]


@pytest.mark.parametrize("channel", ["default", "own"])
def test_a_non_transient_error_flushing_outcomes_at_close_still_closes_and_stops_the_heartbeat(
    make_connection: Any, store: Store, channel: str
) -> None:
    """kombu closes the default channel first (Channel.close flushes), then the transport closes the
    others (close_connection flushes): an error in either flush must not skip the rest of the close."""
    conn = make_connection(**SLOW_BEATS)
    producer = conn.Producer()
    for n in range(3):
        producer.publish({"n": n}, routing_key="closing", declare=[Queue("closing")])
    simple = SimpleQueue(conn.default_channel if channel == "default" else conn.channel(), "closing")
    first = simple.get(timeout=10)  # the claim took all three: one delivered, two buffered
    transport = conn.transport
    heartbeat = transport.heartbeat
    assert heartbeat.wait_for(lambda h: h.rescues >= 1, timeout=30)  # its first pass is behind it
    consumer_id = transport.consumer_id
    _run(store, "ack_function_drop")
    first.ack()  # buffered (a draining consumer writes it with its next claim, or at close)
    assert simple.channel.qos.pending == 1

    error: AkadzeError | None = None
    try:
        conn.release()
    except AkadzeError as exc:  # the flush's error must be logged, not skip the close
        error = exc

    assert not heartbeat.running, "the heartbeat still beats"
    assert not _heartbeat_threads(consumer_id), "the heartbeat thread is still alive"
    assert _run(store, "consumer_count")[0] == 0, "the consumer row is still there"
    # The two buffered messages went back in place; the acked one, whose ack could not be written, was
    # still held under the consumer as it went, and the consumer's delete gave it back too (it runs once
    # more, as a rescue after heartbeat_ttl would have had it, without the wait).
    assert store.message_counts() == {("closing", "ready"): 3}
    later = datetime.now(UTC) + timedelta(seconds=61)
    assert len(store.lease_rescue(ttl=60, max_attempts=20, consumer_id="rescuer", now=later).ready) == 0
    assert error is None, f"close raised {error!r}"


class _OnWriteFailure(logging.Handler):
    """Calls *hook* on the writing thread when QoS logs that a write failed (the point of failure)."""

    def __init__(self, hook: Any) -> None:
        super().__init__(logging.ERROR)
        self.hook = hook

    def emit(self, record: logging.LogRecord) -> None:
        if "failed" in record.getMessage() and "stay held" in record.getMessage():
            hook, self.hook = self.hook, None
            if hook is not None:
                hook()


def test_an_outcome_buffered_while_an_after_close_write_fails_is_not_dropped(
    make_connection: Any, store: Store, pg_url: str
) -> None:
    """A channel closed under running tasks (its release failed: they stay held). Task A's ack fails
    (cancelled while it waits for a row lock); at that moment task B buffers its ack. B's ack must be
    written, and A's kept and written with it, never cleared by A's failed flush."""
    conn = make_connection(**SLOW_BEATS)
    producer = conn.Producer()
    for n in range(2):
        producer.publish({"n": n}, routing_key="after-close", declare=[Queue("after-close")])
    simple = SimpleQueue(conn.channel(), "after-close")
    a, b = simple.get(timeout=10), simple.get(timeout=10)
    qos = simple.channel.qos
    locker = connect(pg_url, role="test-locker", connect_timeout=10, autocommit=False)
    try:
        locker.execute(SQL["messages_lock"].replace("{schema}", sqlfiles.quote_ident(store.schema)))
        # The channel closes while the database cannot take the release: both runs stay held.
        closing = threading.Thread(target=simple.channel.close)
        closing.start()
        eventually(lambda: _cancel_lock_waiters(store), timeout=30, what="the release waits for the row lock")
        closing.join(30)
        assert store.message_counts() == {("after-close", "held"): 2}

        appended, go = threading.Event(), threading.Event()
        quick_ack = qos._quick_ack
        acking_b = threading.Thread(target=b.ack)

        def pause_after_append(tag: str) -> None:  # B's ack is buffered; its own flush waits for *go*
            quick_ack(tag)
            appended.set()
            assert go.wait(30)

        def b_acks_now() -> None:
            qos._quick_ack = pause_after_append
            acking_b.start()
            assert appended.wait(30)

        handler = _OnWriteFailure(b_acks_now)
        logging.getLogger("kombu_akadze").addHandler(handler)
        try:
            acking = threading.Thread(target=a.ack)
            acking.start()
            eventually(lambda: _cancel_lock_waiters(store), timeout=30, what="A's ack waits for the row lock")
            acking.join(30)
        finally:
            logging.getLogger("kombu_akadze").removeHandler(handler)
        assert appended.is_set(), "the write did not fail as the test meant"
    finally:
        locker.rollback()
        locker.close()
    go.set()
    acking_b.join(30)  # B's ack flushes on its own thread (the channel is closed) before it returns
    assert store.message_counts() == {}, "an ack was dropped: its message is still held"
    assert qos.pending == 0


def test_a_close_waits_for_the_idle_stop_that_is_removing_its_consumer(
    make_connection: Any, store: Store, pg_url: str
) -> None:
    """A connection whose consumers were all cancelled has its heartbeat thread stop it (unpark, then delete
    the consumer row, giving back what is still held under its id). A close that lands meanwhile waits for
    that delete: it used to return at once, and a test's schema dropped right after deadlocked with the
    delete still running. Injected: a row held under the consumer's id and locked by another session, so
    the idle stop's delete waits for that lock (the beats in between touch no message row)."""
    conn = make_connection(heartbeat_interval=0.25, heartbeat_ttl=5.0, rescue_interval=60.0, lock_timeout=30.0)
    consumer = conn.Consumer([Queue("idle-stop")], callbacks=[lambda body, msg: msg.ack()], accept=["json"])
    consumer.consume()
    with contextlib.suppress(TimeoutError):
        conn.drain_events(timeout=0.5)  # a claim: the heartbeat starts (its one maintenance pass too)
    transport = conn.transport
    owner = transport.consumer_id
    held = store.message_insert(NewMessage(queue="idle-stop-held", body=b"held"))
    assert held is not None
    query = {name: SQL[name].replace("{schema}", sqlfiles.quote_ident(store.schema)) for name in SQL}
    store.connection().execute(query["message_hold_for"], {"id": held, "owner": owner})
    with connect(pg_url, role="test", connect_timeout=10) as locker:
        with locker.transaction():
            assert locker.execute(query["message_lock"], {"id": held}).fetchall() == [(held,)]
            consumer.cancel()  # now the connection holds nothing: the next beat stops it
            eventually(lambda: transport.lease.heartbeat is None, timeout=30, what="the idle stop under way")
            closer = threading.Thread(target=conn.release)
            closer.start()
            closer.join(0.5)
            assert closer.is_alive(), "the close returned while the idle stop was still deleting the consumer"
        closer.join(30)  # the lock is gone: the delete lands, then the close returns
    assert not closer.is_alive()
    assert store.connection().execute(query["consumer_exists"], {"id": owner}).fetchone() == (0,)
    assert _heartbeat_threads(owner) == []
    assert store.message_counts() == {("idle-stop-held", "ready"): 1}  # given back by the delete, not lost
