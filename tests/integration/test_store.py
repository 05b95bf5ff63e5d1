"""Store methods against real PostgreSQL: claim order, fencing, release, requeue, dead letters, rescue."""

from __future__ import annotations

import pickle
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NamedTuple

import psycopg
import pytest

from kombu_akadze.store import NewMessage, Store, sqlfiles

OWNER = "consumer-a"
SQL = sqlfiles.parse_blocks(Path(__file__).with_name("inspect.sql").read_text())


class Rescued(NamedTuple):
    requeued: int
    dead: int
    consumers_gone: int


def rescue_once(store: Store, *, ttl: float, max_attempts: int, now: datetime | None = None) -> Rescued:
    """The rescue pass (lease_rescue), as the elected consumer's maintenance round runs it."""
    outcome = store.lease_rescue(ttl=ttl, max_attempts=max_attempts, now=now)
    return Rescued(len(outcome.ready), len(outcome.dead), outcome.consumers_gone)


def publish(store: Store, queue: str = "q", n: int = 1, **kw: object) -> list[int]:
    return [store.message_insert(NewMessage(queue=queue, body=f"m{i}".encode(), **kw)) for i in range(n)]  # type: ignore[arg-type]


def later_than_publish() -> datetime:
    """A moved clock must not run behind the rows' available_at (set by the database's now())."""
    return datetime.now(UTC) + timedelta(seconds=1)


def register(store: Store, consumer_id: str = OWNER, now: datetime | None = None) -> None:
    store.consumer_heartbeat(consumer_id=consumer_id, hostname="h", pid=1, now=now)


def claim(store: Store, queue: str = "q", limit: int = 1, owner: str = OWNER, now: datetime | None = None):  # type: ignore[no-untyped-def]
    return store.message_claim(queues=[queue], limits=[limit], owner=owner, now=now)


def test_bodies_and_headers_round_trip_byte_for_byte(store: Store) -> None:
    body = pickle.dumps({"set": {1, 2}, "nul": b"\x00\xff"})
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    store.message_insert(
        NewMessage(
            queue="q",
            body=body,
            content_type="application/x-python-serialize",
            content_encoding="binary",
            headers={"eta": when, "n": 1},
            properties={"x": [1]},
        )
    )
    register(store)
    (got,) = claim(store)
    assert got.body == body
    assert got.headers == {"eta": when, "n": 1}
    assert got.properties == {"x": [1]}
    assert (got.content_type, got.content_encoding) == ("application/x-python-serialize", "binary")


def test_claim_takes_higher_priority_first_then_publish_order(store: Store) -> None:
    low = publish(store, n=3, priority=0)
    high = publish(store, n=2, priority=9)
    register(store)
    got = claim(store, limit=10)
    assert [m.id for m in got] == high + low


def test_claim_bumps_run_count_and_attempts_and_holds_the_row(store: Store) -> None:
    (mid,) = publish(store)
    register(store)
    (got,) = claim(store)
    assert (got.run_count, got.attempts) == (1, 1)
    row = store.message_get(mid)
    assert row is not None
    assert (row["state"], row["owner"]) == ("held", OWNER)
    assert claim(store) == []


def test_messages_not_yet_available_are_not_claimed_until_promoted(store: Store) -> None:
    store.message_insert(NewMessage(queue="q", body=b"later", delay=3600))
    register(store)
    assert claim(store) == []
    assert store.queue_size(name="q") == 0
    later = datetime.now(UTC) + timedelta(hours=2)
    assert claim(store, now=later) == []  # delayed rows wait outside the claim index...
    assert store.message_promote(now=later) == 1  # ...until the maintenance pass promotes them when due
    assert len(claim(store, now=later)) == 1


def test_ack_is_fenced_on_run_count(store: Store) -> None:
    (mid,) = publish(store)
    register(store)
    (got,) = claim(store)
    assert store.message_ack([(mid, got.run_count + 1)], owner=OWNER) == set()
    assert store.message_get(mid) is not None
    assert store.message_ack([got.tag], owner=OWNER) == {mid}
    assert store.message_get(mid) is None
    assert store.message_ack([got.tag], owner=OWNER) == set()


def test_a_run_the_server_lost_and_gave_again_fences_every_late_outcome_of_the_first_owner(
    store: Store, pg_url: str, schema: str
) -> None:
    """Injected: consumer A's claim undone as a failover to an asynchronous standby undoes it, so B's
    claim issues the same (id, run_count) again. 1 message in; A's late ack, ack+claim, release,
    requeue and reject all change nothing (the owner is in the fence); B's ack completes it:
    run twice, completed once, 0 duplicated by an outcome of the wrong run, 0 lost."""
    (mid,) = publish(store)
    register(store, "consumer-a")
    register(store, "consumer-b")
    (a_run,) = claim(store, owner="consumer-a")
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(SQL["forget_claim"].replace("{schema}", sqlfiles.quote_ident(schema)), {"id": mid})
    (b_run,) = claim(store, owner="consumer-b")
    assert b_run.tag == a_run.tag
    assert store.message_ack([a_run.tag], owner="consumer-a") == set()
    assert store.message_ack_claim(acks=[a_run.tag], queues=["q"], limits=[1], owner="consumer-a")[:2] == ([], set())
    assert store.message_release([a_run.tag], owner="consumer-a") == set()
    assert store.message_bury([a_run.tag], reason="late", owner="consumer-a") == set()
    requeued = store.message_requeue([a_run.tag], max_attempts=20, owner="consumer-a")
    assert (requeued.ready, requeued.dead) == (set(), set())
    row = store.message_get(mid)
    assert row is not None
    assert (row["state"], row["owner"], row["run_count"]) == ("held", "consumer-b", b_run.run_count)
    assert store.message_ack([b_run.tag], owner="consumer-b") == {mid}
    assert store.message_counts() == {}
    assert store.deadletter_list() == []


def test_release_gives_the_attempt_back_in_place(store: Store) -> None:
    (mid,) = publish(store)
    register(store)
    (got,) = claim(store)
    assert store.message_release([got.tag], owner=OWNER) == {mid}
    row = store.message_get(mid)
    assert row is not None
    assert (row["state"], row["attempts"], row["run_count"], row["owner"]) == ("ready", 0, 1, None)
    assert store.message_counts() == {("q", "ready"): 1}
    (again,) = claim(store)
    assert (again.id, again.run_count, again.attempts) == (mid, 2, 1)


def test_requeue_spends_the_attempt_and_buries_after_max_attempts(store: Store) -> None:
    (mid,) = publish(store)
    register(store)
    for attempt in (1, 2):
        (got,) = claim(store)
        assert got.attempts == attempt
        outcome = store.message_requeue([got.tag], max_attempts=3, owner=OWNER)
        assert outcome.ready == {mid}
    (got,) = claim(store)
    outcome = store.message_requeue([got.tag], max_attempts=3, owner=OWNER)
    assert outcome.dead == {mid}
    assert store.message_get(mid) is None
    (dead,) = store.deadletter_list(queue="q")
    assert (dead["id"], dead["reason"], dead["attempts"]) == (mid, "max_attempts exceeded", 3)


def test_per_queue_max_attempts_overrides_the_default(store: Store) -> None:
    store.queue_declare(name="strict", max_attempts=1)
    (mid,) = publish(store, queue="strict")
    register(store)
    (got,) = claim(store, queue="strict")
    assert store.message_requeue([got.tag], max_attempts=20, owner=OWNER).dead == {mid}


def test_bury_moves_to_dead_letters_with_reason_and_is_fenced(store: Store) -> None:
    (mid,) = publish(store)
    register(store)
    (got,) = claim(store)
    assert store.message_bury([(mid, 99)], reason="nope", owner=OWNER) == set()
    assert store.message_bury([got.tag], reason="bad input", owner=OWNER) == {mid}
    (dead,) = store.deadletter_list()
    assert (dead["reason"], dead["queue"]) == ("bad input", "q")


def test_rescue_returns_messages_of_silent_consumers_and_spends_an_attempt(store: Store) -> None:
    ids = publish(store, n=3)
    t0 = later_than_publish()
    register(store, "dead-one", now=t0)
    assert len(claim(store, limit=3, owner="dead-one", now=t0)) == 3
    assert rescue_once(store, ttl=30, max_attempts=20, now=t0 + timedelta(seconds=10)).requeued == 0
    result = rescue_once(store, ttl=30, max_attempts=20, now=t0 + timedelta(seconds=31))
    assert (result.requeued, result.dead, result.consumers_gone) == (3, 0, 1)
    for mid in ids:
        row = store.message_get(mid)
        assert row is not None
        assert (row["state"], row["attempts"]) == ("ready", 1)


def test_rescue_buries_messages_that_used_up_their_attempts(store: Store) -> None:
    (mid,) = publish(store)
    t0 = later_than_publish()
    register(store, "dead-one", now=t0)
    assert len(claim(store, owner="dead-one", now=t0)) == 1
    result = rescue_once(store, ttl=30, max_attempts=1, now=t0 + timedelta(seconds=60))
    assert (result.requeued, result.dead) == (0, 1)
    (dead,) = store.deadletter_list()
    assert (dead["id"], dead["reason"]) == (mid, "max_attempts exceeded")


def test_rescue_leaves_live_consumers_alone(store: Store) -> None:
    publish(store)
    register(store)
    claim(store)
    assert rescue_once(store, ttl=30, max_attempts=20).requeued == 0


def test_rescue_of_a_held_row_whose_consumer_row_vanished_waits_for_the_ttl(store: Store) -> None:
    (mid,) = publish(store)
    t0 = later_than_publish()
    assert len(claim(store, owner="never-registered", now=t0)) == 1
    assert rescue_once(store, ttl=30, max_attempts=20, now=t0 + timedelta(seconds=5)).requeued == 0
    assert rescue_once(store, ttl=30, max_attempts=20, now=t0 + timedelta(seconds=31)).requeued == 1
    row = store.message_get(mid)
    assert row is not None
    assert row["state"] == "ready"


def test_concurrent_rescuers_do_not_count_an_attempt_twice(pg_url: str, schema: str, store: Store) -> None:
    ids = publish(store, n=200)
    t0 = later_than_publish()
    register(store, "dead-one", now=t0)
    assert len(claim(store, limit=200, owner="dead-one", now=t0)) == 200
    results: list[Rescued] = []
    barrier = threading.Barrier(4)

    def rescuer() -> None:
        s = Store(pg_url, schema=schema, role="rescuer")
        s.connection()
        barrier.wait()
        results.append(rescue_once(s, ttl=1, max_attempts=20, now=t0 + timedelta(seconds=5)))
        s.close()

    threads = [threading.Thread(target=rescuer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sum(r.requeued for r in results) == 200
    for mid in ids:
        row = store.message_get(mid)
        assert row is not None
        assert (row["state"], row["attempts"]) == ("ready", 1)


def test_concurrent_claimers_never_share_a_message(pg_url: str, schema: str, store: Store) -> None:
    total = 2000
    store.message_insert_many([NewMessage(queue="q", body=str(i).encode()) for i in range(total)])
    seen: dict[str, list[int]] = {}

    def consumer(name: str) -> None:
        s = Store(pg_url, schema=schema, role="claimer")
        register(s, name)
        mine: list[int] = []
        while batch := s.message_claim(queues=["q"], limits=[7], owner=name):
            mine.extend(m.id for m in batch)
            s.message_ack([m.tag for m in batch], owner=name)
        seen[name] = mine
        s.close()

    threads = [threading.Thread(target=consumer, args=(f"c{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    every = [mid for ids in seen.values() for mid in ids]
    print(f"claimed per consumer: { {k: len(v) for k, v in seen.items()} }")
    assert len(every) == total
    assert len(set(every)) == total
    assert store.message_counts() == {}


def test_claim_plan_uses_the_partial_index(store: Store) -> None:
    """The claim function's own queries (migration 0005) walk messages_claim_idx and the primary key:
    no sequential scan, no sort; seen through auto_explain, which logs a function's nested plans."""
    store.message_insert_many([NewMessage(queue=f"q{i % 2}", body=b"x") for i in range(20000)])
    conn = store.connection()
    inspect = sqlfiles.parse_blocks((Path(__file__).with_name("inspect.sql")).read_text())
    conn.execute(inspect["analyze_messages"].replace("{schema}", sqlfiles.quote_ident(store.schema)))
    try:
        conn.execute(inspect["auto_explain_load"])
    except psycopg.errors.UndefinedFile:
        pytest.skip("this PostgreSQL has no auto_explain module (contrib)")
    conn.execute(inspect["auto_explain_nested"])
    plans: list[str] = []
    conn.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
    register(store)
    assert len(claim(store, queue="q1", limit=10)) == 10
    plan = "\n".join(plans)
    assert "messages_claim_idx" in plan, plan
    assert "Seq Scan on messages" not in plan, plan
    assert "Sort" not in plan, plan


def test_queue_size_purge_and_delete(store: Store) -> None:
    store.queue_declare(name="q")
    publish(store, n=3)
    register(store)
    claim(store)
    assert store.queue_size(name="q") == 2
    assert store.queue_purge(name="q") == 2
    assert store.message_counts() == {("q", "held"): 1}
    assert store.queue_exists(name="q")
    assert store.queue_delete(name="q") == 1
    assert not store.queue_exists(name="q")
    assert store.message_counts() == {}


@pytest.mark.parametrize("name", ["it's", 'q"; DROP TABLE messages; --', "очередь ✓", "x" * 255])
def test_queue_names_are_data_never_sql(store: Store, name: str) -> None:
    store.queue_declare(name=name)
    (mid,) = publish(store, queue=name)
    register(store)
    (got,) = claim(store, queue=name)
    assert (got.id, got.queue) == (mid, name)
    assert store.queue_exists(name=name)


def test_the_oldest_live_consumer_is_elected_and_the_next_takes_over_once_it_is_silent(store: Store) -> None:
    t0 = later_than_publish()

    def beat(consumer: str, at: datetime) -> bool:
        return store.consumer_heartbeat(consumer_id=consumer, hostname="h", pid=1, ttl=30, now=at).leader

    assert beat("a", t0) is True  # alone: elected
    assert beat("b", t0 + timedelta(seconds=1)) is False  # younger, while a beats
    assert beat("a", t0 + timedelta(seconds=20)) is True
    assert beat("b", t0 + timedelta(seconds=40)) is False  # a beat 20 s ago: within the 30 s ttl
    assert beat("b", t0 + timedelta(seconds=51)) is True  # a silent for 31 s: b takes over
    assert beat("c", t0 + timedelta(seconds=52)) is False
    # a comes back before anyone's rescue forgot it: the oldest again, so it leads again (two leaders
    # for at most one round is safe: every pass skips rows another one holds).
    assert beat("a", t0 + timedelta(seconds=53)) is True
    assert beat("b", t0 + timedelta(seconds=54)) is False


def test_the_heartbeat_says_which_consumed_queues_have_a_claimable_message(store: Store) -> None:
    publish(store, queue="full")
    publish(store, queue="later", delay=3600)  # delayed: not claimable yet
    beat = store.consumer_heartbeat(consumer_id=OWNER, hostname="h", pid=1, queues=["full", "later", "empty"])
    assert beat.ready == ("full",)
