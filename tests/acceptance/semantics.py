"""Helpers of the worker-semantics acceptance tests: workers of semantics_app, its JSON ledger, and the tally."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from celery import Celery

from kombu_akadze.integrations.testing import eventually
from kombu_akadze.store import sqlfiles

from . import semantics_app
from .conftest import CELERY, ROOT, STOP_TIMEOUT, Cluster, Worker

SQL = sqlfiles.parse_blocks(Path(__file__).with_name("semantics.sql").read_text(encoding="utf-8"))

T = TypeVar("T")

APP = "tests.acceptance.semantics_app"
QUEUE = "celery"
#: The rejected-by-consumer reason kombu-akadze writes (kombu_akadze/qos.py REJECT_REASON).
REJECTED = "rejected by consumer (requeue=False)"
EXHAUSTED = "max_attempts exceeded"
FENCED = "not ours any more"

#: Lease timings of most semantics tests: a consumer silent for 2 s is dead (>= 2 x heartbeat_interval).
LEASE = {"heartbeat_interval": 0.4, "heartbeat_ttl": 2.0, "rescue_interval": 0.4, "poll_interval": 0.5}


@dataclass(frozen=True)
class Event:
    """One line of the semantics ledger: what a task saw when it noted *event*."""

    event: str
    key: int
    task: str
    id: str
    pid: int
    hostname: str
    t: float
    attempt: int | None
    message_id: int | None
    redelivered: bool | None
    routing_key: str | None
    retries: int
    eta: str | None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def node(self) -> str:
        """The worker's name before the @ (a, b, ...)."""
        return self.hostname.split("@", 1)[0]


@dataclass(frozen=True)
class SemTally:
    sent: int
    executions: int
    completed: int
    duplicates: int
    queued: int
    dead: int
    lost: int


@dataclass
class Semantics:
    """A Cluster whose workers run semantics_app; it knows which task id carries which key."""

    cluster: Cluster
    ledger: Path
    task_ids: dict[int, str] = field(default_factory=dict)

    # -- processes ----------------------------------------------------------------------------------------

    def env(
        self, transport_options: dict[str, Any] | None = None, conf: dict[str, Any] | None = None
    ) -> dict[str, str]:
        return self.cluster.env(
            {**LEASE, **(transport_options or {})},
            AKADZE_CELERY_CONF=json.dumps(conf or {}),
            AKADZE_SEM_LEDGER=str(self.ledger),
        )

    def start(
        self,
        name: str,
        *,
        pool: str = "prefork",
        concurrency: int = 1,
        args: Sequence[str] = (),
        transport_options: dict[str, Any] | None = None,
        conf: dict[str, Any] | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> Worker:
        """A `celery -A semantics_app worker` subprocess in its own process group, killed at teardown."""
        command = [CELERY, "-A", APP, "worker", "-P", pool, "-c", str(concurrency)]
        command += ["--loglevel=WARNING", "-n", f"{name}@%h", *args]
        log_path = self.cluster.tmp_path / f"worker-{name}.log"
        log = open(log_path, "wb")  # noqa: SIM115  (closed by Worker.close at teardown)
        env = {**self.env(transport_options, conf), **(extra_env or {})}
        proc = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        worker = Worker(name, proc, log_path, log)
        self.cluster.workers.append(worker)
        return worker

    def start_consuming(self, name: str, **kwargs: Any) -> Worker:
        """start(), then wait until the worker's connection is a registered consumer (it claims from now on)."""
        worker = self.start(name, **kwargs)
        self.wait_consuming(worker)
        return worker

    def wait_consuming(self, worker: Worker, timeout: float = 60.0) -> None:
        def up() -> bool:
            assert worker.alive, f"worker {worker.name} exited with {worker.proc.returncode}:\n{worker.output()}"
            return any(c["pid"] == worker.pid for c in self.consumers())

        eventually(up, timeout=timeout, what=f"worker {worker.name} registers as a consumer")

    def producer(self, transport_options: dict[str, Any] | None = None, conf: dict[str, Any] | None = None) -> Celery:
        app = semantics_app.make_semantics_app(self.env(transport_options, conf))
        self.cluster.apps.append(app)
        return app

    def send(self, app: Celery, task: str, key: int, *args: Any, **options: Any) -> str:
        """send_task(task, args=[key, *args], **options); remembers the task id of *key*."""
        kwargs = options.pop("kwargs", None)
        result = app.send_task(task, args=[key, *args], kwargs=kwargs, **options)
        self.task_ids[key] = result.id
        return str(result.id)

    def control(self, *arguments: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """`celery -A semantics_app <arguments>` (inspect, control) with this test's environment."""
        return subprocess.run(
            [CELERY, "-A", APP, *arguments],
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    @staticmethod
    def signal_group(worker: Worker, signum: signal.Signals) -> None:
        os.killpg(worker.pid, signum)

    @staticmethod
    def wait_exit(worker: Worker, timeout: float = STOP_TIMEOUT) -> int:
        return worker.proc.wait(timeout)

    # -- what happened ------------------------------------------------------------------------------------

    def events(self, event: str | None = None, key: int | None = None) -> list[Event]:
        found = []
        for line in self.ledger.read_text(encoding="utf-8").splitlines():
            raw = json.loads(line)
            known = {k: raw.pop(k) for k in list(raw) if k in Event.__dataclass_fields__ and k != "extra"}
            entry = Event(**known, extra=raw)
            if (event is None or entry.event == event) and (key is None or entry.key == key):
                found.append(entry)
        return found

    def starts(self, key: int | None = None) -> list[Event]:
        return self.events("start", key)

    def dones(self, key: int | None = None) -> list[Event]:
        return self.events("done", key)

    def messages(self) -> list[dict[str, Any]]:
        """Every row of the messages table, with the Celery task id from its headers."""
        return self._fetch("messages")

    def consumers(self) -> list[dict[str, Any]]:
        """Registered consumers and the age of their last heartbeat, in seconds (database clock)."""
        return self._fetch("consumers")

    def dead(self) -> list[dict[str, Any]]:
        """Dead letters with the Celery task id from their headers."""
        return [
            {**d, "task_id": (d.get("headers") or {}).get("id")} for d in self.cluster.store.deadletter_list(limit=1000)
        ]

    def dead_keys(self) -> dict[int, dict[str, Any]]:
        by_id = {d["task_id"]: d for d in self.dead()}
        return {k: by_id[t] for k, t in self.task_ids.items() if t in by_id}

    def queued_keys(self) -> dict[int, dict[str, Any]]:
        by_id = {m["task_id"]: m for m in self.messages()}
        return {k: by_id[t] for k, t in self.task_ids.items() if t in by_id}

    def _fetch(self, name: str) -> list[dict[str, Any]]:
        query = SQL[name].replace("{schema}", sqlfiles.quote_ident(self.cluster.schema))
        with psycopg.connect(self.cluster.pg_url, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(query)
            names = [c.name for c in cur.description or []]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def tally(
        self, keys: Iterable[int], *, behaviour: str, acked_by_celery: Iterable[int] = (), **numbers: Any
    ) -> SemTally:
        """Count what happened to *keys* and print it: executions (task starts), completed (recorded in the
        demo table), duplicates (keys recorded more than once), still queued, dead letters, and lost: keys
        neither completed, nor queued, nor in dead letters, nor knowingly acked by Celery (*acked_by_celery*,
        e.g. a failure acked under acks_on_failure_or_timeout)."""
        keys = sorted(set(keys))
        rows = self.cluster.table.rows()
        starts = self.starts()
        executions = sum(1 for e in starts if e.key in keys)
        completed = [k for k in keys if k in rows]
        duplicates = sum(1 for k in keys if rows.get(k, 0) > 1)
        queued, dead = self.queued_keys(), self.dead_keys()
        accounted = set(completed) | set(queued) | set(dead) | set(acked_by_celery)
        lost = [k for k in keys if k not in accounted]
        result = SemTally(len(keys), executions, len(completed), duplicates, len(queued), len(dead), len(lost))
        extra = "".join(f"  {name}: {value}" for name, value in numbers.items())
        print(
            f"\nbehaviour: {behaviour}\nsent: {result.sent}  executions: {result.executions}  completed: "
            f"{result.completed}  duplicates: {result.duplicates}  queued: {result.queued}  dead letters: "
            f"{result.dead}  lost: {result.lost}{extra}"
        )
        return result


@dataclass(frozen=True)
class Handover:
    """How a message held by a silent worker reached another one, on the database clock: *gap* is from the
    silent worker's last heartbeat to the other worker's claim (the rescue lies in between)."""

    gap: float
    run_count: int
    attempts: int


def handover(sem: Semantics, silent: Worker, message_ids: Sequence[int], *, timeout: float) -> list[Handover]:
    """Wait until each of *message_ids* is held by another consumer than *silent*'s, noting *silent*'s last
    heartbeat (its consumer row is deleted by the rescue) on the way. The new run must last long enough
    (a second) for its held row to be seen."""
    last_beat: list[Any] = []
    seen: dict[int, dict[str, Any]] = {}

    def claimed_by_others() -> bool:
        last_beat[:] = [c["heartbeat_at"] for c in sem.consumers() if c["pid"] == silent.pid] or last_beat
        rows = {m["id"]: m for m in sem.messages()}
        for message_id in message_ids:
            row = rows.get(message_id)
            if message_id not in seen and row is None:
                raise AssertionError(f"message {message_id} is gone before it was seen held by another worker")
            if row is not None and row["state"] == "held" and f":{silent.pid}:" not in row["owner"]:
                seen.setdefault(message_id, row)
        return len(seen) == len(message_ids)

    eventually(claimed_by_others, timeout=timeout, what=f"messages {list(message_ids)} held by another worker")
    assert last_beat, f"no heartbeat of worker {silent.name} seen before the rescue"
    return [
        Handover((seen[i]["claimed_at"] - last_beat[0]).total_seconds(), seen[i]["run_count"], seen[i]["attempts"])
        for i in message_ids
    ]


def seconds_since(t0: float) -> float:
    return time.monotonic() - t0


def settle(get: Callable[[], T], expected: T, *, timeout: float = 30.0, what: str = "") -> T:
    """Poll get() until it equals *expected*; fail with the last value seen (eventually() shows only False)."""
    seen: list[T] = []

    def matches() -> bool:
        seen[:] = [get()]
        return seen[0] == expected

    try:
        eventually(matches, timeout=timeout, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; expected {expected!r}, last seen {seen[0]!r}") from None
    return seen[0]
