"""The claimer thread: one job in flight, its result or exception collected on the caller's thread."""

from __future__ import annotations

import select
import threading

import pytest

from kombu_akadze.claimer import Claimer
from kombu_akadze.events import Waker


def test_a_job_runs_off_thread_wakes_the_loop_and_hands_back_its_result() -> None:
    woken = threading.Event()
    claimer = Claimer(woken.set)
    ran_on: list[int] = []
    try:
        claimer.submit(lambda: ran_on.append(threading.get_ident()) or 7)
        assert claimer.busy
        assert claimer.wait(30.0)
        assert woken.wait(30.0)
        assert claimer.collect() == 7
        assert not claimer.busy
        assert ran_on
        assert ran_on[0] != threading.get_ident()
    finally:
        claimer.close()


def test_a_second_job_is_refused_until_the_first_is_collected_and_errors_reach_the_caller() -> None:
    claimer = Claimer(lambda: None)
    release = threading.Event()
    try:
        claimer.submit(lambda: release.wait(30.0))
        with pytest.raises(RuntimeError, match="already in flight"):
            claimer.submit(lambda: None)
        release.set()
        assert claimer.wait(30.0)
        assert claimer.collect() is True

        def boom() -> None:
            raise ValueError("statement failed")

        claimer.submit(boom)
        assert claimer.wait(30.0)
        with pytest.raises(ValueError, match="statement failed"):
            claimer.collect()
        with pytest.raises(RuntimeError, match="no finished claim"):
            claimer.collect()
    finally:
        claimer.close()


def test_wakes_from_another_thread_are_never_lost_by_the_waker() -> None:
    """The race the claimer exposed: a wake() between clearing the flag and reading the pipe."""
    waker = Waker()
    try:
        for _ in range(2000):
            thread = threading.Thread(target=waker.wake)
            thread.start()
            waker.drain()
            thread.join()
            waker.drain()
            waker.wake()  # must always write again once drained
            ready, _, _ = select.select([waker.fileno()], [], [], 5.0)
            assert ready, "a wake() after drain() left the pipe empty"
            waker.drain()
    finally:
        waker.close()


def test_run_here_keeps_the_outcome_for_collect_without_waking() -> None:
    wakes: list[int] = []
    claimer = Claimer(lambda: wakes.append(1))
    claimer.run_here(lambda: 42)
    assert claimer.done()
    assert claimer.busy
    assert claimer.collect() == 42
    assert not claimer.busy
    assert wakes == []


def test_run_here_raises_the_jobs_exception_at_collect() -> None:
    claimer = Claimer(lambda: None)

    def boom() -> None:
        raise ValueError("the statement failed")

    claimer.run_here(boom)
    with pytest.raises(ValueError, match="the statement failed"):
        claimer.collect()
    claimer.run_here(lambda: "next")  # the failed one is collected: the slot is free again
    assert claimer.collect() == "next"
