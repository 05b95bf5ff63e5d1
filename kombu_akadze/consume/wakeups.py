"""Wake-ups: a self-pipe any thread can poke, and the jitter that keeps idle consumers out of lockstep."""

from __future__ import annotations

import contextlib
import os
import random


def jittered(poll_interval: float) -> float:
    """Between half and all of the poll interval, so idle consumers do not poll in lockstep."""
    return poll_interval * random.uniform(0.5, 1.0)


class Waker:
    """A self-pipe: wake() makes a select/poll on fileno() return now, from any thread."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._pending = False
        self._closed = False

    def fileno(self) -> int:
        return self._r

    def wake(self) -> None:
        if self._pending or self._closed:  # closed: its descriptor numbers may belong to a new file now
            return
        self._pending = True
        with contextlib.suppress(OSError):  # full (a wake-up is pending anyway), or closed at a stop
            os.write(self._w, b"!")

    def drain(self) -> None:
        # Read first, clear after: cleared first, a wake() from another thread in between could set
        # the flag and have its byte read here, and every later wake() would skip its write. The
        # caller looks at the state it was woken for after drain(), so a wake() skipped meanwhile
        # loses nothing.
        with contextlib.suppress(BlockingIOError):
            while os.read(self._r, 512):
                pass
        self._pending = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for fd in (self._r, self._w):
            with contextlib.suppress(OSError):
                os.close(fd)
