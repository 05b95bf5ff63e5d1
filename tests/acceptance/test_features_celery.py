"""Message features seen from Celery with real workers: native delay of far ETAs, priorities, queue caps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kombu import Exchange, Queue

from examples import tasks
from kombu_akadze.errors import QueueFullError
from kombu_akadze.integrations.testing import eventually

from .conftest import Cluster, Tally

QUEUE = "celery"


def test_a_far_countdown_waits_in_the_database_then_runs_once_on_time(cluster: Cluster) -> None:
    options = {"native_delay_threshold": 2}
    app = tasks.make_app(cluster.env(options))
    cluster.apps.append(app)
    eta = datetime.now(UTC) + timedelta(seconds=8)
    app.send_task(tasks.RECORD, args=[1], eta=eta)
    assert cluster.store.message_counts() == {(QUEUE, "delayed"): 1}  # no worker will hold it yet
    cluster.start_worker("a", concurrency=1, env=cluster.env(options))
    eventually(lambda: cluster.table.rows().get(1), timeout=60, what="the delayed task ran")
    done_at = datetime.now(UTC)
    assert done_at >= eta - timedelta(seconds=0.5), "ran before its ETA"
    print(f"\nnative delay: ran {(done_at - eta).total_seconds():.2f} s after its ETA")
    # The task records before it returns; the worker acks after: wait for the ack, do not race it.
    eventually(lambda: cluster.queue_rows() == 0, timeout=30, what="the delayed task's message acked")
    tally = cluster.tally([1], injected="none (countdown beyond native_delay_threshold)")
    assert tally == Tally(sent=1, completed=1, duplicated=0, queued=0, lost=0)


def test_a_high_priority_task_sent_after_a_backlog_runs_first(cluster: Cluster) -> None:
    app = cluster.producer()
    with app.producer_or_acquire() as producer:
        for n in range(200):
            app.send_task(tasks.RECORD, args=[n], priority=0, producer=producer)
        app.send_task(tasks.RECORD, args=[999], priority=9, producer=producer)
    cluster.start_worker("a", pool="solo", concurrency=1)
    eventually(lambda: len(cluster.entries()) >= 4, timeout=60, what="the worker starts tasks")
    first = next(e for e in cluster.entries() if e.event == "start")
    assert first.n == 999
    eventually(lambda: cluster.queue_rows() == 0, timeout=120, what="the backlog drains")
    tally = cluster.tally([*range(200), 999], injected="none (priority 9 after 200 of priority 0)")
    assert tally == Tally(sent=201, completed=201, duplicated=0, queued=0, lost=0)


def test_a_full_queue_with_reject_publish_raises_to_the_caller_and_keeps_its_cap(cluster: Cluster) -> None:
    app = cluster.producer()
    with app.connection_for_write() as conn:
        Queue("capped", max_length=2, queue_arguments={"x-overflow": "reject-publish"})(conn.default_channel).declare()
    app.send_task(tasks.RECORD, args=[1], queue="capped")  # Celery declares "capped" again, plainly
    app.send_task(tasks.RECORD, args=[2], queue="capped")
    with pytest.raises(QueueFullError, match="full"):
        app.send_task(tasks.RECORD, args=[3], queue="capped")
    assert cluster.store.message_counts() == {("capped", "ready"): 2}


def _declare_dead_letter_route(app: Any, *, work_arguments: dict[str, Any], work_ttl: float | None = None) -> None:
    """Queue "work" dead-letters to exchange "parking", whose binding "parked" feeds queue "parked"."""
    parking = Exchange("parking", type="direct")
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        Queue("work", message_ttl=work_ttl, queue_arguments=work_arguments)(channel).declare()
        Queue("parked", exchange=parking, routing_key="parked")(channel).declare()


@pytest.mark.slow
def test_an_expired_task_is_dead_lettered_to_another_queue_where_a_worker_runs_it(cluster: Cluster) -> None:
    app = cluster.producer()
    _declare_dead_letter_route(
        app,
        work_arguments={"x-dead-letter-exchange": "parking", "x-dead-letter-routing-key": "parked"},
        work_ttl=1.0,
    )
    app.send_task(tasks.RECORD, args=[1], queue="work")  # nobody consumes "work": it expires there
    cluster.start_worker("parking", pool="solo", concurrency=1, args=["-Q", "parked"])
    eventually(lambda: cluster.table.rows().get(1), timeout=90, what="the dead-lettered task ran from 'parked'")
    eventually(lambda: cluster.queue_rows() == 0, timeout=30, what="its run acked")
    assert cluster.store.deadletter_list() == [], "a routed dead letter must leave the dead letters table"
    tally = cluster.tally([1], injected="message TTL 1 s on 'work' with x-dead-letter-exchange, no consumer")
    assert tally == Tally(sent=1, completed=1, duplicated=0, queued=0, lost=0)


@pytest.mark.slow
def test_an_over_attempted_task_is_dead_lettered_to_another_queue_not_dropped(cluster: Cluster) -> None:
    app = cluster.producer()
    _declare_dead_letter_route(app, work_arguments={"x-dead-letter-exchange": "parking", "x-max-attempts": 1})
    # No x-dead-letter-routing-key: the original routing key ("work") is kept, so bind that one too.
    with app.connection_for_write() as conn:
        Queue("parked", exchange=Exchange("parking", type="direct"), routing_key="work")(conn.default_channel).declare()
    app.send_task(tasks.SLOW, args=[1, 4.0], queue="work")
    first = cluster.start_worker("first", pool="solo", concurrency=1, args=["-Q", "work"])
    eventually(lambda: cluster.started(1), timeout=60, what="the first worker starts the task")
    first.kill_group()  # its lease dies with it: the rescue spends the only attempt
    cluster.start_worker("parking", pool="solo", concurrency=1, args=["-Q", "parked"])
    eventually(lambda: cluster.table.rows().get(1), timeout=90, what="the dead-lettered task ran from 'parked'")
    eventually(lambda: cluster.queue_rows() == 0, timeout=30, what="its run acked")
    starts = cluster.started(1)
    assert len(starts) == 2, starts
    assert starts[0].pid != starts[1].pid, "the second run is the parking worker's"
    assert cluster.store.deadletter_list() == []
    tally = cluster.tally([1], injected="kill -9 mid-task on a queue with x-max-attempts 1 and a DLX")
    assert tally == Tally(sent=1, completed=1, duplicated=0, queued=0, lost=0)
