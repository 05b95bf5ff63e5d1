"""Ack batching on kombu's event loop, as Celery runs it, against a real server (consume.batching): while
the worker holds a task waiting for a pool process and more than half its prefetch window, acks wait up to
ack_batch_delay for others and go out in one statement; with no task waiting (every slot a busy pool
process) or half the window free, the next tick's statement carries them at once. Every ack is written."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import kombu
import pytest
from kombu import Queue
from kombu.asynchronous import Hub

from kombu_akadze.store import Store
from kombu_akadze.transport.claims import celery_tasks_waiting

DELAY = 1.0  # the most the option allows: a loaded machine never stalls a turn that long


class Loop:
    """A consumer with a prefetch window of 8 on kombu's hub, each statement the loop sends recorded as
    (monotonic time sent, how many acks it carried)."""

    def __init__(self, conn: kombu.Connection, queue: Queue) -> None:
        self.conn = conn
        self.got: list[kombu.Message] = []
        self.sent: list[tuple[float, int]] = []
        store = conn.transport.store
        real_start = store.message_ack_claim_start

        def recording_start(*, acks: Any, **kwargs: Any) -> Any:
            acks = list(acks)
            self.sent.append((time.monotonic(), len(acks)))
            return real_start(acks=acks, **kwargs)

        store.message_ack_claim_start = recording_start
        conn.connect()
        consumer = conn.Consumer([queue], callbacks=[lambda body, msg: self.got.append(msg)], accept=["json"])
        consumer.qos(prefetch_count=8)
        consumer.consume()
        self.hub = Hub()
        conn.transport.register_with_event_loop(conn.connection, self.hub)
        self.loop = self.hub.create_loop()

    def turn_until(self, predicate: Any, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, "condition not reached on the event loop"
            next(self.loop)

    def close(self) -> None:
        self.conn.transport.unregister_from_event_loop(self.conn.connection, self.hub)
        self.hub.close()


@pytest.fixture
def loop(make_connection: Any) -> Iterator[Loop]:
    queue = Queue("batched")
    producer = make_connection().Producer()
    for i in range(40):
        producer.publish({"i": i}, routing_key="batched", declare=[queue])
    running = Loop(make_connection(ack_batch_delay=DELAY), queue)
    yield running
    running.close()


def test_acks_wait_for_each_other_while_a_task_waits_for_the_pool(loop: Loop, store: Store) -> None:
    loop.conn.transport.claims.tasks_waiting = lambda: True  # as Celery's worker with a task queued for the pool
    loop.turn_until(lambda: len(loop.got) == 8)  # the window is full
    before = len(loop.sent)
    first = time.monotonic()
    for message in loop.got[:3]:  # 3 of 8 free: the window still holds more than half
        message.ack()
    loop.turn_until(lambda: len(loop.sent) > before)
    at, acks = loop.sent[before]
    assert acks == 3, loop.sent[before:]  # one statement for the three
    assert at - first >= DELAY * 0.9, f"sent {at - first:.3f} s after the first ack, before the delay"
    loop.turn_until(lambda: len(loop.got) == 11)  # and it claimed for their three slots
    before = len(loop.sent)
    first = time.monotonic()
    for message in loop.got[3:7]:  # 4 of 8 free: half the window, refilled at once
        message.ack()
    loop.turn_until(lambda: len(loop.sent) > before)
    at, acks = loop.sent[before]
    assert acks == 4
    assert at - first < DELAY, "a half-free window waited for the delay"
    loop.turn_until(lambda: len(loop.got) == 15)
    for message in loop.got[7:15]:
        message.ack()
    loop.turn_until(lambda: len(loop.got) == 23)
    # Every ack written: 15 rows gone, the window's 8 held, the rest ready.
    assert store.message_counts() == {("batched", "held"): 8, ("batched", "ready"): 17}


def test_with_no_task_waiting_for_the_pool_an_ack_goes_with_the_next_tick(loop: Loop) -> None:
    loop.conn.transport.claims.tasks_waiting = lambda: False  # every slot is a busy pool process
    loop.turn_until(lambda: len(loop.got) == 8)
    before = len(loop.sent)
    first = time.monotonic()
    loop.got[0].ack()
    loop.turn_until(lambda: len(loop.sent) > before)
    at, acks = loop.sent[before]
    assert acks == 1
    assert at - first < DELAY, "an ack that frees an idle pool process waited"


class _Request:
    """Stands for a Celery request in celery.worker.state's weak sets."""


def test_celery_tasks_waiting_reads_the_workers_reserved_and_accepted_requests() -> None:
    from celery.worker import state

    request = _Request()
    assert not celery_tasks_waiting()
    state.reserved_requests.add(request)
    try:
        assert celery_tasks_waiting()  # received, not accepted by a pool process yet
        state.active_requests.add(request)
        assert not celery_tasks_waiting()  # a pool process runs it
    finally:
        state.reserved_requests.discard(request)
        state.active_requests.discard(request)
