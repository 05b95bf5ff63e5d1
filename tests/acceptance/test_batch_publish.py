"""A Celery group fan-out published as one statement runs every task exactly once on a real worker."""

from __future__ import annotations

import time

from celery import group

import kombu_akadze.integrations.batch
from examples import tasks
from kombu_akadze.integrations.testing import eventually

from .conftest import Cluster, Tally

N = 1000


def test_a_group_published_in_one_statement_runs_each_task_once(cluster: Cluster) -> None:
    app = cluster.producer()
    record = app.signature(tasks.RECORD)
    t0 = time.monotonic()
    with app.producer_or_acquire() as producer, kombu_akadze.integrations.batch.publishing(producer):
        group(record.clone(args=(n,)) for n in range(N)).apply_async(producer=producer)
    batched = time.monotonic() - t0
    assert cluster.queue_rows() == N
    t0 = time.monotonic()
    with app.producer_or_acquire() as producer:
        for n in range(N, N + 200):
            record.clone(args=(n,)).apply_async(producer=producer)
    single = (time.monotonic() - t0) / 200 * N
    print(f"\npublish {N} tasks: batched {N / batched:.0f} msgs/s, one by one {N / single:.0f} msgs/s")
    cluster.start_worker("a", concurrency=2)
    eventually(lambda: cluster.queue_rows() == 0, timeout=120, what="every task done")
    tally = cluster.tally(range(N + 200), injected="none (batched publish of a group)")
    assert tally == Tally(sent=N + 200, completed=N + 200, duplicated=0, queued=0, lost=0)
