"""Real `celery worker` processes on kombu-akadze: a clean run, kill -9, warm shutdown, the broker_transport form."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import pytest

from examples import tasks
from kombu_akadze.integrations.testing import eventually

from .conftest import FAST_WORKER, ROOT, Cluster, Tally, Worker

QUEUE = "celery"


def test_example_app_leaves_the_alias_to_the_celery_entry_point() -> None:
    probe = "import sys, examples.tasks; print('kombu_akadze' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.slow
def test_prefork_worker_runs_200_tasks_exactly_once_each(cluster: Cluster) -> None:
    app = cluster.producer()
    worker = cluster.start_worker("a", pool="prefork", concurrency=2)
    sent = range(200)
    for n in sent:
        app.send_task(tasks.RECORD, args=[n])

    eventually(lambda: cluster.table.progress().done >= 200, timeout=120, what="200 record tasks done")
    eventually(lambda: cluster.queue_rows() == 0, timeout=30, what="every message acked: the queue table is empty")

    tally = cluster.tally(sent, injected="nothing (clean run, prefork -c 2, acks_late)")
    assert tally == Tally(sent=200, completed=200, duplicated=0, queued=0, lost=0)
    assert cluster.store.message_counts() == {}
    assert sum(1 for e in cluster.entries() if e.event == "done") == 200
    assert worker.alive


@pytest.mark.slow
def test_kill_9_of_the_worker_group_mid_task_redelivers_to_another_worker(cluster: Cluster) -> None:
    ttl, rescue = FAST_WORKER["heartbeat_ttl"], FAST_WORKER["rescue_interval"]
    app = cluster.producer()
    a = cluster.start_worker("a", concurrency=1)
    app.send_task(tasks.SLOW, args=[1, 60])  # 60 s on the first attempt, at once on later ones
    first = eventually(lambda: cluster.started(1), timeout=60, what="worker a starts slow(1)")[0]

    a.kill_group()
    killed_at = time.monotonic()
    b = cluster.start_worker("b", concurrency=1)
    again = eventually(
        lambda: [e for e in cluster.started(1) if e.pid != first.pid],
        timeout=ttl + rescue + 60,
        what="slow(1) runs again, on worker b",
    )[0]
    redelivery = time.monotonic() - killed_at
    eventually(lambda: cluster.table.rows().get(1), timeout=30, what="worker b records 1")
    eventually(lambda: cluster.queue_rows() == 0, timeout=30, what="worker b acks the redelivered message")

    tally = cluster.tally([1], injected="SIGKILL to worker a's whole process group while slow(1) ran")
    print(
        f"redelivery: {redelivery:.2f} s from the kill to worker b's start (heartbeat_ttl {ttl} s, rescue {rescue} s)"
    )
    assert (first.attempt, again.attempt) == (1, 2)  # the lost run spent its attempt
    assert redelivery < ttl + rescue + 30
    assert tally == Tally(sent=1, completed=1, duplicated=0, queued=0, lost=0)
    assert b.warm_shutdown() == 0


@pytest.mark.slow
def test_warm_shutdown_releases_held_unstarted_messages_in_place(cluster: Cluster) -> None:
    app = cluster.producer()
    for n in (1, 2, 3):  # held by the worker until their ETA, never started: Celery's prefetched messages
        app.send_task(tasks.RECORD, args=[n], countdown=45)  # under native_delay_threshold (60 s)
    app.send_task(tasks.SLOW, args=[4, 4])
    a = cluster.start_worker("a", concurrency=1)
    eventually(lambda: cluster.started(4), timeout=60, what="worker a starts slow(4)")
    eventually(
        lambda: cluster.store.message_counts() == {(QUEUE, "held"): 4},
        timeout=30,
        what="worker a holds all 4 messages: slow(4) running, 3 waiting for their ETA",
    )

    assert a.warm_shutdown() == 0

    tally = cluster.tally([1, 2, 3, 4], injected="SIGTERM (warm shutdown) with 1 task running and 3 held for their ETA")
    assert tally == Tally(sent=4, completed=1, duplicated=0, queued=3, lost=0), "the running task finishes once"
    assert [e.n for e in cluster.entries() if e.event == "start"] == [4]
    assert _shape(cluster.message_rows(4)) == [
        (1, "ready", None, 1, 0),
        (2, "ready", None, 1, 0),
        (3, "ready", None, 1, 0),
    ]
    assert cluster.queue_rows() == 3, "released in place: no copies"

    b = cluster.start_worker("b", concurrency=1)
    eventually(
        lambda: _shape(cluster.message_rows(4)) == [(i, "held", True, 2, 1) for i in (1, 2, 3)],
        timeout=60,
        what="worker b claims the 3 released messages again, as their first attempt",
    )
    assert b.warm_shutdown() == 0
    assert _shape(cluster.message_rows(4)) == [
        (1, "ready", None, 2, 0),
        (2, "ready", None, 2, 0),
        (3, "ready", None, 2, 0),
    ]
    tally = cluster.tally([1, 2, 3, 4], injected="a second warm shutdown (worker b) while holding them")
    assert tally == Tally(sent=4, completed=1, duplicated=0, queued=3, lost=0)
    assert [e.n for e in cluster.entries() if e.event == "start"] == [4]


def _shape(rows: list[dict[str, Any]]) -> list[tuple[int, str, bool | None, int, int]]:
    """(id, state, held by someone, run_count, attempts) of each message row."""
    return [(r["id"], r["state"], r["owner"] and True, r["run_count"], r["attempts"]) for r in rows]


def test_broker_transport_setting_with_a_plain_postgresql_url_runs_a_worker(cluster: Cluster) -> None:
    form = {"AKADZE_BROKER_TRANSPORT": "kombu_akadze.transport:Transport"}
    app = cluster.producer(**form)
    assert app.conf.broker_url.startswith("postgresql://")
    with app.connection_for_write() as conn:
        assert type(conn.transport).__module__ == "kombu_akadze.transport.transport"
    worker = cluster.start_worker("a", concurrency=1, env=cluster.env(**form))
    for n in range(20):
        app.send_task(tasks.RECORD, args=[n])

    eventually(lambda: cluster.table.progress().done == 20, timeout=60, what="20 record tasks done")
    eventually(lambda: cluster.queue_rows() == 0, timeout=30, what="every message acked")
    assert cluster.tally(range(20), injected="nothing") == Tally(sent=20, completed=20, duplicated=0, queued=0, lost=0)
    assert worker.warm_shutdown() == 0


@pytest.mark.slow
def test_warm_shutdown_of_a_solo_worker_leaves_nothing_held_and_runs_nothing_twice(cluster: Cluster) -> None:
    a = _solo_worker_holding_4(cluster)
    assert a.warm_shutdown() == 0
    rows = cluster.message_rows(4)
    done = cluster.table.rows()
    tally = cluster.tally([1, 2, 3, 4], injected="SIGTERM to a solo worker with 1 task running and 3 prefetched")
    assert [r["id"] for r in rows if r["state"] == "held"] == [], "held by a worker that is gone: rescued, run again"
    assert [r["id"] for r in rows if r["id"] in done] == [], "completed, yet still queued: it will run again"

    cluster.start_worker("b", pool="solo", concurrency=1)
    eventually(lambda: cluster.queue_rows() == 0, timeout=60, what="worker b drains what worker a left")
    tally = cluster.tally([1, 2, 3, 4], injected="nothing more: worker b drains what worker a left")
    assert tally == Tally(sent=4, completed=4, duplicated=0, queued=0, lost=0)


# -- prompt claims and warm shutdown of a solo worker -------------------------------------------------------


@pytest.mark.slow
def test_prefork_worker_claims_the_next_message_when_a_slot_frees_not_at_the_next_poll(cluster: Cluster) -> None:
    poll = 5.0
    app = cluster.producer()
    for n in range(10):
        app.send_task(tasks.RECORD, args=[n])
    cluster.start_worker("a", concurrency=1, env=cluster.env({"poll_interval": poll}))
    eventually(lambda: cluster.started(0), timeout=60, what="worker a starts the first task")
    eventually(
        lambda: cluster.table.progress().done == 10,
        timeout=poll,
        what=f"10 short tasks done within one poll_interval ({poll} s) of the first start",
    )


@pytest.mark.slow
def test_warm_shutdown_of_a_solo_worker_releases_prefetched_messages(cluster: Cluster) -> None:
    a = _solo_worker_holding_4(cluster)
    assert a.warm_shutdown() == 0
    cluster.tally([1, 2, 3, 4], injected="SIGTERM to a solo worker with 1 task running and 3 prefetched")
    assert [e.n for e in cluster.entries() if e.event == "start"] == [1], "prefetched messages must not start"


def _solo_worker_holding_4(cluster: Cluster) -> Worker:
    """A solo worker with prefetch 4 that runs slow(1) (3 s) and holds record(2..4), ids 1..4 in order."""
    app = cluster.producer()
    app.send_task(tasks.SLOW, args=[1, 3])
    for n in (2, 3, 4):
        app.send_task(tasks.RECORD, args=[n])
    a = cluster.start_worker("a", pool="solo", concurrency=1, args=["--prefetch-multiplier", "4"])
    eventually(lambda: cluster.started(1), timeout=60, what="worker a starts slow(1)")
    eventually(
        lambda: cluster.store.message_counts() == {(QUEUE, "held"): 4},
        timeout=30,
        what="worker a holds all 4 messages: slow(1) running, 3 prefetched",
    )
    return a
