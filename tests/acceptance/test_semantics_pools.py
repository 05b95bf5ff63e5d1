"""Celery worker semantics, pools and leases: every pool delivers and acks late; long, CPU-bound and ETA tasks
keep their lease (a second worker stands by to rescue, and would run them again, if a lease lapsed)."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from kombu_akadze.integrations.testing import eventually

from .semantics import FENCED, LEASE, Semantics, seconds_since, settle

TTL = LEASE["heartbeat_ttl"]


def _watching_heartbeat(sem: Semantics, pid: int, ages: list[float], done: Callable[[], Any]) -> Callable[[], Any]:
    """done(), noting on every call the age of worker *pid*'s heartbeat into *ages*."""

    def check() -> Any:
        ages.extend(c["age"] for c in sem.consumers() if c["pid"] == pid)
        return done()

    return check


#: gevent is no dev dependency: the case runs where it is installed (psycopg's waits cooperate with gevent's
#: monkey-patched select). eventlet is not covered: psycopg 3 does not cooperate with it.
GEVENT = pytest.param(
    "gevent",
    4,
    marks=pytest.mark.skipif(importlib.util.find_spec("gevent") is None, reason="gevent is not installed"),
)


@pytest.mark.slow
@pytest.mark.parametrize(("pool", "concurrency"), [("prefork", 2), ("threads", 2), ("solo", 1), GEVENT])
def test_pool_delivers_acks_late_and_keeps_the_lease_of_a_task_longer_than_the_ttl(
    sem: Semantics, pool: str, concurrency: int
) -> None:
    app = sem.producer()
    a = sem.start_consuming("a", pool=pool, concurrency=concurrency)
    shorts = list(range(1, 21))
    for key in shorts:
        sem.send(app, "sem.work", key)
    eventually(lambda: len(sem.dones()) >= 20, timeout=90, what=f"20 short tasks done by the {pool} worker")
    eventually(lambda: sem.messages() == [], timeout=30, what="every short task acked")

    long_key, long_seconds = 100, 2.5 * TTL
    sem.send(app, "sem.work", long_key, long_seconds)
    eventually(lambda: sem.starts(long_key), timeout=60, what=f"the {pool} worker starts the long task")
    sem.start_consuming("b")  # a rescuer: it would claim and run the long task again if a's lease lapsed
    held = sem.messages()
    assert [(m["state"], m["run_count"], f":{a.pid}:" in m["owner"]) for m in held] == [("held", 1, True)], (
        "acks late: a running task's message is held by its worker, not deleted"
    )

    ages: list[float] = []
    eventually(
        _watching_heartbeat(sem, a.pid, ages, lambda: sem.dones(long_key)),
        timeout=long_seconds + 60,
        what="the long task finishes",
    )
    eventually(lambda: sem.messages() == [], timeout=30, what="the long task's message acked")

    tally = sem.tally(
        [*shorts, long_key],
        behaviour=f"-P {pool} -c {concurrency}: 20 short tasks, then one of {long_seconds:.0f} s (ttl {TTL} s)",
        oldest_heartbeat_seen=f"{max(ages):.2f} s",
    )
    assert {e.node for e in sem.starts() if e.key in shorts} == {"a"}
    assert [(e.node, e.attempt, e.redelivered) for e in sem.starts(long_key)] == [("a", 1, False)]
    assert (tally.executions, tally.completed, tally.duplicates, tally.lost) == (21, 21, 0, 0)
    assert max(ages) < TTL, "the heartbeat kept the lease alive through the long task"
    assert FENCED not in a.output()
    assert a.warm_shutdown() == 0


@pytest.mark.slow
def test_cpu_bound_task_holding_the_gil_in_a_prefork_child_for_3_ttls_runs_exactly_once(sem: Semantics) -> None:
    app = sem.producer()
    a = sem.start_consuming("a", concurrency=1)
    seconds, chunk = 3 * TTL, TTL + 0.5  # each GIL-holding call outlasts the TTL on its own
    sem.send(app, "sem.spin", 1, seconds, chunk)
    eventually(lambda: sem.starts(1), timeout=60, what="a starts the CPU-bound task")
    sem.start_consuming("b")  # then b stands by, ready to rescue should a's lease lapse
    ages: list[float] = []
    spun = eventually(
        _watching_heartbeat(sem, a.pid, ages, lambda: sem.events("spun", 1)),
        timeout=seconds + 60,
        what="the CPU-bound task finishes",
    )[0]
    eventually(lambda: sem.messages() == [], timeout=30, what="its message acked")

    tally = sem.tally(
        [1],
        behaviour=f"CPU-bound task, {spun.extra['chunks']} GIL-holding calls of ~{chunk} s, ttl {TTL} s",
        cpu_seconds=f"{spun.extra['seconds']:.1f}",
        oldest_heartbeat_seen=f"{max(ages):.2f} s",
    )
    assert spun.extra["seconds"] >= seconds
    assert [(e.node, e.attempt) for e in sem.starts(1)] == [("a", 1)]
    assert (tally.executions, tally.completed, tally.duplicates, tally.lost) == (1, 1, 0, 0)
    assert max(ages) < TTL, "the heartbeat runs in the worker's main process, not in the busy child"


@pytest.mark.slow
def test_threads_pool_task_holding_the_gil_past_the_ttl_loses_its_lease_and_nothing_is_lost(
    sem: Semantics,
) -> None:
    """The documented limit of the in-process pools: the heartbeat thread needs the GIL. A C call that holds it
    longer than heartbeat_ttl silences the worker; another worker rescues and runs the task again; the late ack
    of the first run is fenced. At least once, never lost."""
    app = sem.producer()
    a = sem.start_consuming("a", pool="threads", concurrency=1)
    # Calls holding the GIL for 2.5 x ttl each, on every run, until b has started it: however long b takes
    # to start on a loaded machine, a is silent for over ttl in every call (a single call was over before
    # a slow b was up, and a then finished the task itself).
    sem.send(app, "sem.spin", 1, 0.1, 2.5 * TTL, True)
    eventually(lambda: sem.starts(1), timeout=60, what="a starts the GIL-holding task")
    stalled = time.monotonic()
    b = sem.start_consuming("b")
    again = eventually(lambda: [e for e in sem.starts(1) if e.node == "b"], timeout=60, what="b runs it again")[0]
    redelivery = seconds_since(stalled)
    eventually(lambda: sem.messages() == [], timeout=60, what="b acks it")
    eventually(lambda: FENCED in a.output(), timeout=60, what="a's late ack is fenced")

    tally = sem.tally(
        [1],
        behaviour="-P threads, C calls holding the GIL for 2.5 x ttl each until b runs it",
        redelivery=f"{redelivery:.1f} s",
    )
    assert (again.attempt, again.redelivered) == (2, True)
    assert (tally.executions, tally.completed, tally.duplicates, tally.lost) == (2, 1, 1, 0)
    assert b.alive


@pytest.mark.slow
@pytest.mark.parametrize(
    "threshold",
    [pytest.param(None, id="held-in-worker-memory"), pytest.param(1.0, id="delayed-in-the-database-first")],
)
def test_countdown_tasks_waiting_longer_than_the_ttl_run_once_at_or_after_their_eta(
    sem: Semantics, threshold: float | None
) -> None:
    """Below native_delay_threshold (default 60 s) Celery holds an ETA message in worker memory, leased; above
    it the message waits in the database as 'delayed' and is claimed that long before it is due."""
    options = {} if threshold is None else {"native_delay_threshold": threshold}
    app = sem.producer(transport_options=options)
    sem.start_consuming("a", concurrency=1, transport_options=options)
    sem.start_consuming("b", concurrency=1, transport_options=options)
    countdown = 3 * TTL
    sent_at = time.time()
    keys = [1, 2, 3]
    for key in keys:
        sem.send(app, "sem.work", key, countdown=countdown)
    waiting = "held" if threshold is None else "delayed"
    settle(
        lambda: [m["state"] for m in sem.messages()],
        [waiting] * 3,
        what=f"the 3 ETA messages wait, {waiting}",
    )
    eventually(lambda: len(sem.dones()) == 3, timeout=countdown + 60, what="the 3 ETA tasks ran")
    eventually(lambda: sem.messages() == [], timeout=30, what="their messages acked")

    starts = sem.starts()
    late = [e.t - datetime.fromisoformat(str(e.eta)).timestamp() for e in starts]
    tally = sem.tally(
        keys,
        behaviour=f"countdown={countdown:.0f} s (3 x ttl), 2 workers, waiting {waiting}",
        waited=f"{min(e.t for e in starts) - sent_at:.1f} s",
        started_after_eta=", ".join(f"{d * 1000:.0f} ms" for d in late),
    )
    assert sorted(e.key for e in starts) == keys, "each ETA task ran exactly once"
    assert {(e.attempt, e.redelivered) for e in starts} == {(1, False)}, "never rescued while waiting for its ETA"
    assert min(late) >= 0, "no task starts before its ETA"
    assert min(e.t for e in starts) - sent_at >= countdown
    assert (tally.executions, tally.completed, tally.duplicates, tally.lost) == (3, 3, 0, 0)
