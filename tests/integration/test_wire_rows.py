"""store.wire.rows_of: a binary result read without psycopg's loaders reads as psycopg's loaders read it, and a
result it has no reader for goes through those loaders. Real PostgreSQL, both ways on the same result."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import pq
from psycopg.adapt import Transformer

from kombu_akadze.store import kombu_json_setup, wire

#: One column of every type the reader reads itself, with the values that break a careless decoder.
READ_HERE = """
SELECT v.b::bool AS b, v.raw::bytea AS raw, v.i2::int2 AS i2, v.i4::int4 AS i4, v.i8::int8 AS i8,
       v.t::text AS t, v.vc::varchar AS vc, v.doc::jsonb AS doc
FROM (VALUES
    (true, '\\x00ff'::bytea, -32768, -2147483648, -9223372036854775808, 'caf\u00e9 "q" \\', 'x',
     '{"eta": {"__type__": "datetime", "__value__": "2026-01-02T03:04:05+00:00"}, "n": [1, null]}'),
    (false, ''::bytea, 32767, 2147483647, 9223372036854775807, '', '', '{}'),
    (NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)
) AS v(b, raw, i2, i4, i8, t, vc, doc)
"""


@pytest.fixture
def conn(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_url, autocommit=True) as c:
        kombu_json_setup(c)  # as every session of the transport
        yield c


def binary_result(conn: psycopg.Connection[Any], query: str) -> pq.abc.PGresult:
    """*query*'s result in binary format, sent as the event loop sends its claim (in the client encoding)."""
    wire.send(conn, query.encode(conn.info.encoding), [], [], prepared=None, result_format=wire.BINARY, timeout=10.0)
    results = wire.read_all(conn)
    assert len(results) == 1
    return results[0]


def through_loaders(conn: psycopg.Connection[Any], result: pq.abc.PGresult) -> list[dict[str, Any]]:
    loader = Transformer(conn)
    loader.set_pgresult(result)
    names = [(result.fname(i) or b"").decode() for i in range(result.nfields)]
    return [dict(zip(names, row, strict=True)) for row in loader.load_rows(0, result.ntuples, tuple)]


def test_each_type_read_here_reads_as_psycopg_reads_it(conn: psycopg.Connection[Any]) -> None:
    result = binary_result(conn, READ_HERE)
    rows = wire.rows_of(result, conn)
    assert rows == through_loaders(conn, result)
    assert rows[0]["doc"]["eta"].year == 2026  # kombu's typed JSON comes back typed
    assert [row["raw"] for row in rows] == [b"\x00\xff", b"", None]
    assert [row["i8"] for row in rows] == [-(2**63), 2**63 - 1, None]
    assert [type(v) for v in rows[0].values()] == [bool, bytes, int, int, int, str, str, dict]


def test_a_result_with_another_type_goes_through_psycopgs_loaders(conn: psycopg.Connection[Any]) -> None:
    result = binary_result(conn, "SELECT 1::int8 AS id, now() AS at, 1.10::numeric AS price, 'x'::text AS t")
    rows = wire.rows_of(result, conn)
    assert rows == through_loaders(conn, result)
    assert str(rows[0]["price"]) == "1.10"


def test_two_results_of_the_same_types_keep_their_own_column_names(conn: psycopg.Connection[Any]) -> None:
    first = wire.rows_of(binary_result(conn, "SELECT 1::int8 AS id, 'a'::text AS queue"), conn)
    second = wire.rows_of(binary_result(conn, "SELECT 2::int8 AS n, 'b'::text AS name"), conn)
    assert first == [{"id": 1, "queue": "a"}]
    assert second == [{"n": 2, "name": "b"}]


def test_text_in_another_client_encoding_is_decoded_in_it(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SET client_encoding = 'LATIN1'")
    result = binary_result(conn, "SELECT 'caf\u00e9'::text AS t, 3::int4 AS n")
    assert result.get_value(0, 0) == "caf\u00e9".encode("latin-1")
    assert wire.rows_of(result, conn) == [{"t": "caf\u00e9", "n": 3}] == through_loaders(conn, result)
