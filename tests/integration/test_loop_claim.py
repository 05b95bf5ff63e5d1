"""The event loop's ack+claim statement sent without waiting (Store.message_ack_claim_start/read/wait), real PG."""

from __future__ import annotations

import select
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest

from kombu_akadze.errors import TransientDatabaseError
from kombu_akadze.store import NewMessage, Store, sqlfiles
from tests.conftest import abandon_a_transaction

SQL = sqlfiles.parse_blocks(Path(__file__).with_name("inspect.sql").read_text())
OWNER = "loop-consumer"


@pytest.fixture(params=[True, False], ids=["prepared", "unprepared"])
def loop_store(request: pytest.FixtureRequest, pg_url: str, schema: str) -> Iterator[Store]:
    s = Store(pg_url, schema=schema, role="loopclaim", prepared_statements=request.param)
    s.consumer_heartbeat(consumer_id=OWNER, hostname="h", pid=1)
    yield s
    s.close()


def _claim_bodies(store: Store, queue: str = "q") -> list[bytes]:
    """One message_ack_claim of up to one message of *queue*, sent and waited for: the bodies it claimed."""
    store.message_ack_claim_start(acks=[], queues=[queue], limits=[1], owner=OWNER)
    outcome = store.message_ack_claim_wait(30)
    assert outcome is not None
    return [m.body for m in outcome[0]]


def _locked(pg_url: str, schema: str, store: Store) -> psycopg.Connection:
    """A session holding an ACCESS EXCLUSIVE lock on the messages table until it commits (after one
    claim on *store*, which prepares the statement: PREPARE itself would wait for the lock)."""
    store.message_ack_claim_start(acks=[], queues=["warm-up"], limits=[1], owner=OWNER)
    assert store.message_ack_claim_wait(30) == ([], set(), frozenset())
    conn = psycopg.connect(pg_url)
    conn.execute(SQL["lock_messages_exclusive"].replace("{schema}", sqlfiles.quote_ident(schema)))
    return conn


def test_a_sent_claim_gives_what_the_blocking_claim_gives(loop_store: Store, store: Store) -> None:
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    for i in range(5):
        store.message_insert(NewMessage(queue="q", body=bytes([0, 255, i]), headers={"i": i, "eta": when}))
    loop_store.message_ack_claim_start(acks=[], queues=["q"], limits=[3], owner=OWNER)
    outcome = loop_store.message_ack_claim_wait(30)
    assert outcome is not None
    claimed, acked, _ = outcome
    assert acked == set()
    assert [m.body for m in claimed] == [bytes([0, 255, i]) for i in range(3)]
    assert [m.headers for m in claimed] == [{"i": i, "eta": when} for i in range(3)]
    assert {m.run_count for m in claimed} == {1}
    loop_store.message_ack_claim_start(acks=[m.tag for m in claimed], queues=["q"], limits=[5], owner=OWNER)
    outcome = loop_store.message_ack_claim_wait(30)
    assert outcome is not None
    rest, acked, _ = outcome
    assert acked == {m.id for m in claimed}
    assert [m.body for m in rest] == [bytes([0, 255, i]) for i in (3, 4)]
    assert store.message_counts() == {("q", "held"): 2}


def test_the_outcome_is_read_only_once_it_has_arrived(
    loop_store: Store, store: Store, pg_url: str, schema: str
) -> None:
    store.message_insert(NewMessage(queue="q", body=b"x"))
    blocker = _locked(pg_url, schema, loop_store)
    try:
        fd = loop_store.message_ack_claim_start(acks=[], queues=["q"], limits=[1], owner=OWNER)
        assert loop_store.message_ack_claim_read() is None  # the claim waits on the lock
        assert loop_store.message_ack_claim_wait(0.2) is None
        assert loop_store.fileno_in_flight() == fd
    finally:
        blocker.commit()
        blocker.close()
    readable, _, _ = select.select([fd], [], [], 30)
    assert readable, "the claim's socket never became readable once the lock was gone"
    outcome = loop_store.message_ack_claim_wait(30)
    assert outcome is not None
    assert [m.body for m in outcome[0]] == [b"x"]
    assert loop_store.fileno_in_flight() is None


def test_another_statement_on_the_session_first_lands_the_claim_and_keeps_its_outcome(
    loop_store: Store, store: Store
) -> None:
    store.message_insert(NewMessage(queue="q", body=b"y"))
    landings: list[bool] = []
    loop_store.on_claim_landing = lambda: landings.append(True)
    loop_store.message_ack_claim_start(acks=[], queues=["q"], limits=[1], owner=OWNER)
    assert loop_store.queue_size(name="q") == 0  # runs after the claim, on the same session
    assert landings == [True]
    assert loop_store.claim_landed()
    outcome = loop_store.message_ack_claim_read()
    assert outcome is not None
    assert [m.body for m in outcome[0]] == [b"y"]
    with pytest.raises(RuntimeError, match="no message_ack_claim in flight"):
        loop_store.message_ack_claim_read()


def test_a_second_claim_before_the_first_is_read_is_refused(loop_store: Store) -> None:
    loop_store.message_ack_claim_start(acks=[], queues=["q"], limits=[1], owner=OWNER)
    with pytest.raises(RuntimeError, match="already in flight"):
        loop_store.message_ack_claim_start(acks=[], queues=["q"], limits=[1], owner=OWNER)
    assert loop_store.message_ack_claim_wait(30) == ([], set(), frozenset())


def test_a_session_ended_mid_claim_is_a_transient_error_and_the_next_claim_reconnects(
    loop_store: Store, store: Store, pg_url: str, schema: str
) -> None:
    """Injected: the claim session's backend terminated while its claim waits on a lock. 1 message in,
    the failed claim took nothing (its transaction died with the session), the retry claims it: 0 lost."""
    store.message_insert(NewMessage(queue="q", body=b"z"))
    blocker = _locked(pg_url, schema, loop_store)
    try:
        loop_store.message_ack_claim_start(acks=[], queues=["q"], limits=[1], owner=OWNER)
        with psycopg.connect(pg_url, autocommit=True) as admin:
            ended = admin.execute(SQL["terminate_sessions"], {"name": "akadze-loopclaim"}).fetchone()
        assert ended is not None
        assert ended[0] == 1
        with pytest.raises(TransientDatabaseError, match="message_ack_claim"):
            loop_store.message_ack_claim_wait(30)
    finally:
        blocker.commit()
        blocker.close()
    assert store.message_counts() == {("q", "ready"): 1}
    assert _claim_bodies(loop_store) == [b"z"]


def test_the_loop_claim_is_prepared_once_per_connection_and_keeps_its_generic_plan(
    loop_store: Store, store: Store, pg_url: str
) -> None:
    """Prepared: the server parses and plans the statement once, then runs its generic plan (an unnamed
    statement was planned at every claim, 0.15 ms of 0.7); again after a reconnect. Unprepared (PgBouncer
    transaction pooling): nothing is left prepared on the server."""
    for round_ in range(2):
        for i in range(8):
            store.message_insert(NewMessage(queue="q", body=b"%d" % i))
        tags: list[tuple[int, int]] = []
        for _ in range(8):
            loop_store.message_ack_claim_start(acks=tags, queues=["q"], limits=[1], owner=OWNER)
            outcome = loop_store.message_ack_claim_wait(30)
            assert outcome is not None
            tags = [m.tag for m in outcome[0]]
            assert len(tags) == 1
        loop_store.message_ack_claim_start(acks=tags, queues=["q"], limits=[1], owner=OWNER)
        assert loop_store.message_ack_claim_wait(30) == ([], {tags[0][0]}, frozenset())
        plans = loop_store.connection().execute(SQL["loop_claim_plans"]).fetchall()
        if loop_store.prepared_statements:
            assert len(plans) == 1
            generic, custom = plans[0]
            assert custom <= 5, f"{round_=}: {custom} custom plans"
            assert generic >= 9 - 5, f"{round_=}: {generic} generic plans"
        else:
            assert plans == []
        with psycopg.connect(pg_url, autocommit=True) as admin:  # the next round starts on a new connection
            admin.execute(SQL["terminate_sessions"], {"name": "akadze-loopclaim"})
        with pytest.raises(TransientDatabaseError):
            loop_store.queue_size(name="q")
    assert store.message_counts() == {}


def test_a_prepared_claim_walks_the_indexes_once_a_backlog_arrives(pg_url: str, schema: str, store: Store) -> None:
    """A claim prepared while the queue was near-empty planned, with those statistics, a sort of every
    ready row to pick one and a scan of the whole table to update it: 47 ms per claim once a
    200,000-message backlog arrived (no ANALYZE since). The claim and ack functions (migration 0005)
    are planned with sequential scans, bitmap scans and sorts off: claiming one message behind 200,000
    reads a handful of pages, not the table."""
    s = Store(pg_url, schema=schema, role="planprobe")
    s.consumer_heartbeat(consumer_id=OWNER, hostname="h", pid=1)
    try:
        for _ in range(20):  # psycopg prepares after 5 runs; PostgreSQL weighs a generic plan after 5 more
            store.message_insert(NewMessage(queue="q", body=b"w"))
            claimed, _, _ = s.message_ack_claim(acks=[], queues=["q"], limits=[1], owner=OWNER)
            assert len(claimed) == 1
            s.message_ack([m.tag for m in claimed], owner=OWNER)
        store.message_insert_many([NewMessage(queue="q", body=b"b" * 100)] * 200_000)
        with s.connection().cursor() as cur:
            cur.execute(SQL["prepared_claim"], prepare=False)
            row = cur.fetchone()
            assert row is not None, "psycopg never prepared the claim"
            cur.execute(
                SQL["explain_prepared_claim"].replace("{statement}", sqlfiles.quote_ident(row[0])), prepare=False
            )
            explained = cur.fetchone()
    finally:
        s.close()
    assert explained is not None
    top = explained[0][0]["Plan"]
    pages = top["Shared Hit Blocks"] + top["Shared Read Blocks"] + top["Temp Written Blocks"]
    assert pages < 100, f"claiming one message read {pages} pages: {explained[0]}"


AWKWARD_QUEUES = ["plain", 'with "quotes"', "back\\slash", "comma,brace}{", "space and ünïcode", "NULL", ""]


def test_the_hand_written_parameters_read_back_as_any_queue_name(loop_store: Store, store: Store) -> None:
    """The loop path writes its parameters in PostgreSQL's text format itself (array literals, quoting)
    instead of through psycopg's dumpers: every queue name, the acks' ids and run counts survive."""
    for queue in AWKWARD_QUEUES:
        store.message_insert(NewMessage(queue=queue, body=queue.encode(), headers={"q": queue}))
    loop_store.message_ack_claim_start(
        acks=[], queues=AWKWARD_QUEUES, limits=[1] * len(AWKWARD_QUEUES), owner=OWNER, park="akadze.some-channel"
    )
    outcome = loop_store.message_ack_claim_wait(30)
    assert outcome is not None
    assert sorted(m.queue for m in outcome.claimed) == sorted(AWKWARD_QUEUES)
    assert all(m.body == m.queue.encode() and m.headers == {"q": m.queue} for m in outcome.claimed)
    tags = [m.tag for m in outcome.claimed]
    stale = (tags[0][0], tags[0][1] + 1)  # a run count this consumer does not hold: fenced off
    loop_store.message_ack_claim_start(acks=[stale, *tags[1:]], queues=["plain"], limits=[1], owner=OWNER)
    again = loop_store.message_ack_claim_wait(30)
    assert again is not None
    assert again.acked == {message_id for message_id, _ in tags[1:]}
    assert again.claimed == []
    assert store.message_counts() == {(outcome.claimed[0].queue, "held"): 1}


def test_headers_that_only_look_typed_stay_as_they_were(loop_store: Store, store: Store) -> None:
    """kombu's typed values ({"__type__": ..., "__value__": ...}) decode; anything else that mentions
    "__type__" is left a plain dict or string."""
    headers = {
        "note": "__type__",
        "almost": {"__type__": "datetime"},
        "extra": {"__type__": "x", "__value__": 1, "y": 2},
    }
    store.message_insert(NewMessage(queue="t", body=b"b", headers=headers))
    loop_store.message_ack_claim_start(acks=[], queues=["t"], limits=[1], owner=OWNER)
    outcome = loop_store.message_ack_claim_wait(30)
    assert outcome is not None
    assert [m.headers for m in outcome.claimed] == [headers]


def test_a_claim_whose_statement_was_deallocated_fails_transiently_and_the_next_prepares_it_again(
    loop_store: Store, store: Store
) -> None:
    """Injected: DEALLOCATE ALL on the claim session behind the store's back. 1 message in; the claim that
    found its statement gone ran nothing (prepared: a transient error, the session dropped), the next one
    prepares it again and claims the message: 0 lost."""
    store.message_insert(NewMessage(queue="q", body=b"kept"))
    loop_store.message_ack_claim_start(acks=[], queues=["other"], limits=[1], owner=OWNER)
    assert loop_store.message_ack_claim_wait(30) == ([], set(), frozenset())
    loop_store.connection().execute(SQL["prepared_drop_all"])
    if loop_store.prepared_statements:
        loop_store.message_ack_claim_start(acks=[], queues=["q"], limits=[1], owner=OWNER)
        with pytest.raises(TransientDatabaseError, match="message_ack_claim"):
            loop_store.message_ack_claim_wait(30)
        assert store.message_counts() == {("q", "ready"): 1}
    assert _claim_bodies(loop_store) == [b"kept"]


def test_a_rolled_back_transaction_on_the_claim_session_keeps_the_claim_prepared(
    loop_store: Store, store: Store
) -> None:
    """psycopg ends a rolled-back transaction with DEALLOCATE ALL once it has prepared statements of its own;
    the next claim prepares its statement again instead of failing."""
    store.message_insert(NewMessage(queue="q", body=b"kept"))
    loop_store.message_ack_claim_start(acks=[], queues=["other"], limits=[1], owner=OWNER)
    assert loop_store.message_ack_claim_wait(30) == ([], set(), frozenset())
    for _ in range(6):  # psycopg prepares a query of its own after its fifth run
        loop_store.queue_size(name="q")
    with pytest.raises(ValueError, match="abandon"):
        abandon_a_transaction(loop_store)
    names = loop_store.connection().execute(SQL["prepared_names"]).fetchall()
    assert ("akadze_ack_claim",) not in names, "the premise: it was deallocated"
    assert _claim_bodies(loop_store) == [b"kept"]
