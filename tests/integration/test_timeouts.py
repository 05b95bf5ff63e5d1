"""Lock and statement timeouts: a claim that waits behind an operator's lock gives up within lock_timeout
with a transient error (retried by kombu/Celery as a lost connection) instead of freezing the consumer,
and once the lock is gone the message is delivered; nothing is lost."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from kombu import Queue

from kombu_akadze.errors import TransientDatabaseError
from kombu_akadze.integrations.testing import eventually
from kombu_akadze.store import NewMessage, Store, sqlfiles

SQL = sqlfiles.parse_blocks(Path(__file__).with_name("inspect.sql").read_text())

#: How long a waiting claim may take before the test calls it hung (the lock_timeout it sets is 0.5 s).
HUNG = 15.0


def _lock_messages(pg_url: str, schema: str) -> psycopg.Connection[Any]:
    """An operator's session holding LOCK TABLE messages IN ACCESS EXCLUSIVE MODE until it commits."""
    conn = psycopg.connect(pg_url)
    conn.execute(SQL["lock_messages_exclusive"].replace("{schema}", sqlfiles.quote_ident(schema)))
    return conn


def _outcome_within(func: Any, timeout: float) -> tuple[bool, Any]:
    """Run *func* on a thread: (True, its result or exception) if it ended within *timeout*, else (False, None)."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(func())
        except Exception as exc:
            box.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    return (True, box[0]) if box else (False, None)


def test_a_claim_behind_an_exclusive_lock_fails_transiently_and_delivers_after_it(
    make_connection: Any, pg_url: str, schema: str, store: Store
) -> None:
    conn = make_connection(lock_timeout=0.5, statement_timeout=10)
    conn.Producer().publish({"n": 1}, routing_key="locked", declare=[Queue("locked")])
    simple = conn.SimpleQueue("locked")  # declared and consuming before the lock is taken
    locker = _lock_messages(pg_url, schema)
    try:
        started = time.monotonic()
        done, outcome = _outcome_within(lambda: simple.get(timeout=HUNG * 2), HUNG)
        took = time.monotonic() - started
    finally:
        locker.commit()
        locker.close()
    assert done, f"the claim hung behind the lock for {HUNG:.0f} s"
    assert isinstance(outcome, TransientDatabaseError), outcome
    assert isinstance(outcome, conn.connection_errors), "kombu and Celery must retry it as a lost connection"
    assert took < HUNG
    message = simple.get(timeout=30)  # the retry, once the lock is gone
    assert message.payload == {"n": 1}
    message.ack()  # buffered: written at the next beat
    eventually(lambda: store.message_counts() == {}, timeout=30, what="the ack written, nothing left")
    simple.close()


def test_the_event_loops_inline_claim_gives_up_within_the_lock_timeout(
    make_connection: Any, pg_url: str, schema: str, store: Store
) -> None:
    """Celery's event loop waits inline for the claim of an idle worker (Transport.start_claim), on the
    transport's command session."""
    store.message_insert(NewMessage(queue="q", body=b"x"))
    transport = make_connection(lock_timeout=0.5, statement_timeout=10).transport
    loop, owner = transport.store, transport.consumer_id
    loop.consumer_heartbeat(consumer_id=owner, hostname="h", pid=1)
    loop.message_ack_claim_start(acks=[], queues=["warm-up"], limits=[1], owner=owner)  # prepared before the lock
    assert loop.message_ack_claim_wait(30) == ([], set(), frozenset())
    locker = _lock_messages(pg_url, schema)
    try:
        loop.message_ack_claim_start(acks=[], queues=["q"], limits=[1], owner=owner)
        done, outcome = _outcome_within(lambda: loop.message_ack_claim_wait(None), HUNG)
    finally:
        locker.commit()
        locker.close()
    assert done, f"the inline claim hung behind the lock for {HUNG:.0f} s"
    assert isinstance(outcome, TransientDatabaseError), outcome
    loop.message_ack_claim_start(acks=[], queues=["q"], limits=[1], owner=owner)
    again = loop.message_ack_claim_wait(30)
    assert again is not None
    assert [m.body for m in again[0]] == [b"x"]
    loop.close()


@pytest.mark.parametrize(
    ("lock_timeout", "statement_timeout", "shown"),
    [(0.5, 10, ("500ms", "10s")), (0, 0, ("0", "0")), (0.0001, 0.25, ("1ms", "250ms"))],
)
def test_a_session_runs_with_the_timeouts_it_was_given(
    pg_url: str, schema: str, lock_timeout: float, statement_timeout: float, shown: tuple[str, str]
) -> None:
    s = Store(pg_url, schema=schema, role="t", lock_timeout=lock_timeout, statement_timeout=statement_timeout)
    assert s.connection().execute(SQL["timeouts_show"]).fetchone() == shown
    s.close()
