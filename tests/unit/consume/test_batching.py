"""Ack batching's rule (consume.batching.batch_wait) without a database: the next statement waits for more
acks only while a freed slot leaves no pool process idle, and never longer than the delay."""

from __future__ import annotations

from kombu_akadze.consume.batching import batch_wait

#: A Celery worker -c 2 at prefetch multiplier 4 that acked one task: 1 slot of 8 free.
BUSY = [(1, 8)]


def wait(**changes: object) -> float:
    args: dict[str, object] = {"oldest": 10.0, "now": 10.0005, "delay": 0.002, "windows": BUSY, "tasks_waiting": True}
    args.update(changes)
    return batch_wait(**args)  # type: ignore[arg-type]


def test_with_a_task_waiting_for_the_pool_the_statement_waits_for_the_rest_of_the_delay() -> None:
    assert abs(wait() - 0.0015) < 1e-9


def test_an_ack_that_has_waited_the_whole_delay_goes_at_once() -> None:
    assert wait(now=10.002) == 0.0
    assert wait(now=11.0) == 0.0


def test_no_task_waiting_for_a_pool_process_means_a_freed_slot_is_an_idle_process_so_no_wait() -> None:
    # Prefetch multiplier 1 (-c 4, one task each): every slot is a pool process, the refill must not wait.
    assert wait(tasks_waiting=False, windows=[(1, 4)]) == 0.0


def test_a_window_half_free_is_refilled_at_once() -> None:
    assert wait(windows=[(4, 8)]) == 0.0
    assert wait(windows=[(3, 8)]) > 0
    assert wait(windows=[(1, 2)]) == 0.0  # -c 2 at multiplier 1: any ack frees half the window
    assert wait(windows=[(3, 8), (2, 4)]) == 0.0  # every window must still hold more than half


def test_nothing_buffered_no_prefetch_window_or_no_delay_never_waits() -> None:
    assert wait(oldest=None) == 0.0
    assert wait(windows=[]) == 0.0  # only unlimited channels (Celery's remote control)
    assert wait(delay=0.0) == 0.0
