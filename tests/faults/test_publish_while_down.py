"""A publish while PostgreSQL is down raises to the caller (kombu and Celery alike), never a silent
success; once the server is back the same producer publishes again, and only what succeeded is stored."""

from __future__ import annotations

import time

import kombu
import pytest
from kombu.exceptions import OperationalError

from kombu_akadze.errors import TransientDatabaseError

from .checker import verdict
from .conftest import SCHEMA, Faults
from .jobs import TOUCH

QUEUE = "celery"


@pytest.mark.slow
def test_publish_while_the_database_is_down_raises_and_stores_nothing(own: Faults) -> None:
    server = own.server
    assert server is not None
    celery_app = own.producer()
    celery_app.send_task(TOUCH, args=[0])  # connected, its session open
    fresh_app = own.producer()  # never connected before the outage
    conn = kombu.Connection(f"akadze+{server.url()}", transport_options={"schema": SCHEMA})
    producer = conn.Producer()
    producer.publish({"n": 1}, routing_key=QUEUE, retry=False)
    assert own.queued() == 2

    server.stop("immediate")
    # Celery retries a few times (its default retry policy), then raises kombu's OperationalError.
    began = time.monotonic()
    with pytest.raises(OperationalError):
        celery_app.send_task(TOUCH, args=[100])
    celery_raised_after = time.monotonic() - began
    with pytest.raises(OperationalError):
        fresh_app.send_task(TOUCH, args=[101])
    with pytest.raises(OperationalError):
        celery_app.send_task(TOUCH, args=[102], retry=False)
    # kombu without retry: the transport's own error, a ConnectionError kombu knows to recover from.
    with pytest.raises(TransientDatabaseError) as raised:
        producer.publish({"n": 103}, routing_key=QUEUE, retry=False)
    assert isinstance(raised.value, ConnectionError)
    assert "transient database error" in str(raised.value)
    with pytest.raises(OperationalError):
        producer.publish({"n": 104}, routing_key=QUEUE, retry=True, retry_policy={"max_retries": 2})
    attempts = 5

    server.start()
    back = time.monotonic()
    celery_app.send_task(TOUCH, args=[2])  # the same Celery apps reconnect by themselves
    fresh_app.send_task(TOUCH, args=[4])
    recovery = time.monotonic() - back
    conn.release()
    assert own.queued() == 4, "a publish that raised must not have stored a message"

    own.start_worker("a", concurrency=2)
    own.until(lambda: own.ledgers.all_done([0, 2, 4]), timeout=90, what="the Celery tasks run")
    result = verdict(
        "publish while postgres is down",
        injected=f"{attempts} publishes with the server stopped (all raised)",
        published=[0, 2, 4],
        ledgers=own.ledgers,
        recovery=recovery,
    )
    print(f"Celery's send_task raised after {celery_raised_after:.2f} s (its default retry policy)")
    assert result.lost == 0
    assert {r.n for r in own.ledgers.runs()} == {0, 2, 4}


@pytest.mark.slow
def test_a_kombu_producer_publishes_again_after_an_outage_that_outlasted_its_retries(own: Faults) -> None:
    server = own.server
    assert server is not None
    with kombu.Connection(f"akadze+{server.url()}", transport_options={"schema": SCHEMA}) as conn:
        producer = conn.Producer()
        producer.publish({"n": 1}, routing_key=QUEUE, retry=True)
        server.stop("immediate")
        with pytest.raises(OperationalError):
            producer.publish({"n": 2}, routing_key=QUEUE, retry=True, retry_policy={"max_retries": 1})
        server.start()
        back = time.monotonic()
        # The channel kombu closed in the failed retry answers with a connection error, so this
        # retry reconnects and revives the producer on a new channel.
        producer.publish({"n": 3}, routing_key=QUEUE, retry=True, retry_policy={"max_retries": 5})
        recovery = time.monotonic() - back
    assert own.queued() == 2
    verdict(
        "kombu producer after an outage longer than its retries",
        injected="1 immediate stop during a publish with max_retries=1",
        published=[],
        ledgers=own.ledgers,
        recovery=recovery,
    )
