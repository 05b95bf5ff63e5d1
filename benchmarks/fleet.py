"""Workload f: N idle `celery worker -P solo` on one queue, then a trickle of tasks: PostgreSQL cost and latency.

For each fleet size: start N workers, wait until every one is ready, let start-up settle, count the
database's transactions over an idle window and the sessions the fleet holds, then send a trickle of
latency tasks at a fixed rate and count transactions again. RabbitMQ runs the same fleet and trickle.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import celeryapp
from brokers import Broker
from celery import Celery
from celery_level import Worker, percentile, purge
from pgstats import Pg

SOLO = ("-P", "solo")
#: 32 workers importing Celery at once on 2 cores take a while; a worker not ready by then is reported.
READY_TIMEOUT = 240.0
#: Seconds after the last worker is ready before anything is counted: past start-up (declares, first
#: heartbeat, first claim) and past PostgreSQL's delay in reporting an idle session's transactions
#: (up to 10 s, PGSTAT_IDLE_INTERVAL). The same wait closes the trickle window, for the same reason.
SETTLE = 12.0
#: Log lines that mean a worker could not get (or keep) a database connection.
CONNECTION_ERRORS = (
    "too many clients",
    "remaining connection slots",
    "connection failed",
    "could not connect",
    "connection refused",
    "server closed the connection",
)


class Fleet:
    """N solo workers on one queue, started together and always stopped together."""

    def __init__(self, broker: Broker, *, size: int, queue: str, run_id: str, redis_url: str, logdir: Path) -> None:
        tag = uuid.uuid4().hex[:6]
        self.broker = broker
        self.queue = queue
        self.workers = [
            Worker(
                broker, queue=queue, prefetch=1, key=f"akadze-bench:{run_id}:{tag}w{i}:",
                redis_url=redis_url, logdir=logdir, pool=SOLO,
            )
            for i in range(size)
        ]  # fmt: skip

    def start(self, timeout: float = READY_TIMEOUT) -> dict[str, Any]:
        """Start every worker, then wait for all; those that exit or never get ready are counted, not raised."""
        for worker in self.workers:
            worker.start()
        pending = set(range(len(self.workers)))
        exited: list[int] = []
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for i in sorted(pending):
                w = self.workers[i]
                if w.redis.get(w.key + "ready") is not None:
                    pending.discard(i)
                elif w.proc is not None and w.proc.poll() is not None:
                    pending.discard(i)
                    exited.append(i)
            time.sleep(0.1)
        ready = len(self.workers) - len(pending) - len(exited)
        return {"ready": ready, "exited": len(exited), "not_ready": len(pending)}

    def alive(self) -> int:
        return sum(1 for w in self.workers if w.proc is not None and w.proc.poll() is None)

    def latencies_ms(self) -> list[float]:
        """Every latency recorded by any worker of the fleet, ascending."""
        found: list[float] = []
        for w in self.workers:
            found += [float(v) * 1000.0 for v in w.redis.lrange(w.key + "latency", 0, -1)]
        return sorted(found)

    def started_by(self) -> dict[float, tuple[float, int]]:
        """When each task started (epoch s) and the index of the worker that ran it, by the send time the
        task carried: to pair with the producer's sends."""
        found: dict[float, tuple[float, int]] = {}
        for i, w in enumerate(self.workers):
            for v in w.redis.lrange(w.key + "latency_at", 0, -1):
                sent_at, started = v.split()
                found[float(sent_at)] = (float(started), i)
        return found

    def forget_latencies(self) -> None:
        for w in self.workers:
            w.redis.delete(w.key + "latency", w.key + "latency_at")

    def log_problems(self) -> dict[str, Any]:
        """Connection errors (counted by worker) and the first error lines of the logs."""
        lines, workers_hit = [], 0
        for w in self.workers:
            errors = w.log_errors()
            if any(p in e.lower() for e in errors for p in CONNECTION_ERRORS):
                workers_hit += 1
            lines += errors
        connection = [e for e in lines if any(p in e.lower() for p in CONNECTION_ERRORS)]
        return {
            "workers_with_connection_errors": workers_hit,
            "connection_error_lines": len(connection),
            "error_lines": len(lines),
            "first_errors": lines[:10],
        }

    def stop(self) -> None:
        """Stop every worker at once (each cold shutdown takes ~2 s), then delete its Redis keys."""
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(len(self.workers), 1)) as pool:
            list(pool.map(lambda w: w.stop(), self.workers))
        for w in self.workers:
            for k in w.redis.scan_iter(match=w.key + "*"):
                w.redis.delete(k)


@contextlib.contextmanager
def running(fleet: Fleet, log: Callable[[str], None]) -> Iterator[dict[str, Any]]:
    """The fleet started; stopped (and its queue purged) however the block ends."""
    try:
        started = time.monotonic()
        state = fleet.start()
        state["start_seconds"] = round(time.monotonic() - started, 1)
        log(f"   {state['ready']} of {len(fleet.workers)} ready in {state['start_seconds']:.0f} s")
        yield state
    finally:
        fleet.stop()
        with contextlib.suppress(Exception):
            purge(fleet.broker, fleet.queue)


def named(url: str, application_name: str) -> str:
    """A libpq URL whose sessions carry *application_name*, to tell them from the workers' akadze-* ones."""
    return f"{url}{'&' if '?' in url else '?'}application_name={application_name}"


def producer_app(broker: Broker, queue: str) -> Celery:
    """The parent's Celery app, its producer connected and the queue declared before any window opens:
    the trickle then counts sending, not connecting (akadze's connect checks the schema)."""
    url = named(broker.url, "akadze-bench-producer") if broker.kind == "akadze" else broker.url
    app = celeryapp.make_app(
        {"broker_url": url, "broker_transport_options": broker.transport_options, "task_default_queue": queue}
    )
    with app.producer_or_acquire() as producer:
        producer.connection.ensure_connection(max_retries=3)
        app.amqp.queues[queue](producer.channel).declare()
    return app


class CommitFloor:
    """The durable commit's own latency on the broker's server: the publish part's bare single-row INSERT
    (publishers.bare_sender: autocommit, synchronous commit, prepared) into a table with akadze's columns
    and indexes, in a schema of its own in *dsn*'s database (not the fleet's scratch database, whose
    transactions are counted)."""

    def __init__(self, dsn: str, run_id: str) -> None:
        import publishers

        self.dsn, self.schema, table = dsn, f"bench_{run_id}_floor", "messages"
        with Pg(dsn) as pg:
            pg.run("schema_create", schema=self.schema)
            pg.run("bare_table_create", schema=self.schema, table=table)
        target = publishers.Target(variant="insert", queue="floor", dsn=dsn, schema=self.schema, table=table)
        self._send, self._close = publishers.bare_sender(target)

    def commit_ms(self) -> float:
        began = time.perf_counter()
        self._send()
        return (time.perf_counter() - began) * 1000.0

    def close(self) -> None:
        self._close()
        with contextlib.suppress(Exception), Pg(self.dsn) as pg:
            pg.run("schema_drop", schema=self.schema)


def trickle(
    app: Celery, queue: str, *, count: int, rate: float, floor: CommitFloor | None = None
) -> tuple[float, dict[float, float], list[float]]:
    """Send *count* latency tasks at *rate*/s through the app's (pooled, already connected) producer: seconds,
    how long each send_task call took (ms, by the send time the task carries), and with *floor* the bare
    commit's latency (ms, ascending), one half-way between each two sends, when the task before has long
    started. A send returns once the broker has the message as its publish defines it: akadze's once the row
    is committed (a round trip and, for a persistent message, the WAL flush); RabbitMQ's without confirms once
    the frame is written to the socket."""
    sends: dict[float, float] = {}
    floors: list[float] = []
    with app.producer_or_acquire() as producer:
        start = time.perf_counter()
        for i in range(count):
            pause = start + i / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            began, sent_at = time.perf_counter(), time.time()
            app.send_task(celeryapp.LATENCY, args=(sent_at,), queue=queue, producer=producer)
            sends[sent_at] = (time.perf_counter() - began) * 1000.0
            if floor is not None:
                pause = start + (i + 0.5) / rate - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                floors.append(floor.commit_ms())
        return time.perf_counter() - start, sends, sorted(floors)


def split(sends: dict[float, float], started: dict[float, tuple[float, int]]) -> dict[str, float]:
    """The part of each task's latency after its send_task call returned (the rest is the call, *sends*):
    p50/p99 in ms, over the tasks both sides saw (*started*: Fleet.started_by)."""
    after = sorted((started[t][0] - t) * 1000.0 - ms for t, ms in sends.items() if t in started)
    if not after:
        return {}
    return {"after_send_p50_ms": statistics.median(after), "after_send_p99_ms": percentile(after, 99)}


def warm_up(app: Celery, fleet: Fleet, queue: str, timeout: float = 30.0) -> float | None:
    """One latency task before anything is measured, its latency kept apart (ms; None if it never ran): a
    process's first send_task loads Celery's result backend (imports, entry points: ~27 ms of 29 ms, cProfile),
    and the fleet run's producer is a new app for each fleet. That one-off made the run's first task its worst
    (37 ms akadze, 6.6 ms RabbitMQ at 32 workers; whichever broker runs first pays the imports), and, with p99
    of 150 being the second worst, half of the p99 figure (the trickle is now 600: p99 is the sixth worst)."""
    app.send_task(celeryapp.LATENCY, args=(time.time(),), queue=queue)
    deadline = time.monotonic() + timeout
    while not (found := fleet.latencies_ms()) and time.monotonic() < deadline:
        time.sleep(0.05)
    fleet.forget_latencies()
    return found[0] if found else None


def counter(pg: Pg | None) -> int:
    return pg.activity_counter(use_statements=False) if pg is not None else 0


def run_size(
    broker: Broker,
    *,
    size: int,
    run_id: str,
    pg_dsn: str | None,
    sampler_count: int,
    idle_seconds: float,
    tasks: int,
    rate: float,
    redis_url: str,
    logdir: Path,
    floor_dsn: str | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """One fleet of *size* on *broker*; *pg_dsn* (the scratch database) only for akadze; *floor_dsn* (another
    database of the same server) for the bare commit's latency, measured during the trickle."""
    queue = broker.queue_name(f"fleet{size}-{uuid.uuid4().hex[:6]}", run_id)
    fleet = Fleet(broker, size=size, queue=queue, run_id=run_id, redis_url=redis_url, logdir=logdir)
    out: dict[str, Any] = {"broker": broker.name, "size": size}
    with contextlib.ExitStack() as stack:
        pg = stack.enter_context(Pg(pg_dsn)) if pg_dsn else None
        state = stack.enter_context(running(fleet, log))
        out.update(state)
        if state["ready"] == 0:
            out.update(fleet.log_problems())
            return out
        app = producer_app(broker, queue)
        stack.callback(app.close)
        out["warmup_ms"] = warm_up(app, fleet, queue)
        time.sleep(SETTLE)
        if pg is not None:
            out["sessions"] = pg.client_sessions()
            out["server"] = pg.one("server_sessions")
            first = counter(pg)
            start = time.monotonic()
            time.sleep(idle_seconds)
            idle_count, idle_secs = counter(pg) - first, time.monotonic() - start
            net = max(idle_count - sampler_count, 0)
            out["idle"] = {"count": idle_count, "seconds": idle_secs, "per_s": net / idle_secs,
                           "per_worker_per_s": net / idle_secs / state["ready"]}  # fmt: skip
            log(f"   idle: {out['idle']['per_s']:.2f} transactions/s ({out['idle']['per_worker_per_s']:.3f} "
                f"per worker); sessions {out['sessions']}")  # fmt: skip
        floor = stack.enter_context(contextlib.closing(CommitFloor(floor_dsn, run_id))) if floor_dsn else None
        first = counter(pg)
        start = time.monotonic()
        sent_secs, sent, floors = trickle(app, queue, count=tasks, rate=rate, floor=floor)
        sends = sorted(sent.values())
        deadline = time.monotonic() + 15.0
        while len(fleet.latencies_ms()) < tasks and time.monotonic() < deadline:
            time.sleep(0.05)
        if pg is not None:
            time.sleep(SETTLE)  # let the idle workers' last transactions reach pg_stat_database
            raw, secs = counter(pg) - first, time.monotonic() - start
            idle_cost = out["idle"]["per_s"] * secs
            out["trickle_xacts"] = {"raw": raw, "seconds": secs, "idle_share": idle_cost,
                                    "per_task_raw": raw / tasks,
                                    "per_task_net": max(raw - sampler_count - idle_cost, 0) / tasks}  # fmt: skip
        values = fleet.latencies_ms()
        out["alive_after"] = fleet.alive()
        out["latency"] = {"count": len(values), "sent": tasks, "send_seconds": sent_secs,
                          "send_p50_ms": statistics.median(sends), "send_p99_ms": percentile(sends, 99)}  # fmt: skip
        if values:
            out["latency"].update(
                p50_ms=statistics.median(values), p99_ms=percentile(values, 99), max_ms=values[-1], worst_ms=values[-5:]
            )  # what p99 of a trickle is made of
            started = fleet.started_by()
            out["latency"].update(split(sent, started))
            trace = [(t, ms, *started.get(t, (None, None))) for t, ms in sorted(sent.items())]
            (logdir / f"tasks-{broker.name}-{size}.json").write_text(json.dumps(trace))  # by hand: where a tail is
        if floors:
            out["latency"].update(floor_p50_ms=statistics.median(floors), floor_p99_ms=percentile(floors, 99))
        out.update(fleet.log_problems())
    return out


def headroom(
    broker: Broker,
    *,
    workers: int,
    publish: Callable[[], dict[str, Any]],
    run_id: str,
    pg_dsn: str,
    redis_url: str,
    logdir: Path,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """*workers* akadze workers held idle while *publish* (publisher processes on another queue) runs:
    does the server's connection limit hold? Sessions are sampled at the peak, while publishers run."""
    queue = broker.queue_name(f"headroom-{uuid.uuid4().hex[:6]}", run_id)
    fleet = Fleet(broker, size=workers, queue=queue, run_id=run_id, redis_url=redis_url, logdir=logdir)
    out: dict[str, Any] = {"workers": workers}
    with Pg(pg_dsn) as pg, running(fleet, log) as state:
        out.update(state)
        time.sleep(SETTLE / 4)
        peak: dict[str, Any] = {}
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            job = pool.submit(publish)
            while not job.done():
                now = pg.one("server_sessions")
                if now["client_backends"] > peak.get("client_backends", -1):
                    peak = now
                time.sleep(0.5)
            out["publish"] = job.result()
        out["peak"] = peak
        out["sessions"] = pg.client_sessions()
        out["alive_after"] = fleet.alive()
        out.update(fleet.log_problems())
    return out
