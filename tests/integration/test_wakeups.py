"""Wake-ups proportional to work: a ready message goes to one consumer parked on its queue, on that consumer's
own channel (handed over, the message in the notification, or a wake-up naming the queue); nobody parked
(nobody consumes the queue, or every consumer is busy) means no NOTIFY at all; a consumer parking while a
publish commits is never left asleep (functions wake, publish and ack_claim)."""

from __future__ import annotations

import select
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kombu_akadze.integrations.testing import eventually, fresh_schema, store_for
from kombu_akadze.store import NewMessage, Store, handoff_message, is_handoff, sqlfiles, wake_channel
from kombu_akadze.store.session import _LIVE_STORES

SQL = sqlfiles.parse_blocks(Path(__file__).with_name("inspect.sql").read_text())


def waiting(store: Store) -> list[tuple[str, str]]:
    query = SQL["waiting_rows"].replace("{schema}", sqlfiles.quote_ident(store.schema))
    return [(r[0], r[1]) for r in store.connection().execute(query).fetchall()]


def wake(store: Store, *queues: str) -> int:
    query = SQL["wake_call"].replace("{schema}", sqlfiles.quote_ident(store.schema))
    row = store.connection().execute(query, {"queues": list(queues)}).fetchone()
    assert row is not None
    return int(row[0])


def heard(listener: Store, timeout: float = 0.0) -> list[str]:
    """Notifications delivered to *listener*'s session, at once or the first within *timeout* seconds: the
    queue a wake-up names, or 'handoff:' and the queue of a message handed over."""

    def read() -> list[str]:
        return [f"handoff:{handoff_message(p).queue}" if is_handoff(p) else p for p in listener.listen_notifies()]

    if timeout:
        return eventually(read, timeout=timeout, what="a wake-up")
    return read()


def test_a_publish_wakes_the_longest_parked_consumer_of_its_queue_and_nobody_else(
    store: Store, parked_listener: Callable[..., Store]
) -> None:
    parked = [parked_listener("q", consumer=f"c{i}") for i in range(4)]
    other = parked_listener("r", consumer="other")
    assert waiting(store) == [("q", "c0"), ("q", "c1"), ("q", "c2"), ("q", "c3"), ("r", "other")]

    store.message_insert(NewMessage(queue="q", body=b"one"))

    assert heard(parked[0], timeout=10) == ["handoff:q"]
    assert waiting(store) == [("q", "c1"), ("q", "c2"), ("q", "c3"), ("r", "other")]
    # The next publish goes to the next one; a batch of two wakes two more (a batch wakes, it does not hand
    # over); nobody is woken twice.
    store.message_insert(NewMessage(queue="q", body=b"two"))
    assert heard(parked[1], timeout=10) == ["handoff:q"]
    store.message_insert_many([NewMessage(queue="q", body=b"3"), NewMessage(queue="q", body=b"4")])
    assert heard(parked[2], timeout=10) == ["q"]
    assert heard(parked[3], timeout=10) == ["q"]
    assert waiting(store) == [("r", "other")]
    assert [heard(listener) for listener in (*parked, other)] == [[], [], [], [], []]


def test_no_notify_when_nobody_consumes_the_queue_or_every_consumer_is_busy(
    store: Store, parked_listener: Callable[..., Store]
) -> None:
    other = parked_listener("elsewhere")
    assert wake(store, "nobody") == 0  # no NOTIFY issued: the wake-up looks for parked consumers only
    busy_channel = wake_channel(store.schema, "busy")
    store.message_insert(NewMessage(queue="busy", body=b"x"))
    got = store.message_ack_claim(acks=[], queues=["busy"], limits=[1], owner="busy", park=busy_channel)
    assert len(got.claimed) == 1  # its window is full: it does not park, it claims again as it acks
    assert waiting(store) == [("elsewhere", "parked")]
    assert wake(store, "busy", "busy") == 0
    assert heard(other) == []


def test_a_consumer_that_cannot_park_while_a_publish_commits_is_told_to_claim_again(pg_url: str, store: Store) -> None:
    """The publish holds its queue's wake lock until it commits; a claim that comes back short meanwhile
    cannot park (it would miss the wake-up the publisher has already looked for) and says 'retry'; the
    retry finds the message once committed. Nothing waits for the safety poll."""
    channel = wake_channel(store.schema, "c")
    with psycopg.connect(pg_url) as publisher:  # a transaction: the publish is not committed yet
        store.message_insert_on(publisher, NewMessage(queue="q", body=b"racing"))
        first = store.message_ack_claim(acks=[], queues=["q"], limits=[1], owner="c", park=channel)
        assert (first.claimed, first.retry) == ([], frozenset({"q"}))
        assert waiting(store) == []
    second = store.message_ack_claim(acks=[], queues=["q"], limits=[1], owner="c", park=channel)
    assert [m.body for m in second.claimed] == [b"racing"]


def test_a_publish_that_starts_while_a_consumer_parks_finds_it_parked(
    pg_url: str, schema: str, store: Store, parked_listener: Callable[..., Store]
) -> None:
    """The other order: the consumer parks first (its claim found nothing); a publish then wakes it."""
    listener = parked_listener("q", consumer="c")
    with psycopg.connect(pg_url) as publisher:
        store.message_insert_on(publisher, NewMessage(queue="q", body=b"later"))
        assert heard(listener) == []  # NOTIFY is delivered at commit
    assert heard(listener, timeout=10) == ["handoff:q"]


def test_a_draining_kombu_consumer_is_woken_by_its_own_channel_long_before_its_safety_poll(
    make_connection: Any, store: Store
) -> None:
    # Slow polls and slow beats (the heartbeat also reports claimable messages): only the NOTIFY is fast.
    slow = {"heartbeat_interval": 30.0, "heartbeat_ttl": 90.0, "rescue_interval": 30.0}
    consumer = make_connection(listen_poll_interval=120.0, poll_interval=120.0, **slow)
    simple = consumer.SimpleQueue("woken")
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(simple.get(timeout=60)))
    thread.start()
    eventually(lambda: ("woken", consumer.transport.consumer_id) in waiting(store), timeout=30, what="parked")
    make_connection().SimpleQueue("woken").put({"n": 1})
    thread.join(30)
    assert not thread.is_alive(), "the parked consumer was not woken (its safety poll is 60-120 s away)"
    assert got[0].payload == {"n": 1}
    got[0].ack()
    listener = consumer.transport.listener
    assert (listener.handoffs, listener.wakeups) == (1, 0)  # handed over: no claim needed
    simple.close()


def test_a_consumer_that_stops_leaves_no_parked_row_behind(make_connection: Any, store: Store) -> None:
    conn = make_connection()
    simple = conn.SimpleQueue("leaving")
    with pytest.raises(simple.Empty):
        simple.get(timeout=2)
    assert ("leaving", conn.transport.consumer_id) in waiting(store)
    simple.close()
    conn.release()
    assert waiting(store) == []


def test_a_lost_wake_up_costs_at_most_a_heartbeat_not_a_safety_poll(make_connection: Any, store: Store) -> None:
    """A row written without a wake-up (by hand, or a wake-up sent to a consumer that died): the heartbeat
    of a parked consumer finds its queue claimable and the consumer claims, long before a poll."""
    consumer = make_connection(listen_poll_interval=120.0, poll_interval=120.0)  # FAST beats: 0.25 s
    simple = consumer.SimpleQueue("lost")
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(simple.get(timeout=60)))
    thread.start()
    eventually(lambda: ("lost", consumer.transport.consumer_id) in waiting(store), timeout=30, what="parked")
    query = SQL["insert_without_wake"].replace("{schema}", sqlfiles.quote_ident(store.schema))
    with store.connection().cursor() as cur:
        cur.execute(query, {"queue": "lost", "body": b'{"n": 1}'})
    thread.join(30)
    assert not thread.is_alive(), "the consumer waited for its safety poll (60-120 s)"
    assert got[0].body == b'{"n": 1}'
    got[0].ack()
    simple.close()


def test_wake_ups_read_while_the_session_runs_other_statements_are_kept(
    store: Store, parked_listener: Callable[..., Store]
) -> None:
    """The heartbeat and LISTEN share one session: a NOTIFY that arrives while a heartbeat statement runs is
    read by that statement, and must reach the next listen_notifies all the same."""
    parked = parked_listener("shared", consumer="beating")
    store.message_insert(NewMessage(queue="shared", body=b"x"))
    fd = parked.connection().fileno()
    eventually(lambda: select.select([fd], [], [], 0.05)[0], timeout=10, what="the NOTIFY on the socket")
    assert sum(parked.message_counts().values()) == 1  # another statement on the session reads the NOTIFY first
    assert heard(parked) == ["handoff:shared"]
    assert parked.listen_notifies() == []


def test_a_consuming_connection_holds_two_sessions_the_command_and_the_heartbeat_that_listens(
    make_connection: Any, store: Store, schema: str
) -> None:
    conn = make_connection()
    simple = conn.SimpleQueue("two")
    with pytest.raises(simple.Empty):
        simple.get(timeout=1)  # parked: the heartbeat runs and LISTEN is armed
    transport = conn.transport
    assert transport.listener.armed
    assert transport.listener.store is transport.heartbeat.store
    mine = [s for s in list(_LIVE_STORES) if s.schema == schema and s.connected and s is not store]
    assert sorted(s.role for s in mine) == ["command", "heartbeat"]
    pids = [s.connection().info.backend_pid for s in mine]
    assert store.connection().execute(SQL["backends_alive"], {"pids": pids}).fetchone() == (2,)
    simple.close()


def test_an_ack_claim_over_several_queues_claims_where_there_is_work_and_parks_on_the_rest(store: Store) -> None:
    channel = wake_channel(store.schema, "c")
    store.message_insert_many([NewMessage(queue="full", body=b"a"), NewMessage(queue="full", body=b"b")])
    first = store.message_ack_claim(acks=[], queues=["full", "empty"], limits=[1, 1], owner="c", park=channel)
    assert ([m.body for m in first.claimed], first.acked, first.retry) == ([b"a"], set(), frozenset())
    assert waiting(store) == [("empty", "c")]
    # One queue, one message short of the limit: the ack lands, the message comes, the queue is parked on.
    second = store.message_ack_claim(acks=[first.claimed[0].tag], queues=["full"], limits=[2], owner="c", park=channel)
    assert ([m.body for m in second.claimed], second.acked) == ([b"b"], {first.claimed[0].id})
    assert waiting(store) == [("empty", "c"), ("full", "c")]


def test_the_previous_releases_ack_and_claim_still_work_on_the_migrated_schema(store: Store) -> None:
    """Rolling upgrade: workers that still send ack(...) + claim_park(...) (before migration 0011) ack, claim
    and park as before, beside workers that call ack_claim."""
    channel = wake_channel(store.schema, "old")
    query = SQL["previous_ack_claim"].replace("{schema}", sqlfiles.quote_ident(store.schema))
    store.message_insert(NewMessage(queue="q", body=b"one"))
    conn = store.connection()
    params: dict[str, Any] = {"ack_ids": [], "ack_run_counts": [], "owner": "old", "queues": ["q"], "limits": [1]}
    claimed = conn.execute(query, {**params, "park": channel}).fetchall()
    assert [(bytes(r[2]), r[3], r[4]) for r in claimed] == [(b"one", 1, "claimed")]
    tag = {"ack_ids": [claimed[0][0]], "ack_run_counts": [claimed[0][3]]}
    done = conn.execute(query, {**params, **tag, "park": channel}).fetchall()
    assert [(r[0], r[4]) for r in done] == [(claimed[0][0], "acked")]
    assert waiting(store) == [("q", "old")]


def test_over_several_queues_only_the_one_a_publish_is_committing_to_says_retry(pg_url: str, store: Store) -> None:
    """Per queue, as with one: the queue whose wake lock a publisher holds comes back 'retry' (no park);
    the other is parked on; once the publish commits, a claim over both gets its message."""
    channel = wake_channel(store.schema, "c")
    with psycopg.connect(pg_url) as publisher:
        store.message_insert_on(publisher, NewMessage(queue="q", body=b"racing"))
        first = store.message_ack_claim(acks=[], queues=["other", "q"], limits=[1, 1], owner="c", park=channel)
        assert (first.claimed, first.retry) == ([], frozenset({"q"}))
        assert waiting(store) == [("other", "c")]
    second = store.message_ack_claim(acks=[], queues=["other", "q"], limits=[1, 1], owner="c", park=channel)
    assert ([m.body for m in second.claimed], second.retry) == ([b"racing"], frozenset())
    assert waiting(store) == [("other", "c")]


def test_a_publish_in_another_schema_does_not_hold_back_this_schemas_consumers(pg_url: str, store: Store) -> None:
    """Two deployments in one database (the schema option) that share a queue name: one's publish,
    uncommitted, holds its queue's wake lock, and the other's consumer still parks on its own queue of
    that name (the lock was keyed by the queue name alone: it said 'retry' and claimed again, 10 ms to
    1 s later, for as long as the other kept publishing). Within one schema the lock still holds."""
    with fresh_schema(pg_url) as other_schema:
        other = store_for(pg_url, other_schema)
        try:
            channel = wake_channel(store.schema, "c")
            with psycopg.connect(pg_url) as publisher:  # the other deployment's publish, not committed yet
                other.message_insert_on(publisher, NewMessage(queue="celery", body=b"theirs"))
                mine = store.message_ack_claim(acks=[], queues=["celery"], limits=[1], owner="c", park=channel)
                assert (mine.claimed, mine.retry) == ([], frozenset())
                assert waiting(store) == [("celery", "c")]
                theirs = other.message_ack_claim(
                    acks=[], queues=["celery"], limits=[1], owner="c", park=wake_channel(other_schema, "c")
                )
                assert (theirs.claimed, theirs.retry) == ([], frozenset({"celery"}))
            late = other.message_ack_claim(acks=[], queues=["celery"], limits=[1], owner="c", park=None)
            assert [m.body for m in late.claimed] == [b"theirs"]
        finally:
            other.close()
