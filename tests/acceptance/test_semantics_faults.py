"""Celery worker semantics under faults and shutdowns: SIGSTOP past the TTL, cold and soft shutdown, and what a
task sees on a message claimed again (delivery_info['redelivered'], self.request.akadze_attempt)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from kombu_akadze.integrations.testing import eventually

from .semantics import FENCED, LEASE, Semantics, handover, seconds_since, settle

TTL = LEASE["heartbeat_ttl"]
RESCUE = LEASE["rescue_interval"]
#: Seconds of scheduling delay a loaded 2-core machine may add to a hand-over (heartbeat thread, claim, fork).
SLACK = 2.0
#: ETA messages handed to the worker at once, whatever the ETA: Celery holds them in memory (native delay off).
IN_MEMORY = {"native_delay_threshold": 0}


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def _rows(sem: Semantics) -> list[tuple[Any, ...]]:
    """(id, state, owner set, run_count, attempts) of every message row."""
    return [(m["id"], m["state"], m["owner"] is not None, m["run_count"], m["attempts"]) for m in sem.messages()]


@pytest.mark.slow
def test_sigstop_past_the_ttl_then_sigcont_runs_twice_completes_once_and_fences_the_late_ack(sem: Semantics) -> None:
    """The resumed worker's ack arrives while the other worker still runs the message: the fence keeps that
    run's row, and only the other worker's ack deletes it."""
    app = sem.producer()
    a = sem.start_consuming("a", concurrency=1)
    rerun = 3 * TTL  # the second run outlasts the ttl too, and a's resume
    sem.send(app, "sem.work", 1, 3 * TTL, rerun)
    first = eventually(lambda: sem.starts(1), timeout=60, what="a starts the task")[0]
    b = sem.start_consuming("b", concurrency=1)  # idle, standing by: the only one that can rescue

    sem.signal_group(a, signal.SIGSTOP)  # main process and pool child: silent, but alive and holding
    stopped = time.monotonic()
    (moved,) = handover(sem, a, [first.message_id or 0], timeout=TTL + RESCUE + 60)
    again = eventually(lambda: [e for e in sem.starts(1) if e.node == "b"], timeout=60, what="b runs it again")[0]
    redelivery = seconds_since(stopped)
    assert a.alive, "SIGSTOP only pauses worker a"

    sem.signal_group(a, signal.SIGCONT)  # a's run is past its deadline: it finishes and acks at once
    fenced = f"ack of message id={first.message_id} run_count=1 changed nothing"
    eventually(lambda: fenced in a.output(), timeout=30, what="a's late ack is fenced and logged")
    during = [(m["id"], m["state"], f":{b.pid}:" in m["owner"], m["run_count"]) for m in sem.messages()]
    b_running = not sem.dones(1) or all(e.node == "a" for e in sem.dones(1))
    eventually(lambda: [e for e in sem.dones(1) if e.node == "b"], timeout=rerun + 60, what="b finishes it")
    eventually(lambda: sem.messages() == [], timeout=30, what="b's ack deletes the row")

    tally = sem.tally(
        [1],
        behaviour=f"SIGSTOP of worker a's process group for > ttl ({TTL} s), b takes over, SIGCONT while b runs",
        last_heartbeat_to_claim=f"{moved.gap:.2f} s",
        redelivery=f"{redelivery:.1f} s",
        row_after_a_ack=during,
        fenced_acks=a.output().count(FENCED),
    )
    assert (first.node, first.attempt, first.redelivered) == ("a", 1, False)
    assert (again.attempt, again.redelivered, again.message_id) == (2, True, first.message_id)
    assert TTL <= moved.gap < TTL + RESCUE + SLACK, "rescued once the heartbeat is older than the ttl, not before"
    assert b_running, "a's ack came while b still ran the task"
    assert during == [(first.message_id, "held", True, 2)], "the fence kept b's run: a's stale ack deleted nothing"
    assert [(e.node, e.extra["runs"]) for e in sem.dones(1)] == [("a", 1), ("b", 2)], (
        "a's late run finished first; b's run only bumped the idempotent record"
    )
    # 2 executions, 1 completion (b's ack); duplicates counts the demo record the second run bumped to 2.
    assert (tally.executions, tally.completed, tally.duplicates) == (2, 1, 1)
    assert (tally.queued, tally.dead, tally.lost) == (0, 0, 0)
    assert a.output().count(FENCED) == 1, "exactly one outcome fenced: a's ack"
    assert FENCED not in b.output(), "b's ack deleted the row"
    assert b.warm_shutdown() == 0


def test_cold_shutdown_sigquit_restores_running_and_eta_held_messages_in_place(sem: Semantics) -> None:
    app = sem.producer(transport_options=IN_MEMORY)
    a = sem.start_consuming("a", concurrency=2, transport_options=IN_MEMORY)
    for key in (1, 2):  # held in memory for their ETA
        sem.send(app, "sem.work", key, countdown=3600)
    for key in (3, 4):  # running in the two pool children
        sem.send(app, "sem.work", key, 60)
    eventually(lambda: len(sem.starts()) == 2, timeout=60, what="a runs 2 tasks")
    settle(lambda: _rows(sem), [(i, "held", True, 1, 1) for i in (1, 2, 3, 4)], what="a holds all 4 messages")

    quit_at = time.monotonic()
    a.proc.send_signal(signal.SIGQUIT)
    code = sem.wait_exit(a)
    took = seconds_since(quit_at)
    eventually(lambda: _group_gone(a.pid), timeout=30, what="the cancelled pool children are gone too")

    tally = sem.tally(
        [1, 2, 3, 4],
        behaviour="SIGQUIT (cold shutdown), 2 tasks running, 2 held for their ETA",
        exit_code=code,
        shutdown=f"{took:.1f} s",
    )
    assert _rows(sem) == [(i, "ready", False, 1, 0) for i in (1, 2, 3, 4)], (
        "every held message back in place: same ids, ready, attempt given back, no copies"
    )
    assert (tally.executions, tally.completed, tally.duplicates) == (2, 0, 0)
    assert (tally.queued, tally.dead, tally.lost) == (4, 0, 0)
    assert took < 30


@pytest.mark.slow
def test_soft_shutdown_finishes_short_tasks_and_restores_the_rest_in_place(sem: Semantics) -> None:
    soft = 3.0
    app = sem.producer(transport_options=IN_MEMORY)
    a = sem.start_consuming(
        "a", concurrency=2, transport_options=IN_MEMORY, conf={"worker_soft_shutdown_timeout": soft}
    )
    sem.send(app, "sem.work", 1, countdown=3600)  # held for its ETA
    sem.send(app, "sem.work", 2, 1.0)  # finishes within the soft shutdown timeout
    sem.send(app, "sem.work", 3, 60)  # does not
    eventually(lambda: len(sem.starts()) == 2, timeout=60, what="a runs tasks 2 and 3")
    settle(lambda: [r[:3] for r in _rows(sem)], [(i, "held", True) for i in (1, 2, 3)], what="a holds all 3")

    quit_at = time.monotonic()
    a.proc.send_signal(signal.SIGQUIT)
    code = sem.wait_exit(a)
    took = seconds_since(quit_at)
    eventually(lambda: _group_gone(a.pid), timeout=30, what="the cancelled pool child is gone too")

    tally = sem.tally(
        [1, 2, 3],
        behaviour=f"SIGQUIT with worker_soft_shutdown_timeout={soft} s: one short task, one long, one ETA",
        exit_code=code,
        shutdown=f"{took:.1f} s",
    )
    assert "Initiating Soft Shutdown" in a.output()
    assert [e.key for e in sem.dones()] == [2], "the short task finished during the soft shutdown"
    assert _rows(sem) == [(1, "ready", False, 1, 0), (3, "ready", False, 1, 0)], (
        "the ETA message and the cancelled long task back in place, attempt given back; the short one acked"
    )
    assert (tally.executions, tally.completed, tally.duplicates, tally.queued, tally.lost) == (2, 1, 0, 2, 0)
    assert soft <= took < soft + 30


@pytest.mark.slow
def test_kill_9_of_a_worker_group_mid_task_hands_both_running_tasks_to_the_standby_after_the_ttl(
    sem: Semantics,
) -> None:
    app = sem.producer()
    a = sem.start_consuming("a", concurrency=2)
    for key in (1, 2):
        sem.send(app, "sem.work", key, 60, 1.0)  # 60 s on the first attempt, 1 s on later ones
    eventually(lambda: len(sem.starts()) == 2, timeout=60, what="a runs both tasks")
    firsts = sem.starts()
    b = sem.start_consuming("b", concurrency=2)  # idle, standing by: the only one that can rescue

    os.killpg(a.pid, signal.SIGKILL)  # main process and pool children at once
    killed = time.time()  # the wall clock of the ledger
    moved = handover(sem, a, [e.message_id or 0 for e in firsts], timeout=TTL + RESCUE + 60)
    eventually(lambda: len(sem.dones()) == 2, timeout=60, what="b runs both again")
    redelivery = [e.t - killed for e in sem.starts() if e.node == "b"]
    eventually(lambda: sem.messages() == [], timeout=30, what="b acks both")
    a.proc.wait(30)

    tally = sem.tally(
        [1, 2],
        behaviour="kill -9 of worker a's process group with 2 tasks running; b standing by",
        last_heartbeat_to_claim=", ".join(f"{m.gap:.2f} s" for m in moved),
        kill_to_rerun_started=", ".join(f"{r:.2f} s" for r in redelivery),
    )
    seen = sorted((e.key, e.node, e.message_id, e.attempt, e.redelivered) for e in sem.starts())
    print(f"seen by the task (key, node, message id, akadze_attempt, redelivered): {seen}")
    assert seen == [(k, n, k, att, red) for k in (1, 2) for n, att, red in (("a", 1, False), ("b", 2, True))]
    for m in moved:
        assert TTL <= m.gap < TTL + RESCUE + SLACK, "rescued once the heartbeat is older than the ttl, not before"
        assert (m.run_count, m.attempts) == (2, 2), "the lost run spent its attempt"
    assert TTL - LEASE["heartbeat_interval"] <= min(redelivery), "not rescued while the lease could be alive"
    assert max(redelivery) < TTL + RESCUE + SLACK
    assert (tally.executions, tally.completed, tally.duplicates, tally.dead, tally.lost) == (4, 2, 0, 0, 0)
    assert b.warm_shutdown() == 0


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["prefork", "solo"])
def test_warm_shutdown_finishes_the_running_task_and_releases_prefetched_ones_to_the_standby_at_once(
    sem: Semantics, pool: str
) -> None:
    app = sem.producer()
    sem.send(app, "sem.work", 1, 2.0)
    for key in (2, 3):
        sem.send(app, "sem.work", key)
    a = sem.start_consuming("a", pool=pool, concurrency=1, args=["--prefetch-multiplier", "3"])
    eventually(lambda: sem.starts(1), timeout=60, what="a runs task 1")
    settle(lambda: [r[1:4] for r in _rows(sem)], [("held", True, 1)] * 3, what="a holds 2 and 3, prefetched")
    sem.start_consuming("b", concurrency=2)  # idle, standing by

    exited: list[float] = []

    def a_gone_and_all_done() -> bool:
        if not exited and not a.alive:
            exited.append(time.time())  # the wall clock of the ledger
        return bool(exited) and len(sem.dones()) == 3

    a.proc.send_signal(signal.SIGTERM)
    eventually(a_gone_and_all_done, timeout=60, what="a finishes task 1 and exits, b runs 2 and 3")
    assert a.proc.returncode == 0
    eventually(lambda: sem.messages() == [], timeout=30, what="every run acked")

    done_1 = sem.dones(1)[0].t
    started = [e.t for e in sem.starts() if e.key in (2, 3)]
    tally = sem.tally(
        [1, 2, 3],
        behaviour=f"SIGTERM to a -P {pool} worker running 1 task and holding 2 prefetched; b standing by",
        task_1_done_to_b_started=", ".join(f"{t - done_1:.2f} s" for t in started),
        a_exit_to_b_started=", ".join(f"{t - exited[0]:+.2f} s" for t in started),
    )
    seen = {e.key: (e.node, e.attempt, e.redelivered) for e in sem.starts()}
    print(f"seen by the task (node, akadze_attempt, redelivered): {seen}")
    assert seen == {1: ("a", 1, False), 2: ("b", 1, True), 3: ("b", 1, True)}, (
        "the running task finished on a; the prefetched ones never started there and were released with "
        "their attempt given back"
    )
    assert [e.node for e in sem.dones(1)] == ["a"]
    assert max(started) - exited[0] < 1.0, "visible to b within a second of a's exit (released at its close)"
    assert (tally.executions, tally.completed, tally.duplicates, tally.lost) == (3, 3, 0, 0)
    assert FENCED not in a.output(), "task 1's ack was a's to write"
