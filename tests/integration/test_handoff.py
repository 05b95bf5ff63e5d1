"""Handoff (migration 0018): a publish to a queue a consumer is parked on writes the row already held by
that consumer and sends the message itself in the notification, so the consumer delivers it without a
claim statement. What each path does with the row: handed over within the consumer's slots, woken instead
(too big for a notification, or a worker of the previous release), given back when the consumer stops
without reading it, when it has no free slot for it, or when the notification was lost (the reconcile)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import kombu
import pytest
from kombu import Queue
from psycopg.types.json import Jsonb

from kombu_akadze.consume import relay
from kombu_akadze.integrations.testing import eventually
from kombu_akadze.store import NewMessage, Store, handoff_message, is_handoff, sqlfiles, wake_channel
from tests.conftest import store_for
from tests.integration.test_transport import drain_until

SQL = sqlfiles.parse_blocks(Path(__file__).with_name("inspect.sql").read_text())


def run(store: Store, name: str, **params: Any) -> list[tuple[Any, ...]]:
    query = SQL[name].replace("{schema}", sqlfiles.quote_ident(store.schema))
    with store.connection().cursor() as cur:
        cur.execute(query, params)
        return cur.fetchall() if cur.description else []


def waiting(store: Store) -> list[tuple[Any, ...]]:
    return run(store, "waiting_rows")


def row(store: Store, message_id: int) -> tuple[str, str | None, int, int]:
    found = store.message_get(message_id)
    assert found is not None
    return found["state"], found["owner"], found["run_count"], found["attempts"]


def parked(pg_url: str, schema: str, made: list[Store], consumer: str, queue: str, slots: int) -> Store:
    """A session LISTENing on *consumer*'s channel, parked on *queue* with *slots* free, as a claim that came
    back empty parks this release's consumers."""
    session = store_for(pg_url, schema)
    made.append(session)
    channel = wake_channel(schema, consumer)
    session.listen_start(channel=channel)
    got = session.message_ack_claim(acks=[], queues=[queue], limits=[slots], owner=consumer, park=channel)
    assert got.claimed == []
    return session


def notes(session: Store, count: int) -> list[str]:
    got: list[str] = []

    def read() -> bool:
        got.extend(session.listen_notifies())
        return len(got) >= count

    eventually(read, timeout=10, what=f"{count} notification(s)")
    return got


def test_a_publish_hands_its_message_over_within_the_parked_consumers_slots(
    pg_url: str, schema: str, store: Store
) -> None:
    made: list[Store] = []
    try:
        session = parked(pg_url, schema, made, "c", "q", slots=2)
        sent = [NewMessage(queue="q", body=f"m{i}".encode(), headers={"i": i}, properties={"p": i}) for i in range(3)]
        ids = [store.message_insert(m) for m in sent]
        assert all(i is not None for i in ids)
        # Two slots: two messages held under c's id since their publish, run 1, one attempt spent; the third
        # waits ready (c is no longer parked: it claims again as it acks).
        assert [row(store, i) for i in ids if i is not None] == [
            ("held", "c", 1, 1), ("held", "c", 1, 1), ("ready", None, 0, 0)
        ]  # fmt: skip
        assert waiting(store) == []
        payloads = notes(session, 2)
        assert all(is_handoff(p) for p in payloads)
        handed = [handoff_message(p) for p in payloads]
        assert [(m.id, m.queue, m.body, m.headers, m.properties) for m in handed] == [
            (ids[0], "q", b"m0", {"i": 0}, {"p": 0}), (ids[1], "q", b"m1", {"i": 1}, {"p": 1})
        ]  # fmt: skip
        # Settled as a claimed run is: fenced on (id, run_count, owner).
        assert store.message_ack([(handed[0].id, 0)], owner="c") == set()
        assert store.message_ack([handed[0].tag], owner="other") == set()
        assert store.message_ack([handed[0].tag], owner="c") == {handed[0].id}
        assert session.listen_notifies() == []
    finally:
        for s in made:
            s.close()


def test_a_message_too_big_for_a_notification_wakes_its_consumer_instead(
    pg_url: str, schema: str, store: Store
) -> None:
    made: list[Store] = []
    try:
        session = parked(pg_url, schema, made, "c", "q", slots=3)
        big = store.message_insert(NewMessage(queue="q", body=b"x" * 6000))  # 8,000 bytes in base64
        assert big is not None
        assert row(store, big) == ("ready", None, 0, 0)
        assert notes(session, 1) == ["q"]  # woken to claim it; its row went
        assert waiting(store) == []
    finally:
        for s in made:
            s.close()


def test_a_worker_of_the_previous_release_is_woken_not_handed_a_message(store: Store, pg_url: str) -> None:
    """Rolling upgrade: a worker of the release before 0018 parks without slots (it cannot read a handoff);
    a publish wakes it to claim, as before."""
    session = store_for(pg_url, store.schema)
    try:
        channel = wake_channel(store.schema, "old")
        session.listen_start(channel=channel)
        query = SQL["previous_ack_claim"].replace("{schema}", sqlfiles.quote_ident(store.schema))
        params = {"ack_ids": [], "ack_run_counts": [], "owner": "old", "queues": ["q"], "limits": [1], "park": channel}
        assert store.connection().execute(query, params).fetchall() == []
        sent = store.message_insert(NewMessage(queue="q", body=b"one"))
        assert sent is not None
        assert row(store, sent) == ("ready", None, 0, 0)
        assert notes(session, 1) == ["q"]
    finally:
        session.close()


def test_a_route_hands_each_copy_to_a_consumer_of_its_queue(pg_url: str, schema: str, store: Store) -> None:
    made: list[Store] = []
    try:
        store.exchange_declare(name="fan", type="fanout", durable=True, auto_delete=False)
        for q in ("q1", "q2", "q3"):
            store.queue_declare(name=q)
            store.binding_declare(exchange="fan", routing_key="", queue=q, pattern="")
        one = parked(pg_url, schema, made, "c1", "q1", slots=1)
        two = parked(pg_url, schema, made, "c2", "q2", slots=1)
        queues, matched = store.message_route(NewMessage(queue="", body=b"all"), exchange="fan", routing_key="")
        assert (sorted(queues), matched) == (["q1", "q2", "q3"], 3)
        assert store.message_counts() == {("q1", "held"): 1, ("q2", "held"): 1, ("q3", "ready"): 1}
        for session, queue in ((one, "q1"), (two, "q2")):
            [payload] = notes(session, 1)
            assert (handoff_message(payload).queue, handoff_message(payload).body) == (queue, b"all")
    finally:
        for s in made:
            s.close()


def test_a_consumer_that_stops_gives_back_what_was_handed_to_it_unread(pg_url: str, schema: str, store: Store) -> None:
    """Injected: a handoff committed as the consumer stops, its notification never read. The clean stop
    (consumer_unpark, then consumer_delete) gives it back in place, the attempt too; the run it was handed
    as stays fenced."""
    made: list[Store] = []
    try:
        parked(pg_url, schema, made, "c", "q", slots=1)
        sent = store.message_insert(NewMessage(queue="q", body=b"unread"))
        assert sent is not None
        assert row(store, sent) == ("held", "c", 1, 1)
        store.consumer_unpark(consumer_id="c")
        assert store.consumer_delete(consumer_id="c") == 1
        assert row(store, sent) == ("ready", None, 1, 0)
        again = store.message_ack_claim(acks=[], queues=["q"], limits=[1], owner="d")
        assert [(m.id, m.run_count, m.attempts) for m in again.claimed] == [(sent, 2, 1)]
        assert store.message_ack([(sent, 1)], owner="c") == set()  # c's late ack of its run is fenced
        print("injected: a handoff never read before a clean stop; in 1, given back 1, lost 0")
    finally:
        for s in made:
            s.close()


def test_a_handoff_whose_notification_was_lost_is_given_back_by_the_reconcile(
    make_connection: Any, store: Store
) -> None:
    """Injected: the consumer's park points at a channel nobody LISTENs on (its LISTEN session or relay link
    lost between the park and the publish), so three publishes are held under its id and nobody tells it.
    Its reconcile (lease_orphans) gives them back two passes after they are two heartbeat intervals old
    (0.25 s beats here), and it claims them."""
    conn = make_connection()
    queue = Queue("handoff-lost")
    got: list[kombu.Message] = []
    consumer = conn.Consumer([queue], callbacks=[lambda body, msg: (got.append(msg), msg.ack())], accept=["json"])
    consumer.qos(prefetch_count=10)
    consumer.consume()
    producer = conn.Producer()
    producer.publish({"i": -1}, routing_key="handoff-lost", declare=[queue])
    drain_until(conn, lambda: len(got) == 1, 20)
    eventually(lambda: store.message_counts() == {}, timeout=20, what="the warm-up's ack written")
    owner = conn.transport.consumer_id
    run(store, "park_unheard", queue="handoff-lost", consumer=owner, slots=3)

    sent = 3
    for i in range(sent):
        producer.publish({"i": i}, routing_key="handoff-lost")
    assert store.message_counts() == {("handoff-lost", "held"): sent}

    drain_until(conn, lambda: len(got) == 1 + sent, 60)
    payloads = [m.payload["i"] for m in got[1:]]
    completed, duplicated = len(set(payloads)), len(payloads) - len(set(payloads))
    print(f"injected: {sent} handoffs with lost notifications; in {sent}, completed {completed}, "
          f"duplicated {duplicated}, lost {sent - completed}")  # fmt: skip
    assert (completed, duplicated) == (sent, 0)
    # Given back by the reconcile, so the attempt came back too: each ran as its first attempt.
    assert [m.delivery_info["akadze_attempt"] for m in got[1:]] == [1, 1, 1]
    eventually(lambda: store.message_counts() == {}, timeout=20, what="every ack written")
    consumer.cancel()


#: Beats far apart, so that neither the reconcile (two passes over rows two intervals old) nor the poll can
#: explain a delivery within the tests' deadlines below: only the adoption at the re-arm can.
SLOW_BEATS = {"heartbeat_interval": 2.0, "heartbeat_ttl": 60.0, "rescue_interval": 60.0, "poll_interval": 60.0}


def unheard_handoffs(conn: kombu.Connection, store: Store, queue: str, sent: int) -> kombu.Producer:
    """Park *conn*'s consumer on *queue* on a channel nobody LISTENs on, as if its LISTEN path had just gone,
    and publish *sent* messages: each held under its id, each notification lost."""
    run(store, "park_unheard", queue=queue, consumer=conn.transport.consumer_id, slots=sent)
    producer = conn.Producer()
    for i in range(sent):
        producer.publish({"i": i}, routing_key=queue)
    assert store.message_counts() == {(queue, "held"): sent}
    return producer


def delivered_as_handed(got: list[kombu.Message], sent: int, injected: str) -> None:
    payloads = [m.payload["i"] for m in got]
    completed, duplicated = len(set(payloads)), len(payloads) - len(set(payloads))
    print(f"injected: {injected}; in {sent}, completed {completed}, duplicated {duplicated}, lost {sent - completed}")
    assert (completed, duplicated) == (sent, 0)
    # Adopted, not given back by the reconcile and claimed again: the run they were handed as, the first.
    assert [(m.delivery_info["redelivered"], m.delivery_info["akadze_attempt"]) for m in got] == [(False, 1)] * sent


def test_handoffs_sent_while_the_listen_session_was_replaced_are_adopted_at_the_re_arm(
    make_connection: Any, store: Store
) -> None:
    """Injected: two handoffs whose notifications were lost, then the consumer's LISTEN session (its
    heartbeat's) terminated. When the heartbeat re-arms LISTEN on a new session it finds the two rows held
    under its id that it never received and delivers them, at the next beat (2 s here); the reconcile could
    not give them back before two passes over rows 4 s old."""
    conn = make_connection(listen_relay=False, **SLOW_BEATS)
    queue = Queue("adopt-session")
    got: list[kombu.Message] = []
    consumer = conn.Consumer([queue], callbacks=[lambda body, msg: (got.append(msg), msg.ack())], accept=["json"])
    consumer.consume()
    with contextlib.suppress(TimeoutError):
        conn.drain_events(timeout=0.5)  # its claim finds nothing: parked
    listener = conn.transport.listener
    assert (listener.role, listener.sessions) == ("own", 1)
    unheard_handoffs(conn, store, "adopt-session", 2)
    session = conn.transport.heartbeat.store._conn  # the heartbeat thread's session, which LISTENs
    assert session is not None
    ended = run(store, "terminate_pid", pid=session.info.backend_pid)
    assert ended == [(True,)]

    drain_until(conn, lambda: len(got) == 2, 20)
    delivered_as_handed(got, 2, "2 handoffs unheard, then the LISTEN session terminated")
    assert listener.sessions == 2
    assert conn.transport.lease.adoption.count == 2
    eventually(lambda: store.message_counts() == {}, timeout=20, what="every ack written")
    consumer.cancel()


@pytest.mark.skipif(not relay.supported(), reason="the wake-up relay needs Linux's abstract sockets")
def test_handoffs_relayed_by_a_hub_that_went_are_adopted_once_linked_again(make_connection: Any, store: Store) -> None:
    """Injected: two handoffs to a consumer linked to its host's hub, their notifications lost, then the hub's
    connection closed. The linked consumer takes the hub's place (or links to the next), and once LISTEN
    runs for it again it delivers the two rows held under its id; the reconcile could not yet."""
    hub_conn, conn = make_connection(**SLOW_BEATS), make_connection(**SLOW_BEATS)
    for c, name in ((hub_conn, "adopt-hub-first"), (conn, "adopt-linked")):
        with pytest.raises(c.SimpleQueue(name).Empty):
            c.SimpleQueue(name).get(timeout=0.5)  # claims once, finds nothing, parks
    assert (hub_conn.transport.listener.role, conn.transport.listener.role) == ("hub", "linked")
    linked = conn.SimpleQueue("adopt-linked")
    unheard_handoffs(conn, store, "adopt-linked", 2)
    hub_conn.release()

    got = []
    for _ in range(2):
        message = linked.get(timeout=20)
        message.ack()
        got.append(message)
    delivered_as_handed(got, 2, "2 handoffs unheard, then the relay hub's connection closed")
    assert conn.transport.lease.adoption.count == 2
    assert conn.transport.listener.role in ("hub", "linked")
    eventually(lambda: store.message_counts() == {}, timeout=20, what="every ack written")
    linked.close()


def test_a_handoff_to_a_consumer_with_no_free_slot_is_given_back_at_once(make_connection: Any, store: Store) -> None:
    """Injected: a park promising more slots than the consumer has (prefetch 1, one message held), as Celery
    shrinking its window after an ETA task leaves one. The handed-over message is given back on arrival,
    run_count and attempt undone, and runs once the slot frees."""
    conn = make_connection()
    queue = Queue("handoff-full")
    got: list[kombu.Message] = []
    consumer = conn.Consumer([queue], callbacks=[lambda body, msg: got.append(msg)], accept=["json"])
    consumer.qos(prefetch_count=1)
    consumer.consume()
    producer = conn.Producer()
    producer.publish({"i": 0}, routing_key="handoff-full", declare=[queue])
    drain_until(conn, lambda: len(got) == 1, 20)
    listener = conn.transport.listener
    channel = conn.transport.lease.channel
    query = SQL["park_unheard"].replace("{schema}", sqlfiles.quote_ident(store.schema))
    store.connection().execute(
        query.replace("'akadze.nobody-listens'", "%(channel)s"),
        {"queue": "handoff-full", "consumer": conn.transport.consumer_id, "slots": 5, "channel": channel},
    )

    producer.publish({"i": 1}, routing_key="handoff-full")
    eventually(lambda: listener.handoffs == 1, timeout=20, what="the handoff read")
    eventually(lambda: store.message_counts().get(("handoff-full", "ready")) == 1, timeout=20, what="given back")
    got[0].ack()
    drain_until(conn, lambda: len(got) == 2, 20)
    assert got[1].payload == {"i": 1}
    # Given back as if never handed over: its first run, not a redelivery (RabbitMQ never delivers past
    # the prefetch window, so a task must not see one).
    assert (got[1].delivery_info["akadze_attempt"], got[1].delivery_info["redelivered"]) == (1, False)
    got[1].ack()
    eventually(lambda: store.message_counts() == {}, timeout=20, what="every ack written")
    print("injected: a handoff beyond the prefetch window; in 2, completed 2, duplicated 0, lost 0")
    consumer.cancel()


def test_the_publish_statements_are_priced_below_jit_on_a_server_with_jit_on(store: Store) -> None:
    """The publish statements stay priced far below jit_above_cost: 0018's handoff_pick, priced at the default
    1,000 rows, pushed them past it and a server with JIT compiled them at every publish (+25 ms each, seen);
    since 0020 they are one call of the function publish (per matching queue for message_route), 0021's too,
    and 0022's handoff functions are inlined into it."""
    params = {
        "queue": "q", "priority": 0, "body": b"x", "content_type": "application/json", "content_encoding": "utf-8",
        "headers": Jsonb({}), "properties": Jsonb({}), "delay": 0.0, "ttl": None, "not_before": None,
        "durable": True, "now": None, "exchange": "fan", "routing_key": "",
    }  # fmt: skip
    conn = store.connection()
    conn.execute("SET jit = on")
    try:
        for name in ("message_insert", "message_route"):
            query = sqlfiles.render(name, schema=store.schema)
            plan = "\n".join(r[0] for r in conn.execute("EXPLAIN (COSTS) " + query, params).fetchall())
            assert "JIT" not in plan, f"{name}:\n{plan}"
            total = float(plan.split("cost=", 1)[1].split("..", 1)[1].split(" ", 1)[0])
            assert total < 1000, f"{name} priced at {total}:\n{plan}"
    finally:
        conn.execute("RESET jit")


def test_a_cancelled_consumer_is_no_longer_parked_on_its_queue(make_connection: Any, store: Store) -> None:
    """Celery's cancel_consumer: a publish right after must leave the message ready for the queue's other
    consumers, not hand it to the one that stopped (which would give it straight back)."""
    conn = make_connection(heartbeat_interval=30.0, heartbeat_ttl=90.0, rescue_interval=30.0)  # no beat unparks it
    queue = Queue("cancelled")
    consumer = conn.Consumer([queue], callbacks=[lambda body, msg: msg.ack()], accept=["json"])
    consumer.consume()
    with contextlib.suppress(TimeoutError):
        conn.drain_events(timeout=1)  # its claim finds nothing: parked
    owner = conn.transport.consumer_id
    assert ("cancelled", owner) in waiting(store)
    consumer.cancel()
    assert ("cancelled", owner) not in waiting(store)
    conn.Producer().publish({"n": 1}, routing_key="cancelled")
    assert store.message_counts() == {("cancelled", "ready"): 1}
