"""The only module that runs SQL at run time: one method per named query, psycopg errors translated here."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import select
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from kombu.utils import json as kombu_json
from psycopg import errors as pg_errors
from psycopg import pq
from psycopg.adapt import PyFormat, Transformer
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from kombu_akadze import sqlfiles
from kombu_akadze.errors import (
    DatabaseError,
    PermissionDeniedError,
    SchemaNotAppliedError,
    TransientDatabaseError,
)
from kombu_akadze.urls import mask_password

logger = logging.getLogger("kombu_akadze")

DRIVER_VERSION = psycopg.__version__

#: A claimed run of a message: the row id and the run_count it was claimed with.
Tag = tuple[int, int]

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
# read-only transaction (we reached a standby during failover).
_TRANSIENT_SQLSTATE_PREFIXES = ("08", "53", "57P", "40")
_TRANSIENT_SQLSTATES = {"25006", "57014"}

# Connections inherited by a forked child: kept referenced so that garbage
# collection never closes them, which would end the parent's sessions.
_INHERITED: list[Any] = []
_LIVE_STORES: weakref.WeakSet[Store] = weakref.WeakSet()


def _forget_after_fork() -> None:
    for store in list(_LIVE_STORES):
        store.forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


@dataclass(frozen=True)
class ClaimedMessage:
    id: int
    queue: str
    priority: int
    body: bytes
    content_type: str | None
    content_encoding: str | None
    headers: dict[str, Any]
    properties: dict[str, Any]
    run_count: int
    attempts: int

    @property
    def tag(self) -> Tag:
        return (self.id, self.run_count)


@dataclass(frozen=True)
class Outcome:
    """What a requeue or rescue did: ids back to ready, ids sent to dead letters."""

    ready: frozenset[int]
    dead: frozenset[int]
    consumers_gone: int = 0


@dataclass(frozen=True)
class NewMessage:
    queue: str
    body: bytes
    priority: int = 0
    content_type: str | None = None
    content_encoding: str | None = None
    headers: dict[str, Any] | None = None
    properties: dict[str, Any] | None = None
    delay: float = 0.0
    #: Seconds until the message expires if still ready (RabbitMQ's per-message expiration).
    ttl: float | None = None
    #: Not claimable before this time (a far Celery ETA, minus the native-delay lead).
    not_before: datetime | None = None


def is_transient(exc: BaseException) -> bool:
    """Whether a psycopg error is one a reconnect or retry can outlive."""
    if isinstance(exc, psycopg.InterfaceError):
        return True
    if not isinstance(exc, psycopg.Error):
        return False
    state = exc.sqlstate
    if state is None:
        return isinstance(exc, psycopg.OperationalError)
    return state in _TRANSIENT_SQLSTATES or state.startswith(_TRANSIENT_SQLSTATE_PREFIXES)


def translate(exc: psycopg.Error, what: str, schema: str) -> DatabaseError:
    """The kombu-akadze error for a psycopg error; callers ``raise translate(...) from exc``."""
    detail = mask_password(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
    if is_transient(exc):
        return TransientDatabaseError(f"{what}: transient database error, will retry: {detail}")
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


def connect(
    dsn: str,
    *,
    role: str,
    connect_timeout: float,
    autocommit: bool = True,
    prepared_statements: bool = True,
    generic_plans: bool = False,
) -> psycopg.Connection[Any]:
    """A new connection with keepalive defaults and an application_name that names its role; with
    *generic_plans* (and prepared statements) its prepared statements keep one plan (see queries.sql)."""
    params: dict[str, Any] = dict(conninfo_to_dict(dsn))
    is_socket = str(params.get("host", "")).startswith("/")
    if not is_socket:
        for key, value in KEEPALIVE_DEFAULTS.items():
            params.setdefault(key, value)
    params.setdefault("application_name", f"akadze-{role}")
    params.setdefault("connect_timeout", str(max(1, int(connect_timeout))))
    conn = psycopg.connect(**params, autocommit=autocommit)
    if not prepared_statements:
        conn.prepare_threshold = None
    elif generic_plans:
        try:
            conn.execute(sqlfiles.render("queries.sql", "session_generic_plans"))
        except psycopg.Error:
            conn.close()
            raise
    kombu_json_setup(conn)
    return conn


def kombu_json_setup(conn: psycopg.Connection[Any]) -> None:
    """JSON columns use kombu's codec so datetimes, UUIDs and decimals in headers round-trip."""
    psycopg.types.json.set_json_loads(kombu_json.loads, conn)
    psycopg.types.json.set_json_dumps(kombu_json.dumps, conn)


class Store:
    """One database session (autocommit) and the named queries that run on it. Thread-safe."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str,
        role: str = "command",
        connect_timeout: float = 10.0,
        prepared_statements: bool = True,
        generic_plans: bool = False,
    ) -> None:
        self.dsn = dsn
        self.schema = schema
        self.role = role
        self.connect_timeout = connect_timeout
        self.prepared_statements = prepared_statements
        self.generic_plans = generic_plans
        self.channel = notify_channel(schema)
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.RLock()
        #: The statement message_ack_claim_start() sent and whose result has not been read yet.
        self._in_flight: _InFlight | None = None
        #: Its outcome, when another statement on this session had to read it first: (ok, value).
        self._landed: tuple[bool, Any] | None = None
        #: Called (on whichever thread) before that happens: the event loop stops watching the socket
        #: (the wait may close and reopen the session) and collects the outcome on its next tick.
        self.on_claim_landing: Callable[[], None] | None = None
        #: The session on which message_ack_claim is prepared under _LOOP_CLAIM (once per session).
        self._loop_prepared_on: psycopg.Connection[Any] | None = None
        _LIVE_STORES.add(self)

    def __repr__(self) -> str:
        return f"<Store {self.role} {mask_password(self.dsn)} schema={self.schema!r}>"

    # -- connection ---------------------------------------------------------

    def connection(self) -> psycopg.Connection[Any]:
        with self._lock:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._drop()
                try:
                    self._conn = connect(
                        self.dsn,
                        role=self.role,
                        connect_timeout=self.connect_timeout,
                        prepared_statements=self.prepared_statements,
                        generic_plans=self.generic_plans,
                    )
                except psycopg.Error as exc:
                    raise translate(exc, f"connecting to {mask_password(self.dsn)}", self.schema) from exc
            return self._conn

    @property
    def connected(self) -> bool:
        conn = self._conn
        return conn is not None and not conn.closed and not conn.broken

    def close(self) -> None:
        with self._lock:
            self._drop()

    def forget(self) -> None:
        """After fork: never touch the parent's session from the child (see _INHERITED)."""
        if self._conn is not None:
            _INHERITED.append(self._conn)
        self._conn = None
        self._in_flight = None
        self._landed = None
        self._loop_prepared_on = None
        self._lock = threading.RLock()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self._in_flight = None
        self._loop_prepared_on = None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):  # closing a broken connection: nothing left to save
                conn.close()

    def _run(self, name: str, params: dict[str, Any] | None = None, *, fetch: bool = True) -> list[dict[str, Any]]:
        query = sqlfiles.render("queries.sql", name, schema=self.schema)
        with self._lock:
            if self._in_flight is not None:
                self._land_in_flight()
            conn = self.connection()
            try:
                with conn.cursor(row_factory=dict_row) as cur:
                    cur.execute(query, params or {})
                    return cur.fetchall() if fetch and cur.description else []
            except psycopg.Error as exc:
                if conn.broken or is_transient(exc):
                    self._drop()
                raise translate(exc, name, self.schema) from exc

    # -- messages -----------------------------------------------------------

    def message_insert(self, message: NewMessage, *, now: datetime | None = None) -> int | None:
        """The new row's id; None when the queue is full and rejects publishes (x-overflow)."""
        rows = self._run("message_insert", {**self._message_params(message), "queue": message.queue, "now": now})
        return int(rows[0]["id"]) if rows else None

    def message_route(
        self, message: NewMessage, *, exchange: str, routing_key: str, now: datetime | None = None
    ) -> tuple[list[str], int]:
        """Publish through *exchange*: (queues that got a copy, queues that matched)."""
        params = {**self._message_params(message), "exchange": exchange, "routing_key": routing_key, "now": now}
        rows = self._run("message_route", params)
        return [r["queue"] for r in rows if r["id"] is not None], int(rows[0]["targets"]) if rows else 0

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
            "channel": self.channel,
        }

    def message_insert_many(self, messages: Sequence[NewMessage], *, now: datetime | None = None) -> int:
        if not messages:
            return 0
        self._run(
            "message_insert_many",
            {
                "queues": [m.queue for m in messages],
                "priorities": [m.priority for m in messages],
                "bodies": [m.body for m in messages],
                "content_types": [m.content_type for m in messages],
                "content_encodings": [m.content_encoding for m in messages],
                "headers": [Jsonb(m.headers or {}) for m in messages],
                "properties": [Jsonb(m.properties or {}) for m in messages],
                "delays": [float(m.delay) for m in messages],
                "ttls": [m.ttl for m in messages],
                "now": now,
                "channel": self.channel,
            },
        )
        return len(messages)

    def message_route_many(
        self, batch: Sequence[tuple[str, str, NewMessage]], *, now: datetime | None = None
    ) -> tuple[int, int]:
        """Publish (exchange, routing_key, message) triples in one statement: (rows inserted, routed)."""
        if not batch:
            return 0, 0
        messages = [m for _, _, m in batch]
        rows = self._run(
            "message_route_many",
            {
                "exchanges": [e for e, _, _ in batch],
                "routing_keys": [k for _, k, _ in batch],
                "priorities": [m.priority for m in messages],
                "bodies": [m.body for m in messages],
                "content_types": [m.content_type for m in messages],
                "content_encodings": [m.content_encoding for m in messages],
                "headers": [Jsonb(m.headers or {}) for m in messages],
                "properties": [Jsonb(m.properties or {}) for m in messages],
                "ttls": [m.ttl for m in messages],
                "not_befores": [m.not_before for m in messages],
                "now": now,
                "channel": self.channel,
            },
        )
        return int(rows[0]["inserted"]), int(rows[0]["routed"])

    def message_claim(
        self, *, queues: Sequence[str], limits: Sequence[int], owner: str, now: datetime | None = None
    ) -> list[ClaimedMessage]:
        rows = self._run(
            "message_claim",
            {"queues": list(queues), "limits": list(limits), "owner": owner, "now": now},
        )
        return _claimed(rows)

    def message_ack_claim(
        self,
        *,
        acks: Iterable[Tag],
        queues: Sequence[str],
        limits: Sequence[int],
        owner: str,
        now: datetime | None = None,
    ) -> tuple[list[ClaimedMessage], set[int]]:
        """Write finished runs and claim the next messages in one statement: (claimed, acked ids)."""
        ack_ids, ack_run_counts = _split(acks)
        rows = self._run(
            "message_ack_claim",
            {
                "ack_ids": ack_ids,
                "ack_run_counts": ack_run_counts,
                "queues": list(queues),
                "limits": list(limits),
                "owner": owner,
                "now": now,
            },
        )
        return _ack_claim_outcome(rows)

    # The same statement for Celery's event loop, which must not block on it: sent in libpq's
    # non-blocking mode, its socket watched by the loop, its result read as it arrives. A thread
    # running the blocking call cost the worker ~0.25 ms of CPU per claim in GIL hand-offs (15
    # futex calls per task, against none for RabbitMQ's consumer). Only for a store that runs
    # nothing else (the transport's claim session): no other statement may start while one is in flight.

    def message_ack_claim_start(
        self, *, acks: Iterable[Tag], queues: Sequence[str], limits: Sequence[int], owner: str
    ) -> int:
        """Send message_ack_claim without waiting; returns the socket to watch for its result. The
        first claim on a session prepares the statement first (one blocking round trip per session)."""
        ack_ids, ack_run_counts = _split(acks)
        params = {"ack_ids": ack_ids, "ack_run_counts": ack_run_counts, "queues": list(queues),
                  "limits": list(limits), "owner": owner, "now": None}  # fmt: skip
        with self._lock:
            if self._in_flight is not None or self._landed is not None:
                raise RuntimeError("message_ack_claim is already in flight on this session")
            conn = self.connection()
            query, names = _positional(sqlfiles.render("queries.sql", "message_ack_claim", schema=self.schema))
            try:
                values = Transformer(conn).dump_sequence([params[n] for n in names], [PyFormat.TEXT] * len(names))
                pgconn = conn.pgconn
                if not self.prepared_statements:
                    pgconn.send_query_params(query, values, None, None, _BINARY)
                else:
                    if self._loop_prepared_on is not conn:
                        _check(pgconn.prepare(_LOOP_CLAIM, query, None), conn)
                        self._loop_prepared_on = conn
                    pgconn.send_query_prepared(_LOOP_CLAIM, values, None, _BINARY)
                while pgconn.flush():  # non-blocking: 1 while part of the statement is still unsent
                    select.select([], [pgconn.socket], [], self.connect_timeout)
            except psycopg.Error as exc:
                self._drop()
                raise translate(exc, "message_ack_claim", self.schema) from exc
            self._in_flight = _InFlight(conn)
            return pgconn.socket

    def message_ack_claim_read(self) -> tuple[list[ClaimedMessage], set[int]] | None:
        """Read what arrived for the statement in flight: its outcome once complete, else None.
        Raises its error (translated) when it failed; the session is then closed if broken."""
        with self._lock:
            landed, self._landed = self._landed, None
            if landed is not None:
                ok, value = landed
                if not ok:
                    raise value
                return value  # type: ignore[no-any-return]
            flight = self._in_flight
            if flight is None:
                raise RuntimeError("no message_ack_claim in flight on this session")
            pgconn = flight.conn.pgconn
            try:
                pgconn.consume_input()
                while not pgconn.is_busy():
                    result = pgconn.get_result()
                    if result is None:
                        break
                    flight.results.append(result)
                else:
                    return None
                self._in_flight = None
                rows = [row for result in flight.results for row in _rows_of(result, flight.conn)]
            except psycopg.Error as exc:
                if flight.conn.pgconn.status != pq.ConnStatus.OK or is_transient(exc):
                    self._drop()
                self._in_flight = None
                raise translate(exc, "message_ack_claim", self.schema) from exc
            return _ack_claim_outcome(rows)

    def _land_in_flight(self) -> None:
        """Another statement needs the session: wait for the one in flight and keep its outcome for
        message_ack_claim_read() (under the lock; the event loop is told through on_claim_landing)."""
        if self.on_claim_landing is not None:
            self.on_claim_landing()
        try:
            outcome = self.message_ack_claim_wait(None)
        except DatabaseError as exc:
            self._landed = (False, exc)
        else:
            self._landed = (True, outcome)

    def message_ack_claim_wait(self, timeout: float | None) -> tuple[list[ClaimedMessage], set[int]] | None:
        """Block up to *timeout* seconds (None: until it ends) for the statement in flight; its outcome,
        or None if it is still running then."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            outcome = self.message_ack_claim_read()
            if outcome is not None:
                return outcome
            flight = self._in_flight
            if flight is None:
                raise RuntimeError("no message_ack_claim in flight on this session")
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            select.select([flight.conn.pgconn.socket], [], [], left)

    def claim_landed(self) -> bool:
        """Another statement already read the outcome of the one in flight (message_ack_claim_read()
        returns it without touching the socket)."""
        return self._landed is not None

    def fileno_in_flight(self) -> int | None:
        """The socket of the statement in flight, if any."""
        flight = self._in_flight
        return None if flight is None else flight.conn.pgconn.socket

    def message_ack(self, tags: Iterable[Tag]) -> set[int]:
        return self._ids("message_ack", tags)

    def message_release(self, tags: Iterable[Tag]) -> set[int]:
        return self._ids("message_release", tags, channel=self.channel)

    def message_bury(self, tags: Iterable[Tag], *, reason: str) -> set[int]:
        return self._ids("message_bury", tags, reason=reason)

    def message_requeue(self, tags: Iterable[Tag], *, max_attempts: int) -> Outcome:
        ids, run_counts = _split(tags)
        if not ids:
            return Outcome(frozenset(), frozenset())
        rows = self._run(
            "message_requeue",
            {
                "ids": ids,
                "run_counts": run_counts,
                "max_attempts": max_attempts,
                "exhausted_reason": "max_attempts exceeded",
                "channel": self.channel,
            },
        )
        return _outcome(rows)

    def _ids(self, name: str, tags: Iterable[Tag], **extra: Any) -> set[int]:
        ids, run_counts = _split(tags)
        if not ids:
            return set()
        rows = self._run(name, {"ids": ids, "run_counts": run_counts, **extra})
        return {int(r["id"]) for r in rows}

    def lease_rescue(self, *, ttl: float, max_attempts: int, now: datetime | None = None) -> Outcome:
        rows = self._run(
            "lease_rescue",
            {
                "ttl": float(ttl),
                "max_attempts": max_attempts,
                "exhausted_reason": "max_attempts exceeded",
                "now": now,
                "channel": self.channel,
            },
        )
        return _outcome(rows)

    def message_get(self, message_id: int) -> dict[str, Any] | None:
        rows = self._run("message_get", {"id": message_id})
        return rows[0] if rows else None

    def message_counts(self) -> dict[tuple[str, str], int]:
        return {(r["queue"], r["state"]): int(r["n"]) for r in self._run("message_counts")}

    def deadletter_list(self, *, queue: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        return self._run("deadletter_list", {"queue": queue, "limit": limit})

    # -- consumers ----------------------------------------------------------

    def consumer_heartbeat(
        self,
        *,
        consumer_id: str,
        hostname: str,
        pid: int,
        queues: Sequence[str] = (),
        now: datetime | None = None,
    ) -> None:
        self._run(
            "consumer_heartbeat",
            {"id": consumer_id, "hostname": hostname, "pid": pid, "queues": list(queues), "now": now},
        )

    def consumer_maintain(
        self,
        *,
        consumer_id: str,
        hostname: str,
        pid: int,
        queues: Sequence[str],
        ttl: float,
        max_attempts: int,
        now: datetime | None = None,
    ) -> dict[str, int]:
        """Heartbeat + rescue + queue expiry + message TTL in one statement; counts of what it did."""
        rows = self._run(
            "consumer_maintain",
            {
                "id": consumer_id,
                "hostname": hostname,
                "pid": pid,
                "queues": list(queues),
                "ttl": float(ttl),
                "max_attempts": max_attempts,
                "exhausted_reason": "max_attempts exceeded",
                "now": now,
                "channel": self.channel,
                "schema": self.schema,
            },
        )
        return {k: int(v) for k, v in rows[0].items()}

    def messages_size(self) -> TableSize:
        rows = self._run("messages_size", {"schema": self.schema})
        if not rows:
            raise SchemaNotAppliedError(
                f"messages_size: no table {self.schema}.messages; run `akadze migrate --url ...`"
            )
        return TableSize(heap_bytes=int(rows[0]["heap_bytes"]), index_bytes=int(rows[0]["index_bytes"]))

    def messages_vacuum(self) -> None:
        """VACUUM the messages table (this session is autocommit, as VACUUM requires)."""
        self._run("messages_vacuum", fetch=False)

    def messages_reindex(self, *, lock_timeout: float) -> bool:
        """REINDEX the messages table, waiting at most *lock_timeout* s for its lock: False when another
        session held it that long (nothing changed; claims and publishes waited at most that long)."""
        timeout = f"{max(1, round(lock_timeout * 1000))}ms"
        with self._lock:
            conn = self.connection()
            try:
                with conn.transaction(), conn.cursor() as cur:
                    cur.execute(sqlfiles.render("queries.sql", "lock_timeout_set"), {"timeout": timeout})
                    cur.execute(sqlfiles.render("queries.sql", "messages_reindex", schema=self.schema))
            except pg_errors.LockNotAvailable:
                return False
            except pg_errors.InsufficientPrivilege as exc:
                raise PermissionDeniedError(
                    f"messages_reindex: only the owner of {self.schema}.messages may REINDEX it "
                    f"({mask_password(str(exc).strip().splitlines()[0])}); run `akadze compact` as the "
                    "owner, or set the transport option compact_interval=0"
                ) from exc
            except psycopg.Error as exc:
                if conn.broken or is_transient(exc):
                    self._drop()
                raise translate(exc, "messages_reindex", self.schema) from exc
        return True

    def consumer_delete(self, *, consumer_id: str) -> None:
        self._run("consumer_delete", {"id": consumer_id}, fetch=False)

    # -- queues -------------------------------------------------------------

    def queue_declare(
        self,
        *,
        name: str,
        max_attempts: int | None = None,
        arguments: dict[str, Any] | None = None,
        durable: bool = True,
        auto_delete: bool = False,
        exclusive: bool = False,
        expires: float | None = None,
        message_ttl: float | None = None,
        max_length: int | None = None,
        overflow: str = "drop-head",
        now: datetime | None = None,
    ) -> int:
        """Declare (or redeclare) a queue; returns how many messages are ready in it."""
        rows = self._run(
            "queue_declare",
            {
                "name": name,
                "max_attempts": max_attempts,
                "arguments": Jsonb(arguments or {}),
                "durable": durable,
                "auto_delete": auto_delete,
                "exclusive": exclusive,
                "expires": expires,
                "message_ttl": message_ttl,
                "max_length": max_length,
                "overflow": overflow,
                "now": now,
            },
        )
        return int(rows[0]["ready"])

    def queue_touch(self, *, queues: Sequence[str], now: datetime | None = None) -> None:
        self._run("queue_touch", {"queues": list(queues), "now": now}, fetch=False)

    def queue_expire(self, *, ttl: float, now: datetime | None = None) -> dict[str, int]:
        """Queue expiry, auto_delete of abandoned queues, message TTL; counts of what went."""
        rows = self._run("queue_expire", {"ttl": float(ttl), "now": now})
        return {k: int(v) for k, v in rows[0].items()}

    def queue_exists(self, *, name: str) -> bool:
        return bool(self._run("queue_exists", {"name": name})[0]["present"])

    def queue_size(self, *, name: str, now: datetime | None = None) -> int:
        return int(self._run("queue_size", {"name": name, "now": now})[0]["ready"])

    def queue_purge(self, *, name: str) -> int:
        return int(self._run("queue_purge", {"name": name})[0]["purged"])

    def queue_delete(self, *, name: str) -> int:
        return int(self._run("queue_delete", {"name": name})[0]["deleted"])

    # -- exchanges and bindings -------------------------------------------

    def exchange_declare(
        self, *, name: str, type: str, durable: bool, auto_delete: bool, arguments: dict[str, Any] | None = None
    ) -> None:
        self._run(
            "exchange_declare",
            {
                "name": name,
                "type": type,
                "durable": durable,
                "auto_delete": auto_delete,
                "arguments": Jsonb(arguments or {}),
            },
            fetch=False,
        )

    def exchange_exists(self, *, name: str) -> bool:
        return bool(self._run("exchange_exists", {"name": name})[0]["present"])

    def exchange_delete(self, *, name: str) -> int:
        return int(self._run("exchange_delete", {"name": name})[0]["exchanges"])

    def binding_declare(
        self, *, exchange: str, routing_key: str, queue: str, pattern: str, arguments: dict[str, Any] | None = None
    ) -> None:
        self._run(
            "binding_declare",
            {
                "exchange": exchange,
                "routing_key": routing_key,
                "queue": queue,
                "pattern": pattern,
                "arguments": Jsonb(arguments or {}),
            },
            fetch=False,
        )

    def binding_delete(self, *, exchange: str, routing_key: str, queue: str) -> None:
        self._run("binding_delete", {"exchange": exchange, "routing_key": routing_key, "queue": queue}, fetch=False)

    def binding_list(self) -> list[dict[str, Any]]:
        return self._run("binding_list")

    # -- LISTEN -------------------------------------------------------------

    def listen_start(self) -> int:
        """Open (or reopen) this session, LISTEN on the schema's channel; returns the socket fd."""
        query = sqlfiles.render("queries.sql", "listen_start", channel=self.channel)
        with self._lock:
            conn = self.connection()
            try:
                conn.execute(query)
            except psycopg.Error as exc:
                self._drop()
                raise translate(exc, "listen_start", self.schema) from exc
            return conn.fileno()

    def listen_notifies(self) -> list[str]:
        """Read what arrived on the socket without blocking; the payloads (queue names) of wake-ups."""
        with self._lock:
            conn = self._conn
            if conn is None:
                raise TransientDatabaseError("listen_notifies: the LISTEN session is not open")
            pgconn = conn.pgconn
            try:
                pgconn.consume_input()
            except psycopg.Error as exc:
                self._drop()
                raise translate(exc, "listen_notifies", self.schema) from exc
            if pgconn.status != psycopg.pq.ConnStatus.OK:
                self._drop()
                raise TransientDatabaseError("listen_notifies: the LISTEN session was lost")
            payloads = []
            while (note := pgconn.notifies()) is not None:
                payloads.append(note.extra.decode("utf-8", "replace"))
            return payloads

    # -- operations --

    def queue_stats(self, *, ttl: float, now: datetime | None = None) -> StatsSnapshot:
        """Every queue's counts and the schema's live consumers (heartbeat within *ttl* s), one statement."""
        rows = self._run("queue_stats", {"ttl": float(ttl), "now": now})
        queues = tuple(
            QueueStats(
                queue=r["queue"],
                ready=int(r["ready"]),
                held=int(r["held"]),
                delayed=int(r["delayed"]),
                dead=int(r["dead"]),
                oldest_ready_age_seconds=r["oldest_ready_age_seconds"],
                consumers_alive=int(r["consumers_alive"]),
            )
            for r in rows
            if r["queue"] is not None
        )
        return StatsSnapshot(rows[0]["taken_at"], int(rows[0]["consumers_alive"]), queues)

    def deadletter_find(
        self, *, where: DeadLetterFilter, limit: int | None = 100, now: datetime | None = None
    ) -> list[DeadLetterSummary]:
        rows = self._run("deadletter_find", {**where.params(), "limit": limit, "now": now})
        return [DeadLetterSummary(**r) for r in rows]

    def deadletter_count(self, *, where: DeadLetterFilter, now: datetime | None = None) -> int:
        return int(self._run("deadletter_count", {**where.params(), "now": now})[0]["n"])

    def deadletter_get(self, *, message_id: int) -> DeadLetter | None:
        rows = self._run("deadletter_get", {"id": message_id})
        return DeadLetter(**{**rows[0], "body": bytes(rows[0]["body"])}) if rows else None

    def deadletter_replay(
        self, *, where: DeadLetterFilter, limit: int | None = None, now: datetime | None = None
    ) -> ReplayResult:
        params = {**where.params(), "limit": limit, "now": now, "channel": self.channel}
        rows = self._run("deadletter_replay", params)
        return ReplayResult(
            replayed=frozenset(int(r["id"]) for r in rows if r["outcome"] == "replayed"),
            already_live=frozenset(int(r["id"]) for r in rows if r["outcome"] == "already_live"),
        )

    def deadletter_purge(self, *, where: DeadLetterFilter, now: datetime | None = None) -> int:
        return int(self._run("deadletter_purge", {**where.params(), "now": now})[0]["purged"])

    # -- transactional enqueue --

    def message_insert_on(
        self, conn: psycopg.Connection[Any], message: NewMessage, *, now: datetime | None = None
    ) -> int | None:
        """message_insert on the caller's connection, inside their transaction and never committed here: the
        row and its wake-up (NOTIFY is delivered at commit) exist only if they commit. None: the queue is full."""
        params = {**self._message_params(message), "queue": message.queue, "now": now}
        rows = self._run_on(conn, "message_insert", params)
        return int(rows[0]["id"]) if rows else None

    def message_route_on(
        self,
        conn: psycopg.Connection[Any],
        message: NewMessage,
        *,
        exchange: str,
        routing_key: str,
        now: datetime | None = None,
    ) -> tuple[list[str], int]:
        """message_route on the caller's connection, as message_insert_on: (queues that got a copy, matched)."""
        params = {**self._message_params(message), "exchange": exchange, "routing_key": routing_key, "now": now}
        rows = self._run_on(conn, "message_route", params)
        return [r["queue"] for r in rows if r["id"] is not None], int(rows[0]["targets"]) if rows else 0

    def _run_on(self, conn: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """A named query on a connection this store does not own: no lock, no reconnect, no commit.

        JSON goes through kombu's codec as on our own sessions, without touching the adapters of the
        caller's connection (they are per connection; the wrapper's dumps wins over them).
        """
        if not isinstance(conn, psycopg.Connection):
            raise TypeError(
                f"{name}: needs a psycopg 3 connection (psycopg.Connection), not {type(conn).__module__}."
                f"{type(conn).__qualname__}; with Django use the postgresql backend on psycopg 3 (Django 4.2+), "
                "with SQLAlchemy a postgresql+psycopg:// URL"
            )
        query = sqlfiles.render("queries.sql", name, schema=self.schema)
        params = {k: Jsonb(v.obj, dumps=kombu_json.dumps) if isinstance(v, Jsonb) else v for k, v in params.items()}
        try:
            with conn.cursor(row_factory=dict_row) as cur:
                cur.execute(query, params)
                return cur.fetchall() if cur.description else []
        except psycopg.Error as exc:
            raise translate(exc, name, self.schema) from exc


def notify_channel(schema: str) -> str:
    """The NOTIFY channel of one schema: at most 63 bytes (pg_notify refuses longer ones, LISTEN would
    truncate them), cut at a character boundary; the schema name may be multibyte."""
    return ("akadze." + schema).encode("utf-8")[:63].decode("utf-8", "ignore")


def _split(tags: Iterable[Tag]) -> tuple[list[int], list[int]]:
    ids: list[int] = []
    run_counts: list[int] = []
    for message_id, run_count in tags:
        ids.append(int(message_id))
        run_counts.append(int(run_count))
    return ids, run_counts


#: Name of message_ack_claim prepared for the event loop's non-blocking claims; results in binary.
_LOOP_CLAIM = b"akadze_loop_ack_claim"
_BINARY = 1
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


@dataclass
class _InFlight:
    conn: psycopg.Connection[Any]
    results: list[pq.abc.PGresult] = field(default_factory=list)


def _positional(query: str) -> tuple[bytes, list[str]]:
    """A named block with %(name)s placeholders as libpq wants it: $1.. in first-use order, and the names."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    return _PLACEHOLDER.sub(number, query).replace("%%", "%").encode("utf-8"), names


def _check(result: pq.abc.PGresult, conn: psycopg.Connection[Any]) -> pq.abc.PGresult:
    if result.status == pq.ExecStatus.FATAL_ERROR:
        raise pg_errors.error_from_result(result, encoding=conn.info.encoding)
    return result


def _rows_of(result: pq.abc.PGresult, conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    _check(result, conn)
    if result.status != pq.ExecStatus.TUPLES_OK:
        return []
    loader = Transformer(conn)
    loader.set_pgresult(result)
    names = [(result.fname(i) or b"").decode() for i in range(result.nfields)]
    return [dict(zip(names, values, strict=True)) for values in loader.load_rows(0, result.ntuples, tuple)]


def _ack_claim_outcome(rows: list[dict[str, Any]]) -> tuple[list[ClaimedMessage], set[int]]:
    """message_ack_claim's rows: (claimed messages, acked ids)."""
    acked = {int(r["id"]) for r in rows if r["acked"]}
    return _claimed([r for r in rows if not r["acked"]]), acked


def _claimed(rows: list[dict[str, Any]]) -> list[ClaimedMessage]:
    """Claimed rows as messages, in claim order (priority first, then publish order)."""
    claimed = [
        ClaimedMessage(
            id=r["id"],
            queue=r["queue"],
            priority=r["priority"],
            body=bytes(r["body"]),
            content_type=r["content_type"],
            content_encoding=r["content_encoding"],
            headers=r["headers"],
            properties=r["properties"],
            run_count=r["run_count"],
            attempts=r["attempts"],
        )
        for r in rows
    ]
    claimed.sort(key=lambda m: (-m.priority, m.id))
    return claimed


def _outcome(rows: list[dict[str, Any]]) -> Outcome:
    ready = frozenset(int(r["id"]) for r in rows if r["outcome"] == "ready")
    dead = frozenset(int(r["id"]) for r in rows if r["outcome"] == "dead")
    gone = sum(1 for r in rows if r["outcome"] == "consumer_gone")
    return Outcome(ready, dead, gone)


# -- operations records --


@dataclass(frozen=True)
class TableSize:
    heap_bytes: int
    index_bytes: int


@dataclass(frozen=True)
class QueueStats:
    """One queue's depth: ready now, held by consumers, delayed (ready later), dead letters."""

    queue: str
    ready: int
    held: int
    delayed: int
    dead: int
    #: Seconds the oldest ready message has been claimable (None: nothing ready).
    oldest_ready_age_seconds: float | None
    #: Live consumers of the whole schema (the consumers table does not record queues).
    consumers_alive: int


@dataclass(frozen=True)
class StatsSnapshot:
    taken_at: datetime
    consumers_alive: int
    queues: tuple[QueueStats, ...]


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which dead letters a find, count, replay or purge touches; None means any."""

    ids: tuple[int, ...] | None = None
    queue: str | None = None
    task: str | None = None
    reason: str | None = None
    #: Seconds: only dead letters buried longer ago than this.
    older_than: float | None = None

    @property
    def is_empty(self) -> bool:
        return all(v is None for v in (self.ids, self.queue, self.task, self.reason, self.older_than))

    def params(self) -> dict[str, Any]:
        return {
            "ids": None if self.ids is None else [int(i) for i in self.ids],
            "queue": self.queue,
            "task": self.task,
            "reason": self.reason,
            "older_than": None if self.older_than is None else float(self.older_than),
        }


@dataclass(frozen=True)
class DeadLetterSummary:
    id: int
    queue: str
    task: str | None
    reason: str
    run_count: int
    attempts: int
    last_owner: str | None
    created_at: datetime
    dead_at: datetime
    body_size: int


@dataclass(frozen=True)
class DeadLetter:
    id: int
    queue: str
    priority: int
    body: bytes
    content_type: str | None
    content_encoding: str | None
    headers: dict[str, Any]
    properties: dict[str, Any]
    run_count: int
    attempts: int
    reason: str
    last_owner: str | None
    created_at: datetime
    dead_at: datetime


@dataclass(frozen=True)
class ReplayResult:
    """Ids put back as ready, and ids whose dead letter was dropped because the message is already live."""

    replayed: frozenset[int]
    already_live: frozenset[int]
