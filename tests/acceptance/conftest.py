"""Acceptance fixtures: real `celery -A examples.tasks worker` subprocesses on the test schema, always killed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest
from celery import Celery

from kombu_akadze.store import Store

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # examples/ is not installed; `.venv/bin/pytest` does not put the root first

from examples import tasks  # noqa: E402

CELERY = str(Path(sys.executable).with_name("celery"))

#: Lease timings short enough for faults to heal in seconds (heartbeat_ttl >= 2 x heartbeat_interval);
#: a short poll, as a busy prefork worker claims again only at its next poll.
FAST_WORKER = {"heartbeat_interval": 0.5, "heartbeat_ttl": 3.0, "rescue_interval": 0.5}

#: Seconds a worker gets to finish a warm shutdown before a test calls it hung.
STOP_TIMEOUT = 60.0

_WORKERS = pytest.StashKey[list["Worker"]]()


@dataclass
class Worker:
    """One `celery worker` subprocess, leader of its own process group."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    log: IO[bytes]

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def warm_shutdown(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM to the main process (Celery's warm shutdown); its exit code."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill_group(self) -> None:
        """SIGKILL to every process of the worker (main process and pool children) at once."""
        os.killpg(self.pid, signal.SIGKILL)
        self.proc.wait(STOP_TIMEOUT)

    def output(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)  # pool children too, even if the main process is gone
        self.proc.wait(STOP_TIMEOUT)
        self.log.close()


@dataclass(frozen=True)
class Entry:
    event: str
    n: int
    pid: int
    attempt: int | None


@dataclass(frozen=True)
class Tally:
    sent: int
    completed: int
    duplicated: int
    queued: int
    lost: int


@dataclass
class Cluster:
    """Workers, a producer and the demo table of one test; everything here is closed at teardown."""

    pg_url: str
    schema: str
    store: Store
    tmp_path: Path
    node: pytest.Item
    demo_schema: str = ""
    ledger: Path = field(init=False)
    table: tasks.DemoTable = field(init=False)
    workers: list[Worker] = field(default_factory=list)
    apps: list[Celery] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.demo_schema = self.demo_schema or f"{self.schema}_demo"
        self.ledger = self.tmp_path / "ledger.txt"
        self.ledger.touch()
        self.table = tasks.DemoTable(self.pg_url, self.demo_schema)
        self.table.setup()
        self.node.stash[_WORKERS] = self.workers

    def env(self, transport_options: dict[str, Any] | None = None, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AKADZE_")}
        env.update(
            AKADZE_URL=self.pg_url,
            AKADZE_TRANSPORT_OPTIONS=json.dumps({"schema": self.schema, **FAST_WORKER, **(transport_options or {})}),
            AKADZE_DEMO_SCHEMA=self.demo_schema,
            AKADZE_LEDGER=str(self.ledger),
        )
        env.update(extra)
        return env

    def start_worker(
        self,
        name: str,
        *,
        pool: str = "prefork",
        concurrency: int = 2,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> Worker:
        command = [CELERY, "-A", "examples.tasks", "worker", "-P", pool, "-c", str(concurrency)]
        command += ["--loglevel=WARNING", "-n", f"{name}@%h", *args]
        log_path = self.tmp_path / f"worker-{name}.log"
        log = open(log_path, "wb")  # noqa: SIM115  (closed by Worker.close at teardown)
        proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env or self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        worker = Worker(name, proc, log_path, log)
        self.workers.append(worker)
        return worker

    def producer(self, **extra_env: str) -> Celery:
        """A Celery app configured like the workers, for sending tasks by name."""
        app = tasks.make_app(self.env(**extra_env))
        self.apps.append(app)
        return app

    def entries(self) -> list[Entry]:
        found = []
        for line in self.ledger.read_text(encoding="utf-8").splitlines():
            event, n, pid, attempt = line.split()
            found.append(Entry(event, int(n), int(pid), None if attempt == "None" else int(attempt)))
        return found

    def started(self, n: int) -> list[Entry]:
        return [e for e in self.entries() if e.event == "start" and e.n == n]

    def tally(self, sent: Iterable[int], *, injected: str) -> Tally:
        """Compare what went in with the demo table and the queue, print the outcome of the fault, return it.

        Lost: sent, never completed, and no longer in the queue table either.
        """
        sent = set(sent)
        rows = self.table.rows()
        completed = len(sent & rows.keys())
        duplicated = sum(1 for n in sent if rows.get(n, 0) > 1)
        queued = self.queue_rows()
        result = Tally(len(sent), completed, duplicated, queued, max(len(sent) - completed - queued, 0))
        print(
            f"\ninjected: {injected}\nmessages in: {result.sent}  completed: {result.completed}  "
            f"duplicated: {result.duplicated}  still queued: {result.queued}  lost: {result.lost}"
        )
        return result

    def queue_rows(self) -> int:
        return sum(self.store.message_counts().values())

    def message_rows(self, upto: int) -> list[dict[str, Any]]:
        """The rows of message ids 1..upto that still exist (ids of a fresh schema start at 1)."""
        return [row for i in range(1, upto + 1) if (row := self.store.message_get(i)) is not None]

    def close(self) -> None:
        for worker in self.workers:
            worker.close()
        for app in self.apps:
            app.close()
        self.table.drop()
        self.table.close()


@pytest.fixture
def cluster(
    pg_url: str, schema: str, store: Store, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Cluster]:
    c = Cluster(pg_url=pg_url, schema=schema, store=store, tmp_path=tmp_path, node=request.node)
    try:
        yield c
    finally:
        c.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """On failure, attach every worker's log to the report."""
    report = yield
    if report.failed:
        for worker in item.stash.get(_WORKERS, []):
            report.sections.append((f"worker {worker.name} (pid {worker.pid}) log", worker.output()))
    return report


@pytest.fixture
def sem(cluster: Cluster) -> Any:
    """The cluster of a worker-semantics test: workers of tests/acceptance/semantics_app.py, a JSON ledger."""
    from .semantics import Semantics  # imports this module: late, to keep the import order one-way

    ledger = cluster.tmp_path / "semantics-ledger.jsonl"
    ledger.touch()
    return Semantics(cluster, ledger)
