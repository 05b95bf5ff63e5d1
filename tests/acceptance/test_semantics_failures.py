"""Celery worker semantics of lost children and rejections: task_reject_on_worker_lost both ways, Reject with and
without requeue, and a poison message that kills its pool child on every attempt."""

from __future__ import annotations

import pytest

from kombu_akadze.integrations.testing import eventually

from .semantics import EXHAUSTED, REJECTED, Semantics

#: Short requeue loops: a message that ran 3 times goes to dead letters.
MAX3 = {"max_attempts": 3}


def test_reject_on_worker_lost_requeues_a_message_whose_child_was_killed_and_it_runs_again(sem: Semantics) -> None:
    app = sem.producer()
    a = sem.start_consuming("a", concurrency=1, conf={"task_reject_on_worker_lost": True})
    sem.send(app, "sem.suicide", 1, [1])  # SIGKILL of its own pool child on attempt 1
    eventually(lambda: sem.dones(1), timeout=60, what="the task runs again and finishes")
    eventually(lambda: sem.messages() == [], timeout=30, what="its second run is acked")

    tally = sem.tally([1], behaviour="task_reject_on_worker_lost=True, pool child SIGKILLed on attempt 1")
    assert [(e.attempt, e.redelivered, e.message_id) for e in sem.starts(1)] == [(1, False, 1), (2, True, 1)], (
        "requeued in place (same message id), the lost run's attempt spent"
    )
    assert "WorkerLostError" in a.output()
    assert (tally.executions, tally.completed, tally.duplicates, tally.dead, tally.lost) == (2, 1, 0, 0, 0)


@pytest.mark.parametrize("acks_on_failure", [True, False])
def test_without_reject_on_worker_lost_celery_decides_the_fate_of_a_lost_child_never_the_broker(
    sem: Semantics, acks_on_failure: bool
) -> None:
    """task_reject_on_worker_lost=False: Celery acks the message and records a failure (acks_on_failure, the
    default), or rejects it without requeue (acks_on_failure=False), which buries it in dead letters."""
    conf = {"task_reject_on_worker_lost": False, "task_acks_on_failure": acks_on_failure}
    app = sem.producer()
    a = sem.start_consuming("a", concurrency=1, conf=conf)
    sem.send(app, "sem.suicide", 1, [1])
    sem.send(app, "sem.work", 2)  # the worker goes on with the next message
    eventually(lambda: sem.dones(2), timeout=60, what="the next task runs")
    eventually(lambda: sem.messages() == [], timeout=30, what="nothing left held or ready")

    dead = sem.dead_keys()
    tally = sem.tally(
        [1, 2],
        behaviour=f"task_reject_on_worker_lost=False, task_acks_on_failure={acks_on_failure}, child SIGKILLed",
        acked_by_celery=[1] if acks_on_failure else [],
        dead_letter_reason=dead[1]["reason"] if 1 in dead else None,
    )
    assert "WorkerLostError" in a.output()
    assert [e.attempt for e in sem.starts(1)] == [1], "never run again"
    if acks_on_failure:
        assert dead == {}, "Celery acked it (a failure result), so the broker deleted it: Celery's choice"
    else:
        assert list(dead) == [1]
        assert (dead[1]["reason"], dead[1]["attempts"]) == (REJECTED, 1)
    assert (tally.executions, tally.completed, tally.duplicates, tally.lost) == (2, 1, 0, 0)


def test_reject_without_requeue_buries_and_reject_with_requeue_loops_until_max_attempts(sem: Semantics) -> None:
    app = sem.producer()
    sem.start_consuming("a", concurrency=1, transport_options=MAX3)
    sem.send(app, "sem.reject", 1, False)
    sem.send(app, "sem.reject", 2, True)
    eventually(lambda: len(sem.dead_keys()) == 2, timeout=60, what="both rejected messages in dead letters")
    eventually(lambda: sem.messages() == [], timeout=30)

    dead = sem.dead_keys()
    tally = sem.tally(
        [1, 2],
        behaviour="Reject(requeue=False) and Reject(requeue=True) with max_attempts=3",
        reasons=f"{dead[1]['reason']!r} / {dead[2]['reason']!r}",
    )
    assert [e.attempt for e in sem.starts(1)] == [1]
    assert (dead[1]["reason"], dead[1]["attempts"]) == (REJECTED, 1)
    assert [(e.attempt, e.redelivered) for e in sem.starts(2)] == [(1, False), (2, True), (3, True)]
    assert (dead[2]["reason"], dead[2]["attempts"]) == (EXHAUSTED, 3)
    assert (tally.executions, tally.completed, tally.dead, tally.lost) == (4, 0, 2, 0)


@pytest.mark.slow
def test_poison_message_killing_its_child_runs_max_attempts_times_then_dies_while_others_flow(
    sem: Semantics,
) -> None:
    app = sem.producer()
    a = sem.start_consuming("a", concurrency=2, transport_options=MAX3, conf={"task_reject_on_worker_lost": True})
    sem.send(app, "sem.suicide", 1, None, 1.0)  # SIGKILL of its pool child on every attempt, after 1 s
    others = list(range(10, 40))
    for key in others:
        sem.send(app, "sem.work", key, 0.2)
    eventually(lambda: sem.dead_keys().get(1), timeout=90, what="the poison message reaches dead letters")
    eventually(lambda: len(sem.dones()) == len(others), timeout=90, what="every other task done")
    eventually(lambda: sem.messages() == [], timeout=30)

    poison = sem.starts(1)
    first, last = poison[0].t, poison[-1].t
    meanwhile = [e for e in sem.dones() if first < e.t < last]
    dead = sem.dead_keys()[1]
    tally = sem.tally(
        [1, *others],
        behaviour="poison message (kills its child every time), max_attempts=3, 30 other tasks, -c 2",
        poison_runs=len(poison),
        others_done_meanwhile=len(meanwhile),
        poison_lifetime=f"{last - first:.1f} s",
    )
    assert [e.attempt for e in poison] == [1, 2, 3], "exactly max_attempts runs"
    assert (dead["reason"], dead["attempts"]) == (EXHAUSTED, 3)
    assert len(meanwhile) >= 2, "the queue kept flowing while the poison message looped"
    assert (tally.executions, tally.completed, tally.duplicates, tally.dead, tally.lost) == (33, 30, 0, 1, 0)
    assert a.alive
