"""Primary/standby failover under load: a second throwaway PostgreSQL streams from the primary as a
synchronous standby (pg_basebackup -R); the primary crashes (`pg_ctl stop -m immediate`) and the
standby is promoted. Workers and producer use one multi-host URL (host=a,b with
target_session_attrs=read-write) and follow by themselves; nothing that was acknowledged is lost.
With `durable_acks` only the messages in flight at the crash run twice; by default (acks and claims
commit without waiting for the standby) the acks and claims of the last WAL-writer window may be
undone too, which means more runs, never a lost message. Either way a publish whose commit reached the
standby but whose reply the crash swallowed is published again by Celery's publish retry: one task
number in two messages, each run once (at-least-once publishing, as with a lost publisher confirm)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from kombu_akadze.store import Store, migrate

from .checker import Ledgers, verdict
from .conftest import SCHEMA, Faults, Stream, _faults
from .pgserver import HOST, PgServer

OPTIONS = {"heartbeat_interval": 1.0, "heartbeat_ttl": 10.0, "rescue_interval": 1.0}
RATE = 40.0  # tasks/s the producer publishes
# Asynchronous commits reach the standby within 3 x wal_writer_delay (0.6 s): at most one second of
# tasks may have their acks or claims undone by the failover.
UNDONE_AT_MOST = int(RATE)
STANDBY = "standby1"  # the name in faults.sql's synchronous_standby_names


@pytest.fixture
def pair(
    pg_server: PgServer, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[Faults, PgServer, PgServer]]:
    """(faults on the multi-host URL, primary, synchronous standby), schema migrated on the primary."""
    primary = pg_server
    migrate.apply(primary.url(), SCHEMA)
    standby = PgServer().init_standby_of(primary, name=STANDBY)
    try:
        standby.start()
        primary.execute("sync_standby_set")
        primary.execute("reload")
        url = f"postgresql://postgres@{HOST}:{primary.port},{HOST}:{standby.port}/postgres"
        url += "?target_session_attrs=read-write"
        store = Store(url, schema=SCHEMA, role="test")
        try:
            for faults in _faults(url, SCHEMA, store, tmp_path, request, primary):
                yield faults, primary, standby
        finally:
            store.close()
            migrate.forget_checks()
    finally:
        standby.destroy()


def _first_start_after(ledgers: Ledgers, worker: str, after: float) -> float | None:
    for run in ledgers.runs():
        if run.event == "start" and run.source.startswith(f"ledger-{worker}-") and run.at > after:
            return run.at
    return None


@pytest.mark.slow
@pytest.mark.parametrize("durable_acks", [True, False], ids=["durable-acks", "relaxed-acks"])
def test_failover_to_a_synchronous_standby_loses_nothing_acknowledged(
    pair: tuple[Faults, PgServer, PgServer], durable_acks: bool
) -> None:
    faults, primary, standby = pair
    faults.options = {**OPTIONS, "durable_acks": durable_acks}
    faults.until(
        lambda: primary.execute("replication_state") == [(STANDBY, "streaming", "sync")],
        timeout=60,
        what="the standby streams synchronously",
    )
    workers = {name: faults.start_worker(name, concurrency=2) for name in ("a", "b")}
    pids = {name: w.pid for name, w in workers.items()}
    producer = Stream(faults, rate=RATE)
    producer.start()
    faults.until(lambda: len(faults.ledgers.done()) >= 100, timeout=120, what="tasks flow on the primary")

    in_flight = faults.held_ids()
    primary.stop("immediate")  # the primary is gone for good: never started again (no split brain)
    failed_at = time.time()
    standby.promote()
    faults.server = standby
    promoted = time.time()
    in_flight |= faults.held_ids()  # what the crash left held (replicated synchronously)
    for name in workers:
        faults.until(
            lambda name=name: _first_start_after(faults.ledgers, name, promoted),
            timeout=90,
            interval=0.2,
            what=f"worker {name} follows to the promoted standby",
        )
    resumed = max(_first_start_after(faults.ledgers, name, promoted) or promoted for name in workers)
    more = len(producer.published) + 100
    faults.until(lambda: len(producer.published) >= more, timeout=60, what="the producer follows too")

    published = producer.finish()
    faults.until(lambda: faults.ledgers.all_done(published), timeout=180, interval=0.5, what="every task completed")
    faults.until(lambda: faults.queued() == 0, timeout=60, interval=0.2, what="every message acked")
    result = verdict(
        f"failover to a synchronous standby (promote, durable_acks={durable_acks})",
        injected=f"1 primary crash + promotion, {len(in_flight)} messages in flight",
        published=published,
        ledgers=faults.ledgers,
        recovery=resumed - failed_at,
    )
    print(f"promotion took {promoted - failed_at:.2f} s; publishes that raised and were retried: {producer.errors}")
    assert standby.execute("in_recovery") == [(False,)]
    assert result.lost == 0, "a publish the producer saw succeed is gone after the failover"
    assert result.completed == len(published)
    done_runs = [r for r in faults.ledgers.runs() if r.event == "done"]
    # A publish the crash cut off after its commit reached the standby, but before its reply reached the
    # producer, is published again by Celery's own publish retry: one task number, two messages, each
    # run once. One producer thread has at most one publish in flight, so at most one such pair.
    messages_of: dict[int, set[int]] = {}
    for r in done_runs:
        messages_of.setdefault(r.n, set()).add(r.message_id)
    republished = {n: sorted(ids) for n, ids in messages_of.items() if len(ids) > 1}
    print(f"task numbers published twice (reply lost in the crash, retried by Celery): {republished}")
    assert len(republished) <= 1, f"more publishes retried than the producer had in flight: {republished}"
    runs_of_message = Counter(r.message_id for r in done_runs)
    twice = {message_id for message_id, runs in runs_of_message.items() if runs > 1}
    if durable_acks:
        assert twice <= in_flight, f"run twice though not in flight at the crash: {sorted(twice - in_flight)}"
    else:
        undone = twice - in_flight
        print(f"run twice though not in flight at the crash (ack or claim undone): {len(undone)}")
        assert len(undone) <= UNDONE_AT_MOST, f"more runs undone than one second of tasks: {sorted(undone)}"
    for name, worker in workers.items():
        assert worker.alive, f"worker {name} exited"
        assert worker.pid == pids[name], f"worker {name} was restarted"
