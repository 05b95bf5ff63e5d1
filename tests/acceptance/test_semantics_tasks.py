"""Celery task features on kombu-akadze: retry with countdown, autoretry_for, soft and hard time limits,
acks_on_failure_or_timeout, revoke of a queued task through `celery control`, and a chain, a group and a chord
with a `db+postgresql` result backend on the same server."""

from __future__ import annotations

import socket
from datetime import datetime
from typing import Any

import pytest
from celery import chain, chord, group

from kombu_akadze.integrations.testing import eventually

from .semantics import EXHAUSTED, QUEUE, REJECTED, Semantics, settle

MAX3 = {"max_attempts": 3}


def _node(name: str) -> str:
    """The node name of worker *name* (started as ``-n name@%h``)."""
    return f"{name}@{socket.gethostname()}"


def _task_rows(sem: Semantics) -> list[dict[str, Any]]:
    """Rows of the task queue (not the pidbox queues of `celery control`)."""
    return [m for m in sem.messages() if m["queue"] == QUEUE]


def _eta(value: str | None) -> float:
    assert value is not None, "a retried run carries the ETA of its countdown"
    return datetime.fromisoformat(value).timestamp()


def test_retry_with_countdown_and_autoretry_for_run_again_after_the_countdown_until_they_succeed(
    sem: Semantics,
) -> None:
    app = sem.producer()
    sem.start_consuming("a", concurrency=2)
    sem.send(app, "sem.retrying", 1, 2, 1.0)  # self.retry(countdown=1) twice, then success
    sem.send(app, "sem.flaky", 2, 2)  # FlakyError twice (autoretry_for, countdown 1), then success
    eventually(lambda: len(sem.dones()) == 2, timeout=60, what="both tasks succeed after 2 retries")
    eventually(lambda: sem.messages() == [], timeout=30, what="every retry message acked")

    gaps = {k: [b.t - a.t for a, b in zip(sem.starts(k), sem.starts(k)[1:], strict=False)] for k in (1, 2)}
    tally = sem.tally(
        [1, 2],
        behaviour="self.retry(countdown=1) x2 and autoretry_for (countdown 1) x2",
        gaps_between_runs=", ".join(f"{g:.2f}" for k in (1, 2) for g in gaps[k]) + " s",
    )
    for key in (1, 2):
        runs = sem.starts(key)
        assert [e.retries for e in runs] == [0, 1, 2]
        assert len({e.message_id for e in runs}) == 3, "Celery publishes each retry as a new message"
        assert {(e.attempt, e.redelivered) for e in runs} == {(1, False)}
        assert all(e.t >= _eta(e.eta) for e in runs[1:]), "a retry never runs before its countdown"
        assert min(gaps[key]) >= 1.0
    assert (tally.executions, tally.completed, tally.duplicates, tally.dead, tally.lost) == (6, 2, 0, 0, 0)


@pytest.mark.slow
def test_time_limits_and_acks_on_failure_or_timeout(sem: Semantics) -> None:
    app = sem.producer(transport_options=MAX3)
    a = sem.start_consuming("a", concurrency=2, transport_options=MAX3)
    sem.send(app, "sem.soft", 1, 5.0, soft_time_limit=1)  # catches SoftTimeLimitExceeded, then succeeds
    sem.send(app, "sem.work", 2, 5.0, time_limit=1)  # hard limit: child killed, Celery acks (acks_on_timeout)
    sem.send(app, "sem.strict", 3, 5.0, time_limit=1)  # acks_on_failure_or_timeout=False: requeued on timeout
    sem.send(app, "sem.strict", 4, kwargs={"fail": True})  # acks_on_failure_or_timeout=False: rejected
    sem.send(app, "sem.fail", 5)  # default: the failure is acked
    eventually(lambda: len(sem.dead_keys()) == 2, timeout=90, what="tasks 3 and 4 in dead letters")
    eventually(lambda: sem.messages() == [], timeout=30, what="nothing left held or ready")

    dead = sem.dead_keys()
    tally = sem.tally(
        [1, 2, 3, 4, 5],
        behaviour="soft limit caught; hard limit (acked); hard limit and failure with acks_on_failure_or_timeout=False;"
        " plain failure (acked)",
        acked_by_celery=[2, 5],
        runs_of_3=len(sem.starts(3)),
    )
    assert [e.event for e in sem.events(key=1)] == ["start", "soft_limit", "done"]
    assert [e.attempt for e in sem.starts(2)] == [1], "hard time limit, acked by Celery: never run again"
    assert "Hard time limit (1" in a.output()
    assert [e.attempt for e in sem.starts(3)] == [1, 2, 3], "timeout without ack: requeued until max_attempts"
    assert (dead[3]["reason"], dead[3]["attempts"]) == (EXHAUSTED, 3)
    assert [e.attempt for e in sem.starts(4)] == [1]
    assert (dead[4]["reason"], dead[4]["attempts"]) == (REJECTED, 1)
    assert [e.attempt for e in sem.starts(5)] == [1]
    assert set(dead) == {3, 4}
    assert (tally.executions, tally.completed, tally.duplicates, tally.dead, tally.lost) == (7, 1, 0, 2, 0)


def test_celery_control_revoke_of_a_queued_task_discards_it_when_a_worker_gets_it(sem: Semantics) -> None:
    app = sem.producer()
    a = sem.start_consuming("a", concurrency=1, args=["--loglevel=INFO"])
    sem.send(app, "sem.work", 1, 3.0)
    eventually(lambda: sem.starts(1), timeout=60, what="a runs task 1")
    revoked = sem.send(app, "sem.work", 2)
    sem.send(app, "sem.work", 3)
    queued = {m["task_id"]: m["state"] for m in sem.messages()}
    assert queued[revoked] == "ready", "prefetch 1: task 2 waits in the queue table, not in the worker"

    out = sem.control("control", "revoke", revoked, "--timeout", "10", "-d", _node("a"))
    print(out.stdout, out.stderr)
    assert out.returncode == 0
    assert revoked in out.stdout
    eventually(lambda: sem.dones(3), timeout=60, what="task 3 runs after task 1")
    eventually(lambda: _task_rows(sem) == [], timeout=30, what="the revoked message is consumed and acked")
    settle(lambda: len(sem.messages()), 0, what="the revoke broadcast and its reply are gone too")

    tally = sem.tally([1, 2, 3], behaviour="`celery control revoke` of a queued task", acked_by_celery=[2])
    assert sem.starts(2) == [], "a revoked task never runs"
    assert f"Discarding revoked task: sem.work[{revoked}]" in a.output()
    assert sem.dead_keys() == {}
    assert (tally.executions, tally.completed, tally.lost) == (2, 2, 0)


NO_ROWS: list[tuple[str, str, int]] = []


def _all_rows(sem: Semantics) -> list[tuple[str, str, int]]:
    """(queue, state, run_count) of every row: task queue, pidbox and reply queues alike."""
    return [(m["queue"], m["state"], m["run_count"]) for m in sem.messages()]


@pytest.mark.slow
def test_control_broadcasts_leave_no_row_behind_and_are_not_replayed_to_a_restarted_worker(sem: Semantics) -> None:
    """Celery's pidbox consumes with no_ack: a broadcast row must go at delivery (as RabbitMQ forgets it), or it
    stays held, is rescued once the worker is gone and replays to the next worker of the same name."""
    a = sem.start_consuming("a", concurrency=1)
    ping = sem.control("inspect", "ping", "--timeout", "10", "-d", _node("a"))
    assert "pong" in ping.stdout, ping.stdout + ping.stderr
    settle(lambda: _all_rows(sem), NO_ROWS, what="neither the ping broadcast nor its reply stays in a queue")

    sem.control("control", "shutdown", "--timeout", "2", "-d", _node("a"))
    assert sem.wait_exit(a) == 0, "`celery control shutdown` stops worker a"
    left = _all_rows(sem)

    again = sem.start_consuming("a", concurrency=1)
    pong = sem.control("inspect", "ping", "--timeout", "10", "-d", _node("a"))
    settle(lambda: _all_rows(sem), NO_ROWS, what="nothing left after the second ping either")
    print(
        f"\nbehaviour: `celery inspect ping`, `celery control shutdown`, restart, ping again\nrows after the "
        f"shutdown: {left}\nrestarted worker answers: {'pong' in pong.stdout}, alive: {again.alive}"
    )
    assert left == [], "a message delivered to a no_ack consumer is gone, as on RabbitMQ"
    assert "pong" in pong.stdout
    assert again.alive, "the restarted worker was not shut down by its predecessor's broadcast"
    assert again.warm_shutdown() == 0


def test_chain_group_and_chord_with_a_postgresql_result_backend(sem: Semantics) -> None:
    url = sem.cluster.pg_url.replace("postgresql://", "postgresql+psycopg://", 1)
    conf = {
        "result_backend": f"db+{url}",
        "task_ignore_result": False,
        "database_table_schemas": {"task": sem.cluster.schema, "group": sem.cluster.schema},
    }
    app = sem.producer(conf=conf)
    assert type(app.backend).__name__ == "DatabaseBackend"  # creates the result tables before any worker
    sem.start_consuming("a", concurrency=2, conf=conf)

    def add(x: int, y: int | None = None) -> object:
        return app.signature("sem.add", args=(x,) if y is None else (x, y))

    chained = chain(add(1, 2), add(3), add(4)).apply_async()
    grouped = group(add(i, i) for i in range(5)).apply_async()
    chorded = chord([add(i, i) for i in range(5)], app.signature("sem.tsum")).apply_async()
    results = (chained.get(timeout=60), grouped.get(timeout=60), chorded.get(timeout=60))
    eventually(lambda: sem.messages() == [], timeout=30, what="every canvas message acked (chord_unlock too)")

    print(f"\nbehaviour: chain, group, chord with result backend db+postgresql+psycopg\nresults: {results}")
    assert results == (10, [0, 2, 4, 6, 8], 20)
    assert sem.dead() == []
