"""Workload a: kombu-level publish, basic_get+ack and Consumer+drain_events rates, each phase time-bounded."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import kombu
from brokers import Broker

# About a Celery task message's worth of JSON.
BODY_PAD = "x" * 200


def entities(name: str) -> tuple[kombu.Exchange, kombu.Queue]:
    exchange = kombu.Exchange(name, type="direct", durable=True)
    return exchange, kombu.Queue(name, exchange, routing_key=name, durable=True)


def publish(producer: kombu.Producer, exchange: kombu.Exchange, key: str, n: int, cap: float) -> tuple[int, float]:
    """Publish up to *n* persistent messages within *cap* seconds; (count, seconds)."""
    start = time.perf_counter()
    deadline = start + cap
    sent = 0
    while sent < n and time.perf_counter() < deadline:
        producer.publish({"i": sent, "pad": BODY_PAD}, exchange=exchange, routing_key=key, delivery_mode=2)
        sent += 1
    return sent, time.perf_counter() - start


def get_ack(conn: kombu.Connection, queue: kombu.Queue, n: int, cap: float) -> tuple[int, float]:
    """basic_get + ack one message at a time until *n*, an empty queue, or *cap* seconds."""
    bound = queue(conn.default_channel)
    start = time.perf_counter()
    deadline = start + cap
    got = 0
    while got < n and time.perf_counter() < deadline:
        message = bound.get(no_ack=False)
        if message is None:
            break
        message.ack()
        got += 1
    return got, time.perf_counter() - start


def consume(conn: kombu.Connection, queue: kombu.Queue, n: int, prefetch: int, cap: float) -> tuple[int, float]:
    """A Consumer with *prefetch* that acks in its callback, driven by drain_events, until *n* or *cap*."""
    got = 0

    def on_message(_body: Any, message: kombu.Message) -> None:
        nonlocal got
        message.ack()
        got += 1

    with conn.Consumer(queue, callbacks=[on_message], prefetch_count=prefetch, accept=["json"]):
        start = time.perf_counter()
        deadline = start + cap
        while got < n and time.perf_counter() < deadline:
            try:
                conn.drain_events(timeout=min(1.0, max(deadline - time.perf_counter(), 0.01)))
            except TimeoutError:
                continue
        elapsed = time.perf_counter() - start
    return got, elapsed


def run(broker: Broker, *, run_id: str, n: int, cap: float, log: Callable[[str], None]) -> dict[str, float]:
    """msgs/s of each phase; the queue is purged between phases and deleted at the end."""
    name = broker.queue_name("kombu", run_id)
    exchange, queue = entities(name)
    out: dict[str, float] = {}
    with broker.connection() as conn:
        conn.ensure_connection(max_retries=3)
        producer = conn.Producer(serializer="json")
        queue(producer.channel).declare()
        bound = queue(conn.default_channel)
        bound.purge()

        sent, secs = publish(producer, exchange, name, n, cap)
        out["publish"] = sent / secs
        got, secs = get_ack(conn, queue, sent, cap)
        out["get_ack"] = got / secs
        log(f"publish {sent} msgs, get+ack {got} msgs")
        bound.purge()

        for prefetch in (1, 100):
            filled, _ = publish(producer, exchange, name, sent, cap)
            got, secs = consume(conn, queue, filled, prefetch, cap)
            out[f"consume_p{prefetch}"] = got / secs
            if got < filled:
                log(f"consume prefetch {prefetch}: {got} of {filled} in the {cap:.0f} s cap")
            bound.purge()
        bound.delete()
    return out
