"""A connection that only publishes gives its session back after idle_close seconds unused and reconnects at
its next publish; a consuming connection keeps its sessions; a forked child (a prefork pool child that
published) closes its own the same way."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path
from typing import Any

import kombu
import pytest
from kombu import Queue

from kombu_akadze.integrations.testing import eventually
from kombu_akadze.store import Store, sqlfiles

SQL = sqlfiles.parse_blocks(Path(__file__).with_name("inspect.sql").read_text())


def alive(store: Store, pid: int) -> bool:
    row = store.connection().execute(SQL["backends_alive"], {"pids": [pid]}).fetchone()
    return row == (1,)


def test_a_publishers_idle_session_closes_and_reopens_for_the_next_publish_a_consumers_stays(
    make_connection: Any, store: Store
) -> None:
    consumer = make_connection(idle_close=0.5)
    simple = consumer.SimpleQueue("idle-consumed")
    with pytest.raises(simple.Empty):
        simple.get(timeout=1)  # it consumes now (its lease runs), parked on an empty queue
    consuming = consumer.transport.store

    producer = make_connection(idle_close=0.5)
    producer.Producer().publish({"n": 1}, routing_key="idle", declare=[Queue("idle")])
    command = producer.transport.store
    pid = command.connection().info.backend_pid
    eventually(lambda: not command.connected, timeout=30, what="the publisher's session closed")
    eventually(lambda: not alive(store, pid), timeout=30, what="its backend gone from the server")
    assert time.monotonic() - consuming.last_used > 0.5, "the consumer's session was not idle as long"
    assert consuming.connected, "a consuming connection's session was closed"

    producer.Producer().publish({"n": 2}, routing_key="idle")  # reconnects
    assert command.connected
    assert command.connection().info.backend_pid != pid
    assert store.message_counts() == {("idle", "ready"): 2}
    simple.close()


def _child(url: str, schema: str, done: Any) -> None:
    conn = kombu.Connection(url, transport_options={"schema": schema, "idle_close": 0.3})
    conn.Producer().publish({"child": 1}, routing_key="forked", declare=[Queue("forked")])
    command = conn.transport.store
    pid = command.connection().info.backend_pid
    eventually(lambda: not command.connected, timeout=30, what="the child's session closed")
    done.send(pid)
    conn.release()


def test_a_forked_child_that_published_closes_its_session_when_idle(
    make_connection: Any, store: Store, pg_url: str, schema: str
) -> None:
    parent = make_connection(idle_close=0.3)
    parent.Producer().publish({"parent": 1}, routing_key="forked", declare=[Queue("forked")])  # the closer runs
    ctx = multiprocessing.get_context("fork")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_child, args=(f"akadze+{pg_url}", schema, theirs))
    child.start()
    assert ours.poll(60), "the child's session did not close"
    pid = ours.recv()
    child.join(30)
    assert child.exitcode == 0
    eventually(lambda: not alive(store, pid), timeout=30, what="the child's backend gone from the server")
    assert store.message_counts() == {("forked", "ready"): 2}
