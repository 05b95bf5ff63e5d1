"""message_ack_claim for Celery's event loop: sent in libpq's non-blocking mode, read as its result arrives."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import pq

from kombu_akadze import polling
from kombu_akadze.errors import DatabaseError
from kombu_akadze.store import sqlfiles, wire
from kombu_akadze.store.records import AckClaim, Tag, ack_claim_outcome, ack_claim_params
from kombu_akadze.store.session import Session, is_transient, translate


@dataclass
class InFlight:
    conn: psycopg.Connection[Any]
    results: list[pq.abc.PGresult] = field(default_factory=list)


class LoopClaims(Session):
    """message_ack_claim as Celery's event loop runs it, never blocking the loop: sent in libpq's
    non-blocking mode, its socket watched by the loop, its result read as it arrives (a thread running
    the blocking call would cost the worker GIL hand-offs at every claim). While one is in flight, any
    other statement on the session first waits for it and keeps its outcome for
    message_ack_claim_read(). This part owns that state; the session only calls its hooks."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: The statement message_ack_claim_start() sent and whose result has not been read yet.
        self._in_flight: InFlight | None = None
        #: Its outcome, when another statement on this session had to read it first: (ok, value).
        self._landed: tuple[bool, Any] | None = None
        #: Called (on whichever thread) before that happens: the event loop stops watching the socket
        #: (the wait may close and reopen the session) and collects the outcome on its next tick.
        self.on_claim_landing: Callable[[], None] | None = None

    def _settle(self) -> None:
        if self._in_flight is not None:
            self._land_in_flight()

    def _busy(self) -> bool:
        return self._in_flight is not None or self._landed is not None

    def _reset(self, *, forget: bool) -> None:
        self._in_flight = None
        if forget:
            self._landed = None

    def message_ack_claim_start(
        self,
        *,
        acks: Iterable[Tag],
        queues: Sequence[str],
        limits: Sequence[int],
        owner: str,
        park: str | None = None,
    ) -> int:
        """Send message_ack_claim without waiting; returns the socket to watch for its result."""
        params = ack_claim_params(acks, queues, limits, owner, None, durable=self.durable_acks, park=park)
        with self._lock:
            if self._in_flight is not None or self._landed is not None:
                raise RuntimeError("message_ack_claim is already in flight on this session")
            conn = self.connection()
            query, names = wire.positional(sqlfiles.render("message_ack_claim", schema=self.schema))
            try:
                values, formats = wire.parameters(params, names)
                prepared = self._prepared_name(conn, "ack_claim", query)
                timeout = self.connect_timeout
                wire.send(conn, query, values, formats, prepared=prepared, result_format=wire.BINARY, timeout=timeout)
            except psycopg.Error as exc:
                self._drop()
                raise translate(exc, "message_ack_claim", self.schema) from exc
            self._in_flight = InFlight(conn)
            return conn.pgconn.socket

    def message_ack_claim_read(self) -> AckClaim | None:
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
                rows = [row for result in flight.results for row in wire.rows_of(result, flight.conn)]
            except psycopg.Error as exc:
                if flight.conn.pgconn.status != pq.ConnStatus.OK or is_transient(exc):
                    self._drop()
                self._in_flight = None
                raise translate(exc, "message_ack_claim", self.schema) from exc
            return ack_claim_outcome(rows)

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

    def message_ack_claim_wait(self, timeout: float | None) -> AckClaim | None:
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
            polling.readable([flight.conn.pgconn.socket], left)

    def claim_landed(self) -> bool:
        """Another statement already read the outcome of the one in flight (message_ack_claim_read()
        returns it without touching the socket)."""
        return self._landed is not None

    def fileno_in_flight(self) -> int | None:
        """The socket of the statement in flight, if any."""
        flight = self._in_flight
        return None if flight is None else flight.conn.pgconn.socket
