"""PostgreSQL `pg_ctl stop -m immediate` under load, down 5 s, 30 s and 5 s, then started again: the
same worker processes reconnect by themselves, finish everything, and start latency comes back."""

from __future__ import annotations

import statistics
import time
from collections import Counter

import pytest

from .checker import Ledgers, verdict
from .conftest import Faults, Stream

#: Seconds down in each cycle: shorter and longer than heartbeat_ttl.
OUTAGES = (5.0, 30.0, 5.0)
TTL = 10.0
OPTIONS = {"heartbeat_interval": 1.0, "heartbeat_ttl": TTL, "rescue_interval": 1.0}
#: Tasks a second: well under what two workers manage, so latency is the broker's, not a backlog's.
RATE = 40.0
#: Acks and claims commit asynchronously (durable_acks off): a crash may undo those of its last
#: 3 x wal_writer_delay (0.6 s), so at most a second of tasks per stop may run again though not held.
UNDONE_PER_STOP = int(RATE)


def _first_start_after(ledgers: Ledgers, worker: str, after: float) -> float | None:
    for run in ledgers.runs():
        if run.event == "start" and run.source.startswith(f"ledger-{worker}-") and run.at > after:
            return run.at
    return None


def _latency(ledgers: Ledgers, published: dict[int, float], since: float, until: float) -> float | None:
    """Median seconds from publish to first start, of the tasks published between *since* and *until*."""
    first: dict[int, float] = {}
    for run in ledgers.runs():
        if run.event == "start":
            first.setdefault(run.n, run.at)
    waits = [first[n] - at for n, at in published.items() if since <= at < until and n in first]
    return statistics.median(waits) if waits else None


@pytest.mark.slow
def test_immediate_stop_and_restart_of_postgresql_under_load_loses_nothing(own: Faults) -> None:
    own.options = OPTIONS
    server = own.server
    assert server is not None
    workers = {name: own.start_worker(name, concurrency=2) for name in ("a", "b")}
    pids = {name: w.pid for name, w in workers.items()}
    producer = Stream(own, rate=RATE)
    producer.start()
    own.until(lambda: len(own.ledgers.done()) >= 100, timeout=120, what="workers are running tasks")
    baseline_from = time.time()
    own.until(lambda: time.time() - baseline_from > 3, timeout=10, what="3 s of baseline traffic")

    in_flight: set[int] = set()  # message ids held at some stop: the only ones that may run twice
    cycles = []
    for down in OUTAGES:
        in_flight |= own.held_ids()
        server.stop("immediate")
        stopped = time.monotonic()
        while time.monotonic() - stopped < down:  # the outage itself: nothing to wait for
            time.sleep(0.05)
        server.start()
        back = time.time()
        in_flight |= own.held_ids()  # what the crash left held (the workers reconnect seconds later)
        for name in workers:  # each worker claims and starts work again on its own
            own.until(
                lambda name=name, back=back: _first_start_after(own.ledgers, name, back),
                timeout=90,
                interval=0.2,
                what=f"worker {name} starts tasks again after a {down:g} s outage",
            )
        resumed = max(_first_start_after(own.ledgers, name, back) or back for name in workers)
        # Latency: of what was published from 3 s after both resumed, for 3 s (the backlog is gone by then).
        window = resumed + 3.0
        own.until(lambda w=window: time.time() > w + 3.0 + 2.0, timeout=30, what="traffic after recovery")
        cycles.append((down, resumed - back, _latency(own.ledgers, producer.published, window, window + 3)))

    published = producer.finish()
    own.until(lambda: own.ledgers.all_done(published), timeout=180, interval=0.5, what="every task completed")
    own.until(lambda: own.queued() == 0, timeout=60, interval=0.2, what="every message acked")

    baseline = _latency(own.ledgers, producer.published, baseline_from, baseline_from + 3)
    result = verdict(
        "postgres stop -m immediate + restart",
        injected=f"{len(OUTAGES)} immediate stops, down {'/'.join(f'{d:g}' for d in OUTAGES)} s",
        published=published,
        ledgers=own.ledgers,
        recovery=max(c[1] for c in cycles),
    )
    print(f"publishes that raised while down (and were retried): {len(producer.errors)} {set(producer.errors)}")
    print(f"start latency (median) before the faults: {baseline:.3f} s")
    for down, resume, latency in cycles:
        print(f"  down {down:g} s: workers resumed {resume:.2f} s after the restart, latency then {latency:.3f} s")
    assert result.lost == 0
    assert result.completed == len(published)
    assert producer.errors, "no publish ever raised: the outages missed the producer"
    # Per message, not per task: a publish whose commit landed just before a stop raises in the producer,
    # which publishes the task again as a new message (seen: ids 216 and 232 of one task, each run once:
    # 3 message ids in tasks run twice, 2 such tasks, 553 of them held at a stop).
    # Those are the producer's at-least-once copies; what the broker may run twice is a message it held.
    done_runs = Counter(r.message_id for r in own.ledgers.runs() if r.event == "done")
    twice = {message_id for message_id, runs in done_runs.items() if runs > 1}
    undone = twice - in_flight
    print(f"run twice though not held at a stop (ack or claim undone by the crash): {len(undone)}")
    assert len(undone) <= UNDONE_PER_STOP * len(OUTAGES), f"more runs undone than a second per stop: {sorted(undone)}"
    assert baseline is not None
    for down, _, latency in cycles:
        assert latency is not None, f"no task published after the {down:g} s outage started"
        assert latency < max(1.0, 5 * baseline), f"latency after the {down:g} s outage stays high: {latency:.2f} s"
    for name, worker in workers.items():
        assert worker.alive, f"worker {name} exited"
        assert worker.pid == pids[name], f"worker {name} was restarted"
