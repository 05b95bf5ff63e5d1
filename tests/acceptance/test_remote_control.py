"""Remote control with three real workers: inspect, control, events, Flower, mingle, and dead clients' queues.

The three workers (threads pool: they answer control commands while tasks run, at little CPU) start once
for the module; tests that need a fourth worker start and stop it themselves.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psycopg
import pytest
from celery import Celery
from kombu import Exchange, Queue

from examples import tasks
from kombu_akadze.integrations.testing import eventually, fresh_schema, store_for
from kombu_akadze.store import wire

from .conftest import _WORKERS, CELERY, FAST_WORKER, ROOT, Cluster, Worker

HOST = socket.gethostname()
TRIO = [f"rc{i}@{HOST}" for i in (1, 2, 3)]
APP = "tests.acceptance.remote_control_app"
INSPECT_COMMANDS = ("ping", "active", "reserved", "scheduled", "stats", "active_queues")

pytestmark = pytest.mark.slow


@dataclass
class Trio:
    cluster: Cluster
    workers: list[Worker]
    app: Celery

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """`celery -A examples.tasks ARGS` on the test schema, as an operator would run it."""
        return subprocess.run(
            [CELERY, "-A", "examples.tasks", *args],
            cwd=ROOT,
            env=self.cluster.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def nodes(self, **kwargs: Any) -> set[str]:
        """The workers that answer one ping (timeout 1 s, or as soon as *limit* replied)."""
        return {name for reply in self.app.control.ping(timeout=1.0, **kwargs) for name in reply}

    def worker(self, name: str, **kwargs: Any) -> Worker:
        """One more worker (solo pool), answering ping before this returns."""
        worker = self.cluster.start_worker(name, pool="solo", concurrency=1, **kwargs)
        node = f"{name}@{HOST}"
        eventually(lambda: node in self.nodes(destination=[node]), timeout=120, what=f"{node} answers ping")
        return worker


@pytest.fixture(scope="module")
def trio(pg_url: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Trio]:
    with fresh_schema(pg_url, prefix="rc") as schema:
        store = store_for(pg_url, schema)
        cluster = Cluster(
            pg_url=pg_url, schema=schema, store=store, tmp_path=tmp_path_factory.mktemp("rc"), node=request.node
        )
        try:
            started = time.monotonic()
            workers = [cluster.start_worker(f"rc{i}", pool="threads", concurrency=2, args=["-E"]) for i in (1, 2, 3)]
            trio = Trio(cluster, workers, cluster.producer())
            eventually(lambda: trio.nodes(limit=3) == set(TRIO), timeout=120, what="all 3 workers answer ping")
            print(f"\n3 workers answer ping {time.monotonic() - started:.1f} s after their start")
            yield trio
        finally:
            cluster.close()
            store.close()


@pytest.fixture
def rc(trio: Trio, request: pytest.FixtureRequest) -> Trio:
    """The module's workers; a failing test gets their logs attached."""
    request.node.stash[_WORKERS] = trio.cluster.workers
    assert all(w.alive for w in trio.workers), "a worker of the trio died"
    return trio


def stays(predicate: Callable[[], Any], seconds: float, *, what: str) -> None:
    """Fail as soon as *predicate()* is falsy within the next *seconds* (an observation, not a wait)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert predicate(), f"no longer true within {seconds} s: {what}"
        time.sleep(0.1)


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def replies_of(replies: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {name: body for reply in replies or [] for name, body in reply.items()}


# -- 1. inspect ---------------------------------------------------------------------------------------


def test_ping_of_three_workers_answers_in_milliseconds(rc: Trio, caplog: pytest.LogCaptureFixture) -> None:
    latencies = []
    with caplog.at_level(logging.WARNING, logger="kombu_akadze"):
        for _ in range(20):
            replies, seconds = timed(lambda: rc.app.control.ping(timeout=5.0, limit=3))
            assert replies_of(replies) == {key: {"ok": "pong"} for key in TRIO}
            latencies.append(seconds)
    # kombu drops the reply queue after the replies: their no_ack outcomes are written first, not fenced out.
    assert caplog.messages == []
    median, worst = statistics.median(latencies), max(latencies)
    print(f"\ninspect ping, 3 workers, limit=3, 20 pings: median {median * 1000:.1f} ms, max {worst * 1000:.1f} ms")
    assert worst < 1.0


def test_inspect_commands_get_every_workers_reply_within_a_second(rc: Trio) -> None:
    running = rc.app.send_task(tasks.SLOW, args=[101, 8])
    scheduled = rc.app.send_task(tasks.RECORD, args=[102], countdown=50)  # held by a worker until its ETA
    eventually(lambda: rc.cluster.started(101), timeout=60, what="slow(101) starts")
    inspect = rc.app.control.inspect(timeout=1.0, limit=3)
    seen: dict[str, Any] = {}
    for command in INSPECT_COMMANDS:
        reply, seconds = timed(getattr(inspect, command))
        print(f"inspect {command}: {len(reply or {})} replies in {seconds * 1000:.0f} ms")
        assert set(reply or {}) == set(TRIO), command
        assert seconds < 1.0, command
        seen[command] = reply

    assert [t["id"] for tasks_ in seen["active"].values() for t in tasks_] == [running.id]
    eventually(lambda: _scheduled_ids(inspect.scheduled()) == [scheduled.id], timeout=30, what="the ETA task is held")
    assert all(reply["pool"]["max-concurrency"] == 2 for reply in seen["stats"].values())
    assert all("akadze" in reply["broker"]["transport"] for reply in seen["stats"].values())
    for queues in seen["active_queues"].values():
        assert [q["name"] for q in queues] == ["celery"]
    rc.app.control.revoke(scheduled.id)  # discarded at its ETA


def _scheduled_ids(reply: dict[str, Any] | None) -> list[str]:
    return [t["request"]["id"] for held in (reply or {}).values() for t in held]


def test_celery_inspect_and_status_cli_list_all_three_workers(rc: Trio) -> None:
    for command in INSPECT_COMMANDS:
        out, seconds = timed(lambda command=command: rc.cli("inspect", command, "--timeout", "1", "--json"))
        assert out.returncode == 0, out.stderr
        assert set(json.loads(out.stdout.strip().splitlines()[-1])) == set(TRIO), command
        print(f"celery inspect {command} --timeout 1: 3 replies, {seconds:.1f} s with the interpreter's start")
    status = rc.cli("status", "--timeout", "1")
    assert status.returncode == 0, status.stderr
    assert "3 nodes online." in status.stdout
    assert all(f"{node}: OK" in status.stdout for node in TRIO)


# -- 2. control ---------------------------------------------------------------------------------------


def test_add_consumer_runs_a_new_queue_revoked_tasks_never_run_cancel_consumer_stops_it(rc: Trio) -> None:
    queue, node = "rc.extra", TRIO[0]
    revoked = rc.app.send_task(tasks.RECORD, args=[201], queue=queue)
    out = rc.cli("control", "revoke", revoked.id, "--timeout", "1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count(f"tasks {{'{revoked.id}'}} flagged as revoked") == 3, out.stdout
    rc.app.send_task(tasks.RECORD, args=[202], queue=queue)

    out = rc.cli("control", "add_consumer", queue, "--destination", node, "--timeout", "1")
    assert out.returncode == 0, out.stderr
    assert f"{node}: OK" in out.stdout, out.stdout
    assert f"add consumer {queue}" in out.stdout, out.stdout
    done = eventually(lambda: rc.cluster.started(202), timeout=60, what="the added consumer runs record(202)")
    assert done[0].pid == rc.workers[0].pid
    eventually(lambda: not _rows(rc, queue), timeout=30, what="both messages of the queue settled")
    assert rc.cluster.started(201) == [], "a task revoked while queued ran"
    active = replies_of([rc.app.control.inspect(timeout=1.0, limit=3).active_queues() or {}])
    assert {q["name"] for q in active[node]} == {"celery", queue}

    out = rc.cli("control", "cancel_consumer", queue, "--destination", node, "--timeout", "1")
    assert out.returncode == 0, out.stderr
    assert f"no longer consuming from {queue}" in out.stdout, out.stdout
    active = replies_of([rc.app.control.inspect(timeout=1.0, limit=3).active_queues() or {}])
    assert all({q["name"] for q in queues} == {"celery"} for queues in active.values())
    rc.app.send_task(tasks.RECORD, args=[203], queue=queue)
    stays(lambda: _rows(rc, queue) == {"ready": 1}, 3.0, what="record(203) waits in the queue nobody consumes")
    assert rc.cluster.started(203) == []
    rc.cluster.store.queue_purge(name=queue)


def _rows(rc: Trio, queue: str) -> dict[str, int]:
    return {state: n for (q, state), n in rc.cluster.store.message_counts().items() if q == queue}


def test_rate_limit_is_acknowledged_by_every_worker(rc: Trio) -> None:
    out = rc.cli("control", "rate_limit", tasks.RECORD, "600/m", "--timeout", "1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("new rate limit set successfully") == 3, out.stdout
    reset = replies_of(rc.app.control.rate_limit(tasks.RECORD, 0, reply=True, timeout=1.0, limit=3))
    assert reset == {key: {"ok": "rate limit disabled successfully"} for key in TRIO}


def test_shutdown_stops_one_worker_process_and_status_lists_the_rest(rc: Trio) -> None:
    extra = rc.worker("rc4")
    node = f"rc4@{HOST}"
    assert rc.nodes() == {*TRIO, node}
    rc.app.control.shutdown(destination=[node])  # no reply: `celery control shutdown` says "No nodes replied"
    assert extra.proc.wait(60) == 0
    status = rc.cli("status", "--timeout", "1")
    assert "3 nodes online." in status.stdout, status.stdout
    assert node not in status.stdout


# -- 3. events and Flower ----------------------------------------------------------------------------


@contextlib.contextmanager
def client(rc: Trio, mode: str, *args: str, conf: dict[str, Any] | None = None) -> Iterator[tuple[Any, str]]:
    """A client process of remote_control_app (killed -9 at the end if still running) and its queue's name."""
    env = rc.cluster.env(AKADZE_CELERY_CONF=json.dumps(conf or {}))
    proc = subprocess.Popen(
        [sys.executable, "-m", APP, mode, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        yield proc, proc.stdout.readline().strip()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()


def events_in(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.endswith("}")]


def test_an_events_receiver_sees_heartbeats_of_every_worker_and_a_tasks_events(rc: Trio, tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.touch()
    with client(rc, "events", str(path)) as (_, queue):
        started = time.monotonic()
        eventually(lambda: rc.cluster.store.queue_exists(name=queue), timeout=60, what="the receiver's queue")
        beating = eventually(
            lambda: {e["hostname"] for e in events_in(path) if e["type"] == "worker-heartbeat"} >= set(TRIO),
            timeout=60,
            what="a worker-heartbeat of every worker",
        )
        print(f"\nevents: heartbeats of all 3 workers seen {time.monotonic() - started:.1f} s after the receiver")
        assert beating
        sent = rc.app.send_task(tasks.RECORD, args=[301])
        wanted = {"task-received", "task-started", "task-succeeded"}
        eventually(
            lambda: {e["type"] for e in events_in(path) if e["uuid"] == sent.id} >= wanted,
            timeout=30,
            what="task-received, task-started and task-succeeded of record(301)",
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def test_flower_lists_the_workers_and_a_task(rc: Trio, tmp_path: Path) -> None:
    port = free_port()
    log: IO[bytes]
    with open(tmp_path / "flower.log", "wb") as log:
        flower = subprocess.Popen(
            [CELERY, "-A", "examples.tasks", "flower", f"--port={port}", "--address=127.0.0.1"],
            cwd=ROOT,
            env=rc.cluster.env(FLOWER_UNAUTHENTICATED_API="true"),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            base = f"http://127.0.0.1:{port}"

            def workers() -> set[str]:
                with contextlib.suppress(OSError):
                    return set(get_json(f"{base}/api/workers?refresh=1"))
                return set()

            eventually(lambda: workers() >= set(TRIO), timeout=90, what="Flower's /api/workers lists the 3 workers")
            sent: list[str] = []

            def task_succeeded() -> bool:
                # A monitor sees a worker's events within event_route_cache (10 s) of binding its queue:
                # send until one task's events reach Flower.
                sent.append(rc.app.send_task(tasks.RECORD, args=[400 + len(sent)]).id)
                seen = get_json(f"{base}/api/tasks")
                return any(seen.get(task_id, {}).get("state") == "SUCCESS" for task_id in sent)

            started = time.monotonic()
            eventually(task_succeeded, timeout=60, interval=1.0, what="Flower's /api/tasks shows a task as SUCCESS")
            print(f"\nflower: 3 workers listed; a task SUCCESS {time.monotonic() - started:.1f} s after the first send")
            with pytest.raises(urllib.error.HTTPError) as broker_page:
                get_json(f"{base}/broker")  # Flower reads queue lengths from RabbitMQ's API or Redis only
            assert broker_page.value.code == 404
            broker_page.value.close()
        finally:
            os.killpg(flower.pid, signal.SIGKILL)
            flower.wait(30)


# -- 4. mingle and gossip ----------------------------------------------------------------------------


def app_worker(rc: Trio, name: str, **env: str) -> Worker:
    """A solo worker of remote_control_app (Cluster.start_worker runs examples.tasks), logging at INFO."""
    command = [CELERY, "-A", APP, "worker", "-P", "solo", "--loglevel=INFO", "-n", f"{name}@%h"]
    log_path = rc.cluster.tmp_path / f"worker-{name}.log"
    log = open(log_path, "wb")  # noqa: SIM115  (closed by Worker.close at teardown)
    proc = subprocess.Popen(
        command, cwd=ROOT, env=rc.cluster.env(**env), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    worker = Worker(name, proc, log_path, log)
    rc.cluster.workers.append(worker)
    return worker


def test_a_worker_with_akadze_mingle_syncs_revokes_from_the_others_and_without_it_does_not(rc: Trio) -> None:
    task_id = str(uuid.uuid4())
    revoked = replies_of(rc.app.control.revoke(task_id, reply=True, timeout=1.0, limit=3))
    assert set(revoked) == set(TRIO)
    mingling = app_worker(rc, "rc5", AKADZE_MINGLE="1")
    plain = app_worker(rc, "rc6")
    nodes = [f"rc5@{HOST}", f"rc6@{HOST}"]
    eventually(lambda: rc.nodes(destination=nodes) == set(nodes), timeout=120, what="rc5 and rc6 answer ping")

    found = replies_of([rc.app.control.inspect(destination=nodes, timeout=1.0).revoked() or {}])
    assert task_id in found[nodes[0]], "enable_mingle(): the revoked id came over from the other workers"
    assert task_id not in found[nodes[1]], "without enable_mingle() Celery's Mingle stays off on akadze"
    assert re.search(r"mingle: sync with [34] nodes", mingling.output())  # rc6 may answer rc5's hello too
    assert "mingle" not in plain.output()
    # No gossip: no worker consumes worker events, so an idle worker's heartbeat event costs nothing.
    assert not [b for b in rc.cluster.store.binding_list() if b["routing_key"] == "worker.#"]
    for worker in (mingling, plain):
        assert worker.warm_shutdown() == 0


# -- 5. queues of killed clients ---------------------------------------------------------------------


def test_reply_and_event_queues_of_killed_clients_are_removed(rc: Trio, tmp_path: Path) -> None:
    """kill -9 of an `inspect` and of an events receiver: their queues go after x-expires (or after
    heartbeat_ttl, as auto_delete queues nobody consumes any more, whichever comes first)."""
    store, ttl = rc.cluster.store, FAST_WORKER["heartbeat_ttl"]
    expires = 1.5

    def client_queues() -> set[str]:
        names = {q.queue for q in store.queue_stats(ttl=ttl).queues}
        return {q for q in names if q.startswith("celeryev.") or q.endswith(".reply.celery.pidbox")}

    before = client_queues()
    with (
        client(rc, "inspect", conf={"control_queue_expires": expires}) as (inspector, _),
        client(rc, "events", str(tmp_path / "events.jsonl")) as (receiver, event_queue),
    ):
        assert event_queue.startswith("celeryev.")
        found = eventually(
            lambda: [q for q in client_queues() - before if q.endswith(".reply.celery.pidbox")],
            timeout=60,
            what="the inspect client's reply queue",
        )
        reply_queue = found[0]
        eventually(lambda: store.queue_exists(name=event_queue), timeout=60, what="the receiver's queue")
        os.killpg(inspector.pid, signal.SIGKILL)
        os.killpg(receiver.pid, signal.SIGKILL)
        killed = time.monotonic()
    gone: dict[str, float] = {}

    def removed() -> bool:
        for queue in {reply_queue, event_queue} - gone.keys():
            if not store.queue_exists(name=queue):
                gone[queue] = time.monotonic() - killed
        return len(gone) == 2

    eventually(removed, timeout=60, what="both queues of the killed clients removed")
    print(
        f"\nqueues of killed clients removed: reply queue {gone[reply_queue]:.1f} s after kill -9 "
        f"(control_queue_expires={expires} s), event queue {gone[event_queue]:.1f} s "
        f"(event_queue_expires 60 s, heartbeat_ttl {ttl} s)"
    )
    assert gone[reply_queue] < expires + 10
    assert gone[event_queue] < ttl + 10
    remaining = {b["queue"] for b in store.binding_list()}
    assert reply_queue not in remaining
    assert event_queue not in remaining

    # The clients of the other tests (a receiver, Flower) were killed -9 too: nothing of theirs stays either.
    eventually(lambda: not client_queues(), timeout=30, what="no client's queue left behind")


# -- 6. publish cost ---------------------------------------------------------------------------------


@contextlib.contextmanager
def statements() -> Iterator[list[str]]:
    """Every statement this thread sends meanwhile (one round trip each): through psycopg's cursors, and
    through libpq directly (store.wire: publishes, the event loop's ack+claim)."""
    sent: list[str] = []
    me = threading.get_ident()
    original, original_send = psycopg.Cursor.execute, wire.send

    def execute(self: psycopg.Cursor[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == me:
            sent.append(str(query.as_string(self) if hasattr(query, "as_string") else query).split("\n", 1)[0])
        return original(self, query, *args, **kwargs)

    def send(conn: Any, query: bytes, *args: Any, **kwargs: Any) -> None:
        if threading.get_ident() == me:
            sent.append(query.decode().split("\n", 1)[0])
        original_send(conn, query, *args, **kwargs)

    psycopg.Cursor.execute = execute  # type: ignore[method-assign]
    wire.send = send
    try:
        yield sent
    finally:
        psycopg.Cursor.execute = original  # type: ignore[method-assign]
        wire.send = original_send


def test_a_publish_costs_one_round_trip_direct_or_fanout(rc: Trio, make_connection: Any) -> None:
    n = 50
    conn = make_connection()
    producer = conn.Producer()
    direct = Exchange("rt.direct", "direct")
    fanout = Exchange("rt.fanout", "fanout")
    targets = {
        "default exchange": ("", [Queue("rt.plain", routing_key="rt.plain")]),
        "direct, 1 queue": (direct, [Queue("rt.d", direct, routing_key="rt.d")]),
        "fanout, 3 queues": (fanout, [Queue(f"rt.f{i}", fanout) for i in range(3)]),
        "fanout, 30 queues": (Exchange("rt.fanout30", "fanout"), []),
    }
    targets["fanout, 30 queues"][1].extend(Queue(f"rt.g{i}", targets["fanout, 30 queues"][0]) for i in range(30))
    costs: dict[str, float] = {}
    for label, (exchange, queues) in targets.items():
        for q in queues:
            q(conn.default_channel).declare()
        key = queues[0].routing_key
        producer.publish({"warm": True}, exchange=exchange, routing_key=key, declare=[exchange] if exchange else [])
        with statements() as sent:
            for i in range(n):
                producer.publish({"i": i}, exchange=exchange, routing_key=key)
        costs[label] = len(sent) / n
    celery_paths: dict[str, Callable[[int], Any]] = {
        # nobody consumes rt.celery; the first send declares it (not counted: each path runs once first)
        "celery send_task": lambda i: rc.app.send_task(tasks.RECORD, args=[-i], queue="rt.celery"),
        # a fanout to the 3 workers' pidbox queues
        "celery broadcast (3 workers)": lambda i: rc.app.control.broadcast("ping", reply=False),
    }
    for label, publish in celery_paths.items():
        publish(0)
        with statements() as sent:
            for i in range(n):
                publish(i + 1)
        costs[label] = len(sent) / n
    print("\nround trips per publish: " + ", ".join(f"{label} {cost:.2f}" for label, cost in costs.items()))
    assert all(cost == 1 for cost in costs.values()), costs

    rc.app.control.ping(timeout=1.0, limit=3)
    with statements() as sent:
        for _ in range(10):
            rc.app.control.ping(timeout=1.0, limit=3)
    print(f"a whole `inspect ping` of 3 workers (limit=3), client side: {len(sent) / 10:.1f} round trips")
    rc.cluster.store.queue_purge(name="rt.celery")
