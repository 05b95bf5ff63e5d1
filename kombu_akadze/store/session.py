"""One database session: connecting (keepalives, role names), fork safety, errors translated."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import psycopg
from kombu.utils import json as kombu_json
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from kombu_akadze.errors import (
    DatabaseError,
    SchemaNotAppliedError,
    TransientDatabaseError,
)
from kombu_akadze.store import refusals, sqlfiles, wire
from kombu_akadze.urls import mask_password

if TYPE_CHECKING:
    from kombu_akadze.store.records import NewMessage

logger = logging.getLogger("kombu_akadze")

DRIVER_VERSION = psycopg.__version__


# libpq defaults that make a black-holed TCP connection fail within seconds, not hours;
# a URL or conninfo that sets any of these wins.
KEEPALIVE_DEFAULTS = {
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "20000",
}

# SQLSTATE classes that a retry can outlive: connection exceptions, insufficient
# resources (too many connections), operator intervention (admin shutdown, crash,
# cannot connect now), transaction rollback (deadlock, serialization), and a
# read-only transaction (we reached a standby during failover), and the lock and
# statement timeouts (55P03 lock_not_available, 57014 query_canceled): a lock held
# elsewhere (a long REINDEX, an operator's LOCK TABLE) is outlived by a retry. And 26000
# invalid_sql_statement_name: a prepared statement the session lost (a DEALLOCATE ALL it did not
# expect): the session is dropped, and the next one prepares again.
_TRANSIENT_SQLSTATE_PREFIXES = ("08", "53", "57P", "40")
_TRANSIENT_SQLSTATES = {"25006", "55P03", "57014", "26000"}

# Connections inherited by a forked child: kept referenced so that garbage
# collection never closes them, which would end the parent's sessions.
_INHERITED: list[Any] = []
_LIVE_STORES: weakref.WeakSet[Session] = weakref.WeakSet()


def _forget_after_fork() -> None:
    for store in list(_LIVE_STORES):
        store.forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def is_transient(exc: BaseException) -> bool:
    """Whether a psycopg error is one a reconnect or retry can outlive (a refused login is not)."""
    if isinstance(exc, psycopg.InterfaceError):
        return True
    if not isinstance(exc, psycopg.Error):
        return False
    if refusals.refusal(str(exc), exc.sqlstate) is not None:
        return False
    state = exc.sqlstate
    if state is None:
        return isinstance(exc, psycopg.OperationalError)
    return state in _TRANSIENT_SQLSTATES or state.startswith(_TRANSIENT_SQLSTATE_PREFIXES)


def translate(exc: psycopg.Error, what: str, schema: str, *, dsn: str | None = None) -> DatabaseError:
    """The kombu-akadze error for a psycopg error; callers ``raise translate(...) from exc``. *dsn*: the
    one a failed connection attempt used (a refusal of a DSN that worked before is retried)."""
    detail = mask_password(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
    refused = refusals.error_for(str(exc), exc.sqlstate, what, dsn=dsn)
    if refused is not None:
        return refused
    if is_transient(exc):
        # kombu and Celery retry it where a retry policy applies (a worker's connection, a publish
        # with retry=True); the words "will retry" would be untrue for a caller that has none.
        return TransientDatabaseError(f"{what}: transient database error, retryable: {detail}")
    if isinstance(exc, pg_errors.UndefinedTable | pg_errors.InvalidSchemaName):
        return SchemaNotAppliedError(
            f"{what}: the kombu-akadze schema {schema!r} is not there ({detail}); "
            "run `akadze migrate --url ...` or enable the transport option auto_migrate"
        )
    if isinstance(exc, pg_errors.UntranslatableCharacter):
        return DatabaseError(
            f"{what}: {detail}; a header or property holds a NUL character (U+0000), which PostgreSQL's jsonb "
            "cannot store: remove it there (a message body may hold any bytes)"
        )
    if isinstance(exc, pg_errors.InsufficientPrivilege):
        return DatabaseError(
            f"{what}: permission denied ({detail}); the role needs SELECT, INSERT, UPDATE, DELETE "
            f"on the tables of schema {schema!r} (see docs/operations.md)"
        )
    return DatabaseError(f"{what}: {detail}")


def pg_duration(seconds: float | None) -> str | None:
    """Seconds as a PostgreSQL timeout setting: milliseconds, at least 1 ms when set at all ('0' is off)."""
    if seconds is None:
        return None
    return "0" if seconds <= 0 else f"{max(1, round(seconds * 1000))}ms"


def connect(dsn: str, **kwargs: Any) -> psycopg.Connection[Any]:
    """A new connection with keepalive defaults and an application_name that names its role (keyword
    arguments as connect_probed's)."""
    return connect_probed(dsn, **kwargs)[0]


def connect_probed(
    dsn: str,
    *,
    role: str,
    connect_timeout: float,
    autocommit: bool = True,
    prepared_statements: bool = True,
    lock_timeout: float | None = None,
    statement_timeout: float | None = None,
) -> tuple[psycopg.Connection[Any], bool]:
    """A new connection and whether a pooler (PgBouncer) stands between it and PostgreSQL. With
    *lock_timeout* / *statement_timeout* (seconds, 0: off; None: the server's setting) every statement
    of a direct session is bounded: one waiting behind a lock held elsewhere fails, transiently, instead
    of freezing its caller. Through a pooler nothing is prepared server-side (PgBouncer before 1.21
    cannot route a prepared statement under transaction pooling) and nothing is SET for the session
    (it would stay on a shared server connection): the role's settings bound statements there."""
    params: dict[str, Any] = dict(conninfo_to_dict(dsn))
    is_socket = str(params.get("host", "")).startswith("/")
    if not is_socket:
        for key, value in KEEPALIVE_DEFAULTS.items():
            params.setdefault(key, value)
    params.setdefault("application_name", f"akadze-{role}")
    params["client_encoding"] = "UTF8"  # store.wire writes and reads text as UTF-8, whatever the database's
    params.setdefault("connect_timeout", str(max(1, int(connect_timeout))))
    conn = psycopg.connect(**params, autocommit=autocommit)
    kombu_json_setup(conn)
    try:
        row = conn.execute(
            sqlfiles.render("session_setup"),
            {
                "client_pid": conn.info.backend_pid,
                "lock_timeout": pg_duration(lock_timeout),
                "statement_timeout": pg_duration(statement_timeout),
                "idle_timeout": pg_duration(lock_timeout) if lock_timeout else None,
            },
            prepare=False,
        ).fetchone()
        if not autocommit:
            conn.commit()
    except BaseException:
        conn.close()
        raise
    refusals.accepted(dsn)
    pooled = bool(row and row[0])
    if not prepared_statements or pooled:
        conn.prepare_threshold = None
    if pooled:
        _warn_pooled(dsn, role, timeouts_ok=bool(row and row[3] and row[4]))
    return conn, pooled


_WARNED_POOLED: set[str] = set()


def _warn_pooled(dsn: str, role: str, *, timeouts_ok: bool) -> None:
    """Once per process and kind: what a pooler in front of PostgreSQL changes."""
    if role == "heartbeat" and "listen" not in _WARNED_POOLED:
        _WARNED_POOLED.add("listen")
        logger.warning(
            "kombu-akadze: the heartbeat and LISTEN session reaches PostgreSQL through a pooler (%s); under "
            "transaction pooling its wake-ups may be lost: set the transport option listen_url to a direct URL, "
            "or listen=False",
            mask_password(dsn),
        )
    elif not timeouts_ok and "timeouts" not in _WARNED_POOLED:
        _WARNED_POOLED.add("timeouts")
        logger.warning(
            "kombu-akadze: connected through a pooler (%s), where a session SET would stay on a shared server "
            "connection, so lock_timeout and statement_timeout are not set per session and the role's settings "
            "differ from them: set them on the role, e.g. ALTER ROLE ... SET lock_timeout = '5s' (see "
            "docs/operations.md, Behind PgBouncer)",
            mask_password(dsn),
        )


def kombu_json_setup(conn: psycopg.Connection[Any]) -> None:
    """JSON columns use kombu's codec so datetimes, UUIDs and decimals in headers round-trip."""
    psycopg.types.json.set_json_loads(wire.json_loads, conn)
    psycopg.types.json.set_json_dumps(kombu_json.dumps, conn)


def wake_channel(schema: str, consumer_id: str) -> str:
    """The NOTIFY channel on which one consumer of one schema is woken (see the wake function): a digest,
    so any schema name and consumer id fit PostgreSQL's 63 bytes (pg_notify refuses longer ones)."""
    digest = hashlib.sha256(f"{schema}\0{consumer_id}".encode()).hexdigest()[:40]
    return f"akadze.{digest}"


def relay_key(dsn: str, schema: str) -> str:
    """What the consumers sharing one host's wake-up relay have in common (consume.relay): the server
    their LISTEN session reaches, its database, and the schema. Credentials play no part."""
    params = conninfo_to_dict(dsn)
    host = params.get("hostaddr") or params.get("host") or os.environ.get("PGHOST", "")
    port = params.get("port") or os.environ.get("PGPORT", "5432")
    dbname = params.get("dbname") or os.environ.get("PGDATABASE", "")
    return f"{host}\0{port}\0{dbname}\0{schema}"


class Session:
    """One database session (autocommit): connecting, reconnecting, running a named query. Thread-safe."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str,
        role: str = "command",
        connect_timeout: float = 10.0,
        prepared_statements: bool = True,
        durable_acks: bool = False,
        lock_timeout: float | None = None,
        statement_timeout: float | None = None,
    ) -> None:
        self.dsn = dsn
        self.schema = schema
        self.role = role
        self.connect_timeout = connect_timeout
        self.prepared_statements = prepared_statements
        #: Acks and claims wait for the WAL flush, as publishes always do (transport option durable_acks).
        self.durable_acks = durable_acks
        #: Seconds any statement may wait for a lock / run (0: off; None: the server's settings).
        self.lock_timeout = lock_timeout
        self.statement_timeout = statement_timeout
        #: The last connection reached PostgreSQL through a pooler (see connect_probed).
        self.pooled = False
        self._conn: psycopg.Connection[Any] | None = None
        #: The per-message statements prepared on that connection (store.wire).
        self._prepared = wire.Prepared()
        self._lock = threading.RLock()
        #: time.monotonic() of the last statement (see close_if_idle).
        self.last_used = 0.0
        _LIVE_STORES.add(self)

    def __repr__(self) -> str:
        return f"<Store {self.role} {mask_password(self.dsn)} schema={self.schema!r}>"

    # -- connection ---------------------------------------------------------

    def connection(self) -> psycopg.Connection[Any]:
        with self._lock:
            self.last_used = time.monotonic()
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._drop()
                try:
                    self._conn, self.pooled = connect_probed(
                        self.dsn,
                        role=self.role,
                        connect_timeout=self.connect_timeout,
                        prepared_statements=self.prepared_statements,
                        lock_timeout=self.lock_timeout,
                        statement_timeout=self.statement_timeout,
                    )
                except psycopg.Error as exc:
                    raise translate(exc, f"connecting to {mask_password(self.dsn)}", self.schema, dsn=self.dsn) from exc
            return self._conn

    @property
    def connected(self) -> bool:
        conn = self._conn
        return conn is not None and not conn.closed and not conn.broken

    def close(self) -> None:
        with self._lock:
            self._drop()

    def close_if_idle(self, idle: float) -> bool:
        """Close the connection if no statement used it for *idle* seconds and nothing is in flight on it
        (the next statement reconnects). Never waits: a session in use is busy, not idle."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._conn is None or self._busy() or time.monotonic() - self.last_used < idle:
                return False
            self._drop()
            return True
        finally:
            self._lock.release()

    def _busy(self) -> bool:
        """Whether a part keeps state on the connection that closing it would lose (store.loop)."""
        return False

    def forget(self) -> None:
        """After fork: never touch the parent's session from the child (see _INHERITED)."""
        if self._conn is not None:
            _INHERITED.append(self._conn)
        self._conn = None
        self._prepared.forget()
        self._reset(forget=True)
        self._lock = threading.RLock()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self._prepared.forget()
        self._reset(forget=False)
        if conn is not None:
            with contextlib.suppress(psycopg.Error):  # closing a broken connection: nothing left to save
                conn.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """The named queries run inside share one transaction and one commit (a maintenance round);
        an error in any of them rolls back all of them."""
        with self._lock:
            self._settle()
            conn = self.connection()
            try:
                with conn.transaction():
                    yield
            except BaseException as exc:
                # psycopg ends a rolled-back transaction with DEALLOCATE ALL when it has prepared statements
                # of its own: the store.wire ones went with them
                self._prepared.forget()
                if not isinstance(exc, psycopg.Error):
                    raise
                if conn.broken or is_transient(exc):
                    self._drop()
                raise translate(exc, "transaction", self.schema) from exc

    def _settle(self) -> None:
        """Called under the lock before every statement: a part that leaves a statement in flight on the
        session (store.loop) lands it here first."""

    def _reset(self, *, forget: bool) -> None:
        """Called when the connection is dropped (or, with *forget*, abandoned after a fork): a part
        that keeps per-connection state (store.loop) clears it."""

    def _message_params(self, message: NewMessage) -> dict[str, Any]:
        return {
            "priority": message.priority,
            "body": message.body,
            "content_type": message.content_type,
            "content_encoding": message.content_encoding,
            "headers": Jsonb(message.headers or {}),
            "properties": Jsonb(message.properties or {}),
            "delay": float(message.delay),
            "ttl": message.ttl,
            "not_before": message.not_before,
            "durable": message.durable,
        }

    def _run(
        self, name: str, params: dict[str, Any] | None = None, *, fetch: bool = True, prepare: bool | None = None
    ) -> list[dict[str, Any]]:
        return self._execute(name, params, dict_row, fetch=fetch, prepare=prepare)

    def _prepared_name(self, conn: psycopg.Connection[Any], name: str, query: bytes) -> bytes | None:
        """The server-side name of a store.wire statement on *conn*, prepared there if needed; None (send
        it unnamed) when prepared statements are off or a pooler may run it on another server."""
        if not self.prepared_statements or self.pooled:
            return None
        return self._prepared.name(conn, name, query)

    def _run_direct(self, name: str, params: dict[str, Any]) -> list[tuple[bytes | None, ...]]:
        """A per-message statement (a publish) through libpq directly (store.wire): its rows as raw text
        values. Errors as _execute's; a wait cut short (a signal's exception) drops the connection, whose
        statement may still be running."""
        query, names = wire.positional(sqlfiles.render(name, schema=self.schema))
        values, formats = wire.parameters(params, names)
        with self._lock:
            self._settle()
            conn = self.connection()

            def exchange() -> list[Any]:
                prepared = self._prepared_name(conn, name, query)
                timeout = self.connect_timeout
                wire.send(conn, query, values, formats, prepared=prepared, result_format=wire.TEXT, timeout=timeout)
                return wire.read_all(conn)

            try:
                results = exchange()
                if wire.lost_prepared(results):
                    # deallocated behind the registry's back (nothing ran): prepare it again, send it once more
                    self._prepared.forget()
                    results = exchange()
                return [row for result in results for row in wire.text_rows(result, conn)]
            except psycopg.Error as exc:
                if conn.pgconn.status != psycopg.pq.ConnStatus.OK or is_transient(exc):
                    self._drop()
                raise translate(exc, name, self.schema) from exc
            except BaseException:
                self._drop()
                raise

    def _execute(
        self, name: str, params: dict[str, Any] | None, rows: Any, *, fetch: bool, prepare: bool | None
    ) -> list[Any]:
        query = sqlfiles.render(name, schema=self.schema)
        with self._lock:
            self._settle()
            conn = self.connection()
            try:
                with conn.cursor(row_factory=rows) as cur:
                    cur.execute(query, params or {}, prepare=prepare)
                    return cur.fetchall() if fetch and cur.description else []
            except psycopg.Error as exc:
                if conn.broken or is_transient(exc):
                    self._drop()
                raise translate(exc, name, self.schema) from exc
