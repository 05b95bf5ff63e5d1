"""DelayedFlush: the deadline thread for buffered outcomes of a client that neither drains nor runs a loop."""

from __future__ import annotations

import threading

from kombu_akadze.consume.flusher import DelayedFlush
from kombu_akadze.integrations.testing import eventually


def test_arming_calls_the_flush_once_after_the_delay_on_another_thread() -> None:
    threads: list[str] = []
    flusher = DelayedFlush(lambda: threads.append(threading.current_thread().name), delay=0.01)
    for _ in range(100):  # arming while armed only sets nothing new
        flusher.arm()
    eventually(lambda: len(threads) >= 1, timeout=30, what="the armed flush runs")
    assert not flusher.armed
    assert threads[0] == "akadze-outcomes"
    flusher.arm()
    eventually(lambda: len(threads) >= 2, timeout=30, what="a second arming runs it again")
    flusher.stop()


def test_a_failing_flush_is_logged_and_the_thread_goes_on() -> None:
    calls: list[int] = []

    def flush() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("database down")

    flusher = DelayedFlush(flush, delay=0.01)
    flusher.arm()
    eventually(lambda: len(calls) == 1, timeout=30, what="the first flush runs")
    flusher.arm()
    eventually(lambda: len(calls) == 2, timeout=30, what="the thread survived the failure")
    flusher.stop()


def test_fire_flushes_on_the_caller_only_when_armed_and_stop_disarms() -> None:
    calls: list[str] = []
    flusher = DelayedFlush(lambda: calls.append(threading.current_thread().name), delay=3600)
    flusher.fire()
    assert calls == []
    flusher.arm()
    assert flusher.armed
    flusher.fire()
    assert calls == [threading.current_thread().name]
    flusher.arm()
    flusher.stop()
    assert not flusher.armed
    flusher.arm()
    assert not flusher.armed
    flusher.fire()
    assert calls == [threading.current_thread().name]
