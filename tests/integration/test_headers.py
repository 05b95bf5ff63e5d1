"""Headers come back exactly as published, on every publish path; the broker's facts ride in delivery_info."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import kombu
import psycopg
import pytest
from celery import Celery
from celery.signals import before_task_publish
from kombu import Exchange, Queue

import kombu_akadze
from kombu_akadze.integrations import batch, outbox
from kombu_akadze.integrations.testing import eventually
from kombu_akadze.ops import deadletters
from kombu_akadze.store import Store

#: Every JSON type a header may hold, nested too.
PUBLISHED = {
    "h-str": "v",
    "h-int": 7,
    "h-float": 1.5,
    "h-bool": True,
    "h-null": None,
    "h-list": [1, "a"],
    "h-map": {"k": "v"},
}


def get(conn: kombu.Connection, queue: str | Queue, timeout: float = 20) -> kombu.Message:
    simple = conn.SimpleQueue(queue)
    try:
        return simple.get(timeout=timeout)
    finally:
        simple.consumer.cancel()


def assert_first_delivery(msg: kombu.Message, headers: dict[str, Any]) -> None:
    assert msg.headers == headers
    assert msg.delivery_info["redelivered"] is False
    assert msg.delivery_info["akadze_attempt"] == 1
    assert isinstance(msg.delivery_info["akadze_message_id"], int)
    assert kombu_akadze.attempt_of(msg) == 1


def test_a_direct_publish_is_delivered_with_exactly_its_headers(make_connection: Any) -> None:
    conn = make_connection()
    Queue("direct")(conn.default_channel).declare()
    conn.Producer().publish({"n": 1}, routing_key="direct", headers=PUBLISHED)
    msg = get(conn, "direct")
    assert_first_delivery(msg, PUBLISHED)
    msg.ack()


def test_a_message_without_headers_is_delivered_without_any(make_connection: Any) -> None:
    conn = make_connection()
    Queue("bare")(conn.default_channel).declare()
    conn.Producer().publish({"n": 1}, routing_key="bare")
    msg = get(conn, "bare")
    assert_first_delivery(msg, {})
    msg.ack()


def test_an_exchange_routed_publish_keeps_its_headers(make_connection: Any) -> None:
    conn = make_connection()
    ex = Exchange("hx", "topic")
    Queue("routed", ex, routing_key="a.*")(conn.default_channel).declare()
    conn.Producer().publish({"n": 1}, exchange=ex, routing_key="a.b", headers=PUBLISHED)
    msg = get(conn, "routed")
    assert_first_delivery(msg, PUBLISHED)
    msg.ack()


def test_a_batched_publish_keeps_its_headers(make_connection: Any) -> None:
    conn = make_connection()
    ex = Exchange("bx", "direct")
    Queue("batched", ex, routing_key="k")(conn.default_channel).declare()
    Queue("batched-plain")(conn.default_channel).declare()
    producer = conn.Producer()
    with batch.publishing(producer):
        producer.publish({"n": 1}, exchange=ex, routing_key="k", headers=PUBLISHED)
        producer.publish({"n": 2}, routing_key="batched-plain", headers={"only": "this"})
    first = get(conn, "batched")
    assert_first_delivery(first, PUBLISHED)
    second = get(conn, "batched-plain")
    assert_first_delivery(second, {"only": "this"})
    first.ack()
    second.ack()


def test_a_redelivery_adds_only_x_delivery_count_as_a_quorum_queue_does(make_connection: Any) -> None:
    conn = make_connection()
    Queue("again")(conn.default_channel).declare()
    conn.Producer().publish({"n": 1}, routing_key="again", headers=PUBLISHED)
    simple = conn.SimpleQueue("again")
    first = simple.get(timeout=20)
    first.reject(requeue=True)
    second = simple.get(timeout=20)
    assert second.headers == {**PUBLISHED, "x-delivery-count": 1}
    assert second.delivery_info["redelivered"] is True
    assert second.delivery_info["akadze_attempt"] == 2
    assert second.delivery_info["akadze_message_id"] == first.delivery_info["akadze_message_id"]
    second.ack()
    simple.close()


def test_a_natively_delayed_message_keeps_its_headers(make_connection: Any, store: Store) -> None:
    conn = make_connection(native_delay_threshold=1)
    Queue("later")(conn.default_channel).declare()
    headers = {**PUBLISHED, "eta": (datetime.now(UTC) + timedelta(seconds=3)).isoformat()}
    conn.Producer().publish({"n": 1}, routing_key="later", headers=headers)
    assert store.message_counts() == {("later", "delayed"): 1}
    msg = get(conn, "later", timeout=30)  # promoted by the consumer's maintenance pass a second before the ETA
    assert_first_delivery(msg, headers)
    msg.ack()


def test_a_dead_lettered_message_keeps_its_headers_plus_x_death(make_connection: Any, store: Store) -> None:
    conn = make_connection()
    Queue("dl.dead", exchange="dlx", routing_key="dl.dead")(conn.default_channel).declare()
    dl = Queue("dl", queue_arguments={"x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "dl.dead"})
    dl(conn.default_channel).declare()
    conn.Producer().publish({"n": 1}, routing_key="dl", headers=PUBLISHED)
    simple = conn.SimpleQueue(dl)  # consuming: its maintenance pass re-publishes to the DLX
    simple.get(timeout=20).reject(requeue=False)
    eventually(lambda: store.message_counts() == {("dl.dead", "ready"): 1}, timeout=30, what="dead-lettered")
    simple.close()
    msg = get(conn, "dl.dead")
    death = msg.headers.pop("x-death")
    assert death[0]["queue"] == "dl"
    assert msg.headers == PUBLISHED
    msg.ack()


def test_a_replayed_dead_letter_keeps_its_headers(make_connection: Any, store: Store) -> None:
    conn = make_connection()
    Queue("rp")(conn.default_channel).declare()
    conn.Producer().publish({"n": 1}, routing_key="rp", headers=PUBLISHED)
    get(conn, "rp").reject(requeue=False)
    eventually(lambda: deadletters.count(store) == 1, timeout=30, what="in the dead letters table")
    assert deadletters.replay(store, deadletters.matching(queue="rp")).replayed
    msg = get(conn, "rp")
    msg.headers.pop("x-death", None)  # RabbitMQ's replayed dead letters may carry it too
    assert msg.headers == PUBLISHED
    msg.ack()


@pytest.fixture
def app(pg_url: str, schema: str) -> Iterator[Celery]:
    celery_app = Celery("headers_test", broker=f"akadze+{pg_url}", set_as_current=False)
    celery_app.conf.update(broker_transport_options={"schema": schema}, task_ignore_result=True)
    yield celery_app
    celery_app.close()


@pytest.fixture
def celery_headers() -> Iterator[list[dict[str, Any]]]:
    """The headers Celery hands to the producer, as its before_task_publish signal sees them."""
    seen: list[dict[str, Any]] = []

    def record(headers: dict[str, Any], **_: Any) -> None:
        seen.append(dict(headers))

    before_task_publish.connect(record, weak=False)
    yield seen
    before_task_publish.disconnect(record)


def test_a_celery_task_message_keeps_celerys_headers(
    app: Celery, make_connection: Any, celery_headers: list[dict[str, Any]]
) -> None:
    app.send_task("headers.t", args=(1,), queue="tasks")
    msg = get(make_connection(), "tasks")
    assert_first_delivery(msg, celery_headers[0])
    assert not [k for k in msg.headers if k.startswith("akadze")]
    msg.ack()


def test_a_transactional_enqueue_keeps_celerys_headers(
    app: Celery, pg_url: str, make_connection: Any, celery_headers: list[dict[str, Any]]
) -> None:
    with psycopg.connect(pg_url) as conn:
        outbox.enqueue(conn, "headers.t", (1,), app=app, queue="outboxed")
    msg = get(make_connection(), "outboxed")
    assert_first_delivery(msg, celery_headers[0])
    msg.ack()


def test_a_before_task_publish_handler_republishing_with_its_kwargs_is_not_refused(
    app: Celery, make_connection: Any
) -> None:
    """Celery passes the handler ``signal`` (an object JSON cannot hold) among its kwargs; py-amqp ignores
    publish keywords it does not know, so such a handler works on RabbitMQ and must work here."""
    republished: list[str] = []

    def copy_to_audit(
        body: Any, exchange: str, routing_key: str, headers: dict[str, Any], properties: dict[str, Any], **kwargs: Any
    ) -> None:
        kwargs.pop("sender", None)
        kwargs.pop("declare", None)
        kwargs.pop("retry_policy", None)
        if routing_key != "orders":
            return
        with app.producer_or_acquire() as producer:
            producer.publish(
                body, routing_key="audit", headers=headers, declare=[Queue("audit")], **properties, **kwargs
            )
        republished.append(sorted(kwargs))

    before_task_publish.connect(copy_to_audit, weak=False)
    try:
        app.send_task("headers.order", args=(1,), queue="orders", custom_option=object())
    finally:
        before_task_publish.disconnect(copy_to_audit)
    assert republished
    assert "signal" in republished[0]
    conn = make_connection()
    original, copy = get(conn, "orders"), get(conn, "audit")
    assert copy.body == original.body
    assert copy.headers == original.headers
    assert copy.properties["correlation_id"] == original.properties["correlation_id"]
    assert "signal" not in copy.properties
    original.ack()
    copy.ack()
