"""Queue stats and dead letters (find, show, replay, purge, prune) against real PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from kombu_akadze.errors import ConfigurationError
from kombu_akadze.integrations.testing import eventually
from kombu_akadze.ops import deadletters, stats
from kombu_akadze.store import NewMessage, Store

OWNER = "consumer-a"


def later_than_publish(seconds: float = 1.0) -> datetime:
    """A moved clock must not run behind the rows' available_at (set by the database's now())."""
    return datetime.now(UTC) + timedelta(seconds=seconds)


def register(store: Store, consumer_id: str = OWNER, now: datetime | None = None) -> None:
    store.consumer_heartbeat(consumer_id=consumer_id, hostname="h", pid=1, now=now)


def bury(store: Store, queue: str, n: int, *, reason: str = "bad input", task: str = "app.add") -> list[int]:
    """Publish n messages to *queue* and send them to dead letters with *reason*."""
    for i in range(n):
        store.message_insert(NewMessage(queue=queue, body=f"{queue}-{i}".encode(), headers={"task": task, "i": i}))
    register(store)
    claimed = store.message_claim(queues=[queue], limits=[n], owner=OWNER)
    assert len(claimed) == n
    return sorted(store.message_bury([m.tag for m in claimed], reason=reason, owner=OWNER))


def test_stats_count_ready_held_delayed_dead_and_the_oldest_ready_age(store: Store) -> None:
    store.message_insert_many([NewMessage(queue="work", body=b"x") for _ in range(5)])
    store.message_insert(NewMessage(queue="work", body=b"later", delay=3600))
    register(store)
    store.message_claim(queues=["work"], limits=[2], owner=OWNER)
    bury(store, "other", 1)
    store.queue_declare(name="idle")
    now = later_than_publish(10)

    got = {q.queue: q for q in stats.queue_stats(store, now=now)}

    assert sorted(got) == ["idle", "other", "work"]
    work = got["work"]
    assert (work.ready, work.held, work.delayed, work.dead) == (3, 2, 1, 0)
    assert work.oldest_ready_age_seconds is not None
    assert 10 <= work.oldest_ready_age_seconds < 15
    assert (got["other"].dead, got["other"].ready, got["other"].oldest_ready_age_seconds) == (1, 0, None)
    assert (got["idle"].ready, got["idle"].dead) == (0, 0)


def test_a_delayed_message_counts_as_ready_once_its_time_has_come(store: Store) -> None:
    store.message_insert(NewMessage(queue="q", body=b"later", delay=60))
    (before,) = stats.queue_stats(store)
    (after,) = stats.queue_stats(store, now=later_than_publish(61))
    assert (before.ready, before.delayed) == (0, 1)
    assert (after.ready, after.delayed) == (1, 0)


def test_an_expired_message_not_yet_swept_is_not_counted_as_ready(store: Store) -> None:
    store.message_insert(NewMessage(queue="q", body=b"brief", ttl=30))
    store.message_insert(NewMessage(queue="q", body=b"keeps"))
    (now,) = stats.queue_stats(store)
    (later,) = stats.queue_stats(store, now=later_than_publish(60))
    assert (now.ready, later.ready) == (2, 1)


def test_consumers_alive_counts_only_fresh_heartbeats_even_with_no_queues(store: Store) -> None:
    t0 = later_than_publish()
    register(store, "fresh", now=t0)
    register(store, "stale", now=t0 - timedelta(seconds=120))
    snap = stats.snapshot(store, now=t0 + timedelta(seconds=5), ttl=30)
    assert snap.queues == ()
    assert snap.consumers_alive == 1
    assert stats.snapshot(store, now=t0 + timedelta(seconds=5), ttl=600).consumers_alive == 2


def test_find_filters_by_queue_task_reason_and_age(store: Store) -> None:
    a = bury(store, "a", 2, reason="ValueError: bad input", task="app.add")
    b = bury(store, "b", 1, reason="max_attempts exceeded", task="app.mul")
    m = deadletters.matching

    assert {d.id for d in deadletters.find(store)} == set(a + b)
    assert {d.id for d in deadletters.find(store, m(queue="a"))} == set(a)
    assert {d.id for d in deadletters.find(store, m(task="app.mul"))} == set(b)
    assert {d.id for d in deadletters.find(store, m(reason="VALUEERROR"))} == set(a)
    assert {d.id for d in deadletters.find(store, m(reason="bad", queue="b"))} == set()
    assert deadletters.find(store, m(older_than=60)) == []
    assert len(deadletters.find(store, m(older_than=60), now=later_than_publish(120))) == 3
    assert len(deadletters.find(store, limit=1)) == 1
    (one,) = deadletters.find(store, m(ids=b))
    assert (one.queue, one.task, one.reason) == ("b", "app.mul", "max_attempts exceeded")
    assert (one.attempts, one.body_size) == (1, 3)
    assert deadletters.count(store, m(queue="a")) == 2


def test_show_returns_the_whole_dead_letter_with_its_body(store: Store) -> None:
    (mid,) = bury(store, "q", 1, reason="boom")
    got = deadletters.show(store, mid)
    assert got is not None
    assert (got.id, got.queue, got.body, got.reason) == (mid, "q", b"q-0", "boom")
    assert got.headers == {"task": "app.add", "i": 0}
    detail = deadletters.detail_dict(got)
    assert (detail["body_base64"], detail["body_repr"]) == ("cS0w", "b'q-0'")
    assert deadletters.show(store, mid + 1000) is None


def test_replay_puts_the_message_back_ready_under_the_same_id_with_attempts_reset(store: Store) -> None:
    ids = bury(store, "q", 3)
    result = deadletters.replay(store, deadletters.matching(queue="q"))
    assert result.replayed == set(ids)
    assert result.already_live == set()
    assert deadletters.find(store) == []
    for mid in ids:
        row = store.message_get(mid)
        assert row is not None
        assert (row["state"], row["attempts"], row["owner"]) == ("ready", 0, None)
    claimed = store.message_claim(queues=["q"], limits=[10], owner=OWNER)
    assert sorted(m.id for m in claimed) == ids
    assert {m.body for m in claimed} == {b"q-0", b"q-1", b"q-2"}


def test_replaying_twice_never_makes_a_second_copy(store: Store) -> None:
    (mid,) = bury(store, "q", 1)
    where = deadletters.matching(ids=[mid])
    assert deadletters.replay(store, where).replayed == {mid}
    again = deadletters.replay(store, where)
    assert (again.replayed, again.already_live) == (frozenset(), frozenset())
    assert store.message_counts() == {("q", "ready"): 1}


def test_concurrent_replays_of_the_same_dead_letters_make_one_copy_each(pg_url: str, schema: str, store: Store) -> None:
    ids = bury(store, "q", 300)
    barrier = threading.Barrier(4)
    results: list[deadletters.ReplayResult] = []

    def replayer() -> None:
        s = Store(pg_url, schema=schema, role="replayer")
        s.connection()
        barrier.wait()
        results.append(deadletters.replay(s, deadletters.matching(queue="q")))
        s.close()

    threads = [threading.Thread(target=replayer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    replayed = [mid for r in results for mid in r.replayed]
    assert sorted(replayed) == ids
    assert store.message_counts() == {("q", "ready"): 300}


def test_replay_keeps_run_count_so_a_stale_tag_cannot_ack_the_replayed_message(store: Store) -> None:
    store.message_insert(NewMessage(queue="q", body=b"x"))
    register(store)
    (first,) = store.message_claim(queues=["q"], limits=[1], owner=OWNER)
    store.message_bury([first.tag], reason="worker gave up", owner=OWNER)
    deadletters.replay(store, deadletters.matching(ids=[first.id]))
    (second,) = store.message_claim(queues=["q"], limits=[1], owner=OWNER)
    assert (second.id, second.attempts) == (first.id, 1)
    assert second.run_count > first.run_count
    assert store.message_ack([first.tag], owner=OWNER) == set()
    assert store.message_ack([second.tag], owner=OWNER) == {first.id}


def test_replay_wakes_a_consumer_parked_on_the_queue(store: Store, parked_listener: Callable[..., Store]) -> None:
    bury(store, "wake-me", 1)
    listener = parked_listener("wake-me")
    try:
        deadletters.replay(store, deadletters.matching(queue="wake-me"))
        heard: list[str] = []
        eventually(lambda: heard.extend(listener.listen_notifies()) or "wake-me" in heard, timeout=10)
    finally:
        listener.close()


def test_purge_deletes_only_what_matches(store: Store) -> None:
    bury(store, "a", 2)
    b = bury(store, "b", 2, reason="poison")
    assert deadletters.purge(store, deadletters.matching(queue="a")) == 2
    assert {d.id for d in deadletters.find(store)} == set(b)
    assert deadletters.purge(store, deadletters.matching(reason="nothing like it")) == 0


def test_replay_and_purge_refuse_an_empty_filter_unless_told_everything(store: Store) -> None:
    bury(store, "a", 2)
    with pytest.raises(ConfigurationError, match="--all"):
        deadletters.purge(store, deadletters.matching())
    with pytest.raises(ConfigurationError, match="--all"):
        deadletters.replay(store, deadletters.matching(ids=[]))
    assert deadletters.purge(store, deadletters.matching(), everything=True) == 2


def test_prune_deletes_dead_letters_older_than_the_retention(store: Store) -> None:
    bury(store, "a", 3)
    assert deadletters.prune(store) == 0
    assert deadletters.prune(store, days=14, now=later_than_publish(13 * 86400)) == 0
    assert deadletters.prune(store, days=14, now=later_than_publish(15 * 86400)) == 3
    with pytest.raises(ConfigurationError, match="days must be > 0"):
        deadletters.prune(store, days=0)
