"""Workload g: how many ~1 KB persistent messages P publisher processes send per second, per variant.

Variants: a bare single-row INSERT (autocommit, synchronous commit) into a table shaped like akadze's
messages; the same INSERT with pg_notify in its transaction; kombu's Producer.publish into kombu's in-memory
transport followed by that bare INSERT (the ceiling of any kombu transport that stores a message as one
row: kombu's own client work plus the row); akadze through kombu's Producer.publish; RabbitMQ (pyamqp) with
publisher confirms. Every process connects first, then all start together.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import queue as queue_module
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import proccpu

#: ~1 KB of JSON, the body every variant sends (kombu serializes the same dict to the same bytes).
PAYLOAD = {"task": "bench.publish", "pad": "x" * 990}
BODY = json.dumps(PAYLOAD).encode()
#: What kombu stores beside a persistent message on the default exchange, roughly; constant per process.
PROPERTIES = {"delivery_mode": 2, "priority": 0, "body_encoding": "base64", "delivery_info": {"exchange": ""}}

VARIANTS = ("insert", "insert_notify", "kombu_insert", "akadze", "rabbitmq_confirm")
TITLES = {
    "insert": "bare INSERT",
    "insert_notify": "bare INSERT + NOTIFY",
    "kombu_insert": "kombu publish (in memory) + bare INSERT",
    "akadze": "akadze (kombu publish)",
    "rabbitmq_confirm": "RabbitMQ, confirms",
}
#: Seconds a process may take to import, connect and declare before the round starts without it.
READY_TIMEOUT = 60.0
#: The server processes (by /proc/<pid>/comm) whose CPU a variant's messages cost.
SERVER_PROCESSES = {"rabbitmq_confirm": ("beam.smp",)}
DEFAULT_SERVER_PROCESSES = ("postgres",)


@dataclass(frozen=True)
class Target:
    """Where one variant publishes; pickled into each publisher process."""

    variant: str
    queue: str
    url: str = ""  # kombu URL (akadze+..., pyamqp://...)
    transport_options: dict[str, Any] | None = None
    dsn: str = ""  # PostgreSQL, for the bare variants
    schema: str = ""
    table: str = ""
    channel: str = ""


def bare_sender(target: Target) -> tuple[Callable[[], None], Callable[[], None]]:
    import psycopg
    from pgstats import render
    from psycopg.types.json import Jsonb

    conn = psycopg.connect(target.dsn, autocommit=True, application_name="akadze-bench-publisher")
    block = "bare_insert_notify" if target.variant == "insert_notify" else "bare_insert"  # kombu_insert too
    sql = render(block, schema=target.schema, table=target.table)
    params = {
        "queue": target.queue,
        "body": BODY,
        "content_type": "application/json",
        "content_encoding": "utf-8",
        "headers": Jsonb({}),
        "properties": Jsonb(PROPERTIES),
        "channel": target.channel,
    }

    def send() -> None:
        conn.execute(sql, params, prepare=True)

    if target.variant != "kombu_insert":
        return send, conn.close
    import kombu

    memory = kombu.Connection("memory://")
    memory_queue = kombu.Queue(target.queue, routing_key=target.queue, durable=True)
    memory_queue(memory.default_channel).declare()
    producer = memory.Producer(serializer="json")
    published = 0

    def publish_then_insert() -> None:
        nonlocal published
        producer.publish(PAYLOAD, routing_key=target.queue, delivery_mode=2)
        published += 1
        if published % 1000 == 0:  # the in-memory queue would only grow: empty it now and then
            memory.default_channel.queue_purge(target.queue)
        send()

    def close() -> None:
        conn.close()
        memory.release()

    return publish_then_insert, close


def _kombu_sender(target: Target) -> tuple[Callable[[], None], Callable[[], None]]:
    import kombu

    import kombu_akadze  # noqa: F401  (registers the akadze+ URL scheme in this process)

    conn = kombu.Connection(target.url, transport_options=dict(target.transport_options or {}), connect_timeout=10)
    conn.ensure_connection(max_retries=3)
    kombu.Queue(target.queue, routing_key=target.queue, durable=True)(conn.default_channel).declare()
    producer = conn.Producer(serializer="json")

    def send() -> None:
        producer.publish(PAYLOAD, routing_key=target.queue, delivery_mode=2)

    return send, conn.release


def publisher(target: Target, seconds: float, ready: Any, go: Any, results: Any, release: Any) -> None:
    """One publisher process: connect, say ready, wait for the start, publish for *seconds*, report, and keep
    the connection until released (its server process's CPU is read before it ends)."""
    try:
        send, close = bare_sender(target) if target.dsn else _kombu_sender(target)
    except Exception as exc:
        ready.put(f"{type(exc).__name__}: {exc}")
        return
    ready.put(None)
    try:
        if not go.wait(READY_TIMEOUT * 2):
            results.put(("error", "never told to start"))
            return
        sent = 0
        cpu = time.process_time()
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            send()
            sent += 1
        results.put(("ok", sent, time.perf_counter() - start, time.process_time() - cpu))
    except Exception as exc:
        results.put(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        release.wait(READY_TIMEOUT)
        with contextlib.suppress(Exception):
            close()


def run_round(target: Target, *, processes: int, seconds: float) -> dict[str, Any]:
    """msgs/s of *processes* publishers of one variant started together, and the CPU each message cost the
    publishers (client) and the server's processes (server), in microseconds; errors are counted, not raised.
    The server's CPU is everything its processes used over the round (WAL writer and checkpointer too); the
    publishers keep their connections until it is read, so their server processes are still there."""
    ctx = multiprocessing.get_context("spawn")  # no psycopg or AMQP socket inherited across fork
    ready, results, go, release = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Event()
    procs = [
        ctx.Process(target=publisher, args=(target, seconds, ready, go, results, release)) for _ in range(processes)
    ]
    errors: list[str] = []
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + READY_TIMEOUT
        started = 0
        for _ in procs:
            try:
                problem = ready.get(timeout=max(deadline - time.monotonic(), 0.1))
            except queue_module.Empty:
                errors.append(f"publisher not ready after {READY_TIMEOUT:.0f} s")
                break
            if problem is None:
                started += 1
            else:
                errors.append(problem)
        names = SERVER_PROCESSES.get(target.variant, DEFAULT_SERVER_PROCESSES)
        server_before = proccpu.named(names)
        go.set()
        rates = []
        sent = 0
        client_cpu = 0.0
        for _ in range(started):
            try:
                outcome = results.get(timeout=seconds + READY_TIMEOUT)
            except queue_module.Empty:
                errors.append("publisher sent no result")
                break
            if outcome[0] == "ok":
                rates.append(outcome[1] / outcome[2])
                sent += outcome[1]
                client_cpu += outcome[3]
            else:
                errors.append(outcome[1])
        server_after = proccpu.named(names)
    finally:
        go.set()
        release.set()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)
    server = proccpu.cpu_used(server_before, server_after)
    return {
        "msgs_per_s": sum(rates), "processes": processes, "running": len(rates), "errors": errors,
        "client_us": client_cpu / sent * 1e6 if sent else None,
        "server_us": server / sent * 1e6 if sent and server is not None else None,
    }  # fmt: skip


def targets(akadze: Any, rabbit_confirm: Any, *, dsn: str, run_id: str) -> dict[str, Target]:
    """One target per variant; the akadze broker must point at *dsn* (the run's scratch database)."""
    schema = f"bench_{run_id}_bare"
    return {
        "insert": Target("insert", f"bench-{run_id}-g", dsn=dsn, schema=schema, table="insert_only"),
        "insert_notify": Target(
            "insert_notify", f"bench-{run_id}-g", dsn=dsn, schema=schema, table="insert_notify",
            channel=f"akadze-bench.{run_id}",
        ),
        "kombu_insert": Target("kombu_insert", f"bench-{run_id}-g", dsn=dsn, schema=schema, table="kombu_insert"),
        "akadze": Target(
            "akadze", akadze.queue_name("publish", run_id), url=f"{akadze.url}?application_name=akadze-bench-publisher",
            transport_options=akadze.transport_options,
        ),
        "rabbitmq_confirm": Target(
            "rabbitmq_confirm", rabbit_confirm.queue_name("publish", run_id), url=rabbit_confirm.url,
            transport_options=rabbit_confirm.transport_options,
        ),
    }  # fmt: skip


def prepare(found: dict[str, Target], pg: Any) -> None:
    """The bare tables (the akadze schema and the RabbitMQ queue are the brokers' own)."""
    bare = [t for t in found.values() if t.dsn]
    if bare:
        pg.run("schema_create", schema=bare[0].schema)
    for t in bare:
        pg.run("bare_table_create", schema=t.schema, table=t.table)


def empty(target: Target, pg: Any, akadze_schema: str, broker: Any) -> None:
    """Every round starts on an empty table (or queue): TRUNCATE, not DELETE, so no dead rows carry over."""
    if target.dsn:
        pg.run("table_truncate", schema=target.schema, table=target.table)
    elif target.variant == "akadze":
        pg.run("table_truncate", schema=akadze_schema, table="messages")
    else:
        with broker.connection() as conn, contextlib.suppress(Exception):  # not declared yet: nothing to purge
            conn.default_channel.queue_purge(target.queue)
