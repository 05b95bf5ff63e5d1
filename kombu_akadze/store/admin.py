"""Store methods of consumers, queues, exchanges, LISTEN, operations and transactional enqueue."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg
from kombu.utils import json as kombu_json
from psycopg import errors as pg_errors
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from kombu_akadze.errors import PermissionDeniedError, SchemaNotAppliedError, TransientDatabaseError
from kombu_akadze.store import sqlfiles
from kombu_akadze.store.records import (
    DeadLetter,
    DeadLetterFilter,
    DeadLetterSummary,
    FleetStats,
    NewMessage,
    QueueStats,
    ReplayResult,
    StatsSnapshot,
    TableSize,
)
from kombu_akadze.store.session import Session, is_transient, translate
from kombu_akadze.urls import mask_password


class AdminQueries(Session):
    #: The connection listen_start ran LISTEN on, and the wake-ups read on it and not yet returned.
    _listening_on: psycopg.Connection[Any] | None = None
    _woken: list[tuple[str, str]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._woken = []

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
                    cur.execute(sqlfiles.render("lock_timeout_set"), {"timeout": timeout})
                    cur.execute(sqlfiles.render("messages_reindex", schema=self.schema))
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

    def exchanges_unbound(self, *, names: Sequence[str]) -> set[str]:
        return {r["name"] for r in self._run("exchanges_unbound", {"names": list(names)})}

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

    def listen_start(self, *, channel: str) -> int:
        """LISTEN on a consumer's wake-up channel on this session (connecting if needed); returns the socket
        fd. The session may run other statements (the heartbeat's): wake-ups read meanwhile are kept for
        listen_notifies."""
        query = sqlfiles.render("listen_start", channel=channel)
        with self._lock:
            conn = self.connection()
            if conn is not self._listening_on:
                conn.add_notify_handler(self._keep_notify)
            try:
                conn.execute(query)
            except psycopg.Error as exc:
                self._drop()
                raise translate(exc, "listen_start", self.schema) from exc
            self._listening_on = conn
            return conn.fileno()

    @property
    def listening(self) -> bool:
        """Whether this session's current connection runs the LISTEN of listen_start (a reconnect ends it)."""
        conn = self._listening_on
        return conn is not None and conn is self._conn and self.connected

    def _keep_notify(self, note: psycopg.Notify) -> None:
        self._woken.append((note.channel, note.payload))

    def listen_stop(self, *, channel: str) -> None:
        """UNLISTEN one channel on this session (a consumer of the host's relay went)."""
        query = sqlfiles.render("listen_stop", channel=channel)
        with self._lock:
            conn = self._conn
            if conn is None or not self.listening:
                raise TransientDatabaseError("listen_stop: the LISTEN session is not open")
            try:
                conn.execute(query)
            except psycopg.Error as exc:
                self._drop()
                raise translate(exc, "listen_stop", self.schema) from exc

    def listen_notifies(self) -> list[str]:
        """The payloads of listen_received's notifications (a queue name, or a handoff)."""
        return [payload for _channel, payload in self.listen_received()]

    def listen_received(self) -> list[tuple[str, str]]:
        """Read what arrived on the socket without blocking; (channel, payload) of each wake-up, with
        those read while other statements ran on this session."""
        with self._lock:
            conn = self._conn
            if conn is None or not self.listening:
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
            while (note := pgconn.notifies()) is not None:
                self._woken.append((note.relname.decode("utf-8", "replace"), note.extra.decode("utf-8", "replace")))
            received, self._woken = self._woken, []
            return received

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
                retried=int(r["retried"]),
            )
            for r in rows
            if r["queue"] is not None
        )
        return StatsSnapshot(rows[0]["taken_at"], int(rows[0]["consumers_alive"]), queues)

    def fleet_stats(self, *, ttl: float, now: datetime | None = None) -> FleetStats:
        """PostgreSQL's insert/delete counts of messages and dead_letters, and the maintenance leader."""
        row = self._run("fleet_stats", {"schema": self.schema, "ttl": float(ttl), "now": now})[0]
        return FleetStats(**row)

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
        params = {**where.params(), "limit": limit, "now": now}
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
        # durable: the caller's transaction decides how it commits, whatever the message's delivery mode
        params = {**self._message_params(message), "queue": message.queue, "now": now, "durable": True}
        rows = self._run_on(conn, "message_insert", params)
        return int(rows[0]["id"]) if rows[0]["id"] is not None else None

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
        params = {**self._message_params(message), "exchange": exchange, "routing_key": routing_key, "now": now,
                  "durable": True}  # fmt: skip
        rows = self._run_on(conn, "message_route", params)
        return [r["queue"] for r in rows if r["id"] is not None], len(rows)

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
        query = sqlfiles.render(name, schema=self.schema)
        params = {k: Jsonb(v.obj, dumps=kombu_json.dumps) if isinstance(v, Jsonb) else v for k, v in params.items()}
        try:
            with conn.cursor(row_factory=dict_row) as cur:
                cur.execute(query, params)
                return cur.fetchall() if cur.description else []
        except psycopg.Error as exc:
            raise translate(exc, name, self.schema) from exc
