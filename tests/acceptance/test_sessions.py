"""Sessions a real `celery worker` holds (prefork -c 2, Celery's defaults: worker heartbeat events on, no
monitor): two in steady state, the command session of its consuming connection and the heartbeat session
that also LISTENs; Celery's event producer gives its session back when idle. A pool child that publishes
adds one, closed again after idle_close. Counted on the server (pg_stat_activity), by the TCP ports of the
worker's own processes."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from examples import tasks
from kombu_akadze.integrations.testing import eventually
from kombu_akadze.store import sqlfiles

from .conftest import Cluster

SQL = sqlfiles.parse_blocks(Path(__file__).with_name("sessions.sql").read_text())
IDLE_CLOSE = 1.0
#: application_name of the transport's sessions (store.connect names them akadze-<role>); the demo
#: table's own connection is akadze-demo.
BROKER_SESSIONS = ("akadze-command", "akadze-heartbeat", "akadze-vacuum")


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _local_ports(pid: int) -> set[int]:
    """Local TCP ports of *pid*'s sockets (from /proc: its socket inodes in /proc/net/tcp[6])."""
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        for fd in fd_dir.iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return set()
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def sessions(cluster: Cluster, main: int) -> tuple[Counter[str], Counter[str]]:
    """application_name counts of the broker sessions of the worker's main process, and of its children."""
    rows = cluster.store.connection().execute(SQL["client_sessions"]).fetchall()
    by_port = {int(port): name for name, port in rows if name in BROKER_SESSIONS}

    def of(pids: list[int]) -> Counter[str]:
        ports = set().union(*(_local_ports(p) for p in pids)) if pids else set()
        return Counter(by_port[p] for p in ports if p in by_port)

    return of([main]), of(_children(main))


def test_a_prefork_worker_holds_two_sessions_and_a_publishing_child_one_more_while_it_publishes(
    cluster: Cluster, tcp_pg: Any
) -> None:
    worker = cluster.start_worker("s", env=cluster.env({"idle_close": IDLE_CLOSE}))
    app = cluster.producer()
    app.send_task(tasks.RECORD, args=[1])
    eventually(lambda: cluster.table.rows().get(1), timeout=60, what="the worker runs a task")
    steady = Counter({"akadze-command": 1, "akadze-heartbeat": 1})

    seen: list[Any] = []

    def settled() -> bool:
        main, children = sessions(cluster, worker.pid)
        seen[:] = [main, children]
        return main == steady and not children

    try:
        eventually(settled, timeout=60, interval=0.2, what="the worker down to its two sessions")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last seen (main, children): {seen}") from None
    # Steady: worker heartbeat events every 2 s, heartbeats every 0.5 s; it stays at two for 3 s.
    samples = []
    until = time.monotonic() + 3.0
    while time.monotonic() < until:
        samples.append(sessions(cluster, worker.pid))
        time.sleep(0.2)
    assert all(main == steady and not children for main, children in samples), samples

    app.send_task(tasks.RELAY, args=[2])  # a pool child publishes record(2)
    eventually(lambda: cluster.table.rows().get(2), timeout=60, what="the relayed task ran")
    peak = max(sum(sessions(cluster, worker.pid)[1].values()) for _ in range(5))
    assert peak <= 1, f"a publishing pool child holds {peak} sessions"
    eventually(settled, timeout=60, interval=0.2, what="the child's session closed after idle_close")
    assert worker.alive


def test_a_worker_with_remote_control_and_a_full_window_sends_no_statements_while_its_task_runs(
    cluster: Cluster, tcp_pg: Any
) -> None:
    """Celery's default worker consumes its pidbox beside its task queue, on a channel without a prefetch
    limit. With the task window full (-c 1, prefetch 1: one task running, one waiting in the queue), the
    worker used to claim for the pidbox again and again for as long as the task ran (~1,900 statements/s,
    96 per 50 ms task). Its command session must stay idle instead: sampled every 50 ms for 2 s, its
    state changes at most a few times (the safety poll, a heartbeat report)."""
    worker = cluster.start_worker("full", concurrency=1, args=["--prefetch-multiplier", "1"])
    app = cluster.producer()
    for n in (1, 2):
        app.send_task(tasks.SLOW, args=[n, 8.0])

    def window_full() -> bool:
        counts = cluster.store.message_counts()
        return counts.get(("celery", "held"), 0) == 1 and counts.get(("celery", "ready"), 0) == 1

    eventually(window_full, timeout=60, what="one task held and running, one waiting")
    rows = cluster.store.connection().execute(SQL["client_sessions"]).fetchall()
    ports = _local_ports(worker.pid)
    # the consuming connection's command session, and any other of the main process (a publisher's)
    command = [int(p) for name, p in rows if name == "akadze-command" and int(p) in ports]
    assert command, "no command session of the worker's main process"
    changes = set()
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        for port in command:
            for (changed,) in cluster.store.connection().execute(SQL["session_state_change"], {"port": port}):
                changes.add((port, changed))
        time.sleep(0.05)
    assert window_full(), "the first task ended during the sampling; it runs for 8 s"
    # at most one or two changes each (a poll, a heartbeat's report), not one per 50 ms sample
    assert len(changes) <= 3 * len(command), f"command sessions changed state {len(changes)} times in 2 s"
    eventually(lambda: cluster.table.rows().get(2), timeout=60, what="both tasks run")
