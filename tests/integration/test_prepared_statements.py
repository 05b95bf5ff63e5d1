"""prepared_statements=False: nothing is prepared server-side (PgBouncer transaction pooling before 1.21)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kombu_akadze import sqlfiles

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


def test_the_claim_keeps_one_plan_instead_of_planning_every_run(make_connection: Any) -> None:
    """Under plan_cache_mode=auto PostgreSQL re-planned the prepared ack+claim statement on every run
    (0 generic, every run custom); the command session now runs its generic plan each time."""
    conn = make_connection()
    queue = conn.SimpleQueue("plans")
    for i in range(20):
        queue.put({"n": i})
    for i in range(20):  # one claim per message: basic_get
        message = conn.default_channel.basic_get("plans", no_ack=False)
        assert message is not None
        assert message.payload == {"n": i}
        message.ack()
    queue.close()
    store = conn.default_channel.connection.store
    claim_text = sqlfiles.blocks("queries.sql")["message_ack_claim"]
    with store.connection().cursor() as cur:
        cur.execute(SQL["prepared_plans"], {"prefix": claim_text[:40]}, prepare=False)
        row = cur.fetchone()
    assert row is not None
    generic, custom = int(row[0]), int(row[1])
    assert custom == 0, f"ack+claim plans: {generic} generic, {custom} custom"
    assert generic >= 10, f"ack+claim plans: {generic} generic, {custom} custom"
