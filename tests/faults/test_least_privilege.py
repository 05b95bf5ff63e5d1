"""Least privilege: migrations as an owner role; a worker and a producer as a role with only USAGE on
the schema and row rights on its tables (grants.sql), auto_migrate off. Everything works; DDL does not."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import kombu
import psycopg
import pytest

from kombu_akadze.errors import DatabaseError, PermanentConnectionError, PermissionDeniedError
from kombu_akadze.lease import compact
from kombu_akadze.lease.compact import Compactor
from kombu_akadze.store import DeadLetterFilter, Store, migrate, sqlfiles

from .checker import verdict
from .conftest import SCHEMA, Faults
from .jobs import TOUCH
from .pgserver import free_port

GRANTS = sqlfiles.parse_blocks(Path(__file__).with_name("grants.sql").read_text(encoding="utf-8"), "grants.sql")
OWNER = "akadze_owner"
APP = "akadze_app"
DATABASE = "postgres"


@pytest.mark.slow
def test_worker_and_producer_run_with_only_row_privileges_on_the_schema(own: Faults) -> None:
    server = own.server
    assert server is not None
    names = {"schema": SCHEMA, "owner": OWNER, "role": APP, "database": DATABASE}
    server.execute("role_create", role=OWNER)
    server.execute("role_create", role=APP)
    server.run_sql(GRANTS["grant_owner"], **names)
    owner_url, app_url = server.url(user=OWNER), server.url(user=APP)
    migrate.apply(owner_url, "akadze_lp")  # the owner migrates its schema (the fixture's is the superuser's)
    schema = "akadze_lp"
    names["schema"] = schema
    own.options = {"schema": schema, "auto_migrate": False}

    # Without the grants the application role gets told what is missing, at publish.
    bare = own.producer(url=app_url)
    with pytest.raises(DatabaseError) as refused:
        bare.send_task(TOUCH, args=[0], retry=False)
    print(f"without grants: {type(refused.value).__name__}: {refused.value}")

    for block in ("grant_app", "grant_app_future"):
        server.run_sql(GRANTS[block], user=OWNER, **names)
    app = own.producer(url=app_url)
    worker = own.start_worker("a", concurrency=2, url=app_url)
    numbers = range(100)
    for n in numbers:
        app.send_task(TOUCH, args=[n])
    app.send_task("faults.no_such_task", args=[1])  # rejected into dead letters, by the application role
    own.until(lambda: own.ledgers.all_done(numbers), timeout=120, interval=0.2, what="tasks run as the app role")
    app_store = Store(app_url, schema=schema, role="test")
    try:
        own.until(lambda: app_store.deadletter_count(where=DeadLetterFilter()) == 1, timeout=60, what="dead letter")
        replay = app_store.deadletter_replay(where=DeadLetterFilter())  # dead letters back into messages
        assert len(replay.replayed) == 1
        own.until(
            lambda: app_store.deadletter_count(where=DeadLetterFilter()) == 1,
            timeout=60,
            what="the worker rejects the replayed message again",
        )
        own.until(lambda: sum(app_store.message_counts().values()) == 0, timeout=60, what="queue empty")
        # Compaction (REINDEX) needs the owner: the application role is told so, and its worker's
        # compactor turns itself off instead of failing every interval.
        with pytest.raises(PermissionDeniedError, match="only the owner"):
            compact.run_once(app_store, force=True)
        compactor = Compactor(app_store, interval=1.0, min_index=0, ratio=0)
        assert compactor.check() is None
        assert "compact_interval=0" in compactor.disabled
        assert compactor.check() is None
        assert compactor.runs == 1
        owner_store = Store(owner_url, schema=schema, role="test")
        try:
            # `akadze compact` as the owner. Its REINDEX waits 0.1 s for the table's lock and otherwise
            # leaves it to the next check; the running worker's beat or an autovacuum of the table (on in
            # the embedded server) can hold it longer on a loaded machine, so ask until it runs.
            skipped: list[str] = []

            def compacted() -> bool:
                result = compact.run_once(owner_store, force=True)
                if not result.compacted:
                    skipped.append(result.skipped)
                return result.compacted

            own.until(compacted, timeout=60, interval=0.5, what="the owner's compaction")
            print(f"owner's compaction: ran after {len(skipped)} busy attempt(s) {sorted(set(skipped))}")
        finally:
            owner_store.close()
    finally:
        app_store.close()

    # A table a later migration adds is writable at once (default privileges)...
    server.execute("future_table_create", user=OWNER, schema=schema)
    assert server.execute("future_table_insert", user=APP, schema=schema)
    # ...but the application role cannot change the schema, empty a table, or migrate.
    for probe in ("ddl_probe", "truncate_probe"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            server.execute(probe, user=APP, schema=schema)
    with pytest.raises(DatabaseError, match="permission denied"):
        migrate.apply(app_url, "akadze_intruder")

    result = verdict(
        "least privilege (row rights only, auto_migrate off)",
        injected="worker + producer as a role with USAGE + SELECT/INSERT/UPDATE/DELETE",
        published=numbers,
        ledgers=own.ledgers,
        recovery=None,
    )
    assert result.lost == 0
    assert worker.alive
    assert "permission denied" in str(refused.value)
    assert "docs/operations.md" in str(refused.value)


#: A password with every character a URL or a conninfo string treats specially.
SECRET = "S3cr3t@:/?#&='\" %zz"
SECRET_ROLE = "akadze_pw"


def _leaks(text: str) -> list[str]:
    """The forms of SECRET found in *text* (as typed, URL-encoded, or its distinctive core)."""
    forms = {SECRET, quote(SECRET, safe=""), "S3cr3t"}
    return sorted(f for f in forms if f in text)


@pytest.mark.slow
def test_passwords_never_reach_logs_errors_or_reprs(own: Faults) -> None:
    server = own.server
    assert server is not None
    server.execute("role_create_with_password", literals={"password": SECRET}, role=SECRET_ROLE)
    names = {"schema": SCHEMA, "owner": "postgres", "role": SECRET_ROLE, "database": DATABASE}
    server.run_sql(GRANTS["grant_app"], **names)
    # Real password authentication for this role (the throwaway server trusts everyone else).
    hba = server.data / "pg_hba.conf"
    hba.write_text(f"host all {SECRET_ROLE} 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
    server.execute("reload")
    url = server.url(user=f"{SECRET_ROLE}:{quote(SECRET, safe='')}")
    wrong = server.url(user=f"{SECRET_ROLE}:{quote(SECRET + 'x', safe='')}")

    seen: list[str] = []
    store = Store(url, schema=SCHEMA, role="test")
    try:
        assert store.message_counts() == {}  # the password works
        seen.append(repr(store))
    finally:
        store.close()
    for bad in (wrong, server.url(user=f"{SECRET_ROLE}:{quote(SECRET, safe='')}", port=free_port())):
        with pytest.raises(DatabaseError) as failed:
            Store(bad, schema=SCHEMA, role="test").message_counts()
        seen += [str(failed.value), repr(failed.value)]
    with kombu.Connection(f"akadze+{wrong}", transport_options={"schema": SCHEMA}) as conn:
        seen += [repr(conn), conn.as_uri()]
        with pytest.raises(PermanentConnectionError) as refused:  # a wrong password is not retried
            conn.Producer().publish({"n": 1}, routing_key="celery", retry=False)
        seen += [str(refused.value), repr(refused.value), repr(refused.value.__cause__)]

    # A worker on the password URL, told "no" for a while (NOLOGIN, sessions ended): it logs its
    # reconnect attempts with the URL, and comes back once the role may log in again.
    own.options = {"auto_migrate": False}
    worker = own.start_worker("a", concurrency=1, url=url)
    app = own.producer(url=url)
    app.send_task(TOUCH, args=[1])
    own.until(lambda: own.ledgers.all_done([1]), timeout=90, what="the worker runs a task with a password")
    server.execute("role_nologin", role=SECRET_ROLE)
    server.terminate("akadze-")
    own.until(lambda: "Cannot connect to" in worker.output(), timeout=60, what="the worker reports its retries")
    server.execute("role_login", role=SECRET_ROLE)
    app.send_task(TOUCH, args=[2])
    own.until(lambda: own.ledgers.all_done([2]), timeout=90, what="the worker is back")
    log = worker.output()
    seen.append(log)

    result = verdict(
        "password in the URL (scram auth, wrong password, refused logins)",
        injected="1 URL with a password of URL/conninfo metacharacters, 3 failing connects, 1 NOLOGIN spell",
        published=[1, 2],
        ledgers=own.ledgers,
        recovery=None,
    )
    print("\n" + "\n".join(line for line in log.splitlines() if "Cannot connect" in line)[:600])
    assert result.lost == 0
    assert SECRET_ROLE + ":**@" in log, "the worker's log names the URL, password masked"
    assert {text[:80]: _leaks(text) for text in seen if _leaks(text)} == {}
