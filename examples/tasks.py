"""A Celery app on kombu-akadze, configured from the environment; `make demo` and the acceptance tests run it.

Environment
  AKADZE_URL                libpq URL of the database that holds the queue and the demo table;
                            broker_url is "akadze+" + AKADZE_URL (unset: "akadze://", the embedded server)
  AKADZE_TRANSPORT_OPTIONS  JSON object merged into broker_transport_options (schema, timings, ...)
  AKADZE_BROKER_TRANSPORT   if set (kombu_akadze.transport:Transport): broker_url is AKADZE_URL as is
                            and broker_transport names the class, instead of the akadze+ alias
  AKADZE_DEMO_SCHEMA        schema of the demo table ``done`` (default akadze_demo)
  AKADZE_LEDGER             file each task appends "<event> <n> <pid> <attempt>" lines to

This module never imports kombu_akadze: a `celery` process knows the akadze+ alias through the
package's celery.commands entry point, which is what this app proves.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from celery import Celery, Task
from psycopg import sql

RECORD = "examples.tasks.record"
SLOW = "examples.tasks.slow"
RELAY = "examples.tasks.relay"
DEFAULT_DEMO_SCHEMA = "akadze_demo"

_BLOCK = re.compile(r"^-- name: (?P<name>[a-z_]+)\s*$", re.M)


def _load_blocks(path: Path) -> dict[str, str]:
    """The ``-- name: x`` blocks of one .sql file, keyed by name."""
    text = path.read_text(encoding="utf-8")
    found = list(_BLOCK.finditer(text))
    ends = [m.start() for m in found[1:]] + [len(text)]
    return {m["name"]: text[m.end() : end].strip() for m, end in zip(found, ends, strict=True)}


QUERIES = _load_blocks(Path(__file__).with_name("demo.sql"))


def make_app(environ: Mapping[str, str]) -> Celery:
    """A Celery app configured from *environ* (see the module docstring); tasks are defined on ``app`` below."""
    url = environ.get("AKADZE_URL", "")
    transport = environ.get("AKADZE_BROKER_TRANSPORT", "")
    options = json.loads(environ.get("AKADZE_TRANSPORT_OPTIONS") or "{}")
    if not isinstance(options, dict):
        raise TypeError(f"AKADZE_TRANSPORT_OPTIONS must be a JSON object, not {options!r}")
    conf: dict[str, Any] = {
        "broker_url": url if transport else ("akadze+" + url if url else "akadze://"),
        "broker_transport_options": options,
        "broker_connection_retry_on_startup": True,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "result_backend": None,
        "task_ignore_result": True,
    }
    if transport:
        conf["broker_transport"] = transport
    celery_app = Celery("examples.tasks")
    celery_app.conf.update(conf)
    return celery_app


@dataclass(frozen=True)
class Progress:
    done: int
    duplicated: int
    runs: int


class DemoTable:
    """The demo table on one autocommit connection, opened on first use and again after a fork."""

    def __init__(self, url: str, schema: str = DEFAULT_DEMO_SCHEMA) -> None:
        self.url = url
        self.schema = schema
        self._conn: psycopg.Connection[Any] | None = None
        self._pid = 0
        self._inherited: list[psycopg.Connection[Any]] = []

    def __enter__(self) -> DemoTable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _query(self, name: str) -> sql.Composed:
        return sql.SQL(QUERIES[name]).format(schema=sql.Identifier(self.schema))  # type: ignore[arg-type]

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is not None and self._pid != os.getpid():
            # A forked child must not close the parent's session: keep it referenced, never use it.
            self._inherited.append(self._conn)
            self._conn = None
        if self._conn is None or self._conn.closed or self._conn.broken:
            # prepare_threshold=None: nothing prepared server-side, so it works behind PgBouncer too
            self._conn = psycopg.connect(
                self.url, autocommit=True, application_name="akadze-demo", prepare_threshold=None
            )
            self._pid = os.getpid()
        return self._conn

    def _fetch(self, name: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        with self._connection().cursor() as cur:
            cur.execute(self._query(name), params)
            return cur.fetchall() if cur.description else []

    def setup(self) -> None:
        self._fetch("done_setup")

    def reset(self) -> None:
        self.setup()
        self._fetch("done_reset")

    def drop(self) -> None:
        self._fetch("schema_drop")

    def record(self, n: int) -> int:
        return int(self._fetch("done_record", {"n": n})[0][0])

    def progress(self) -> Progress:
        done, duplicated, runs = self._fetch("done_progress")[0]
        return Progress(int(done), int(duplicated), int(runs))

    def rows(self) -> dict[int, int]:
        return {int(n): int(runs) for n, runs in self._fetch("done_rows")}

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and self._pid == os.getpid():
            conn.close()


app = make_app(os.environ)
_table: DemoTable | None = None


def demo_table() -> DemoTable:
    """This process's demo table (created if missing), on AKADZE_URL."""
    global _table
    if _table is None:
        url = os.environ.get("AKADZE_URL")
        if not url:
            raise RuntimeError("set AKADZE_URL to the libpq URL of the database that holds the demo table")
        table = DemoTable(url, os.environ.get("AKADZE_DEMO_SCHEMA") or DEFAULT_DEMO_SCHEMA)
        table.setup()
        _table = table
    return _table


def ledger(event: str, n: int, attempt: int | None) -> None:
    """Append one line to AKADZE_LEDGER (if set): what the tests read to see who ran what."""
    path = os.environ.get("AKADZE_LEDGER")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{event} {n} {os.getpid()} {attempt}\n")


def attempt_of(task: Task) -> int | None:
    """The kombu-akadze attempt of the running message, from its delivery_info (None on other brokers).
    Imported here, when a task runs in a worker (which has the package loaded), not at module import."""
    import kombu_akadze

    return kombu_akadze.attempt_of(task.request)


@app.task(bind=True, name=RECORD)
def record(self: Task, n: int) -> int:
    """Record *n* as done; running it again only bumps its run count."""
    attempt = attempt_of(self)
    ledger("start", n, attempt)
    runs = demo_table().record(n)
    ledger("done", n, attempt)
    return runs


@app.task(bind=True, name=SLOW)
def slow(self: Task, n: int, seconds: float, later_seconds: float = 0.0) -> int:
    """Like record, after sleeping *seconds* on the first attempt and *later_seconds* on later ones."""
    attempt = attempt_of(self)
    ledger("start", n, attempt)
    deadline = time.monotonic() + (seconds if attempt is None or attempt <= 1 else later_seconds)
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.1))
    runs = demo_table().record(n)
    ledger("done", n, attempt)
    return runs


@app.task(bind=True, name=RELAY)
def relay(self: Task, n: int) -> None:
    """Send record(n) from inside a task: a pool child that publishes (a sub-task, as a chain or a retry would)."""
    ledger("relay", n, attempt_of(self))
    record.delay(n)
