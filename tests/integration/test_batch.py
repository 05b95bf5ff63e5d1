"""Batched publishing: many publishes written in one statement, routed like single ones."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from kombu import Exchange, Queue

from kombu_akadze.integrations import batch
from kombu_akadze.store import Store


def test_a_batch_is_written_at_the_end_of_the_block_in_order(make_connection: Any, store: Store) -> None:
    conn = make_connection()
    ex = Exchange("fan", "topic")
    a, b = Queue("ba", ex, routing_key="x.*"), Queue("bb", ex, routing_key="#")
    for q in (a, b):
        q(conn.default_channel).declare()
    Queue("plain")(conn.default_channel).declare()
    producer = conn.Producer()
    with batch.publishing(producer):
        for i in range(500):
            producer.publish({"i": i}, exchange=ex, routing_key="x.y")
        producer.publish({"direct": True}, routing_key="plain")
        assert store.message_counts() == {}  # nothing written yet
    assert store.message_counts() == {("ba", "ready"): 500, ("bb", "ready"): 500, ("plain", "ready"): 1}
    simple = conn.SimpleQueue(a)
    got = []
    for _ in range(5):
        msg = simple.get(timeout=10)
        got.append(msg.payload["i"])
        msg.ack()
    assert got == [0, 1, 2, 3, 4]
    simple.close()


def test_an_exception_in_the_block_writes_nothing(make_connection: Any, store: Store) -> None:
    conn = make_connection()
    Queue("nothing")(conn.default_channel).declare()
    producer = conn.Producer()
    with contextlib.suppress(RuntimeError), batch.publishing(producer):
        producer.publish({"n": 1}, routing_key="nothing")
        raise RuntimeError("abort")
    assert store.message_counts() == {}


def test_batching_needs_an_akadze_channel() -> None:
    with pytest.raises(TypeError, match="akadze"), batch.publishing(object()):
        pass
