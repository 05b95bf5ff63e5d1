"""Every way a row leaves the messages table besides its ack, each doing what it promises: message TTL
(dead letters only with a dead-letter exchange), drop-head (ready rows only), purge (held messages stay
with their consumers), queue delete (everything, late acks fenced) and x-expires (unused queues only).
A message held by a live consumer leaves by its own fenced outcome, or with its deleted queue."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from kombu import Queue

from kombu_akadze.integrations.testing import eventually
from kombu_akadze.lease import maintenance
from kombu_akadze.store import NewMessage, Store, sqlfiles

SQL = sqlfiles.parse_blocks(Path(__file__).with_name("inspect.sql").read_text())


def maintain(store: Store, *, later: float = 0.0) -> dict[str, int]:
    """One maintenance round, as the elected consumer's heartbeat runs it, *later* seconds from now."""
    now = datetime.now(UTC) + timedelta(seconds=later)
    return maintenance.run_once(store, ttl=30, max_attempts=20, consumer_id="m", now=now)


def states(store: Store) -> dict[tuple[str, str], int]:
    return store.message_counts()


def test_an_expired_message_is_deleted_without_a_dead_letter_exchange(make_connection: Any, store: Store) -> None:
    conn = make_connection()
    queue = Queue("ttl", message_ttl=1)
    for n in range(2):
        conn.Producer().publish({"n": n}, routing_key="ttl", declare=[queue])
    assert maintain(store)["expired"] == 0
    counts = maintain(store, later=2)
    assert (counts["expired"], counts["buried"]) == (2, 0)
    assert states(store) == {}
    assert store.deadletter_list(queue="ttl") == []


def test_an_expired_message_follows_the_dead_letter_exchange(make_connection: Any, store: Store) -> None:
    conn = make_connection()
    Queue("ttl.dead")(conn.default_channel).declare()
    queue = Queue(
        "ttl-dlx",
        message_ttl=1,
        queue_arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "ttl.dead"},
    )
    conn.Producer().publish({"n": 1}, routing_key="ttl-dlx", declare=[queue])
    counts = maintain(store, later=2)
    assert (counts["expired"], counts["buried"]) == (1, 1)
    maintain(store)  # the next pass routes the dead letter to its exchange (ready now, not in 2 s)
    assert states(store) == {("ttl.dead", "ready"): 1}
    simple = conn.SimpleQueue("ttl.dead")
    message = simple.get(timeout=10)
    (death,) = message.headers["x-death"]
    assert (death["queue"], death["reason"]) == ("ttl-dlx", "expired (message TTL)")
    message.ack()
    simple.close()


def test_a_held_message_past_its_ttl_stays_with_its_consumer(make_connection: Any, store: Store) -> None:
    conn = make_connection()
    queue = Queue("ttl-held", message_ttl=1)
    conn.Producer().publish({"n": 1}, routing_key="ttl-held", declare=[queue])
    simple = conn.SimpleQueue(queue)
    message = simple.get(timeout=10)
    assert maintain(store, later=5)["expired"] == 0
    assert states(store) == {("ttl-held", "held"): 1}
    message.ack()
    eventually(lambda: states(store) == {}, timeout=30, what="the ack deleted it")
    assert conn.transport.fenced_outcomes == 0
    simple.close()


def test_drop_head_never_drops_a_held_message(make_connection: Any, store: Store) -> None:
    conn = make_connection()
    queue = Queue("ring-held", max_length=2)
    conn.Producer().publish({"n": 0}, routing_key="ring-held", declare=[queue])
    simple = conn.SimpleQueue(queue)
    simple.consumer.qos(prefetch_count=1)  # full while it holds one: what is published next waits ready
    held = simple.get(timeout=10)  # the oldest, held
    for n in range(1, 6):
        conn.Producer().publish({"n": n}, routing_key="ring-held")
    maintain(store)
    assert states(store) == {("ring-held", "held"): 1, ("ring-held", "ready"): 2}
    held.ack()
    got = []
    for _ in range(2):
        message = simple.get(timeout=10)
        got.append(message.payload["n"])
        message.ack()
    assert got == [4, 5]
    eventually(lambda: states(store) == {}, timeout=30, what="every ack written")
    assert conn.transport.fenced_outcomes == 0
    simple.close()


def test_a_purge_leaves_held_messages_with_their_consumers(make_connection: Any, store: Store) -> None:
    conn = make_connection()
    queue = Queue("purged")
    conn.Producer().publish({"n": 0}, routing_key="purged", declare=[queue])
    simple = conn.SimpleQueue(queue)
    simple.consumer.qos(prefetch_count=1)  # full while it holds one: what is published next waits ready
    held = simple.get(timeout=10)
    for n in range(1, 3):
        conn.Producer().publish({"n": n}, routing_key="purged")
    assert queue(conn.channel()).purge() == 2
    assert states(store) == {("purged", "held"): 1}
    held.ack()
    eventually(lambda: states(store) == {}, timeout=30, what="the held message's ack written")
    assert conn.transport.fenced_outcomes == 0
    simple.close()


def test_a_queue_delete_takes_held_messages_and_their_late_acks_change_nothing(
    make_connection: Any, store: Store
) -> None:
    """As on RabbitMQ, deleting a queue drops its unacked messages too: an operator's explicit action."""
    conn = make_connection()
    queue = Queue("deleted")
    for n in range(2):
        conn.Producer().publish({"n": n}, routing_key="deleted", declare=[queue])
    simple = conn.SimpleQueue(queue)
    held = simple.get(timeout=10)
    queue(conn.channel()).delete()
    assert states(store) == {}
    assert not store.queue_exists(name="deleted")
    held.ack()
    eventually(lambda: conn.transport.fenced_outcomes == 1, timeout=30, what="the late ack reported as fenced")
    simple.close()


def test_x_expires_deletes_an_unused_queue_and_never_one_a_live_consumer_uses(
    make_connection: Any, store: Store
) -> None:
    conn = make_connection()
    unused, kept = Queue("unused", expires=1), Queue("kept", expires=1)
    conn.Producer().publish({"n": 0}, routing_key="unused", declare=[unused])
    for n in range(2):
        conn.Producer().publish({"n": n}, routing_key="kept", declare=[kept])
    simple = conn.SimpleQueue(kept)
    held = simple.get(timeout=10)
    heartbeat = conn.transport.heartbeat
    # The consumer's own maintenance passes expire the unused queue; its beats keep "kept" in use.
    assert heartbeat.wait_for(lambda h: not store.queue_exists(name="unused"), timeout=30)
    assert store.queue_exists(name="kept")
    assert states(store) == {("kept", "held"): 2}
    held.ack()
    assert simple.get(timeout=10).payload == {"n": 1}
    simple.close()


def _new(queue: str, n: int) -> NewMessage:
    return NewMessage(queue=queue, body=str(n).encode())
