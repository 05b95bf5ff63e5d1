"""Fault-suite fixtures: a throwaway PostgreSQL per test, workers with one ledger file per process."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from acceptance.conftest import _WORKERS, ROOT, Cluster, Worker
from celery import Celery

from examples import tasks
from kombu_akadze.errors import TransientDatabaseError
from kombu_akadze.integrations import batch
from kombu_akadze.store import Store, migrate

from .checker import VERDICTS, Ledgers, table
from .jobs import TOUCH
from .pgserver import ADMIN_APP, PgServer, throwaway_server

#: The schema on throwaway servers: the default one, as an operator would have it.
SCHEMA = "akadze"
#: application_name of the test's producer, so terminating "akadze-command" spares it.
PRODUCER_APP = "faults-producer"

_SERVER = pytest.StashKey[PgServer]()
T = TypeVar("T")


@dataclass
class Faults:
    """One fault test's world: a Cluster (workers, producer) plus ledgers and, usually, its own server."""

    cluster: Cluster
    ledgers: Ledgers
    server: PgServer | None = None
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.cluster.pg_url

    @property
    def store(self) -> Store:
        return self.cluster.store

    def worker_env(self, name: str, *, options: dict[str, Any] | None = None, url: str | None = None) -> dict[str, str]:
        """Environment of one worker process: its own ledger file; *url* (e.g. through a proxy) if given."""
        extra = {
            "AKADZE_LEDGER": str(self.ledgers.new(name)),
            # faults.jobs (the tasks) is imported from tests/ by `--include faults.jobs`.
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "tests"), os.environ.get("PYTHONPATH")) if p),
        }
        if url:
            extra["AKADZE_URL"] = url
        return self.cluster.env({**self.options, **(options or {})}, **extra)

    def start_worker(
        self,
        name: str,
        *,
        options: dict[str, Any] | None = None,
        url: str | None = None,
        concurrency: int = 2,
        pool: str = "prefork",
        args: Sequence[str] = (),
    ) -> Worker:
        env = self.worker_env(name, options=options, url=url)
        return self.cluster.start_worker(
            name, pool=pool, concurrency=concurrency, args=["--include", "faults.jobs", *args], env=env
        )

    def producer(self, options: dict[str, Any] | None = None, *, url: str | None = None) -> Celery:
        """A Celery app for sending tasks by name, on sessions named faults-producer."""
        base = url or self.url
        sep = "&" if "?" in base else "?"
        env = self.cluster.env(
            {**self.options, **(options or {})}, AKADZE_URL=f"{base}{sep}application_name={PRODUCER_APP}"
        )
        app = tasks.make_app(env)
        self.cluster.apps.append(app)
        return app

    def publish_many(
        self, app: Celery, task: str, calls: Sequence[tuple[list[Any], dict[str, Any]]], *, chunk: int = 500
    ) -> None:
        """send_task for every (args, kwargs), *chunk* messages per statement (kombu_akadze.integrations.batch)."""
        with app.producer_or_acquire() as producer:
            for start in range(0, len(calls), chunk):
                with batch.publishing(producer):
                    for args, kwargs in calls[start : start + chunk]:
                        app.send_task(task, args=args, kwargs=kwargs, producer=producer)

    def until(
        self,
        predicate: Callable[[], T],
        *,
        timeout: float,
        what: str,
        watch: Iterable[Worker] | None = None,
        interval: float = 0.1,
    ) -> T:
        """eventually(), but failing at once if a watched worker exits (a crash, not a slow machine);
        by default every worker alive when the wait begins is watched."""
        watched = [w for w in self.cluster.workers if w.alive] if watch is None else list(watch)
        deadline = time.monotonic() + timeout
        while True:
            for worker in watched:
                if not worker.alive:
                    raise AssertionError(
                        f"worker {worker.name} exited with code {worker.proc.returncode} while waiting for: {what}"
                    )
            value = predicate()
            if value:
                return value
            if time.monotonic() >= deadline:
                raise AssertionError(f"condition not met within {timeout} s: {what} (last: {value!r})")
            time.sleep(interval)

    def held_by(self, worker: Worker) -> list[int]:
        """Ids of the messages the worker's consumers hold right now (consumer ids carry the main pid)."""
        assert self.server is not None
        rows = self.server.execute("held_by", {"marker": f":{worker.pid}:"}, schema=self.cluster.schema)
        return [int(r[0]) for r in rows]

    def held_ids(self) -> set[int]:
        """Ids of every message some consumer holds right now (in flight)."""
        assert self.server is not None
        return {int(r[0]) for r in self.server.execute("held", schema=self.cluster.schema)}

    def queued(self) -> int:
        """Rows left in the messages table (the test's session may predate a restart: one retry)."""
        try:
            return self.cluster.queue_rows()
        except TransientDatabaseError:
            return self.cluster.queue_rows()


class Stream(threading.Thread):
    """Publishes faults.touch for n = 0, 1, ... at *rate* a second until stopped. A publish that raises
    (database down) is retried until it goes through, and only then counts as published, at that time."""

    def __init__(self, faults: Faults, *, rate: float, seconds: float = 0.01) -> None:
        super().__init__(name="producer", daemon=True)
        self.app = faults.producer()
        self.rate = rate
        self.seconds = seconds
        self.published: dict[int, float] = {}
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            try:
                self.app.send_task(TOUCH, args=[n], kwargs={"seconds": self.seconds})
            except Exception as exc:  # the point: a publish while down raises, and we retry
                self.errors.append(type(exc).__name__)
                self.stop.wait(0.2)
                continue
            self.published[n] = time.time()
            n += 1
            self.stop.wait(1 / self.rate)

    def finish(self) -> list[int]:
        """Stop publishing; every n that was published."""
        self.stop.set()
        self.join(60)
        assert not self.is_alive(), "the producer is stuck in a publish"
        return sorted(self.published)


class HeldSampler(threading.Thread):
    """Samples the ids of held messages every *interval* seconds on its own session, so a test can tell
    what was in flight around a fault it cannot stop the workers for (a killed session, a black hole)."""

    def __init__(self, faults: Faults, interval: float = 0.02) -> None:
        super().__init__(name="held-sampler", daemon=True)
        assert faults.server is not None
        self.server = faults.server
        self.schema = faults.cluster.schema
        self.interval = interval
        self.samples: list[tuple[float, frozenset[int]]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        query = self.server.sql("held", schema=self.schema)
        while not self.stop.wait(self.interval):
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.server.url(), autocommit=True, application_name=ADMIN_APP)
                ids = frozenset(int(r[0]) for r in conn.execute(query).fetchall())
            except psycopg.Error:
                conn = None  # the server is down or restarting: sample again later
                continue
            self.samples.append((time.time(), ids))
        if conn is not None:
            conn.close()

    def around(self, at: float, slack: float = 1.0) -> set[int]:
        """Every id held in some sample within *slack* seconds of *at*."""
        return {i for t, ids in list(self.samples) if abs(t - at) <= slack for i in ids}


def _faults(
    url: str, schema: str, store: Store, tmp_path: Path, request: pytest.FixtureRequest, server: PgServer | None
) -> Iterator[Faults]:
    cluster = Cluster(pg_url=url, schema=schema, store=store, tmp_path=tmp_path, node=request.node)
    faults = Faults(cluster, Ledgers(tmp_path / "ledgers"), server)
    try:
        yield faults
    finally:
        for worker in cluster.workers:
            worker.close()  # first: nothing may reconnect to a server started again below
        current = faults.server  # a failover test moves it to the promoted standby
        if current is not None:
            if not current.running:
                current.start()  # the demo table is dropped on it at close
            cluster.table.close()  # its session may predate a restart: drop() opens a new one
        cluster.close()


@pytest.fixture
def pg_server(request: pytest.FixtureRequest) -> Iterator[PgServer]:
    """A PostgreSQL of this test alone (127.0.0.1, free port): stop it, restart it, break it."""
    with throwaway_server() as server:
        request.node.stash[_SERVER] = server
        yield server


@pytest.fixture
def own(pg_server: PgServer, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Faults]:
    """Workers and a producer on this test's own server, schema migrated."""
    url = pg_server.url()
    migrate.apply(url, SCHEMA)
    store = Store(url, schema=SCHEMA, role="test")
    try:
        yield from _faults(url, SCHEMA, store, tmp_path, request, pg_server)
    finally:
        store.close()
        migrate.forget_checks()


@pytest.fixture
def shared(pg_url: str, schema: str, store: Store, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Faults]:
    """Workers and a producer on the shared server, in this test's fresh schema (for faults that
    leave PostgreSQL alone: bad input)."""
    yield from _faults(pg_url, schema, store, tmp_path, request, None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """On failure, attach every worker's log and the throwaway server's log."""
    report = yield
    if report.failed:
        for worker in item.stash.get(_WORKERS, []):
            report.sections.append((f"worker {worker.name} (pid {worker.pid}) log", worker.output()[-20000:]))
        server = item.stash.get(_SERVER, None)
        if server is not None:
            report.sections.append((f"postgres (port {server.port}) log", server.log_tail(80)))
    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if VERDICTS:
        terminalreporter.section("fault suite verdicts")
        terminalreporter.write_line(table(VERDICTS))
