"""Ack batching: how long the event loop's next statement waits so that more outcomes ride in it.

Each statement of the event loop writes the acks buffered since the last one and claims what their slots
freed. On a worker whose prefetch window is larger than its pool (Celery's prefetch multiplier above 1),
a freed slot is not an idle pool process: the worker still holds tasks that wait for one. Sending a
statement for every ack or two then spends a round trip, and PostgreSQL a transaction, on a slot nobody
waits for. So while the worker has a task waiting for a pool process and every window still holds more
than half its prefetch count, the statement waits until the oldest buffered outcome is *delay* seconds
old (or a window is half free), and the acks of that time ride together with one larger claim.

Pure logic: the caller says what it sees. An outcome waits at most *delay* seconds longer than it would
have; it is still tracked meanwhile (the reconcile leaves its row alone), and one lost with the worker
(a crash inside that time) only runs its task again, as any ack not yet written does.
"""

from __future__ import annotations

from collections.abc import Iterable


def batch_wait(
    *,
    oldest: float | None,
    now: float,
    delay: float,
    windows: Iterable[tuple[int, int]],
    tasks_waiting: bool,
) -> float:
    """Seconds the next statement should wait for more outcomes (0.0: send it now).

    *oldest*: when the oldest buffered outcome was buffered (None: none is); *now*: the same clock;
    *delay*: the longest an outcome may wait here (0: never wait); *windows*: (free slots, prefetch count)
    of each consuming window with a prefetch limit; *tasks_waiting*: the worker holds a task that waits for
    a pool process, so a freed slot leaves no process idle.
    """
    if delay <= 0 or oldest is None or not tasks_waiting:
        return 0.0  # the cheap tests first: *windows* may be computed as it is read
    left = oldest + delay - now
    if left <= 0:
        return 0.0
    seen = False
    for free, prefetch in windows:
        seen = True
        if 2 * free >= prefetch:
            return 0.0  # half the window is free: refill it now, whatever the acks
    return left if seen else 0.0
