"""Three real `celery worker -P solo` processes of one host share one LISTEN session (the wake-up relay):
exactly one of them relays; kill -9 of that one leaves the other two consuming, one of them relays in its
place, and every task runs exactly once."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from examples import tasks
from kombu_akadze.consume import relay
from kombu_akadze.integrations.testing import eventually

from .conftest import Cluster, Worker

pytestmark = pytest.mark.skipif(not relay.supported(), reason="the wake-up relay needs Linux's abstract sockets")

HUB_LINE = "LISTENs for the consumers of its host"


def hubs(workers: list[Worker]) -> list[Worker]:
    return [w for w in workers if HUB_LINE in w.output()]


def test_one_worker_of_the_host_relays_and_another_takes_over_when_it_is_killed(cluster: Cluster) -> None:
    workers = [cluster.start_worker(f"r{i}", pool="solo", concurrency=1, args=["--loglevel=INFO"]) for i in range(3)]
    eventually(
        lambda: cluster.store.queue_stats(ttl=30).consumers_alive == 3, timeout=120, what="three workers consuming"
    )
    app = cluster.producer()
    first = range(1, 31)
    for n in first:
        app.send_task(tasks.RECORD, args=[n])
    eventually(lambda: len(first & cluster.table.rows().keys()) == 30, timeout=120, what="the first 30 tasks")
    assert len(hubs(workers)) == 1, "exactly one worker of the host LISTENs for the others"
    (hub,) = hubs(workers)

    os.killpg(hub.pid, signal.SIGKILL)
    hub.proc.wait(60)
    rest = [w for w in workers if w is not hub]
    eventually(lambda: len(hubs(rest)) == 1, timeout=60, what="another worker relays in its place")
    second = range(31, 61)
    for n in second:
        app.send_task(tasks.RECORD, args=[n])
    sent: Any = [*first, *second]
    eventually(lambda: len(set(sent) & cluster.table.rows().keys()) == 60, timeout=120, what="all 60 tasks")
    eventually(lambda: cluster.queue_rows() == 0, timeout=30, what="every run acked")
    tally = cluster.tally(sent, injected="kill -9 of the worker that relayed the host's wake-ups, 3 solo workers")
    assert (tally.completed, tally.duplicated, tally.lost) == (60, 0, 0)
    assert all(w.alive for w in rest)
