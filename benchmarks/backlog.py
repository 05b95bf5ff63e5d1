"""Workload e: single get+ack latency on an empty queue vs behind a large backlog, and the table's size over time."""

from __future__ import annotations

import os
import socket
import statistics
import time
from collections.abc import Callable
from typing import Any

import kombu
import kombu_level
from brokers import Broker, Endpoints
from celery_level import percentile
from pgstats import Pg

from kombu_akadze.lease import compact
from kombu_akadze.store import NewMessage, Store, migrate

BATCH = 10_000
DRAIN_BATCH = 5_000


def get_ack_latency(broker: Broker, *, run_id: str, samples: int, sample_cap: float) -> dict[str, float]:
    """Reference figure for every broker: publish one message, then time one basic_get + ack; repeat."""
    name = broker.queue_name("getack", run_id)
    exchange, queue = kombu_level.entities(name)
    with broker.connection() as conn:
        producer = conn.Producer(serializer="json")
        queue(producer.channel).declare()
        result = _timed_gets(conn, producer, exchange, queue, samples, publish_each=True, cap=sample_cap)
        queue(conn.default_channel).delete()
    return result


def _timed_gets(
    conn: kombu.Connection,
    producer: kombu.Producer,
    exchange: kombu.Exchange,
    queue: kombu.Queue,
    samples: int,
    *,
    publish_each: bool,
    cap: float = 20.0,
) -> dict[str, float]:
    """*samples* timed get+acks, or as many as fit in *cap* seconds (at least one)."""
    bound = queue(conn.default_channel)
    # Warm-up: the first get registers an akadze consumer and starts its heartbeat.
    kombu_level.publish(producer, exchange, queue.name, 1, 10.0)
    _get_one(bound)
    times: list[float] = []
    deadline = time.monotonic() + cap
    while len(times) < samples and (not times or time.monotonic() < deadline):
        if publish_each:
            kombu_level.publish(producer, exchange, queue.name, 1, 10.0)
        start = time.perf_counter()
        _get_one(bound)
        times.append((time.perf_counter() - start) * 1000.0)
    times.sort()
    return {"p50_ms": statistics.median(times), "p99_ms": percentile(times, 99), "samples": float(len(times))}


def _get_one(bound: kombu.Queue, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        message = bound.get(no_ack=False)
        if message is not None:
            message.ack()
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"no message in queue {bound.name!r} within {timeout} s")


def run(
    ends: Endpoints,
    *,
    run_id: str,
    total: int,
    samples: int,
    sample_cap: float,
    drain_cap: float,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Fill one akadze queue with *total* rows via message_insert_many, measure, drain by claim+ack, VACUUM."""
    schema = f"bench_{run_id}_backlog"
    broker = Broker("akadze", "akadze", f"akadze+{ends.pg}", {"schema": schema}, schema=schema)
    name = f"bench-{run_id}-backlog"
    exchange, queue = kombu_level.entities(name)
    out: dict[str, Any] = {"total": total, "sizes": {}, "latency": {}}
    migrate.apply(ends.pg, schema)
    store = Store(ends.pg, schema=schema, role="bench")
    try:
        with Pg(ends.pg) as pg:
            with broker.connection() as conn:
                producer = conn.Producer(serializer="json")
                queue(producer.channel).declare()
                template = _template(producer, exchange, store, name)
                out["sizes"]["before"] = pg.sizes(schema, "messages")
                out["latency"]["empty"] = _timed_gets(
                    conn, producer, exchange, queue, samples, publish_each=True, cap=sample_cap
                )

                start = time.perf_counter()
                for offset in range(0, total, BATCH):
                    store.message_insert_many([template] * min(BATCH, total - offset))
                out["insert_per_s"] = total / (time.perf_counter() - start)
                out["sizes"]["peak"] = _sizes(pg, schema)
                log(f"inserted {total:,} rows at {out['insert_per_s']:,.0f} rows/s")
                out["latency"]["backlog"] = _timed_gets(
                    conn, producer, exchange, queue, samples, publish_each=False, cap=sample_cap
                )
                pg.run("table_analyze", schema=schema, table="messages")
                out["latency"]["backlog_analyzed"] = _timed_gets(
                    conn, producer, exchange, queue, samples, publish_each=False, cap=sample_cap
                )
            # The kombu connection (and its rescue pass) is closed: only the drain below holds rows now.
            out["drain"] = _drain(store, name, drain_cap)
            log(f"drained {out['drain']['claimed']:,} rows at {out['drain']['per_s']:,.0f} rows/s")
            out["sizes"]["drained"] = _sizes(pg, schema)
            pg.run("table_vacuum", schema=schema, table="messages")
            out["sizes"]["vacuumed"] = pg.sizes(schema, "messages")
            start = time.perf_counter()
            result = compact.run_once(store)
            out["compact"] = {
                "compacted": result.compacted,
                "skipped": result.skipped,
                "seconds": time.perf_counter() - start,
            }
            out["sizes"]["compacted"] = pg.sizes(schema, "messages")
            with broker.connection() as conn:
                producer = conn.Producer(serializer="json")
                queue(producer.channel).declare()
                out["latency"]["after_vacuum"] = _timed_gets(
                    conn, producer, exchange, queue, samples, publish_each=True, cap=sample_cap
                )
    finally:
        store.close()
        migrate.drop(ends.pg, schema)
        migrate.forget_checks()
    return out


def _sizes(pg: Pg, schema: str) -> dict[str, int]:
    time.sleep(1.2)  # tuple counts come from the store session's statistics, published within a second
    return pg.sizes(schema, "messages")


def _template(producer: kombu.Producer, exchange: kombu.Exchange, store: Store, queue: str) -> NewMessage:
    """A row exactly as the transport stores a published message, to copy a million times."""
    kombu_level.publish(producer, exchange, queue, 1, 10.0)
    claimed = store.message_claim(queues=[queue], limits=[1], owner="bench-template")
    store.message_ack([m.tag for m in claimed], owner="bench-template")
    row = claimed[0]
    return NewMessage(
        queue=queue,
        body=row.body,
        priority=row.priority,
        content_type=row.content_type,
        content_encoding=row.content_encoding,
        headers=row.headers,
        properties=row.properties,
    )


def _drain(store: Store, queue: str, cap: float) -> dict[str, float]:
    """Claim + ack in batches, as a consumer with a large prefetch would; purge what the cap leaves."""
    owner = f"bench-drain-{os.getpid()}"
    store.consumer_heartbeat(consumer_id=owner, hostname=socket.gethostname(), pid=os.getpid())
    start = time.perf_counter()
    claimed = 0
    while time.perf_counter() - start < cap:
        batch = store.message_claim(queues=[queue], limits=[DRAIN_BATCH], owner=owner)
        if not batch:
            break
        store.message_ack([m.tag for m in batch], owner=owner)
        claimed += len(batch)
    elapsed = time.perf_counter() - start
    purged = store.queue_purge(name=queue)
    store.consumer_delete(consumer_id=owner)
    return {"claimed": float(claimed), "per_s": claimed / elapsed if elapsed else 0.0, "purged": float(purged)}
