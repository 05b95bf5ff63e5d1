"""Behind PgBouncer (transaction pooling): a real `celery worker` and a producer on the PgBouncer URL, LISTEN
direct through listen_url; every task runs once, wake-ups still come by NOTIFY, and only LISTEN sessions
bypass the pooler."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kombu
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from examples import tasks
from kombu_akadze.integrations.testing import eventually
from kombu_akadze.store import Store, migrate, sqlfiles

from .conftest import Cluster, Tally

HOST = "127.0.0.1"
#: Poll intervals no test waits out: a task that reaches an idle worker sooner came by NOTIFY.
NO_POLL = {"poll_interval": 120.0, "listen_poll_interval": 120.0}
#: Server connections PgBouncer may open: fewer than the worker's and producer's sessions.
POOL_SIZE = 4

SQL = sqlfiles.parse_blocks(Path(__file__).with_name("pgbouncer.sql").read_text(), "pgbouncer.sql")


@dataclass(frozen=True)
class Bouncer:
    url: str  # clients' URL (PgBouncer), as the user the direct URL does not use
    admin_url: str  # PgBouncer's console
    direct_url: str  # PostgreSQL itself, as a role of this test only: its sessions are ours
    role: str

    def show(self, what: str) -> list[dict[str, Any]]:
        with psycopg.connect(self.admin_url, autocommit=True) as conn, conn.cursor() as cur:
            cur.execute(f"SHOW {what}")  # PgBouncer's console, no SQL
            names = [d.name for d in cur.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def clients(self) -> list[str]:
        """application_name of every client session connected to PgBouncer (its console excepted)."""
        return sorted(c["application_name"] for c in self.show("CLIENTS") if c["database"] != "pgbouncer")

    def servers(self) -> int:
        return sum(1 for s in self.show("SERVERS") if s["database"] != "pgbouncer")

    def direct(self, admin: Store) -> list[str]:
        """application_name of every session on PostgreSQL itself as this test's role."""
        with admin.connection().cursor() as cur:
            cur.execute(SQL["role_sessions"], {"role": self.role})
            return sorted(row[0] for row in cur.fetchall())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _pgbouncer() -> str:
    path = shutil.which("pgbouncer") or next((p for p in ("/usr/sbin/pgbouncer",) if os.access(p, os.X_OK)), None)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("pgbouncer is not installed and CI is set: .ci/run installs it (apt-get install pgbouncer)")
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer; CI installs it and never skips)")
    return path


@pytest.fixture
def bouncer(pg_url: str, tcp_pg: Any) -> Iterator[Bouncer]:
    """PgBouncer in transaction pooling mode in front of the test server, started here and stopped at teardown.
    Clients connect as the server's user; this test's own role reaches PostgreSQL directly (listen_url)."""
    binary = _pgbouncer()
    server = conninfo_to_dict(pg_url)
    user, database = str(server.get("user") or "postgres"), str(server.get("dbname") or "postgres")
    role = f"bouncer_{uuid.uuid4().hex[:8]}"
    admin = Store(pg_url, schema="public", role="test-admin")
    with admin.connection().cursor() as cur:
        cur.execute(SQL["role_create"].replace("{role}", role))
    workdir = Path(tempfile.mkdtemp(prefix="akadze-pgbouncer-"))
    port = _free_port()
    (workdir / "userlist.txt").write_text(f'"{user}" ""\n')
    (workdir / "pgbouncer.ini").write_text(
        f"[databases]\n{database} = host={server.get('host', HOST)} port={server.get('port', 5432)} dbname={database}\n"
        f"[pgbouncer]\nlisten_addr = {HOST}\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {workdir / 'userlist.txt'}\nadmin_users = {user}\n"
        f"pool_mode = transaction\ndefault_pool_size = {POOL_SIZE}\nmax_client_conn = 200\n"
        f"logfile = {workdir / 'pgbouncer.log'}\npidfile = {workdir / 'pgbouncer.pid'}\n"
        "ignore_startup_parameters = extra_float_digits\n"
    )
    command = [binary, str(workdir / "pgbouncer.ini")]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        run_as = "postgres" if _user_exists("postgres") else "nobody"
        os.chown(workdir, pwd.getpwnam(run_as).pw_uid, -1)
        command[1:1] = ["-u", run_as]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"postgresql://{user}@{HOST}:{port}/{database}"
    direct = make_conninfo("", **{**server, "user": role})
    try:
        eventually(lambda: _accepts(url) or proc.poll() is not None, timeout=30, what="pgbouncer accepts connections")
        assert proc.poll() is None, (workdir / "pgbouncer.log").read_text(errors="replace")
        yield Bouncer(url, f"postgresql://{user}@{HOST}:{port}/pgbouncer", direct, role)
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        with admin.connection().cursor() as cur:
            cur.execute(SQL["role_sessions_end"], {"role": role})
            cur.execute(SQL["role_drop"].replace("{role}", role))
        admin.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _accepts(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=2, prepare_threshold=None) as conn:
            conn.execute("SELECT 1", prepare=False)
    except psycopg.OperationalError:
        return False
    return True


def test_sessions_through_pgbouncer_prepare_nothing_and_leave_no_setting_behind(
    bouncer: Bouncer, pg_url: str, schema: str
) -> None:
    direct = Store(pg_url, schema=schema, role="probe", lock_timeout=0.123)
    pooled = Store(bouncer.url, schema=schema, role="probe", lock_timeout=0.123)
    try:
        direct.connection()
        pooled.connection()
        assert (direct.pooled, pooled.pooled) == (False, True)
        assert pooled.connection().prepare_threshold is None
        with psycopg.connect(bouncer.url, autocommit=True, prepare_threshold=None) as other:  # same server pool
            assert other.execute(SQL["lock_timeout_get"]).fetchone() != ("123ms",)
    finally:
        direct.close()
        pooled.close()


def test_migrations_and_a_kombu_round_trip_work_through_pgbouncer(bouncer: Bouncer, pg_url: str) -> None:
    schema = f"b_{uuid.uuid4().hex[:10]}"
    try:
        assert migrate.apply(bouncer.url, schema)
        assert migrate.apply(bouncer.url, schema) == []  # re-applying is a no-op
        options = {"schema": schema, "listen_url": bouncer.direct_url, "lock_timeout": 0, "statement_timeout": 0}
        with kombu.Connection(f"akadze+{bouncer.url}", transport_options=options) as conn:
            q = conn.SimpleQueue("through-bouncer")
            for n in range(12):  # psycopg would prepare a statement from its fifth run on
                q.put({"n": n})
            got = []
            for _ in range(12):
                message = q.get(timeout=10)
                got.append(message.payload["n"])
                message.ack()
            q.close()
        assert got == list(range(12))
    finally:
        migrate.drop(pg_url, schema)


@pytest.mark.slow
def test_celery_worker_behind_pgbouncer_runs_each_task_once_with_listen_direct(
    bouncer: Bouncer, cluster: Cluster
) -> None:
    options = {**NO_POLL, "listen_url": bouncer.direct_url, "lock_timeout": 0, "statement_timeout": 0}
    env = cluster.env(options, AKADZE_URL=bouncer.url)
    app = tasks.make_app(env)
    cluster.apps.append(app)
    cluster.start_worker("bouncer", concurrency=2, env=env)
    admin = Store(cluster.pg_url, schema="public", role="test-admin")
    try:
        sent = range(150)
        for n in sent:
            app.send_task(tasks.RECORD, args=[n])
        eventually(lambda: cluster.table.progress().done >= len(sent), timeout=180, what="150 record tasks done")
        eventually(lambda: cluster.queue_rows() == 0, timeout=30, what="every message acked")
        tally = cluster.tally(sent, injected="nothing (prefork -c 2 and a producer through PgBouncer)")

        started = time.monotonic()  # the worker is idle now: only a NOTIFY can wake it before a poll
        app.send_task(tasks.RECORD, args=[1000])
        eventually(lambda: cluster.table.rows().get(1000), timeout=60, what="a task reaches the idle worker")
        wakeup = time.monotonic() - started

        direct, through, servers = bouncer.direct(admin), bouncer.clients(), bouncer.servers()
        print(
            f"tasks: {tally.sent}  completed: {tally.completed}  duplicated: {tally.duplicated}  lost: {tally.lost}\n"
            f"idle worker woken in {wakeup:.2f} s (poll_interval {NO_POLL['poll_interval']:.0f} s)\n"
            f"direct sessions: {len(direct)} {direct}\n"
            f"sessions through PgBouncer: {len(through)} {through}\n"
            f"PgBouncer server connections: {servers} (default_pool_size {POOL_SIZE})"
        )
        assert tally == Tally(sent=150, completed=150, duplicated=0, queued=0, lost=0)
        assert wakeup < 10, "the idle worker was woken by a poll, not by LISTEN"
        assert direct == ["akadze-heartbeat"]  # the worker's one consuming connection: heartbeat and LISTEN
        assert "akadze-heartbeat" not in through
        assert servers <= POOL_SIZE
    finally:
        admin.close()
