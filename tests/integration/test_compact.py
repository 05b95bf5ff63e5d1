"""Compaction against real PostgreSQL: a drained backlog's indexes shrink back; rows are never touched."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from kombu_akadze.integrations.testing import fresh_schema, store_for
from kombu_akadze.lease import compact
from kombu_akadze.lease.compact import Compactor
from kombu_akadze.lease.heartbeat import Heartbeat
from kombu_akadze.store import NewMessage, Store, sqlfiles

SQL = sqlfiles.parse_blocks(Path(__file__).with_name("inspect.sql").read_text())
OWNER = "compact-test"
ROWS = 20_000
#: Far below the production threshold (16 MB), so a backlog of 20,000 rows is "bloated".
SMALL = 256 * 1024


@pytest.fixture
def store(pg_url: str) -> Iterator[Store]:
    """A store on a database of its own: VACUUM empties a drained heap only when no session of the
    database may still see its dead rows, and other tests (or other runs on the same server) keep
    sessions in the shared one."""
    name = sqlfiles.quote_ident(f"akadze_compact_{uuid.uuid4().hex[:10]}")
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(SQL["database_create"].replace("{database}", name))
    url = make_conninfo(pg_url, dbname=name.strip('"'))
    try:
        with fresh_schema(url) as schema:
            made = store_for(url, schema)
            yield made
            made.close()
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(SQL["database_drop"].replace("{database}", name))


def _sql(store: Store, name: str) -> str:
    return SQL[name].replace("{schema}", sqlfiles.quote_ident(store.schema))


def _count(store: Store) -> int:
    with psycopg.connect(store.dsn, autocommit=True) as conn:
        row = conn.execute(_sql(store, "messages_count")).fetchone()
        assert row is not None
        return int(row[0])


def _vacuum(store: Store) -> None:
    with psycopg.connect(store.dsn, autocommit=True) as conn:
        conn.execute(_sql(store, "vacuum_messages"))


def _backlog_then_drain(store: Store, keep: int = 0) -> None:
    """*keep* messages in queue k, then ROWS in queue q, all of q claimed and acked, then VACUUM: the heap
    shrinks (the kept rows sit in its first page), the indexes do not."""
    store.message_insert_many([NewMessage(queue="k", body=b"kept") for _ in range(keep)])
    store.message_insert_many([NewMessage(queue="q", body=b"x" * 100) for _ in range(ROWS)])
    store.consumer_heartbeat(consumer_id=OWNER, hostname="h", pid=1)
    while batch := store.message_claim(queues=["q"], limits=[5_000], owner=OWNER):
        store.message_ack([m.tag for m in batch], owner=OWNER)
    _vacuum(store)


def test_a_drained_backlogs_indexes_shrink_and_the_kept_rows_stay_claimable(store: Store) -> None:
    empty = store.messages_size()
    _backlog_then_drain(store, keep=3)
    bloated = store.messages_size()
    assert bloated.index_bytes > 8 * empty.index_bytes, (empty, bloated)

    result = compact.run_once(store, min_index=SMALL)

    assert result.compacted, result.skipped
    assert result.after.index_bytes <= 2 * empty.index_bytes + 3 * 8192, (empty, result.after)
    # The three rows left are still there and still found through the rebuilt claim index.
    assert _count(store) == 3
    claimed = store.message_claim(queues=["k"], limits=[10], owner=OWNER)
    assert len(claimed) == 3
    after = result.after.index_bytes
    print(f"indexes: empty {empty.index_bytes} B, drained {bloated.index_bytes} B, compacted {after} B")


def test_small_or_healthy_indexes_and_a_big_heap_are_left_alone(store: Store) -> None:
    reason = compact.run_once(store).skipped
    assert "below 16.0 MB" in reason  # an empty schema: nothing to give back

    store.message_insert_many([NewMessage(queue="q", body=b"x" * 2_000) for _ in range(2_000)])
    big_heap = compact.run_once(store, max_heap=64 * 1024, min_index=0)
    assert not big_heap.compacted
    assert "heap is" in big_heap.skipped  # REINDEX would hold its lock while it reads that heap
    healthy = compact.run_once(store, min_index=0)
    assert not healthy.compacted
    assert "under 4x the heap" in healthy.skipped  # live rows, indexes in proportion
    assert _count(store) == 2_000


def test_a_busy_table_makes_the_reindex_give_up_after_its_lock_timeout_and_lose_nothing(store: Store) -> None:
    _backlog_then_drain(store, keep=2)
    before = store.messages_size()
    with psycopg.connect(store.dsn) as writer:  # a transaction in flight, as a claim or publish holds
        writer.execute(_sql(store, "lock_messages_as_writer"))
        busy = compact.run_once(store, min_index=SMALL, lock_timeout=0.2)
        assert not busy.compacted
        assert "busy" in busy.skipped
        assert store.messages_size() == before
        writer.rollback()
    assert _count(store) == 2
    assert compact.run_once(store, min_index=SMALL).compacted  # the next check does it


def test_force_rebuilds_whatever_the_bloat_while_the_heap_is_small(store: Store) -> None:
    store.message_insert_many([NewMessage(queue="q", body=b"y") for _ in range(10)])
    assert not compact.run_once(store).compacted
    forced = compact.run_once(store, force=True)
    assert forced.compacted
    assert _count(store) == 10


def test_the_heartbeat_thread_runs_the_check_every_interval(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    _backlog_then_drain(store)
    bloated = store.messages_size()
    beat_store = Store(store.dsn, schema=store.schema, role="heartbeat")
    compactor = Compactor(beat_store, interval=0.2, min_index=SMALL)
    heartbeat = Heartbeat(
        store=beat_store,
        consumer_id="compact-beat",
        hostname="h",
        pid=1,
        interval=0.1,
        ttl=5.0,
        rescue_interval=1.0,
        max_attempts=5,
        compactor=compactor,
    )
    caplog.set_level(logging.INFO, logger="kombu_akadze")
    heartbeat.start()
    try:
        assert heartbeat.wait_for(lambda _: compactor.runs >= 2, timeout=30.0)
    finally:
        heartbeat.stop()
    assert compactor.last is not None
    after = store.messages_size()
    assert after.index_bytes < bloated.index_bytes / 4, (bloated, after)
    assert any("compaction: messages indexes" in r.getMessage() for r in caplog.records)
