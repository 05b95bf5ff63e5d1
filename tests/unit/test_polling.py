"""Waiting on descriptors numbered past select(2)'s 1,024 (a process with many open files), and a
closed waker that no longer writes (its numbers may belong to another file by then)."""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Iterator

import pytest

from kombu_akadze import polling
from kombu_akadze.consume.wakeups import Waker


@pytest.fixture
def high_pipe() -> Iterator[tuple[int, int]]:
    """A pipe whose read end is numbered 1,024 or above."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1100:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} is under 1,100 descriptors")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1100), hard))
    fillers: list[int] = []
    try:
        while True:
            r, w = os.pipe()
            if r >= 1024:
                break
            fillers += [r, w]
        yield r, w
        os.close(r)
        os.close(w)
    finally:
        for fd in fillers:
            with contextlib.suppress(OSError):
                os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_readable_sees_a_descriptor_past_1024(high_pipe: tuple[int, int]) -> None:
    r, w = high_pipe
    assert polling.readable([r], 0) == []
    os.write(w, b"!")
    assert polling.readable([r], 5) == [r]


def test_writable_and_a_timeout() -> None:
    r, w = os.pipe()
    try:
        assert polling.writable(w, 0)
        assert polling.readable([r], 0.01) == []
    finally:
        os.close(r)
        os.close(w)


def test_a_closed_waker_does_not_write_to_the_numbers_it_had() -> None:
    waker = Waker()
    number = waker.fileno()
    waker.close()
    r, w = os.pipe()  # likely given the numbers the waker had
    try:
        waker.wake()
        assert polling.readable([r], 0) == [], f"a closed waker (fd {number}) wrote into another pipe"
    finally:
        os.close(r)
        os.close(w)
