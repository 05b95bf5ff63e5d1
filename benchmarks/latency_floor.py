"""PostgreSQL's own floors under akadze's fleet figures, measured with bare psycopg: enqueue -> claimed latency
(beside RabbitMQ's enqueue -> delivered), and the transactions one NOTIFY costs the server per LISTENing session.

    .venv/bin/python benchmarks/latency_floor.py [--count 300] [--rate 20] [--listeners 0,8,16,32] [--out DIR]

One message at a time at a fixed rate into an idle consumer, the fastest way each broker allows:
PostgreSQL: an autocommit INSERT with pg_notify in the statement (synchronous commit, as every akadze
publish), the consumer's LISTEN session receives the NOTIFY (select on its socket), then a claim
statement on a second session (UPDATE ... FOR UPDATE SKIP LOCKED, asynchronous commit as akadze's
claims) returns the row. RabbitMQ: a persistent publish with publisher confirms, the consumer's
basic_consume delivers it (the confirm is awaited after the delivery is read, so the two overlap as
they do for a Celery producer). No Celery, no kombu-akadze: the floor below any transport. The
Celery-level latencies of the fleet benchmark (docs/benchmarks/fleet/results.md) sit on top of these.

NOTIFY fan-out: L idle sessions LISTEN, each on a channel of its own; one publisher commits INSERT +
NOTIFY to one of them. PostgreSQL 15 signals every LISTENing session of the database at each NOTIFY
commit (async.c, SignalBackends), and each one reads the notification queue in a transaction of its own,
counted in pg_stat_database once that session reports its statistics (at its next statement: each
listener runs one after the window). Transactions per publish, minus the publish itself, is that cost.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import psycopg  # noqa: E402
from pgstats import Pg, render  # noqa: E402

BODY = json.dumps({"task": "bench.floor", "pad": "x" * 990}).encode()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def postgres_floor(dsn: str, count: int, rate: float) -> dict[str, list[float]]:
    schema, table, channel = f"akadze_floor_{uuid.uuid4().hex[:8]}", "messages", "akadze_floor"
    with Pg(dsn) as pg:
        pg.run("schema_create", schema=schema)
        pg.run("bare_table_create", schema=schema, table=table)
    publisher = psycopg.connect(dsn, autocommit=True, application_name="akadze-bench-floor")
    listener = psycopg.connect(dsn, autocommit=True, application_name="akadze-bench-floor")
    claimer = psycopg.connect(dsn, autocommit=True, application_name="akadze-bench-floor")
    claimer.execute("SET synchronous_commit = off")
    listener.execute(render("floor_listen", channel=channel))
    publish = render("bare_insert_notify", schema=schema, table=table)
    claim = render("floor_claim", schema=schema, table=table)
    params = {"queue": "q", "body": BODY, "content_type": "application/json", "content_encoding": "utf-8",
              "headers": "{}", "properties": "{}", "channel": channel}  # fmt: skip
    out: dict[str, list[float]] = {"published": [], "woken": [], "claimed": []}
    try:
        for i in range(count + 10):
            due = time.perf_counter() + 1.0 / rate
            t0 = time.perf_counter()
            publisher.execute(publish, params, prepare=True)
            t1 = time.perf_counter()
            pgconn = listener.pgconn
            while True:
                pgconn.consume_input()
                if pgconn.notifies() is not None:
                    break
                select.select([listener.fileno()], [], [], 5.0)
            t2 = time.perf_counter()
            row = claimer.execute(claim, {"queue": "q"}, prepare=True).fetchone()
            t3 = time.perf_counter()
            assert row is not None
            if i >= 10:  # warm-up: prepared statements, caches
                out["published"].append((t1 - t0) * 1000)
                out["woken"].append((t2 - t0) * 1000)
                out["claimed"].append((t3 - t0) * 1000)
            time.sleep(max(0.0, due - time.perf_counter()))
    finally:
        for conn in (publisher, listener, claimer):
            conn.close()
        with Pg(dsn) as pg:
            pg.run("schema_drop", schema=schema)
    return out


def rabbitmq_floor(url: str, count: int, rate: float) -> dict[str, list[float]]:
    import amqp  # kombu's own AMQP client (pyamqp)

    host = url.split("@", 1)[-1].split("/", 1)[0]
    queue = f"akadze_floor_{uuid.uuid4().hex[:8]}"
    conn = amqp.Connection(host=host, userid="guest", password="guest", confirm_publish=True)
    conn.connect()
    consumer = amqp.Connection(host=host, userid="guest", password="guest")
    consumer.connect()
    out: dict[str, list[float]] = {"published": [], "delivered": []}
    got = threading.Event()
    arrived: list[float] = []
    try:
        pub = conn.channel()
        pub.queue_declare(queue, durable=True, auto_delete=False)
        sub = consumer.channel()
        sub.basic_qos(0, 1, False)

        def on_message(message: amqp.Message) -> None:
            arrived.append(time.perf_counter())
            message.channel.basic_ack(message.delivery_tag)
            got.set()

        tag = sub.basic_consume(queue, callback=on_message)

        def drain() -> None:
            while not stop.is_set():
                try:
                    consumer.drain_events(timeout=0.2)
                except TimeoutError:
                    continue

        stop = threading.Event()
        thread = threading.Thread(target=drain, daemon=True)
        thread.start()
        for i in range(count + 10):
            due = time.perf_counter() + 1.0 / rate
            got.clear()
            t0 = time.perf_counter()
            pub.basic_publish(amqp.Message(BODY, delivery_mode=2, content_type="application/json"), routing_key=queue)
            t1 = time.perf_counter()
            got.wait(5.0)
            if i >= 10:
                out["published"].append((t1 - t0) * 1000)
                out["delivered"].append((arrived[-1] - t0) * 1000)
            time.sleep(max(0.0, due - time.perf_counter()))
        stop.set()
        thread.join(2)
        sub.basic_cancel(tag)
        pub.queue_delete(queue)
    finally:
        conn.close()
        consumer.close()
    return out


def notify_fanout(dsn: str, listeners: int, count: int) -> float:
    """Server transactions per INSERT + NOTIFY commit with *listeners* idle LISTENing sessions (the publish's
    own included)."""
    schema, table = f"akadze_fanout_{uuid.uuid4().hex[:8]}", "messages"
    with Pg(dsn) as pg:
        pg.run("schema_create", schema=schema)
        pg.run("bare_table_create", schema=schema, table=table)
    sessions = [psycopg.connect(dsn, autocommit=True, application_name="akadze-bench-floor") for _ in range(listeners)]
    publisher = psycopg.connect(dsn, autocommit=True, application_name="akadze-bench-floor")
    sampler = Pg(dsn)
    flush = render("stats_flush")
    publish = render("bare_insert_notify", schema=schema, table=table)
    params = {"queue": "q", "body": BODY, "content_type": "application/json", "content_encoding": "utf-8",
              "headers": "{}", "properties": "{}", "channel": "akadze_fanout_0"}  # fmt: skip
    try:
        for i, conn in enumerate(sessions):
            conn.execute(render("floor_listen", channel=f"akadze_fanout_{i}"))

        def settled_count() -> int:
            time.sleep(1.2)  # a session reports its statistics at most once a second
            for conn in (*sessions, publisher):
                conn.execute(flush)
            time.sleep(0.3)
            return sampler.activity_counter(use_statements=False)

        before = settled_count()
        for _ in range(count):
            publisher.execute(publish, params, prepare=True)
            time.sleep(0.02)
        after = settled_count()
        own = len(sessions) + 1 + 2  # the flushes, and the sampler's two reads
        return (after - before - own) / count
    finally:
        for conn in (*sessions, publisher):
            conn.close()
        sampler.close()
        with Pg(dsn) as pg:
            pg.run("schema_drop", schema=schema)


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--count", type=int, default=300)
    p.add_argument("--rate", type=float, default=20.0)
    p.add_argument("--listeners", type=ints, default=(0, 1, 8, 16, 32), help="LISTENing sessions per fan-out round")
    p.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    p.add_argument("--amqp-url", default=os.environ.get("BENCH_AMQP_URL", "pyamqp://guest:guest@127.0.0.1:5672//"))
    p.add_argument("--out", default=str(HERE.parent / "docs" / "benchmarks" / "fleet"))
    args = p.parse_args(argv)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = os.getloadavg()
    pg = postgres_floor(args.pg_url, args.count, args.rate)
    rmq = rabbitmq_floor(args.amqp_url, args.count, args.rate)
    fanout = {n: notify_fanout(args.pg_url, n, 200) for n in args.listeners}
    rows = [
        ("PostgreSQL: INSERT + NOTIFY committed (sync)", pg["published"]),
        ("PostgreSQL: NOTIFY read by the LISTEN session", pg["woken"]),
        ("PostgreSQL: claimed (SKIP LOCKED, async commit)", pg["claimed"]),
        ("RabbitMQ: publish confirmed", rmq["published"]),
        ("RabbitMQ: delivered to basic_consume", rmq["delivered"]),
    ]
    lines = [
        "# Latency floor: enqueue -> claimed without Celery or a transport",
        "",
        f"`benchmarks/latency_floor.py` on {started}; {args.count} messages at {args.rate:g}/s into an idle "
        f"consumer; load average at start {load[0]:.2f}. See the script's docstring for what each step is.",
        "",
        "| from the start of the publish to | p50 ms | p99 ms |",
        "|---|---|---|",
        *(f"| {name} | {statistics.median(v):.2f} | {pct(v, 0.99):.2f} |" for name, v in rows),
        "",
        f"PostgreSQL's floor for enqueue -> claimed is {statistics.median(pg['claimed']):.2f} ms at p50, "
        f"{statistics.median(pg['claimed']) / statistics.median(rmq['delivered']):.2f}x RabbitMQ's "
        f"enqueue -> delivered ({statistics.median(rmq['delivered']):.2f} ms). A message handed over in its "
        f"NOTIFY (akadze's handoff to a parked consumer, migration 0018) needs no claim: its floor is the "
        f"notification read, {statistics.median(pg['woken']):.2f} ms, "
        f"{statistics.median(pg['woken']) / statistics.median(rmq['delivered']):.2f}x.",
        "",
        "## What one NOTIFY costs the server per LISTENing session",
        "",
        "200 INSERT + NOTIFY commits to one channel while L other idle sessions LISTEN on channels of their own.",
        "",
        "| LISTENing sessions | server transactions per publish | of which wake-ups of listeners |",
        "|---|---|---|",
        *(f"| {n} | {v:.2f} | {v - 1:.2f} |" for n, v in fanout.items()),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "latency-floor.md").write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
