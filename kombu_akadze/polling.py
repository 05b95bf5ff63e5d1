"""Waiting for sockets and pipes with poll(2), not select(2): select cannot watch a descriptor numbered
1024 or above, which any process with many open files (a web server, a test run) hands out."""

from __future__ import annotations

import select
from collections.abc import Iterable

_READ = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR | select.POLLNVAL
_WRITE = select.POLLOUT | select.POLLHUP | select.POLLERR | select.POLLNVAL


def readable(fds: Iterable[int], timeout: float | None) -> list[int]:
    """The descriptors of *fds* ready to read (or closed, or in error) within *timeout* seconds (None:
    no limit); [] on timeout."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, _READ)
    return [fd for fd, _ in poller.poll(_millis(timeout))]


def writable(fd: int, timeout: float | None) -> bool:
    """Whether *fd* can be written (or is closed, or in error) within *timeout* seconds."""
    poller = select.poll()
    poller.register(fd, _WRITE)
    return bool(poller.poll(_millis(timeout)))


def _millis(timeout: float | None) -> int | None:
    return None if timeout is None else max(int(timeout * 1000 + 0.999), 0)
