"""The heartbeat's reconcile against real PostgreSQL: rows held under a live consumer's id that its
transport never received (a claim that committed, whose reply was lost) go back to ready; rows the
transport does hold (buffered, delivered and unacked) are never touched, however long they are held."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import kombu
import pytest
from kombu import Queue

from kombu_akadze.store import Store


def _drain(conn: kombu.Connection, until: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout:.0f} s: {what}")
        with contextlib.suppress(TimeoutError):
            conn.drain_events(timeout=0.25)


def test_a_claim_whose_reply_was_lost_is_given_back_while_the_consumer_lives(
    make_connection: Any, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """Injected: 3 of 6 messages claimed under the live consumer's id by another session, as a claim
    whose reply a reset connection lost after the commit leaves them. Without the reconcile they stay
    held until that consumer stops (here: never), and the consumer waits for them in vain."""
    conn = make_connection()  # heartbeat_ttl 2 s, a pass every 0.25 s (tests/conftest.py FAST)
    queue = Queue("strand")
    got: list[kombu.Message] = []
    consumer = conn.Consumer([queue], callbacks=[lambda body, msg: (got.append(msg), msg.ack())], accept=["json"])
    consumer.qos(prefetch_count=10)
    consumer.consume()
    producer = conn.Producer()
    producer.publish({"i": -1}, routing_key="strand", declare=[queue])
    _drain(conn, lambda: len(got) == 1, 20, "the warm-up message")  # the consumer row exists now
    heartbeat = conn.transport.heartbeat
    assert heartbeat is not None

    # As into a busy consumer: not parked, so what is published waits ready (a parked one would have
    # each message handed over, held under its id already).
    store.consumer_unpark(consumer_id=conn.transport.consumer_id)
    sent = 6
    for i in range(sent):
        producer.publish({"i": i}, routing_key="strand")
    lost, _, _ = store.message_ack_claim(acks=[], queues=["strand"], limits=[3], owner=conn.transport.consumer_id)
    assert [m.attempts for m in lost] == [1, 1, 1]

    with caplog.at_level(logging.WARNING, logger="kombu_akadze"):
        _drain(conn, lambda: len(got) == 1 + sent, 60, "all six messages, the three stranded ones too")
    payloads = [m.payload["i"] for m in got[1:]]
    completed, duplicated = len(set(payloads)), len(payloads) - len(set(payloads))
    lost_count = sent - completed
    print(
        f"injected: 3 claims with lost replies; in {sent}, completed {completed}, duplicated {duplicated}, "
        f"lost {lost_count}"
    )
    assert (completed, duplicated, lost_count) == (sent, 0, 0)
    stranded = {m.id for m in lost}
    again = [m for m in got if m.delivery_info["akadze_message_id"] in stranded]
    assert len(again) == 3
    # The lost claim's attempt was given back: the delivery is the first run the consumer saw.
    assert all(m.delivery_info["akadze_attempt"] == 1 for m in again)
    assert all(m.delivery_info["redelivered"] for m in again)  # run_count 2: fenced off the lost run
    assert heartbeat.unstranded == 3
    assert any("reconcile: 3 message(s)" in r.getMessage() for r in caplog.records)
    _drain(conn, lambda: store.message_counts() == {}, 20, "the acks are written")
    assert conn.transport.fenced_outcomes == 0
    consumer.cancel()


def test_what_the_transport_holds_is_never_reconciled_however_long_it_is_held(
    make_connection: Any, store: Store
) -> None:
    """A message delivered and not acked, and four claimed and still buffered, held for several times
    heartbeat_ttl with a reconcile pass every 0.25 s: all five stay held in their first run."""
    conn = make_connection()
    queue = Queue("keep")
    got: list[kombu.Message] = []
    consumer = conn.Consumer([queue], callbacks=[lambda body, msg: got.append(msg)], accept=["json"])
    consumer.qos(prefetch_count=5)
    consumer.consume()
    producer = conn.Producer()
    for i in range(5):
        producer.publish({"i": i}, routing_key="keep", declare=[queue])
    _drain(conn, lambda: len(got) == 1, 20, "the first delivery")
    assert conn.transport.deliverer.buffered() == 4
    heartbeat = conn.transport.heartbeat
    assert heartbeat is not None

    start = heartbeat.rescues
    # Not draining: the four stay buffered. Wait on passes, not time: 3 x ttl of them.
    assert heartbeat.wait_for(lambda h: h.rescues >= start + int(3 * h.ttl / 0.25), timeout=60)
    held = store.message_counts()
    assert held == {("keep", "held"): 5}, held
    assert heartbeat.unstranded == 0

    _drain(conn, lambda: len(got) == 5, 20, "the four buffered messages")
    assert [m.delivery_info["redelivered"] for m in got] == [False] * 5
    assert all(m.delivery_info["akadze_attempt"] == 1 for m in got)
    for m in got:
        m.ack()
    _drain(conn, lambda: store.message_counts() == {}, 20, "the acks are written")
    assert conn.transport.fenced_outcomes == 0
    consumer.cancel()
