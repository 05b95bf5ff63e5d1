"""Celery routing and prefetch on kombu-akadze: -Q a,b with task_routes, worker_prefetch_multiplier 1 and 4 (what
a worker holds), and the prefetch fairness arithmetic of two workers and six uneven tasks."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from kombu_akadze.integrations.testing import eventually

from .semantics import QUEUE, Semantics

ROUTES = {"task_routes": {"sem.route_a": {"queue": "a"}, "sem.route_b": {"queue": "b"}}}


def _counts(sem: Semantics) -> dict[tuple[str, str], int]:
    return dict(Counter((m["queue"], m["state"]) for m in sem.messages() if m["queue"] in ("a", "b", QUEUE)))


@pytest.mark.slow
def test_task_routes_put_tasks_in_their_queues_and_workers_consume_only_the_queues_they_are_given(
    sem: Semantics,
) -> None:
    app = sem.producer(conf=ROUTES)
    for key in range(1, 11):
        sem.send(app, "sem.route_a", key)
    for key in range(11, 21):
        sem.send(app, "sem.route_b", key)
    assert _counts(sem) == {("a", "ready"): 10, ("b", "ready"): 10}, "task_routes picked the queue of each task"

    ab = sem.start_consuming("ab", concurrency=2, args=["-Q", "a,b"], conf=ROUTES)
    eventually(lambda: len(sem.dones()) == 20, timeout=60, what="the -Q a,b worker drains both queues")
    eventually(lambda: sem.messages() == [], timeout=30)
    assert ab.warm_shutdown() == 0

    sem.start_consuming("b", concurrency=1, args=["-Q", "b"], conf=ROUTES)
    for key in range(21, 26):
        sem.send(app, "sem.route_a", key)
    for key in range(26, 31):
        sem.send(app, "sem.route_b", key)
    eventually(lambda: len(sem.dones()) == 25, timeout=60, what="the -Q b worker runs the 5 new b tasks")
    eventually(lambda: _counts(sem) == {("a", "ready"): 5}, timeout=30, what="the 5 new a tasks wait in queue a")

    tally = sem.tally(range(1, 31), behaviour="task_routes a/b; worker -Q a,b, then a worker -Q b only")
    ran = {e.key: (e.node, e.routing_key) for e in sem.starts()}
    assert {ran[k] for k in range(1, 11)} == {("ab", "a")}
    assert {ran[k] for k in range(11, 21)} == {("ab", "b")}
    assert {ran[k] for k in range(26, 31)} == {("b", "b")}
    assert not any(k in ran for k in range(21, 26)), "nobody consumes queue a any more"
    assert (tally.executions, tally.completed, tally.duplicates, tally.queued, tally.lost) == (25, 25, 0, 5, 0)


@pytest.mark.parametrize("multiplier", [1, 4])
def test_prefetch_multiplier_bounds_what_a_worker_holds(sem: Semantics, multiplier: int) -> None:
    app = sem.producer()
    keys = list(range(1, 7))
    for key in keys:
        sem.send(app, "sem.work", key, 0.5)
    sem.start_consuming("a", concurrency=1, args=["--prefetch-multiplier", str(multiplier)])
    held: list[int] = []

    def drained() -> bool:
        counts = _counts(sem)
        held.append(counts.get((QUEUE, "held"), 0))
        return len(sem.dones()) == len(keys)

    eventually(drained, timeout=60, what="the 6 tasks done")
    eventually(lambda: sem.messages() == [], timeout=30)

    tally = sem.tally(
        keys,
        behaviour=f"-c 1 --prefetch-multiplier {multiplier}, 6 tasks of 0.5 s",
        most_held=max(held),
        samples=len(held),
    )
    assert max(held) == multiplier, f"the worker holds up to concurrency x multiplier = {multiplier} messages"
    assert (tally.executions, tally.completed, tally.duplicates, tally.lost) == (6, 6, 0, 0)


@pytest.mark.slow
def test_prefetch_1_spreads_uneven_tasks_over_two_workers_13_units_not_21(sem: Semantics) -> None:
    unit = 0.4
    units = [10, 1, 1, 1, 10, 1]
    app = sem.producer()
    sem.start_consuming("a", concurrency=1, args=["--prefetch-multiplier", "1"])
    sem.start_consuming("b", concurrency=1, args=["--prefetch-multiplier", "1"])
    for key, n in enumerate(units, start=1):
        sem.send(app, "sem.work", key, n * unit)
    eventually(lambda: len(sem.dones()) == len(units), timeout=60, what="the 6 tasks done")
    eventually(lambda: sem.messages() == [], timeout=30)

    starts, dones = sem.starts(), sem.dones()
    makespan = (max(e.t for e in dones) - min(e.t for e in starts)) / unit
    schedule: dict[str, list[Any]] = {}
    for e in sorted(starts, key=lambda e: e.t):
        schedule.setdefault(e.node, []).append(units[e.key - 1])
    tally = sem.tally(
        range(1, 7),
        behaviour="2 workers -c 1 prefetch 1, tasks of 10,1,1,1,10,1 units (1 unit = 0.4 s)",
        makespan=f"{makespan:.1f} units ({makespan * unit:.1f} s; round-robin prefetch: 21, ideal: 13)",
        schedule=schedule,
    )
    long_nodes = {e.node for e in starts if units[e.key - 1] == 10}
    assert long_nodes == {"a", "b"}, "the two long tasks went to different workers"
    assert makespan < 16, "well under the 21 units of a worker that prefetched both long tasks"
    assert (tally.executions, tally.completed, tally.duplicates, tally.lost) == (6, 6, 0, 0)
