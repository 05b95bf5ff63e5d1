"""prepared_statements=False: nothing is prepared server-side (PgBouncer transaction pooling before 1.21)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kombu_akadze.store import sqlfiles

SQL = sqlfiles.parse_blocks(Path(__file__).with_name("inspect.sql").read_text())


def _round_trip(conn: Any, queue: str, n: int) -> list[int]:
    q = conn.SimpleQueue(queue)
    for i in range(n):
        q.put({"n": i})
    got = []
    for _ in range(n):
        message = q.get(timeout=10)
        got.append(message.payload["n"])
        message.ack()
    q.close()
    return got


def _prepared_in_session(conn: Any) -> int:
    store = conn.default_channel.connection.store  # the transport's command session
    with store.connection().cursor() as cur:
        cur.execute(SQL["prepared_count"], prepare=False)
        row = cur.fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize(("enabled", "expect_prepared"), [(False, False), (True, True)])
def test_prepared_statements_option_decides_whether_the_session_prepares(
    make_connection: Any, enabled: bool, expect_prepared: bool
) -> None:
    conn = make_connection(prepared_statements=enabled)
    assert _round_trip(conn, "prep", 12) == list(range(12))  # psycopg prepares after 5 runs of a query
    prepared = _prepared_in_session(conn)
    assert (prepared > 0) is expect_prepared, f"{prepared} prepared statements with prepared_statements={enabled}"


def test_prepared_statements_accepts_the_usual_words_for_off(make_connection: Any) -> None:
    conn = make_connection(prepared_statements="off")
    assert _round_trip(conn, "prep-words", 8) == list(range(8))
    assert _prepared_in_session(conn) == 0
