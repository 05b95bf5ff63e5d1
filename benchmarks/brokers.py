"""The brokers compared in one run: their URLs and options, and the setup and cleanup of what a run creates."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import kombu
from pgstats import Pg

from kombu_akadze.store import migrate

logger = logging.getLogger("bench")

REFERENCE = "rabbitmq"
ALL = ("akadze", "rabbitmq", "rabbitmq_confirm", "redis", "sqla", "pgmq")


@dataclass(frozen=True)
class Endpoints:
    pg: str = "postgresql://postgres@127.0.0.1:5432/test"
    amqp: str = "pyamqp://guest:guest@127.0.0.1:5672//"
    redis: str = "redis://127.0.0.1:6379/0"


@dataclass
class Broker:
    """One broker configuration; ``names`` collects the queues and exchanges it was given, for cleanup."""

    name: str
    kind: str
    url: str
    transport_options: dict[str, Any]
    schema: str | None = None
    #: A scratch database of its own (pgmq: PGMQ's schema is always named pgmq, one per database).
    database: str | None = None
    names: set[str] = field(default_factory=set)

    def connection(self) -> kombu.Connection:
        return kombu.Connection(self.url, transport_options=dict(self.transport_options), connect_timeout=10)

    def queue_name(self, workload: str, run_id: str) -> str:
        name = f"bench-{run_id}-{workload}-{self.name}"
        self.names.add(name)
        return name

    def celery_env(
        self, *, queue: str, prefetch: int, key: str, redis_url: str, remote_control: bool = False
    ) -> dict[str, str]:
        return {
            "BENCH_REMOTE_CONTROL": "1" if remote_control else "0",
            "BENCH_BROKER_URL": self.url,
            "BENCH_TRANSPORT_OPTIONS": json.dumps(self.transport_options),
            "BENCH_QUEUE": queue,
            "BENCH_PREFETCH": str(prefetch),
            "BENCH_KEY": key,
            "BENCH_REDIS_URL": redis_url,
        }


def akadze_options() -> dict[str, Any]:
    """Transport options for the akadze broker of a by-hand run (BENCH_AKADZE_OPTIONS, a JSON object), to
    compare a setting side by side. The run's own schema always wins: its cleanup drops that schema."""
    text = os.environ.get("BENCH_AKADZE_OPTIONS", "{}")
    try:
        options = json.loads(text)
    except ValueError as exc:
        raise SystemExit(f"BENCH_AKADZE_OPTIONS must be a JSON object of transport options: {exc}") from None
    if not isinstance(options, dict):
        raise SystemExit(f"BENCH_AKADZE_OPTIONS must be a JSON object of transport options, not {text!r}")
    return options


def make(names: list[str], run_id: str, ends: Endpoints) -> list[Broker]:
    """The brokers to compare, each isolated to this run (schema, key prefix, queue names)."""
    pg_host = ends.pg.split("://", 1)[1]
    pgmq_db = f"akadze_bench_{run_id}_pgmq"
    made = {
        "akadze": Broker(
            "akadze",
            "akadze",
            f"akadze+{ends.pg}",
            {**akadze_options(), "schema": f"bench_{run_id}"},
            schema=f"bench_{run_id}",
        ),
        "rabbitmq": Broker("rabbitmq", "amqp", ends.amqp, {}),
        "rabbitmq_confirm": Broker("rabbitmq_confirm", "amqp", ends.amqp, {"confirm_publish": True}),
        "redis": Broker("redis", "redis", ends.redis, {"global_keyprefix": f"akadze-bench-{run_id}:"}),
        # kombu's sqla transport has fixed sequence and index names: a private search_path keeps it apart.
        "sqla": Broker(
            "sqla",
            "sqla",
            f"sqla+postgresql://{pg_host}",
            {"connect_args": {"options": f"-c search_path=bench_{run_id}_sqla"}},
            schema=f"bench_{run_id}_sqla",
        ),
        # kombu's own PostgreSQL transport (kombu 5.7) with its defaults: visibility_timeout 1800 s,
        # long poll wait_time_seconds 10 reading every poll_interval_ms 100, use_notify off. The
        # extension's binaries are not on the server: prepare() runs the plain-SQL install script
        # the pgmq wheel ships, so the transport must not CREATE EXTENSION (init_extension off).
        "pgmq": Broker(
            "pgmq",
            "pgmq",
            urllib.parse.urlunsplit(urllib.parse.urlsplit(ends.pg)._replace(scheme="pgmq", path=f"/{pgmq_db}")),
            {"init_extension": False},
            database=pgmq_db,
        ),
    }
    return [made[n] for n in names]


def prepare(brokers: list[Broker], ends: Endpoints) -> None:
    """Create what each broker needs up front, so no measurement pays for a migration."""
    for broker in brokers:
        if broker.kind == "akadze" and broker.schema:
            migrate.apply(ends.pg, broker.schema)
        elif broker.kind == "sqla" and broker.schema:
            with Pg(ends.pg) as pg:
                pg.run("schema_create", schema=broker.schema)
        elif broker.kind == "pgmq" and broker.database:
            prepare_pgmq(broker.database, ends)


def prepare_pgmq(database: str, ends: Endpoints) -> None:
    """A scratch database with PGMQ installed from the SQL script the pgmq wheel ships (no extension
    binaries needed), plus the send_topic overload kombu's transport calls (see queries.sql)."""
    from pgmq.install import install_pgmq_from_sql

    with Pg(ends.pg) as pg:
        pg.run("database_create", database=database)
    dsn = urllib.parse.urlunsplit(urllib.parse.urlsplit(ends.pg)._replace(path=f"/{database}"))
    version = install_pgmq_from_sql(dsn=dsn)
    logger.info("PGMQ %s installed from SQL in %s", version, database)
    with Pg(dsn) as pg:
        pg.run("pgmq_send_topic_with_headers")


def cleanup(brokers: list[Broker], ends: Endpoints, run_id: str) -> list[str]:
    """Remove every schema, queue, exchange and key this run created; returns what could not be removed."""
    problems: list[str] = []
    for broker in brokers:
        try:
            _cleanup_one(broker, ends)
        except Exception as exc:
            problems.append(f"{broker.name}: {type(exc).__name__}: {exc}")
    try:
        import redis

        client = redis.Redis.from_url(ends.redis)
        for pattern in (f"akadze-bench:{run_id}:*", f"akadze-bench-{run_id}:*"):
            for k in client.scan_iter(match=pattern, count=1000):
                client.delete(k)
    except Exception as exc:
        problems.append(f"redis counters: {type(exc).__name__}: {exc}")
    return problems


def _cleanup_one(broker: Broker, ends: Endpoints) -> None:
    if broker.kind == "akadze" and broker.schema:
        migrate.drop(ends.pg, broker.schema)
        migrate.forget_checks()
    elif broker.kind == "sqla" and broker.schema:
        dispose_sqla_engines()
        with Pg(ends.pg) as pg:
            pg.run("schema_drop", schema=broker.schema)
    elif broker.kind == "pgmq" and broker.database:
        with Pg(ends.pg) as pg:
            pg.run("database_drop", database=broker.database)
    elif broker.kind == "amqp":
        with broker.connection() as conn:
            for name in sorted(broker.names):
                for delete in ("queue_delete", "exchange_delete"):
                    channel = conn.channel()
                    with contextlib.suppress(Exception):  # never declared on this broker: nothing to delete
                        getattr(channel, delete)(name)
                    with contextlib.suppress(Exception):
                        channel.close()


def dispose_sqla_engines() -> None:
    """kombu's sqla channels cache engines (and idle-in-transaction sessions) per URL; close them all."""
    try:
        from kombu.transport.sqlalchemy import Channel
    except ImportError:
        return
    for engine, _session in list(Channel._engines.values()):
        engine.dispose()
    Channel._engines.clear()
