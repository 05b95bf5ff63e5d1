"""A real `celery worker` runs what a committed transaction enqueued, and never what was rolled back."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from examples import tasks
from kombu_akadze.integrations import outbox
from kombu_akadze.integrations.testing import eventually

from .conftest import Cluster, Tally


def enqueue_then_fail(conn: psycopg.Connection[Any], app: Any, n: int) -> None:
    with conn.transaction():
        outbox.enqueue(conn, tasks.RECORD, (n,), app=app)
        raise RuntimeError("rolled back")


@pytest.mark.slow
def test_worker_runs_committed_enqueues_once_and_rolled_back_ones_never(cluster: Cluster) -> None:
    app = cluster.producer()
    cluster.start_worker("a", concurrency=2)
    committed = [1, 2, 5]
    with psycopg.connect(cluster.pg_url, autocommit=True) as conn:
        with conn.transaction():
            outbox.enqueue(conn, tasks.RECORD, (1,), app=app)
            outbox.enqueue(conn, tasks.RECORD, (2,), app=app)
            with pytest.raises(RuntimeError):
                enqueue_then_fail(conn, app, 3)  # a savepoint rolled back inside the transaction
            outbox.enqueue(conn, tasks.RECORD, (5,), app=app)
            assert cluster.queue_rows() == 0  # nothing is visible before the commit
        with pytest.raises(RuntimeError):
            enqueue_then_fail(conn, app, 4)  # a whole transaction rolled back

    eventually(lambda: cluster.table.rows().keys() >= set(committed), timeout=60, what="committed tasks ran")
    eventually(lambda: cluster.queue_rows() == 0, timeout=30, what="every message acked")
    assert cluster.table.rows() == dict.fromkeys(committed, 1)
    tally = cluster.tally(committed, injected="nothing: 3 committed; a savepoint and a transaction rolled back")
    assert tally == Tally(sent=3, completed=3, duplicated=0, queued=0, lost=0)
