"""By hand: where a single worker's no-op drain spends the machine, akadze against RabbitMQ in one run.

Workload b's drain (``celery worker -P prefork -c 2``, acks_late, no-op tasks enqueued first), alternating
the two brokers, with the CPU each process group spent per task read from /proc (Linux) between the
worker's ready signal and its last task: the worker's main process (Celery's event loop and the
transport), its pool children, and the broker's server processes (every ``postgres`` process, or
RabbitMQ's ``beam.smp``). Also per task: how long the main process waited for a CPU while runnable
(/proc/<pid>/schedstat) and, for akadze, the transactions the bench database committed.

Then, in the same run, PostgreSQL's floor for the statement a claim needs: server CPU per statement of
a tight loop on one session, for a round trip that does nothing (``SELECT`` of 7 parameters), the bare
claim UPDATE of latency_floor.py, and akadze's own message_ack_claim (ack the last message, claim one).

    .venv/bin/python benchmarks/drain_profile.py                      # x1 and x4, 3 repeats, 10,000 tasks
    .venv/bin/python benchmarks/drain_profile.py --prefetch 1 --repeat 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import brokers  # noqa: E402
import celery_level  # noqa: E402
import celeryapp  # noqa: E402
import proccpu  # noqa: E402
from pgstats import Pg, render  # noqa: E402

from kombu_akadze.store import sqlfiles  # noqa: E402
from kombu_akadze.store.records import ack_claim_params  # noqa: E402

#: The broker's server processes, by command name (as publishers.py charges a publish to its server).
SERVERS = {"akadze": ("postgres",), "rabbitmq": ("beam.smp",)}
#: Per (broker, prefetch multiplier): each drain's figures.
Samples = dict[tuple[str, int], list[dict[str, Any]]]


def waited(pid: int) -> float:
    """Seconds the main thread of *pid* spent runnable but not running, so far."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9


def groups(main: int, broker: str) -> dict[str, dict[int, float] | None]:
    """CPU seconds so far, by pid, of the worker's main process, its children, and the broker's server."""
    return {
        "main": proccpu.cpu_by_pid(lambda pid, comm, ppid: pid == main),
        "children": proccpu.cpu_by_pid(lambda pid, comm, ppid: ppid == main),
        "server": proccpu.named(SERVERS[broker]),
    }


def drain(broker: brokers.Broker, ends: brokers.Endpoints, run_id: str, prefetch: int, total: int) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    queue = broker.queue_name(f"profile-p{prefetch}-{tag}", run_id)
    key = f"akadze-bench:{run_id}:{tag}:"
    celery_level.enqueue(broker, queue, celeryapp.NOOP, (total,), total)
    logdir = Path(tempfile.mkdtemp(prefix="akadze-profile-"))
    worker = celery_level.Worker(broker, queue=queue, prefetch=prefetch, key=key, redis_url=ends.redis, logdir=logdir)
    pg = Pg(ends.pg)
    try:
        worker.start()
        ready = worker.wait_ready()
        assert worker.proc is not None
        main = worker.proc.pid
        commits = pg.activity_counter(False)
        before, wait0 = groups(main, broker.name), waited(main)
        started = int(worker.redis.get(key + "count") or 0)  # tasks done before the first reading
        done = celery_level.wait_done(worker, worker.redis, key, total, ready, cap=60.0)
        after, wait1 = groups(main, broker.name), waited(main)
        commits = pg.activity_counter(False) - commits
        measured = int(worker.redis.get(key + "count") or 0) - started
    finally:
        pg.close()
        celery_level.stop_in_background(worker, broker, queue, print)
        celery_level.settle()
    if done.get("partial"):
        print(f"!! {broker.name} x{prefetch}: {done['done']} of {total} tasks in the 60 s cap")
    per_task = {k: (proccpu.cpu_used(before[k], after[k]) or 0.0) * 1e6 / measured for k in after}
    out = {"tasks_per_s": done["tasks_per_s"], **per_task, "waited": (wait1 - wait0) * 1e6 / measured}
    out["total"] = sum(per_task.values())
    if broker.kind == "akadze":
        out["transactions"] = commits / measured
    return out


def backend_cpu(conn: psycopg.Connection) -> float:
    pid = conn.info.backend_pid
    return (proccpu.cpu_by_pid(lambda p, comm, ppid: p == pid) or {}).get(pid, 0.0)


def floors(ends: brokers.Endpoints, broker: brokers.Broker, run_id: str, count: int = 3000) -> dict[str, float]:
    """Server CPU (us) per statement of tight loops on one session over a backlog of *count* Celery no-op
    messages: a round trip that touches no table, the bare ack+claim on a copy of the same rows in a table
    with akadze's columns and indexes, and akadze's message_ack_claim itself."""
    out: dict[str, float] = {}
    floor = f"bench_{run_id}_floor"
    queue = broker.queue_name(f"profile-floor-{uuid.uuid4().hex[:6]}", run_id)
    celery_level.enqueue(broker, queue, celeryapp.NOOP, (count,), count + 20)
    with Pg(ends.pg) as pg:
        pg.run("schema_create", schema=floor)
        pg.run("bare_table_create", schema=floor, table="m")
        pg.run("floor_copy_messages", {"queue": queue}, schema=floor, table="m", source=broker.schema or "")
    conn = psycopg.connect(ends.pg, autocommit=True, application_name="akadze-bench-profile")
    try:
        conn.execute("SET synchronous_commit = off")  # as akadze's ack+claim commits (durable_acks off)

        def loop(name: str, statement: str, args: Callable[[list[Any]], dict[str, Any]]) -> None:
            rows: list[Any] = []
            for i in range(count + 10):
                if i == 10:
                    cpu = backend_cpu(conn)
                rows = conn.execute(statement, args(rows), prepare=True).fetchall()
            out[name] = (backend_cpu(conn) - cpu) * 1e6 / count

        loop("round_trip", render("floor_round_trip"), lambda rows: {f"p{i}": i for i in range(7)})
        loop(
            "bare_ack_claim",
            render("floor_ack_claim", schema=floor, table="m"),
            lambda rows: {"ack_id": rows[0][0] if rows else 0, "ack_run_count": rows[0][8] if rows else 0},
        )
        loop(
            "ack_claim",
            sqlfiles.render("message_ack_claim", schema=broker.schema or ""),
            lambda rows: ack_claim_params(
                [(r[0], r[8]) for r in rows if r[10] == "claimed"], [queue], [1], "profile", None, durable=False
            ),
        )
    finally:
        conn.close()
        with Pg(ends.pg) as pg:
            pg.run("schema_drop", schema=floor)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefetch", type=int, nargs="+", default=[1, 4], help="prefetch multipliers (1 4)")
    parser.add_argument("--tasks", type=int, default=10_000, help="no-op tasks per drain (10,000)")
    parser.add_argument("--repeat", type=int, default=3, help="alternating repeats (3)")
    parser.add_argument("--pg-url", default=brokers.Endpoints.pg)
    parser.add_argument("--amqp-url", default=brokers.Endpoints.amqp)
    parser.add_argument("--redis-url", default=brokers.Endpoints.redis)
    args = parser.parse_args(argv)
    if not Path("/proc/self/schedstat").exists():
        sys.exit("drain_profile.py reads /proc (Linux with schedstats)")
    run_id = uuid.uuid4().hex[:8]
    ends = brokers.Endpoints(pg=args.pg_url, amqp=args.amqp_url, redis=args.redis_url)
    made = brokers.make(["akadze", "rabbitmq"], run_id, ends)
    brokers.prepare(made, ends)
    samples: Samples = {}
    try:
        for repeat in range(args.repeat):
            for prefetch in args.prefetch:
                for broker in made if repeat % 2 == 0 else made[::-1]:
                    got = drain(broker, ends, run_id, prefetch, args.tasks)
                    samples.setdefault((broker.name, prefetch), []).append(got)
                    print(f"[{time.strftime('%H:%M:%S')}] {broker.name} x{prefetch}: " + ", ".join(
                        f"{k} {v:,.0f}" if k == "tasks_per_s" else f"{k} {v:.2f}" if k == "transactions"
                        else f"{k} {v:.0f}" for k, v in got.items()))  # fmt: skip
        floor = floors(ends, made[0], run_id)
    finally:
        brokers.cleanup(made, ends, run_id)
    report(samples, floor, args.prefetch)
    return 0


def report(samples: Samples, floor: dict[str, float], prefetches: list[int]) -> None:
    def med(broker: str, prefetch: int, key: str) -> float:
        return statistics.median(s[key] for s in samples[(broker, prefetch)] if key in s)

    print("\nmedians; CPU and waits in us per task\n")
    print("| figure | " + " | ".join(f"akadze x{p} | RabbitMQ x{p} | ratio" for p in prefetches) + " |")
    print("|---|" + "---|---|---|" * len(prefetches))
    for key, label in [("tasks_per_s", "tasks/s"), ("main", "worker main process CPU"),
                       ("children", "pool children CPU"), ("server", "broker server CPU"),
                       ("total", "CPU, all three"), ("waited", "main process runnable, waiting")]:  # fmt: skip
        cells = []
        for p in prefetches:
            a, r = med("akadze", p, key), med("rabbitmq", p, key)
            cells.append(f"{a:,.0f} | {r:,.0f} | x{a / r:.2f}" if r else f"{a:,.0f} | {r:,.0f} | -")
        print(f"| {label} | " + " | ".join(cells) + " |")
    cells = [f"{med('akadze', p, 'transactions'):.2f} | - | -" for p in prefetches]
    print("| transactions per task | " + " | ".join(cells) + " |")
    print(
        "\nPostgreSQL server CPU per statement (us), one session in a tight loop over the same Celery messages:"
        f" a round trip of 7 parameters {floor['round_trip']:.0f}, the bare ack+claim {floor['bare_ack_claim']:.0f},"
        f" akadze's message_ack_claim {floor['ack_claim']:.0f} (x{floor['ack_claim'] / floor['bare_ack_claim']:.2f})"
    )


if __name__ == "__main__":
    raise SystemExit(main())
