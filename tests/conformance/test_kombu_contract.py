"""The kombu transport contract (publish/consume, exchange types, TTL, priority, properties, purge, size),
written for this project against real PostgreSQL. Separate kombu connections share nothing in memory,
so routing between them proves bindings live in the database."""

from __future__ import annotations

import contextlib
import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import kombu
import pytest
from kombu import Exchange, Queue
from kombu.exceptions import ChannelError

from kombu_akadze.store import Store
from kombu_akadze.transport.exchanges import topic_pattern


def receive(conn: kombu.Connection, queue: Queue, n: int, timeout: float = 20.0) -> list[kombu.Message]:
    got: list[kombu.Message] = []
    with conn.Consumer([queue], callbacks=[lambda body, msg: got.append(msg)], accept=["json"]):
        deadline = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                conn.drain_events(timeout=0.5)
    for m in got:
        m.ack()
    conn.transport.flush_outcomes()  # acks of a draining consumer are batched; write them before checking
    return got


def nothing_in(conn: kombu.Connection, queue: Queue) -> bool:
    return queue(conn.default_channel).queue_declare().message_count == 0


@pytest.mark.parametrize(
    ("binding", "key", "matches"),
    [
        ("a.b", "a.b", True),
        ("a.*", "a.b", True),
        ("a.*", "a.b.c", False),
        ("a.*", "a", False),
        ("a.#", "a", True),
        ("a.#", "a.b.c", True),
        ("#", "", True),
        ("#", "x.y", True),
        ("#.z", "x.y.z", True),
        ("#.z", "z", True),
        ("*.b.#", "a.b", True),
        ("*.b.#", "b", False),
        ("a.b", "aXb", False),
        ("q(1)+.x", "q(1)+.x", True),
    ],
)
def test_topic_patterns_match_like_rabbitmq(binding: str, key: str, matches: bool) -> None:
    assert bool(re.match(topic_pattern(binding), "." + key)) is matches


def test_direct_routing_reaches_a_queue_bound_by_another_connection(make_connection: Any) -> None:
    consumer_conn, producer_conn = make_connection(), make_connection()
    ex = Exchange("jobs", "direct")
    queue = Queue("jobs.resize", ex, routing_key="resize")
    queue(consumer_conn.default_channel).declare()
    producer_conn.Producer().publish({"n": 1}, exchange=ex, routing_key="resize")
    producer_conn.Producer().publish({"n": 2}, exchange=ex, routing_key="other")
    got = receive(consumer_conn, queue, 1)
    assert [m.payload for m in got] == [{"n": 1}]
    assert nothing_in(consumer_conn, queue)


def test_topic_routing_with_star_and_hash(make_connection: Any) -> None:
    a, b = make_connection(), make_connection()
    ex = Exchange("logs", "topic")
    errors = Queue("logs.errors", ex, routing_key="*.error")
    everything = Queue("logs.all", ex, routing_key="app.#")
    for q in (errors, everything):
        q(a.default_channel).declare()
    for key in ("app.error", "app.db.error", "web.error", "app"):
        b.Producer().publish({"k": key}, exchange=ex, routing_key=key)
    assert sorted(m.payload["k"] for m in receive(a, errors, 2)) == ["app.error", "web.error"]
    assert sorted(m.payload["k"] for m in receive(a, everything, 3)) == ["app", "app.db.error", "app.error"]


def test_fanout_copies_to_every_bound_queue_once(make_connection: Any, store: Store) -> None:
    ex = Exchange("broadcast", "fanout")
    listeners = [make_connection() for _ in range(3)]
    queues = [Queue(f"bc.{i}", ex) for i in range(3)]
    for conn, q in zip(listeners, queues, strict=True):
        q(conn.default_channel).declare()
    publisher = make_connection()
    publisher.Producer().publish({"hello": "all"}, exchange=ex, routing_key="ignored")
    for conn, q in zip(listeners, queues, strict=True):
        assert [m.payload for m in receive(conn, q, 1)] == [{"hello": "all"}]
    assert store.message_counts() == {}


def test_unbind_and_exchange_delete_stop_routing(make_connection: Any, store: Store) -> None:
    conn = make_connection()
    ex = Exchange("un", "direct")
    q = Queue("un.q", ex, routing_key="k")
    bound = q(conn.default_channel)
    bound.declare()
    bound.unbind_from(ex, routing_key="k")
    conn.Producer().publish({"n": 1}, exchange=ex, routing_key="k")
    assert nothing_in(conn, q)
    bound.bind_to(ex, routing_key="k")
    conn.Producer().publish({"n": 2}, exchange=ex, routing_key="k")
    assert [m.payload for m in receive(conn, q, 1)] == [{"n": 2}]
    ex(conn.default_channel).delete()
    assert not store.exchange_exists(name="un")
    with pytest.raises(ChannelError, match="NOT_FOUND"):
        conn.default_channel.exchange_declare("un", "direct", passive=True)


def test_passive_declare_of_a_missing_queue_is_not_found(make_connection: Any) -> None:
    conn = make_connection()
    with pytest.raises(ChannelError, match="NOT_FOUND"):
        conn.default_channel.queue_declare("no-such-queue", passive=True)


def test_queue_declare_reports_size_and_purge_empties_ready(make_connection: Any) -> None:
    conn = make_connection()
    q = Queue("sized")
    bound = q(conn.default_channel)
    bound.declare()
    for i in range(5):
        conn.Producer().publish({"i": i}, routing_key="sized")
    assert bound.queue_declare().message_count == 5
    assert bound.purge() == 5
    assert bound.queue_declare().message_count == 0


def test_message_properties_and_headers_round_trip(make_connection: Any) -> None:
    conn = make_connection()
    q = Queue("props")
    q(conn.default_channel).declare()
    conn.Producer().publish(
        {"n": 1},
        routing_key="props",
        headers={"x-trace": "abc", "nested": {"a": [1, 2]}},
        correlation_id="corr-1",
        reply_to="replies",
        priority=7,
        delivery_mode=2,
    )
    (msg,) = receive(conn, q, 1)
    assert msg.headers["x-trace"] == "abc"
    assert msg.headers["nested"] == {"a": [1, 2]}
    assert msg.properties["correlation_id"] == "corr-1"
    assert msg.properties["reply_to"] == "replies"
    assert msg.properties["priority"] == 7
    assert msg.properties["delivery_mode"] == 2
    assert msg.content_type == "application/json"


def test_higher_priority_is_delivered_first(make_connection: Any) -> None:
    conn = make_connection()
    q = Queue("prio", queue_arguments={"x-max-priority": 9})
    q(conn.default_channel).declare()
    producer = conn.Producer()
    for i in range(1000):
        producer.publish({"i": i, "p": 0}, routing_key="prio", priority=0)
    producer.publish({"urgent": True}, routing_key="prio", priority=9)
    simple = conn.SimpleQueue(q)
    first = simple.get(timeout=10)
    assert first.payload == {"urgent": True}
    first.ack()
    simple.close()


def test_expired_messages_are_never_delivered(make_connection: Any, store: Store) -> None:
    conn = make_connection()
    q = Queue("ttl")
    q(conn.default_channel).declare()
    conn.Producer().publish({"old": True}, routing_key="ttl", expiration=0.05)
    conn.Producer().publish({"fresh": True}, routing_key="ttl")
    later = datetime.now(UTC) + timedelta(seconds=5)
    got = store.message_claim(queues=["ttl"], limits=[10], owner="x", now=later)
    assert len(got) == 1
    store.message_release([got[0].tag], owner="x")
    counts = store.message_expire(now=later)
    assert counts["expired"] == 1
    assert counts["buried"] == 0  # no dead-letter exchange named: dropped, as RabbitMQ does
    assert [m.payload for m in receive(conn, q, 1)] == [{"fresh": True}]


def test_queue_message_ttl_expires_into_dead_letters_when_the_queue_asks(make_connection: Any, store: Store) -> None:
    conn = make_connection()
    q = Queue("ttlq", message_ttl=0.05, queue_arguments={"x-dead-letter-exchange": "dlx"})
    q(conn.default_channel).declare()
    conn.Producer().publish({"n": 1}, routing_key="ttlq")
    counts = store.message_expire(now=datetime.now(UTC) + timedelta(seconds=5))
    assert (counts["expired"], counts["buried"]) == (1, 1)
    (dead,) = store.deadletter_list(queue="ttlq")
    assert dead["reason"] == "expired (message TTL)"


def test_unused_queues_expire_with_x_expires(make_connection: Any, store: Store) -> None:
    conn = make_connection()
    q = Queue("short-lived", expires=10, exchange=Exchange("sl", "direct"), routing_key="k")
    q(conn.default_channel).declare()
    conn.Producer().publish({"n": 1}, exchange="sl", routing_key="k")
    assert store.queue_expire(ttl=30, now=datetime.now(UTC) + timedelta(seconds=5))["queues"] == 0
    counts = store.queue_expire(ttl=30, now=datetime.now(UTC) + timedelta(seconds=11))
    assert (counts["queues"], counts["dropped"], counts["bindings"]) == (1, 1, 1)
    assert not store.queue_exists(name="short-lived")


def test_an_auto_delete_queue_of_a_vanished_consumer_is_removed(make_connection: Any, store: Store) -> None:
    gone = make_connection()
    q = Queue("reply.abc", auto_delete=True, durable=False)
    simple = gone.SimpleQueue(q)
    with pytest.raises(simple.Empty):
        simple.get(timeout=0.2)  # consumes: the heartbeat marks the queue in use
    gone.transport.heartbeat.stop()  # the client dies without cleaning up
    later = datetime.now(UTC) + timedelta(seconds=60)
    assert store.queue_expire(ttl=30, now=later)["queues"] == 1
    assert not store.queue_exists(name="reply.abc")
    simple.close()


def test_an_auto_delete_queue_nobody_consumed_yet_stays(make_connection: Any, store: Store) -> None:
    conn = make_connection()
    Queue("pending", auto_delete=True)(conn.default_channel).declare()
    assert store.queue_expire(ttl=30, now=datetime.now(UTC) + timedelta(seconds=60))["queues"] == 0
    assert store.queue_exists(name="pending")


@pytest.mark.parametrize("name", ["q'uote", 'semi;colon"', "юникод-очередь", "n" * 255, "x'); DROP TABLE bindings;--"])
def test_odd_names_are_plain_data(make_connection: Any, name: str) -> None:
    conn = make_connection()
    ex = Exchange(name[:200] + "-ex", "topic")
    q = Queue(name, ex, routing_key=name[:100])
    q(conn.default_channel).declare()
    conn.Producer().publish({"name": name}, exchange=ex, routing_key=name[:100])
    assert [m.payload for m in receive(conn, q, 1)] == [{"name": name}]


def test_a_non_bytes_body_with_an_explicit_content_type_is_a_clear_error(make_connection: Any, store: Store) -> None:
    conn = make_connection()
    with pytest.raises(TypeError, match="must be bytes or str"):
        conn.Producer().publish({"n": 1}, routing_key="bad", content_type="application/json")
    assert store.message_counts() == {}
