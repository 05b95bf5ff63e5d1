"""Disk full and read-only: a publish the database cannot store raises to the caller (Celery and
kombu alike), never a silent success, and stores nothing; the worker survives; once space (or
writability) returns the same producer and worker carry on by themselves.

Disk full is real where the test may mount: the messages table (and its TOAST table, where bodies
live) is moved to a tablespace on a 2 MiB tmpfs, filled, then the tmpfs is grown (remount). Read-only
is `ALTER SYSTEM SET default_transaction_read_only = on` + reload, which reaches open sessions too.
"""

from __future__ import annotations

import base64
import contextlib
import os
import pwd
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import kombu
import pytest
from kombu.exceptions import OperationalError

from kombu_akadze.errors import TransientDatabaseError

from .checker import verdict
from .conftest import SCHEMA, Faults
from .jobs import TOUCH
from .pgserver import PgServer

QUEUE = "celery"
OPTIONS = {"heartbeat_interval": 1.0, "heartbeat_ttl": 10.0, "rescue_interval": 1.0}


def _pad(kib: int) -> str:
    """Incompressible text (pglz gains nothing on it), so every body really takes its size on disk."""
    return base64.b64encode(os.urandom(kib * 768)).decode("ascii")


def _reload_until(server: PgServer, block: str, value: str) -> None:
    server.execute(block)
    server.execute("reload")
    deadline = time.monotonic() + 30
    while server.execute("read_only_show") != [(value,)]:
        assert time.monotonic() < deadline, f"default_transaction_read_only never became {value}"
        time.sleep(0.05)


@contextlib.contextmanager
def _small_tmpfs(server: PgServer, size: str) -> Iterator[Path]:
    """A tmpfs of *size* owned by the server's OS user; skips the test where mounting is not allowed."""
    path = server.base / "small"
    path.mkdir()
    owner = pwd.getpwnam(server.user) if server.user else pwd.getpwuid(os.getuid())
    options = f"size={size},mode=0700,uid={owner.pw_uid},gid={owner.pw_gid}"
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "akadze-faults", str(path)], capture_output=True, check=False
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip()}): disk full not simulated")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


@pytest.mark.slow
def test_publish_on_a_full_disk_raises_stores_nothing_and_recovers_when_space_returns(own: Faults) -> None:
    own.options = OPTIONS
    server = own.server
    assert server is not None
    with _small_tmpfs(server, "2m") as small:
        server.execute("tablespace_create", tablespace="small", literals={"location": str(small)})
        try:
            server.execute("messages_move", schema=SCHEMA, tablespace="small")
            _fill_and_recover(own, server, small)
        finally:
            own.cluster.store.close()  # nothing of ours may keep the tablespace busy
            for worker in own.cluster.workers:
                worker.close()
            server.execute("messages_move", schema=SCHEMA, tablespace="pg_default")
            server.execute("tablespace_drop", tablespace="small")


def _fill_and_recover(own: Faults, server: PgServer, small: Path) -> None:
    app = own.producer()
    ok: list[int] = []
    failed: list[int] = []
    raised: list[str] = []
    for n in range(200):  # 2 MiB fill up after a few dozen 64 KiB bodies
        try:
            app.send_task(TOUCH, args=[n], kwargs={"pad": _pad(64)})
        except OperationalError as exc:
            failed.append(n)
            raised.append(str(exc))
            break
        ok.append(n)
    assert failed, "2 MiB never filled up"
    assert own.queued() == len(ok), "a publish that raised stored a message, or one that returned did not"
    with (
        kombu.Connection(f"akadze+{server.url()}", transport_options={"schema": SCHEMA}) as conn,
        pytest.raises(TransientDatabaseError, match="No space left on device") as no_space,
    ):
        conn.Producer().publish({"n": -1}, routing_key=QUEUE, retry=False, headers={"pad": _pad(64)})
    print(f"\nfull after {len(ok)} publishes; Celery: {raised[0][:160]}\nkombu: {str(no_space.value)[:200]}")
    assert own.queued() == len(ok)

    worker = own.start_worker("a", concurrency=2)  # claims and acks on a full disk: it must survive
    pid = worker.pid
    subprocess.run(["mount", "-o", "remount,size=64m", str(small)], check=True, capture_output=True)
    back = time.monotonic()
    later = list(range(1000, 1010))
    for n in later:
        app.send_task(TOUCH, args=[n], kwargs={"pad": _pad(64)})  # the same producer, at once
    own.until(lambda: own.ledgers.all_done(later[:1]), timeout=120, interval=0.1, what="a task after the remount")
    recovery = time.monotonic() - back
    published = ok + later
    own.until(lambda: own.ledgers.all_done(published), timeout=120, interval=0.2, what="every stored task ran")
    own.until(lambda: own.queued() == 0, timeout=60, interval=0.2, what="every message acked")
    result = verdict(
        "disk full (tablespace on a 2 MiB tmpfs, then grown)",
        injected=f"{len(failed) + 1} publishes refused for lack of space (1 Celery, 1 kombu)",
        published=published,
        ledgers=own.ledgers,
        recovery=recovery,
    )
    assert result.lost == 0
    assert not set(failed) & {r.n for r in own.ledgers.runs()}, "a publish that raised ran anyway"
    assert worker.alive
    assert worker.pid == pid


@pytest.mark.slow
def test_publish_to_a_read_only_database_raises_and_recovers_when_writable(own: Faults) -> None:
    own.options = OPTIONS
    server = own.server
    assert server is not None
    worker = own.start_worker("a", concurrency=2)
    app = own.producer()
    before = list(range(20))
    for n in before:
        app.send_task(TOUCH, args=[n])
    own.until(lambda: own.ledgers.all_done(before), timeout=120, what="tasks run while writable")

    _reload_until(server, "read_only_on", "on")
    refused = [100, 101]
    for n in refused:
        with pytest.raises(OperationalError, match="read-only"):
            app.send_task(TOUCH, args=[n])  # Celery's retries, then the error
    with (
        kombu.Connection(f"akadze+{server.url()}", transport_options={"schema": SCHEMA}) as conn,
        pytest.raises(TransientDatabaseError, match="read-only transaction") as read_only,
    ):
        conn.Producer().publish({"n": -1}, routing_key=QUEUE, retry=False)
    print(f"\nkombu: {read_only.value}")
    assert own.queued() == 0

    _reload_until(server, "read_only_off", "off")
    back = time.monotonic()
    after = list(range(200, 220))
    for n in after:
        app.send_task(TOUCH, args=[n])  # the same producer
    own.until(lambda: own.ledgers.all_done(after[:1]), timeout=120, interval=0.1, what="a task once writable")
    recovery = time.monotonic() - back
    published = before + after
    own.until(lambda: own.ledgers.all_done(published), timeout=120, interval=0.2, what="every task ran")
    own.until(lambda: own.queued() == 0, timeout=60, interval=0.2, what="every message acked")
    result = verdict(
        "read-only database (default_transaction_read_only + reload)",
        injected=f"{len(refused) + 1} publishes refused (2 Celery, 1 kombu)",
        published=published,
        ledgers=own.ledgers,
        recovery=recovery,
    )
    assert result.lost == 0
    assert not set(refused) & {r.n for r in own.ledgers.runs()}, "a refused publish ran anyway"
    assert worker.alive
