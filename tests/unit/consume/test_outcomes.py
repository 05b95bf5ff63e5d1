"""The outcome buffer without a database: batching by kind, order, failures back to the front, tracking."""

from __future__ import annotations

import threading

import pytest

from kombu_akadze.consume.outcomes import OutcomeBuffer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Writer:
    """Records each write; fails (transiently) the kinds in *failing*, raises for the kinds in *broken*."""

    def __init__(self, failing: tuple[str, ...] = (), broken: tuple[str, ...] = ()) -> None:
        self.failing = failing
        self.broken = broken
        self.calls: list[tuple[str, list[str]]] = []

    def __call__(self, kind: str, tags: list[str]) -> bool:
        self.calls.append((kind, list(tags)))
        if kind in self.broken:
            raise RuntimeError(f"{kind}: an error no retry fixes")
        return kind not in self.failing


def test_a_flush_writes_one_batch_per_kind_in_settle_order_acks_first() -> None:
    buf = OutcomeBuffer()
    for kind, tag in [("requeue", "3:1"), ("ack", "1:1"), ("bury", "4:1"), ("ack", "2:1")]:
        buf.add(kind, tag)
    write = Writer()
    assert buf.flush(write) == 0
    assert write.calls == [("ack", ["1:1", "2:1"]), ("bury", ["4:1"]), ("requeue", ["3:1"])]
    assert buf.pending == 0
    assert buf.tags() == []


def test_a_flush_of_some_kinds_leaves_the_others_buffered() -> None:
    buf = OutcomeBuffer()
    buf.add("ack", "1:1")
    buf.add("requeue", "2:1")
    write = Writer()
    buf.flush(write, ("bury", "requeue"))
    assert write.calls == [("requeue", ["2:1"])]
    assert buf.pending == 1
    assert buf.take(("ack",)) == [("ack", "1:1")]


def test_transiently_failed_outcomes_go_back_to_the_front_in_order_and_are_retried() -> None:
    buf = OutcomeBuffer()
    buf.add("ack", "1:1")
    buf.add("ack", "2:1")
    assert buf.flush(Writer(failing=("ack",))) == 2
    buf.add("ack", "3:1")  # settled after the failure: written after the two that failed
    write = Writer()
    assert buf.flush(write) == 0
    assert write.calls == [("ack", ["1:1", "2:1", "3:1"])]


def test_an_error_no_retry_fixes_drops_that_kind_only_and_keeps_the_untried_ones() -> None:
    buf = OutcomeBuffer()
    buf.add("ack", "1:1")
    buf.add("bury", "2:1")
    buf.add("requeue", "3:1")
    write = Writer(broken=("bury",))
    with pytest.raises(RuntimeError):
        buf.flush(write)
    # The ack was written; the burial raised and is dropped (its row, untracked, goes back through the
    # reconcile); the requeue was never tried and waits for the next flush.
    assert write.calls == [("ack", ["1:1"]), ("bury", ["2:1"])]
    assert buf.tags() == ["3:1"]
    assert buf.take() == [("requeue", "3:1")]


def test_outcomes_being_written_stay_tracked_until_done() -> None:
    buf = OutcomeBuffer()
    buf.add("ack", "1:1")
    batch = buf.take(("ack",))
    assert buf.pending == 0
    assert buf.tags() == ["1:1"]  # the reconcile must not mistake its row for one nobody holds
    buf.done(batch)
    assert buf.tags() == []


def test_an_ack_taken_into_a_claim_that_failed_returns_for_the_next_one() -> None:
    buf = OutcomeBuffer()
    buf.add("ack", "1:1")
    batch = buf.take(("ack",))
    buf.add("ack", "2:1")
    buf.done(batch, failed=batch)
    assert buf.take(("ack",)) == [("ack", "1:1"), ("ack", "2:1")]


def test_due_after_a_batch_or_once_the_oldest_waited_long_enough() -> None:
    clock = Clock()
    buf = OutcomeBuffer(clock=clock)
    assert not buf.due(batch=3, delay=0.02)
    buf.add("ack", "1:1")
    assert not buf.due(batch=3, delay=0.02)
    clock.now += 0.03
    assert buf.due(batch=3, delay=0.02)
    buf.flush(Writer())
    for i in range(3):
        buf.add("ack", f"{i}:1")
    assert buf.due(batch=3, delay=10)


def test_an_unknown_outcome_says_what_is_valid() -> None:
    with pytest.raises(ValueError, match="ack, bury, requeue"):
        OutcomeBuffer().add("nack", "1:1")


def test_outcomes_added_from_many_threads_while_flushing_are_each_written_once() -> None:
    buf = OutcomeBuffer()
    write = Writer()
    n_threads, per_thread = 4, 500
    start = threading.Barrier(n_threads + 1)

    def settle(t: int) -> None:
        start.wait()
        for i in range(per_thread):
            buf.add("ack", f"{t * per_thread + i}:1")

    threads = [threading.Thread(target=settle, args=(t,)) for t in range(n_threads)]
    for thread in threads:
        thread.start()
    start.wait()
    while any(t.is_alive() for t in threads) or buf.pending:
        buf.flush(write)
    for thread in threads:
        thread.join()
    written = [tag for _, tags in write.calls for tag in tags]
    assert sorted(written) == sorted(f"{i}:1" for i in range(n_threads * per_thread))


def test_wait_written_returns_once_another_threads_write_is_done() -> None:
    """A purge or delete waits for the acks another thread took for writing (the heartbeat's flush): until
    that write is done, the wait says so; once it is, the wait returns at once."""
    buf = OutcomeBuffer()
    buf.add("ack", "1:1")
    inside, go = threading.Event(), threading.Event()

    def slow_write(kind: str, tags: list[str]) -> bool:
        inside.set()
        assert go.wait(60)
        return True

    writer = threading.Thread(target=buf.flush, args=(slow_write,))
    writer.start()
    assert inside.wait(60)
    assert buf.pending == 0  # taken, being written: nothing left to flush here
    assert buf.tags() == ["1:1"]
    assert buf.wait_written(0.01) is False
    released = threading.Thread(target=buf.wait_written, args=(60,))
    released.start()
    go.set()
    writer.join(60)
    released.join(60)
    assert not released.is_alive()
    assert buf.wait_written(0.0) is True
    assert buf.tags() == []
