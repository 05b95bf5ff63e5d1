"""Message features at the kombu level: native delay of far ETAs, x-max-length overflow modes."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from kombu import Queue

from kombu_akadze.errors import QueueFullError
from kombu_akadze.integrations.testing import eventually
from kombu_akadze.lease import maintenance
from kombu_akadze.store import NewMessage, Store, sqlfiles

INSPECT = sqlfiles.parse_blocks(Path(__file__).with_name("inspect.sql").read_text())


def maintain(store: Store, now: datetime) -> dict[str, int]:
    """One round of the fleet's maintenance passes, as the elected consumer runs it."""
    return maintenance.run_once(store, ttl=30, max_attempts=20, consumer_id="m", now=now)


def states(store: Store) -> dict[tuple[str, str], int]:
    return store.message_counts()


def test_a_far_eta_waits_in_the_database_until_shortly_before_it_is_due(make_connection: Any, store: Store) -> None:
    conn = make_connection(native_delay_threshold=60)
    Queue("later")(conn.default_channel).declare()
    eta = datetime.now(UTC) + timedelta(days=1)
    conn.Producer().publish({"task": "t"}, routing_key="later", headers={"eta": eta.isoformat()})
    conn.Producer().publish({"task": "soon"}, routing_key="later", headers={"eta": datetime.now(UTC).isoformat()})
    assert states(store) == {("later", "delayed"): 1, ("later", "ready"): 1}
    assert maintain(store, eta - timedelta(seconds=61))["promoted"] == 0
    assert maintain(store, eta - timedelta(seconds=59))["promoted"] == 1
    assert states(store) == {("later", "ready"): 2}


def test_native_delay_off_hands_far_etas_to_the_worker_at_once(make_connection: Any, store: Store) -> None:
    conn = make_connection(native_delay_threshold=0)
    Queue("later")(conn.default_channel).declare()
    eta = datetime.now(UTC) + timedelta(days=1)
    conn.Producer().publish({"task": "t"}, routing_key="later", headers={"eta": eta.isoformat()})
    assert states(store) == {("later", "ready"): 1}


def test_an_unparseable_eta_is_delivered_now_not_lost(make_connection: Any, store: Store) -> None:
    conn = make_connection()
    Queue("later")(conn.default_channel).declare()
    conn.Producer().publish({"task": "t"}, routing_key="later", headers={"eta": "tomorrow-ish"})
    assert states(store) == {("later", "ready"): 1}


def test_reject_publish_refuses_the_message_beyond_max_length(make_connection: Any, store: Store) -> None:
    conn = make_connection()
    q = Queue("capped", max_length=2, queue_arguments={"x-overflow": "reject-publish"})
    q(conn.default_channel).declare()
    producer = conn.Producer()
    producer.publish({"n": 1}, routing_key="capped")
    producer.publish({"n": 2}, routing_key="capped")
    with pytest.raises(QueueFullError, match="reject-publish"):
        producer.publish({"n": 3}, routing_key="capped")
    assert states(store) == {("capped", "ready"): 2}


def test_a_queue_declared_with_ttl_and_max_length_by_another_connection_binds_a_publisher_already_running(
    make_connection: Any, store: Store
) -> None:
    publisher = make_connection().Producer()
    for n in range(6):  # past psycopg's prepare threshold: the publish statement is prepared by now
        publisher.publish({"n": n}, routing_key="late")
    other = make_connection()
    Queue("late", max_length=8, message_ttl=30, queue_arguments={"x-overflow": "reject-publish"})(
        other.default_channel
    ).declare()
    publisher.publish({"n": 6}, routing_key="late")
    publisher.publish({"n": 7}, routing_key="late", exchange="")
    with pytest.raises(QueueFullError, match="reject-publish"):
        publisher.publish({"n": 8}, routing_key="late")
    query = INSPECT["messages_expiring"].replace("{schema}", sqlfiles.quote_ident(store.schema))
    with store.connection().cursor() as cur:
        assert cur.execute(query, {"queue": "late"}, prepare=False).fetchone() == (2, 8)


def test_reject_publish_through_an_exchange_raises_too(make_connection: Any, store: Store) -> None:
    conn = make_connection()
    q = Queue(
        "capped-ex", exchange="ex", routing_key="k", max_length=1, queue_arguments={"x-overflow": "reject-publish"}
    )
    q(conn.default_channel).declare()
    conn.Producer().publish({"n": 1}, exchange="ex", routing_key="k")
    with pytest.raises(QueueFullError):
        conn.Producer().publish({"n": 2}, exchange="ex", routing_key="k")
    assert states(store) == {("capped-ex", "ready"): 1}


def test_drop_head_trims_the_oldest_beyond_max_length(make_connection: Any, store: Store) -> None:
    conn = make_connection()
    Queue("ring", max_length=3)(conn.default_channel).declare()
    for i in range(10):
        conn.Producer().publish({"n": i}, routing_key="ring")
    assert maintain(store, datetime.now(UTC))["capped"] == 7
    simple = conn.SimpleQueue("ring")
    got = []
    for _ in range(3):
        msg = simple.get(timeout=10)
        got.append(msg.payload["n"])
        msg.ack()
    assert got == [7, 8, 9]
    simple.close()


def test_drop_head_never_drops_a_message_that_a_claim_is_taking(pg_url: str, schema: str, store: Store) -> None:
    """The cap pass picks the rows beyond x-max-length from its snapshot; a claim taking one of them at that
    moment must win: the cap skips the row it cannot lock and checks the state again on the row it locks.
    (Before: the DELETE waited for the claim, re-checked only the id join, and deleted the now-held row
    under its consumer: a message that failed or was released afterwards was gone.)"""
    store.queue_declare(name="ring", max_length=1)
    oldest, newest = (store.message_insert(NewMessage(queue="ring", body=f"m{i}".encode())) for i in range(2))
    capper = Store(pg_url, schema=schema, role="capper")
    result: list[int] = []
    with psycopg.connect(pg_url) as claimer:  # a transaction: the claim has locked and updated the row
        claim = INSPECT["claim_in_transaction"].replace("{schema}", sqlfiles.quote_ident(schema))
        claimed = claimer.execute(claim, {"queue": "ring", "owner": "consumer-a"}).fetchall()
        assert [row[0] for row in claimed] == [oldest]
        worker = threading.Thread(target=lambda: result.append(capper.queue_cap()))
        worker.start()

        def cap_done_or_waiting() -> bool:
            with psycopg.connect(pg_url) as probe:
                waiting = probe.execute(INSPECT["lock_waiters"], {"application_name": "akadze-capper"}).fetchone()
            return not worker.is_alive() or (waiting is not None and waiting[0] > 0)

        eventually(cap_done_or_waiting, timeout=30)
        claimer.commit()  # the claim lands while the cap pass runs (or after it skipped the row)
    worker.join(30)
    capper.close()
    assert not worker.is_alive()
    row = store.message_get(oldest)
    assert row is not None, "the held message was dropped by the cap pass"
    assert (row["state"], row["owner"]) == ("held", "consumer-a")
    assert store.message_get(newest) is not None
    print(f"injected: a cap pass during a claim; 2 messages in, capped {result[0]}, lost 0")
    assert result == [0]
    assert store.queue_cap() == 0  # one waiting message: within the cap


def test_bad_max_length_arguments_say_what_is_valid(make_connection: Any) -> None:
    conn = make_connection()
    with pytest.raises(ValueError, match="x-overflow"):
        Queue("bad", queue_arguments={"x-overflow": "reject-publish-dlx"})(conn.default_channel).declare()
    with pytest.raises(ValueError, match="x-max-length"):
        Queue("bad", queue_arguments={"x-max-length": -1})(conn.default_channel).declare()


def test_rejected_messages_follow_the_dead_letter_exchange(make_connection: Any, store: Store) -> None:
    conn = make_connection()
    dead = Queue("orders.dead", exchange="dlx", routing_key="orders.dead")
    dead(conn.default_channel).declare()
    orders = Queue(
        "orders",
        queue_arguments={"x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "orders.dead"},
    )
    orders(conn.default_channel).declare()
    conn.Producer().publish({"order": 1}, routing_key="orders")
    simple = conn.SimpleQueue(orders)
    simple.get(timeout=10).reject(requeue=False)
    # The consumer's own maintenance pass (every rescue_interval) re-publishes it to the DLX.
    eventually(lambda: states(store) == {("orders.dead", "ready"): 1}, timeout=30, what="routed to orders.dead")
    assert store.deadletter_list(queue="orders") == []
    dead_simple = conn.SimpleQueue(dead)
    msg = dead_simple.get(timeout=10)
    assert msg.payload == {"order": 1}
    (death,) = msg.headers["x-death"]
    assert (death["queue"], death["count"]) == ("orders", 1)
    assert "requeue=False" in death["reason"]
    msg.ack()
    simple.close()
    dead_simple.close()


def test_a_dead_letter_exchange_without_a_binding_keeps_the_message_in_dead_letters(
    make_connection: Any, store: Store
) -> None:
    conn = make_connection()
    conn.default_channel.exchange_declare("nowhere", "direct")
    q = Queue("lonely", queue_arguments={"x-dead-letter-exchange": "nowhere"})
    q(conn.default_channel).declare()
    conn.Producer().publish({"n": 1}, routing_key="lonely")
    simple = conn.SimpleQueue(q)
    simple.get(timeout=10).reject(requeue=False)
    hb = conn.transport.heartbeat
    passes = hb.rescues
    assert hb.wait_for(lambda h: h.rescues >= passes + 3, timeout=30)  # several maintenance passes ran
    assert len(store.deadletter_list(queue="lonely")) == 1
    assert states(store) == {}
    simple.close()


def test_over_attempted_messages_follow_the_dead_letter_exchange_too(make_connection: Any, store: Store) -> None:
    conn = make_connection(max_attempts=1)
    Queue("retry.dead")(conn.default_channel).declare()
    q = Queue("retry", queue_arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "retry.dead"})
    q(conn.default_channel).declare()
    conn.Producer().publish({"n": 1}, routing_key="retry")
    simple = conn.SimpleQueue(q)
    simple.get(timeout=10).reject(requeue=True)  # the only attempt is spent: dead letters, then the DLX
    eventually(lambda: states(store) == {("retry.dead", "ready"): 1}, timeout=30, what="routed to retry.dead")
    assert store.deadletter_list(queue="retry") == []
    simple.close()
