"""The kombu transport against real PostgreSQL: publish/consume, prefetch, fencing, restore in place, leases."""

from __future__ import annotations

import contextlib
import logging
import pickle
import threading
import time
from typing import Any

import kombu
import pytest
from kombu import Exchange, Queue
from kombu.asynchronous import Hub

from kombu_akadze.integrations.testing import eventually
from kombu_akadze.store import Store
from kombu_akadze.transport import Transport


def consume(conn: kombu.Connection, queue: Queue, *, prefetch: int | None = None, accept: list[str] | None = None):  # type: ignore[no-untyped-def]
    got: list[kombu.Message] = []
    consumer = conn.Consumer([queue], callbacks=[lambda body, msg: got.append(msg)], accept=accept or ["json"])
    if prefetch is not None:
        consumer.qos(prefetch_count=prefetch)
    consumer.consume()
    return consumer, got


def drain_until(conn: kombu.Connection, predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached while draining")
        with contextlib.suppress(TimeoutError):
            conn.drain_events(timeout=0.5)


def test_url_alias_resolves_to_this_transport(make_connection: Any) -> None:
    conn = make_connection()
    assert isinstance(conn.transport, Transport)


def test_broker_transport_setting_needs_no_alias(pg_url: str, schema: str) -> None:
    conn = kombu.Connection(pg_url, transport="kombu_akadze.transport:Transport", transport_options={"schema": schema})
    q = conn.SimpleQueue("plain")
    q.put({"n": 1})
    assert q.get(timeout=10).payload == {"n": 1}
    q.close()
    conn.release()


def test_as_uri_masks_the_password(pg_url: str) -> None:
    conn = kombu.Connection("akadze+postgresql://bob:s3cret@db.example:5432/app")
    assert conn.as_uri() == "akadze+postgresql://bob:**@db.example:5432/app"
    assert "s3cret" not in repr(conn)
    assert "s3cret" in conn.as_uri(include_password=True)


def test_a_wrong_password_error_does_not_show_the_password(pg_url: str, schema: str) -> None:
    conn = kombu.Connection(
        "akadze+postgresql://nobody:s3cret@127.0.0.1:1/app",
        transport_options={"schema": schema, "connect_timeout": 2},
    )
    with pytest.raises(Exception) as info:
        conn.connect()
    assert "s3cret" not in str(info.value)
    conn.release()


def test_publish_consume_ack_deletes_the_row(make_connection: Any, store: Store) -> None:
    conn = make_connection()
    queue = Queue("work", Exchange("work", "direct"), "work")
    conn.Producer().publish({"n": 1}, exchange=queue.exchange, routing_key="work", declare=[queue])
    consumer, got = consume(conn, queue)
    drain_until(conn, lambda: got)
    assert got[0].payload == {"n": 1}
    assert got[0].delivery_info["redelivered"] is False
    assert store.message_counts() == {("work", "held"): 1}
    got[0].ack()  # a draining consumer writes acks in batches (at its next claim, or within 20 ms / a beat)
    eventually(lambda: store.message_counts() == {}, timeout=10, what="the acked row is deleted")
    consumer.cancel()


@pytest.mark.parametrize("serializer", ["pickle", "json"])
def test_serialized_bodies_round_trip(make_connection: Any, serializer: str) -> None:
    conn = make_connection()
    payload = {"tuple": [1, "two"], "bytes": "\u0000nul"} if serializer == "json" else {"set": {1, 2}, "b": b"\x00"}
    q = conn.SimpleQueue("ser", serializer=serializer, accept=[serializer])
    q.put(payload)
    msg = q.get(timeout=10)
    assert msg.payload == payload
    msg.ack()
    q.close()


def test_raw_binary_body_round_trips(make_connection: Any) -> None:
    conn = make_connection()
    body = bytes(range(256)) * 10
    q = conn.SimpleQueue("raw")
    q.put(body, serializer=None, content_type="application/octet-stream", content_encoding="binary")
    msg = q.get(timeout=10)
    assert msg.body == body
    msg.ack()
    q.close()


def test_a_get_client_writes_its_ack_with_its_next_get_or_on_its_own_soon_after(
    make_connection: Any, store: Store
) -> None:
    """basic_get without draining: an ack rides in the next get's statement (one round trip for both),
    a requeue is written before the next get claims (so that get finds it), and the last ack lands
    with no further call from the client, long before a heartbeat (60 s here) could write it."""
    conn = make_connection(heartbeat_interval=60, heartbeat_ttl=120)
    queue = Queue("getter")
    producer = conn.Producer()
    for i in range(3):
        producer.publish({"i": i}, routing_key="getter", declare=[queue])
    bound = queue(conn.default_channel)
    first = bound.get(no_ack=False)
    assert first is not None
    first.ack()
    second = bound.get(no_ack=False)
    assert second is not None
    assert second.payload == {"i": 1}
    assert store.message_get(first.delivery_info["akadze_message_id"]) is None
    second.reject(requeue=True)
    again = bound.get(no_ack=False)
    assert again is not None
    assert again.delivery_info["akadze_message_id"] == second.delivery_info["akadze_message_id"]
    again.ack()
    eventually(
        lambda: store.message_counts() == {("getter", "ready"): 1}, timeout=30, what="the last ack written unasked"
    )


def test_prefetch_limits_how_many_messages_are_held(make_connection: Any, store: Store) -> None:
    conn = make_connection()
    queue = Queue("pf")
    producer = conn.Producer()
    for i in range(10):
        producer.publish({"i": i}, routing_key="pf", declare=[queue])
    consumer, got = consume(conn, queue, prefetch=2)
    drain_until(conn, lambda: len(got) >= 2)
    with pytest.raises(TimeoutError):
        conn.drain_events(timeout=1)
    assert len(got) == 2
    assert store.message_counts() == {("pf", "held"): 2, ("pf", "ready"): 8}
    got[0].ack()
    drain_until(conn, lambda: len(got) >= 3)
    assert store.message_counts()[("pf", "held")] == 2
    consumer.cancel()


def test_reject_with_requeue_returns_the_same_row(make_connection: Any, store: Store) -> None:
    conn = make_connection()
    q = conn.SimpleQueue("rq")
    q.put({"n": 1})
    first = q.get(timeout=10)
    first.reject(requeue=True)
    second = q.get(timeout=10)
    assert second.delivery_info["akadze_message_id"] == first.delivery_info["akadze_message_id"]
    assert second.delivery_info["akadze_attempt"] == 2
    assert second.delivery_info["redelivered"] is True
    assert sum(store.message_counts().values()) == 1
    second.ack()
    q.close()


def test_reject_without_requeue_goes_to_dead_letters(make_connection: Any, store: Store) -> None:
    conn = make_connection()
    q = conn.SimpleQueue("dl")
    q.put({"n": 1})
    q.get(timeout=10).reject(requeue=False)
    eventually(lambda: store.message_counts() == {}, timeout=10, what="the rejected row leaves the queue")
    (dead,) = store.deadletter_list(queue="dl")
    assert "requeue=False" in dead["reason"]
    q.close()


def test_requeue_loops_end_in_dead_letters_after_max_attempts(make_connection: Any, store: Store) -> None:
    conn = make_connection(max_attempts=3)
    q = conn.SimpleQueue("loop")
    q.put({"n": 1})
    for _ in range(3):
        q.get(timeout=10).reject(requeue=True)
    with pytest.raises(q.Empty):
        q.get(timeout=1)
    (dead,) = store.deadletter_list(queue="loop")
    assert (dead["reason"], dead["attempts"]) == ("max_attempts exceeded", 3)
    q.close()


def test_closing_the_connection_releases_held_messages_in_place(make_connection: Any, store: Store) -> None:
    conn = make_connection()
    queue = Queue("rel")
    for i in range(5):
        conn.Producer().publish({"i": i}, routing_key="rel", declare=[queue])
    _, got = consume(conn, queue, prefetch=3)
    drain_until(conn, lambda: len(got) >= 3)
    got[0].ack()
    ids_before = {m.delivery_info["akadze_message_id"] for m in got}
    conn.release()
    assert store.message_counts() == {("rel", "ready"): 4}
    for mid in ids_before - {got[0].delivery_info["akadze_message_id"]}:
        row = store.message_get(mid)
        assert row is not None
        assert (row["state"], row["attempts"], row["run_count"]) == ("ready", 0, 1)


def test_a_stale_ack_changes_nothing_and_names_the_message(
    make_connection: Any, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """A consumer whose lease was rescued acks late: the newer run is untouched and a warning is logged."""
    slow = make_connection()
    q = slow.SimpleQueue("fence")
    q.put({"n": 1})
    msg = q.get(timeout=10)
    mid = msg.delivery_info["akadze_message_id"]
    slow.transport.heartbeat.stop()  # the consumer goes silent, as if SIGSTOPped

    fast = make_connection()
    q2 = fast.SimpleQueue("fence")
    newer = q2.get(timeout=30)  # arrives once fast's rescue sees slow's heartbeat expire
    assert newer.delivery_info["akadze_message_id"] == mid
    assert newer.delivery_info["redelivered"] is True

    with caplog.at_level(logging.WARNING, logger="kombu_akadze"):
        msg.ack()
        slow.transport.flush_outcomes()  # slow's heartbeat is stopped: write its buffered ack now
    assert f"message id={mid}" in caplog.text
    assert "not ours" in caplog.text
    row = store.message_get(mid)
    assert row is not None
    assert (row["state"], row["run_count"], row["owner"]) == ("held", 2, fast.transport.consumer_id)
    newer.ack()
    eventually(lambda: store.message_get(mid) is None, timeout=10, what="the newer run's ack lands")
    q.close()
    q2.close()


def test_heartbeat_keeps_the_lease_while_the_consumer_thread_is_blocked(make_connection: Any, store: Store) -> None:
    # The rescuer registers first: the oldest live consumer is the elected one that runs the rescue pass.
    rescuer = make_connection()
    rq = rescuer.SimpleQueue("elsewhere")  # parked on a queue of its own: nothing of "busy" is handed to it
    with pytest.raises(rq.Empty):
        rq.get(timeout=0.1)
    rescuer_hb = rescuer.transport.heartbeat
    holder = make_connection()
    q = holder.SimpleQueue("busy")
    q.put({"n": 1})
    msg = q.get(timeout=10)
    hb = holder.transport.heartbeat
    assert rescuer_hb.wait_for(lambda h: h.led >= 1, timeout=30)  # the rescuer leads
    start = rescuer_hb.led
    beats = hb.beats
    # Block this (the holder's consuming) thread past heartbeat_ttl on purpose, as a long task would.
    threading.Event().wait(2 * hb.ttl)
    assert rescuer_hb.wait_for(lambda h: h.led >= start + 10, timeout=30)  # ten rescue passes ran meanwhile
    assert hb.beats > beats
    row = store.message_get(msg.delivery_info["akadze_message_id"])
    assert row is not None
    assert (row["state"], row["run_count"]) == ("held", 1)
    msg.ack()
    q.close()
    rq.close()


def test_a_silent_consumers_messages_are_rescued_and_redelivered(make_connection: Any, store: Store) -> None:
    dead = make_connection()
    q = dead.SimpleQueue("rescue")
    for i in range(3):
        q.put({"i": i})
    held = [q.get(timeout=10) for _ in range(3)]
    dead.transport.heartbeat.stop()
    alive = make_connection()
    q2 = alive.SimpleQueue("rescue")
    again = [q2.get(timeout=30) for _ in range(3)]
    assert sorted(m.payload["i"] for m in again) == [0, 1, 2]
    assert all(m.delivery_info["akadze_attempt"] == 2 for m in again)
    for m in again:
        m.ack()
    eventually(lambda: store.message_counts() == {}, timeout=10, what="the redelivered messages are acked")
    assert len(held) == 3
    q.close()
    q2.close()


def test_listen_wakes_a_waiting_consumer(make_connection: Any) -> None:
    consumer_conn = make_connection(poll_interval=30)  # the safety poll alone would take 15-30 s
    queue = Queue("wake")
    consumer_conn.Producer().publish({"warm": 1}, routing_key="wake", declare=[queue])
    consumer, got = consume(consumer_conn, queue)
    drain_until(consumer_conn, lambda: got)
    got[0].ack()
    producer_conn = make_connection()
    t0 = time.monotonic()
    timer = threading.Timer(0.3, lambda: producer_conn.Producer().publish({"n": 2}, routing_key="wake"))
    timer.start()
    consumer_conn.drain_events(timeout=20)
    assert got[-1].payload == {"n": 2}
    assert time.monotonic() - t0 < 10
    listener = consumer_conn.transport.listener
    assert listener.handoffs + listener.wakeups >= 1
    got[-1].ack()
    timer.join()
    consumer.cancel()


def test_poll_only_mode_still_delivers(make_connection: Any) -> None:
    conn = make_connection(listen=False, poll_interval=0.2)
    q = conn.SimpleQueue("poll")
    other = make_connection()
    other.SimpleQueue("poll").put({"n": 1})
    assert q.get(timeout=10).payload == {"n": 1}
    assert conn.transport.listener.fd is None
    q.close()


def test_messages_from_several_queues_are_shared_fairly(make_connection: Any, store: Store) -> None:
    conn = make_connection()
    producer = conn.Producer()
    queues = [Queue("fa"), Queue("fb")]
    for i in range(20):
        producer.publish({"q": "fa", "i": i}, routing_key="fa", declare=queues)
    for i in range(20):
        producer.publish({"q": "fb", "i": i}, routing_key="fb", declare=queues)
    got: list[kombu.Message] = []
    consumer = conn.Consumer(queues, callbacks=[lambda body, msg: got.append(msg)])
    consumer.qos(prefetch_count=4)
    consumer.consume()
    drain_until(conn, lambda: len(got) >= 4)
    assert {m.payload["q"] for m in got[:4]} == {"fa", "fb"}
    for m in got:
        m.ack()
    consumer.cancel()


def test_pickled_messages_survive_a_restore(make_connection: Any) -> None:
    conn = make_connection()
    q = conn.SimpleQueue("pk", serializer="pickle", accept=["pickle"])
    q.put({"s": {1, 2, 3}})
    q.get(timeout=10)
    q.close()
    conn.release()
    conn2 = make_connection()
    q2 = conn2.SimpleQueue("pk", accept=["pickle"])
    msg = q2.get(timeout=10)
    assert msg.payload == {"s": {1, 2, 3}}
    assert pickle.loads(msg.body) == {"s": {1, 2, 3}}
    msg.ack()
    q2.close()


def test_a_draining_consumer_writes_its_acks_in_batches(make_connection: Any, store: Store) -> None:
    conn = make_connection(claim_batch=100)
    queue = Queue("batched")
    conn.Producer().publish({"warm": True}, routing_key="batched", declare=[queue])
    for i in range(300):
        conn.Producer().publish({"i": i}, routing_key="batched")
    calls: list[int] = []  # acks carried by each statement that wrote any
    store_of = conn.transport.store
    real_ack, real_ack_claim = store_of.message_ack, store_of.message_ack_claim

    def counting_ack(tags, *, owner):  # type: ignore[no-untyped-def]
        tags = list(tags)
        calls.append(len(tags))
        return real_ack(tags, owner=owner)

    def counting_ack_claim(*, acks, **kwargs):  # type: ignore[no-untyped-def]
        acks = list(acks)
        if acks:
            calls.append(len(acks))
        return real_ack_claim(acks=acks, **kwargs)

    store_of.message_ack = counting_ack
    store_of.message_ack_claim = counting_ack_claim
    consumer, got = consume(conn, queue, prefetch=100)
    consumer.callbacks[:] = [lambda body, msg: (got.append(msg), msg.ack())]
    drain_until(conn, lambda: len(got) >= 301)
    eventually(lambda: store.message_counts() == {}, timeout=10, what="every ack written")
    assert sum(calls) == 301
    assert len(calls) < 301 / 10, calls  # batched: far fewer statements than acks
    consumer.cancel()


def test_a_no_ack_delivery_deletes_its_row_and_takes_no_prefetch_slot(make_connection: Any, store: Store) -> None:
    """As RabbitMQ forgets a message it sends to a no_ack consumer (Celery's pidbox): nothing stays held to be
    rescued and replayed once the consumer is gone."""
    conn = make_connection()
    queue = Queue("noack")
    for i in range(3):
        conn.Producer().publish({"i": i}, routing_key="noack", declare=[queue])
    got: list[kombu.Message] = []
    consumer = conn.Consumer([queue], callbacks=[lambda body, msg: got.append(msg)], accept=["json"], no_ack=True)
    consumer.qos(prefetch_count=1)
    consumer.consume()
    drain_until(conn, lambda: len(got) == 2)
    eventually(lambda: store.message_counts() == {("noack", "ready"): 1}, timeout=10, what="delivered rows deleted")
    assert conn.default_channel.basic_get("noack", no_ack=True).payload == {"i": 2}
    eventually(lambda: store.message_counts() == {}, timeout=10, what="a no_ack basic_get deletes its row too")
    consumer.cancel()
    conn.release()
    assert store.message_counts() == {}, "nothing released back at close: nothing was held"


def _hold_five_of_ten(conn: kombu.Connection, queue: Queue) -> list[kombu.Message]:
    """Publish 10, consume at prefetch 5 until 5 are delivered, cancel: the 5 are held and unsettled."""
    for i in range(10):
        conn.Producer().publish({"i": i}, routing_key=queue.name, declare=[queue])
    consumer, got = consume(conn, queue, prefetch=5)
    drain_until(conn, lambda: len(got) == 5)
    consumer.cancel()
    return got


def test_buffered_acks_are_written_before_a_queue_delete(
    make_connection: Any, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """As on RabbitMQ's channel, acks made before a delete apply first: none is reported as a run that
    "changed nothing" because the delete took its row."""
    conn = make_connection()
    queue = Queue("ordered")
    got = _hold_five_of_ten(conn, queue)
    with caplog.at_level(logging.WARNING, logger="kombu_akadze"):
        for message in got:
            message.ack()  # buffered: this connection drains, so its next statement carries them
        queue(conn.default_channel).delete()
        conn.release()  # writes whatever is still buffered
    stale = [r.getMessage() for r in caplog.records if "changed nothing" in r.getMessage()]
    assert not stale, stale


def test_a_queue_delete_waits_for_the_acks_another_thread_is_writing(
    make_connection: Any, store: Store, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The heartbeat writes a draining client's buffered acks at its beats, on its own thread. A delete that
    lands while such a write is under way (kombu deletes the reply queue of inspect and ping right after the
    replies) waits for it: before, it found nothing left to write, took the session first and deleted the
    rows, and each of those acks was reported as a run that "changed nothing" (seen in CI under load)."""
    conn = make_connection()
    queue = Queue("ordered-threads")
    got = _hold_five_of_ten(conn, queue)
    main = threading.current_thread()
    inside, go = threading.Event(), threading.Event()
    real_ack = Store.message_ack

    def paused_ack(self: Store, tags: Any, *, owner: str) -> set[int]:
        if threading.current_thread() not in (main, deleter):  # whoever writes the acks: ours or the heartbeat
            inside.set()
            assert go.wait(60)
        return real_ack(self, tags, owner=owner)

    monkeypatch.setattr(Store, "message_ack", paused_ack)
    deleter = threading.Thread(target=lambda: queue(conn.default_channel).delete())
    for message in got:
        message.ack()  # buffered: written by the next flush
    flusher = threading.Thread(target=conn.transport.flush_outcomes)
    with caplog.at_level(logging.WARNING, logger="kombu_akadze"):
        flusher.start()
        assert inside.wait(60), "no thread took the acks for writing"
        deleter.start()
        deleter.join(2)  # without the wait, the delete is done by now, ahead of the acks
        go.set()
        flusher.join(60)
        deleter.join(60)
    assert not flusher.is_alive()
    assert not deleter.is_alive()
    stale = [r.getMessage() for r in caplog.records if "changed nothing" in r.getMessage()]
    assert not stale, stale
    assert store.message_counts() == {}
    print("injected: an ack write held back while a queue delete came; acked 5, reported stale 0")
    conn.release()


def test_requeues_are_written_before_a_purge(make_connection: Any, store: Store) -> None:
    """Messages rejected with requeue before a purge are purged with the rest, as on RabbitMQ."""
    conn = make_connection()
    queue = Queue("requeue-purge")
    got = _hold_five_of_ten(conn, queue)
    for message in got:
        message.requeue()
    purged = queue(conn.default_channel).purge()
    conn.release()
    left = sum(store.message_counts().values())
    assert left == 0, f"{left} requeued messages came back after the purge (it purged {purged})"


def test_durable_acks_reaches_every_session_of_the_connection(make_connection: Any) -> None:
    """The option is the store's: off by default, on when set (tests/faults/test_durable_acks.py shows
    what each does to a commit)."""
    assert make_connection().transport.store.durable_acks is False
    conn = make_connection(durable_acks="yes")
    assert conn.transport.store.durable_acks is True
    assert conn.transport._new_store("heartbeat").durable_acks is True


def test_a_queue_that_came_back_empty_is_not_claimed_again_until_something_wakes_it(
    make_connection: Any, store: Store
) -> None:
    """Celery with remote control, on kombu's event loop as Celery runs it: a task channel with a
    prefetch window and a no_ack control channel on one connection. Once the control queue came back
    empty (and was parked on), the claims that keep the task window full ask for the task queue alone; a
    publish to the control queue wakes it up again."""
    conn = make_connection()
    work, control = Queue("rc-work"), Queue("rc-control")
    producer = make_connection().Producer()
    producer.publish({"warm": True}, routing_key="rc-control", declare=[control])
    for i in range(30):
        producer.publish({"i": i}, routing_key="rc-work", declare=[work])
    asked: list[list[str]] = []
    store_of = conn.transport.store
    real_start = store_of.message_ack_claim_start

    def recording_start(*, queues, **kwargs):  # type: ignore[no-untyped-def]
        asked.append(list(queues))
        return real_start(queues=queues, **kwargs)

    store_of.message_ack_claim_start = recording_start
    commands: list[Any] = []
    conn.connect()
    kombu.Consumer(
        conn.channel(), [control], callbacks=[lambda body, msg: commands.append(body)], no_ack=True
    ).consume()
    tasks, got = consume(conn, work, prefetch=2)
    tasks.callbacks[:] = [lambda body, msg: (got.append(body), msg.ack())]
    hub = Hub()
    conn.transport.register_with_event_loop(conn.connection, hub)
    loop = hub.create_loop()

    def turn_until(predicate: Any) -> None:
        deadline = time.monotonic() + 30
        while not predicate():
            assert time.monotonic() < deadline, "condition not reached on the event loop"
            next(loop)

    try:
        beats = conn.transport.heartbeat.beats
        turn_until(lambda: len(got) == 30 and len(commands) == 1)
        beats = conn.transport.heartbeat.beats - beats
        claims = [q for q in asked if q]
        with_control = [q for q in claims if "rc-control" in q]
        print(f"{len(claims)} claims, {len(with_control)} of them asked the control queue; {beats} beats")
        assert len(claims) >= 15  # the task window (2) was refilled again and again
        # The first claims, until the control queue came back empty; after that only a wake-up asks it
        # again, and a heartbeat that reports the task queue ready is one (at most one claim per beat).
        assert len(with_control) <= 2 + beats, claims
        producer.publish({"command": "ping"}, routing_key="rc-control")
        turn_until(lambda: len(commands) == 2)  # its wake-up put it back into the next claim
        assert commands[1] == {"command": "ping"}
    finally:
        conn.transport.unregister_from_event_loop(conn.connection, hub)
        hub.close()
