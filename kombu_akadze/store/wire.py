"""The per-message statements (publish, the event loop's ack+claim) sent through libpq directly.

psycopg's cursor adapts every parameter through its dumper registry and drives each statement through
its generator protocol: ~70 us of client CPU a publish on top of the ~60 us libpq and the socket take
(measured on one session, 5,000 publishes of ~1 KB). Here the parameters are written in PostgreSQL's
text format (bytes as binary), each statement is prepared once per connection under its own name, and
the result is read from libpq as it arrives; waits go through poll(2), so a signal still interrupts
them as it does psycopg's."""

from __future__ import annotations

import functools
import json as stdlib_json
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

import psycopg
from kombu.utils import json as kombu_json
from psycopg import errors as pg_errors
from psycopg import pq
from psycopg.adapt import Transformer
from psycopg.types.json import Jsonb

from kombu_akadze import polling

_PLACEHOLDER = re.compile(r"%\((\w+)\)s")
#: libpq's parameter and result formats.
TEXT = 0
BINARY = 1


@functools.cache
def positional(query: str) -> tuple[bytes, tuple[str, ...]]:
    """A named block with %(name)s placeholders as libpq wants it: $1.. in first-use order, and the names."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    return _PLACEHOLDER.sub(number, query).replace("%%", "%").encode("utf-8"), tuple(names)


def text(value: Any) -> bytes | None:
    """One parameter in PostgreSQL's text format, as the statement's casts or target columns read it:
    boolean, integer, float8, text, timestamptz, bigint[] / integer[] / text[], and jsonb (psycopg's Jsonb
    wrapper, in kombu's JSON so datetimes, UUIDs and decimals round-trip). psycopg's dumpers look up an
    adapter per value, and per array element: ~19 us a claim against ~3 here."""
    if value is None:
        return None
    write = _BY_TYPE.get(type(value))
    if write is not None:
        return write(value)
    for kind, write in _WRITERS:  # bool before int: True is an int too
        if isinstance(value, kind):
            return write(value)
    raise TypeError(f"no text form for a statement parameter of type {type(value).__name__}")


def _array(items: list[Any]) -> bytes:
    if all(type(v) is int for v in items):
        return ("{" + ",".join(map(str, items)) + "}").encode()
    if all(isinstance(v, str) for v in items):
        return ("{" + ",".join(_array_element(v) for v in items) + "}").encode()
    raise TypeError("no text form for an array parameter that is not all int or all str")


_WRITERS: tuple[tuple[type, Callable[[Any], bytes]], ...] = (
    (bool, lambda v: b"t" if v else b"f"),
    (int, lambda v: str(v).encode()),
    (float, lambda v: repr(v).encode()),
    (str, lambda v: v.encode()),
    (Jsonb, lambda v: kombu_json.dumps(v.obj).encode()),  # type: ignore[no-untyped-call]
    (datetime, lambda v: v.isoformat().encode()),
    (list, _array),
)
#: The same writers by exact type, looked up first (a subclass goes through _WRITERS).
_BY_TYPE: dict[type, Callable[[Any], bytes]] = dict(_WRITERS)


def _array_element(item: str) -> str:
    """A text[] element quoted for an array literal: any queue name reads back as itself."""
    return '"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"'


def parameters(params: dict[str, Any], names: tuple[str, ...]) -> tuple[list[bytes | None], list[int]]:
    """The values of *names* for libpq and their formats: bytes (a message body) go as binary, as they
    are; everything else as text()."""
    values: list[bytes | None] = []
    formats: list[int] = []
    for name in names:
        value = params[name]
        if isinstance(value, bytes | bytearray | memoryview):
            values.append(bytes(value))
            formats.append(BINARY)
        else:
            values.append(text(value))
            formats.append(TEXT)
    return values, formats


def lost_prepared(results: list[pq.abc.PGresult]) -> bool:
    """Whether the statement failed because its prepared statement is gone from the session (26000)."""
    return any(
        r.status == pq.ExecStatus.FATAL_ERROR and r.error_field(pq.DiagnosticField.SQLSTATE) == b"26000"
        for r in results
    )


def check(result: pq.abc.PGresult, conn: psycopg.Connection[Any]) -> pq.abc.PGresult:
    """*result*, or its error raised as psycopg raises it (so the session translates it as any other)."""
    if result.status == pq.ExecStatus.FATAL_ERROR:
        raise pg_errors.error_from_result(result, encoding=conn.info.encoding)
    return result


def rows_of(result: pq.abc.PGresult, conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    """A result's rows as dicts. Binary columns of the types the ack+claim returns are read here, as
    psycopg's binary loaders read them; a result with any other column, or text in another client encoding
    than UTF8, is read through those loaders. A claim of one Celery task, read between two claims: 55
    against 64 us of CPU with the caches as a worker's loop leaves them, 35 against 45 right after another
    read; about half of it is the two JSON documents."""
    check(result, conn)
    if result.status != pq.ExecStatus.TUPLES_OK:
        return []
    nfields = result.nfields
    shape = tuple((result.fname(i), result.ftype(i) if result.fformat(i) == BINARY else -1) for i in range(nfields))
    columns = _COLUMNS.get(shape)
    if columns is None:
        columns = _columns(shape)
        if columns is not None:
            _COLUMNS[shape] = columns
    if columns is None or conn.pgconn.parameter_status(b"client_encoding") != b"UTF8":
        return _loaded_rows(result, conn)
    value = result.get_value
    rows = []
    for row in range(result.ntuples):
        values = {}
        for column, (name, read) in enumerate(columns):
            raw = value(row, column)
            values[name] = None if raw is None else read(raw)
        rows.append(values)
    return rows


def json_loads(data: bytes | bytearray | memoryview | str) -> Any:
    """kombu's JSON decoding, without its per-object hook for a document that has no typed value in
    it: a claimed message's headers and properties are two documents (jsonb prints every key as is,
    so a typed value always shows its "__type__" key)."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    if _KOMBU_TYPED in raw:
        return kombu_json.loads(raw)  # type: ignore[no-untyped-call]
    return stdlib_json.loads(raw)


#: What kombu's JSON encoder writes for a value plain JSON lacks (a datetime, UUID, Decimal...).
_KOMBU_TYPED = b'"__type__"'


def _integer(raw: bytes) -> int:
    return int.from_bytes(raw, "big", signed=True)


def _jsonb(raw: bytes) -> Any:
    if raw[:1] != b"\x01":
        raise psycopg.DataError(f"unknown jsonb binary format: {raw[:1]!r}")
    return json_loads(raw[1:])


#: Binary readers by type OID: bool, bytea, int8, int2, int4, text, varchar (a UTF8 client encoding:
#: see rows_of), jsonb.
_READERS: dict[int, Callable[[bytes], Any]] = {
    16: lambda raw: raw != b"\x00",
    17: bytes,
    20: _integer,
    21: _integer,
    23: _integer,
    25: bytes.decode,
    1043: bytes.decode,
    3802: _jsonb,
}

#: Column names and readers by result shape: each column's name and type OID (-1 when in text format).
_COLUMNS: dict[tuple[tuple[bytes | None, int], ...], list[tuple[str, Callable[[bytes], Any]]]] = {}


def _columns(shape: tuple[tuple[bytes | None, int], ...]) -> list[tuple[str, Callable[[bytes], Any]]] | None:
    """The names and readers of a result's columns; None when some column has no reader here."""
    if any(oid not in _READERS for _, oid in shape):
        return None
    return [((name or b"").decode(), _READERS[oid]) for name, oid in shape]


def _loaded_rows(result: pq.abc.PGresult, conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    loader = Transformer(conn)
    loader.set_pgresult(result)
    names = [(result.fname(i) or b"").decode() for i in range(result.nfields)]
    return [dict(zip(names, values, strict=True)) for values in loader.load_rows(0, result.ntuples, tuple)]


def text_rows(result: pq.abc.PGresult, conn: psycopg.Connection[Any]) -> list[tuple[bytes | None, ...]]:
    """A text-format result's rows as the raw values (None for NULL), for a caller that parses its few
    columns itself."""
    check(result, conn)
    if result.status != pq.ExecStatus.TUPLES_OK:
        return []
    columns = range(result.nfields)
    return [tuple(result.get_value(row, col) for col in columns) for row in range(result.ntuples)]


def integer(value: bytes | None) -> int:
    """A text-format integer column that is never NULL."""
    if value is None:
        raise ValueError("expected an integer, the statement returned NULL")
    return int(value)


def string(value: bytes | None) -> str:
    """A text-format text column that is never NULL (the session's encoding is UTF8)."""
    if value is None:
        raise ValueError("expected text, the statement returned NULL")
    return value.decode()


class Prepared:
    """Which statements are prepared on which connection: each is prepared once per connection (one
    round trip, the first time) under its own name; a new connection starts with none."""

    def __init__(self) -> None:
        self._conn: psycopg.Connection[Any] | None = None
        self._names: set[bytes] = set()

    def forget(self) -> None:
        self._conn = None
        self._names = set()

    def name(self, conn: psycopg.Connection[Any], statement: str, query: bytes) -> bytes:
        """The server-side name of *statement* on *conn*, preparing it there first if needed."""
        if self._conn is not conn:
            self._conn, self._names = conn, set()
        name = f"akadze_{statement}".encode()
        if name not in self._names:
            result = check(conn.pgconn.prepare(name, query), conn)
            if result.status != pq.ExecStatus.COMMAND_OK:
                raise psycopg.OperationalError(f"preparing {statement}: status {result.status}")
            self._names.add(name)
        return name


def send(
    conn: psycopg.Connection[Any],
    query: bytes,
    values: list[bytes | None],
    formats: list[int],
    *,
    prepared: bytes | None,
    result_format: int,
    timeout: float,
) -> None:
    """Send one statement (the prepared one named *prepared*, or *query* unnamed) without reading its
    result; *timeout*: seconds a full socket may block the send."""
    pgconn = conn.pgconn
    if prepared is not None:
        pgconn.send_query_prepared(prepared, values, formats, result_format)
    else:
        pgconn.send_query_params(query, values, None, formats, result_format)
    while pgconn.flush():  # non-blocking mode: 1 while part of the statement is still unsent
        polling.writable(pgconn.socket, timeout)


def read_all(conn: psycopg.Connection[Any]) -> list[pq.abc.PGresult]:
    """Wait for the statement sent last and return its results (a statement's error is in them)."""
    pgconn = conn.pgconn
    results: list[pq.abc.PGresult] = []
    while True:
        polling.readable([pgconn.socket], None)
        pgconn.consume_input()
        while not pgconn.is_busy():
            result = pgconn.get_result()
            if result is None:
                return results
            results.append(result)
