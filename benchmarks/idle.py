"""Workload d: what one idle `celery worker` costs PostgreSQL, in statements (or commits) per second."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from brokers import Broker
from celery_level import Worker, purge
from pgstats import Pg

#: Seconds between the worker being ready and the idle window opening (see run()).
STARTUP_SETTLE = 12.0


def _delta(pg: Pg, use_statements: bool, seconds: float) -> tuple[int, float]:
    """How much the counter moved over *seconds*, including the sampler's own (constant) statements."""
    first = pg.activity_counter(use_statements)
    start = time.monotonic()
    time.sleep(seconds)
    last = pg.activity_counter(use_statements)
    return last - first, time.monotonic() - start


def run(
    broker: Broker,
    *,
    run_id: str,
    pg_dsn: str,
    seconds: float,
    baseline_seconds: float,
    redis_url: str,
    logdir: Path,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The counter over a window with no worker, then over one around an idle worker; the difference is the worker."""
    queue = broker.queue_name("idle", run_id)
    key = f"akadze-bench:{run_id}:{uuid.uuid4().hex[:8]}:"
    with Pg(pg_dsn) as pg:
        use_statements = pg.statements_available()
        method = "pg_stat_statements calls" if use_statements else "pg_stat_database xact_commit+xact_rollback"
        before = pg.client_sessions()
        base_count, base_secs = _delta(pg, use_statements, baseline_seconds)
        worker = Worker(broker, queue=queue, prefetch=4, key=key, redis_url=redis_url, logdir=logdir)
        try:
            worker.start()
            worker.wait_ready()
            # Past start-up (declares, first heartbeat, first claim) and past PostgreSQL's own delay
            # in reporting it: an idle session flushes its counters to pg_stat_database up to 10 s
            # after its last transaction (PGSTAT_IDLE_INTERVAL), so a shorter wait counts start-up
            # transactions as idle cost.
            time.sleep(STARTUP_SETTLE)
            during = pg.client_sessions()
            count, secs = _delta(pg, use_statements, seconds)
            worker.check_alive()
        finally:
            worker.stop()
            purge(broker, queue)
            for k in worker.redis.scan_iter(match=key + "*"):
                worker.redis.delete(k)
    others = {name: n for name, n in before.items() if n}
    mine = {name: n - before.get(name, 0) for name, n in during.items() if n - before.get(name, 0) > 0}
    if others:
        log(f"other sessions on the database during the idle measurement: {others} (their work is counted too)")
    # The scratch database has no other client: what moves the counter without a worker is the
    # sampler's own statements, a fixed count per window, so that count (not a rate) is taken off.
    return {
        "per_s": max(count - base_count, 0) / secs,
        "raw_per_s": count / secs,
        "sampler_count": base_count,
        "baseline_per_s": base_count / base_secs,
        "counted": count,
        "method": method,
        "seconds": seconds,
        "worker_sessions": mine,
        "other_sessions": others,
        "worker_errors": worker.log_errors()[:20],
    }
