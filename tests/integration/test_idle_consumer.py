"""A connection whose consumers are all cancelled stops its heartbeat (Celery clients after `inspect`, left in a
pool that app.close() never closes); one that still holds an unacked message keeps beating; consuming again
starts it anew."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import kombu
from kombu import Queue

from kombu_akadze.integrations.testing import eventually
from kombu_akadze.store import Store, sqlfiles

SQL = sqlfiles.parse_blocks(Path(__file__).with_name("inspect.sql").read_text())


def drain_until(conn: kombu.Connection, predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached while draining"
        with contextlib.suppress(TimeoutError):
            conn.drain_events(timeout=0.5)


def _consumer_rows(store: Store) -> int:
    query = SQL["consumer_count"].replace("{schema}", sqlfiles.quote_ident(store.schema))
    row = store.connection().execute(query).fetchone()
    assert row is not None
    return int(row[0])


def _beating(conn: kombu.Connection) -> bool:
    transport = conn.transport
    alive = [t for t in threading.enumerate() if t.name == f"akadze-heartbeat-{transport.consumer_id}"]
    return transport.heartbeat is not None and bool(alive)


def test_cancelled_consumers_stop_the_heartbeat_and_consuming_again_restarts_it(
    make_connection: Any, store: Store
) -> None:
    conn = make_connection()
    queue = Queue("idle-stop")
    producer = conn.Producer()
    producer.publish({"n": 1}, routing_key="idle-stop", declare=[queue])
    got: list[kombu.Message] = []
    consumer = conn.Consumer([queue], callbacks=[lambda body, msg: got.append(msg)], accept=["json"])
    consumer.consume()
    drain_until(conn, lambda: len(got) == 1)
    assert _beating(conn)
    consumer.cancel()

    # Cancelled, but the message is still unacked: its lease must stay alive.
    beats = conn.transport.heartbeat.beats
    eventually(lambda: conn.transport.heartbeat.beats >= beats + 4, timeout=30, what="four more beats")
    assert _beating(conn), "stopped beating while a delivered message was unacked"
    assert _consumer_rows(store) == 1

    got[0].ack()
    eventually(lambda: not _beating(conn), timeout=30, what="the idle connection stops beating")
    eventually(lambda: _consumer_rows(store) == 0, timeout=30, what="its consumer row removed")
    assert store.message_counts() == {}

    # Consuming again registers a consumer and beats again; delivery works as before.
    producer.publish({"n": 2}, routing_key="idle-stop")
    again = conn.Consumer([queue], callbacks=[lambda body, msg: (got.append(msg), msg.ack())], accept=["json"])
    again.consume()
    drain_until(conn, lambda: len(got) == 2)
    assert got[1].payload == {"n": 2}
    assert _beating(conn)
    assert _consumer_rows(store) == 1
    again.cancel()
