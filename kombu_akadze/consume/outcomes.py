"""The outcome buffer: acks, burials and requeues of delivered messages, waiting to be written together.

A settled delivery is not written at once: its outcome waits here so that one statement writes many
(the acks of one event-loop tick ride in the next claim). The buffer knows nothing of the database:
a writer it is handed writes one kind of outcome for a list of delivery tags and says whether that
worked. What failed transiently goes back to the front, in order, for the next flush; while an outcome
is buffered or being written its tag stays tracked, so the heartbeat's reconcile leaves its row alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

#: The kinds of outcome, in the order a flush writes them.
KINDS: tuple[str, ...] = ("ack", "bury", "requeue")

Outcome = tuple[str, str]  # (kind, delivery tag)


#: Writes outcomes of one kind for a list of delivery tags; False when it failed transiently (retry
#: later). An error that no retry fixes is raised: those outcomes are dropped, and their rows, held and
#: no longer tracked, go back to ready through this consumer's reconcile (or a rescue once it is gone).
Writer = Callable[[str, list[str]], bool]


class OutcomeBuffer:
    """One channel's buffered outcomes. Thread-safe: tasks settle from pool callbacks, the event loop
    and the heartbeat flush."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        #: Signalled when the last batch being written is done.
        self._written = threading.Condition(self._lock)
        self._pending: list[Outcome] = []
        #: Taken by a writer and not done yet: still tracked.
        self._writing: list[str] = []
        self._since = 0.0

    def add(self, kind: str, tag: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown outcome {kind!r}; valid: {', '.join(KINDS)}")
        with self._lock:
            if not self._pending:
                self._since = self._clock()
            self._pending.append((kind, tag))

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def oldest(self) -> float | None:
        """When (on the buffer's clock) the oldest outcome still waiting was buffered; None when none waits."""
        with self._lock:
            return self._since if self._pending else None

    def due(self, batch: int, delay: float) -> bool:
        """Whether to write now: *batch* outcomes wait, or the oldest has waited *delay* seconds."""
        with self._lock:
            n = len(self._pending)
            return n >= batch or (n > 0 and self._clock() - self._since >= delay)

    def tags(self) -> list[str]:
        """Every tag buffered or being written."""
        with self._lock:
            return [tag for _, tag in self._pending] + list(self._writing)

    def take(self, kinds: Iterable[str] = KINDS) -> list[Outcome]:
        """Hand the outcomes of *kinds* to a writer; call done() with the same batch afterwards."""
        wanted = set(kinds)
        with self._lock:
            batch = [o for o in self._pending if o[0] in wanted]
            self._pending = [o for o in self._pending if o[0] not in wanted]
            self._writing += [tag for _, tag in batch]
        return batch

    def done(self, batch: list[Outcome], failed: Iterable[Outcome] = ()) -> None:
        """The writer is through with *batch*: *failed* goes back to the front, in order."""
        with self._lock:
            for _, tag in batch:
                self._writing.remove(tag)
            if not self._writing:
                self._written.notify_all()
            retry = list(failed)
            if retry:
                if not self._pending:
                    self._since = self._clock()
                self._pending[:0] = retry

    def wait_written(self, timeout: float) -> bool:
        """Wait until no writer holds a batch (another thread's flush under way); False if one still does
        after *timeout* seconds."""
        with self._written:
            return self._written.wait_for(lambda: not self._writing, timeout)

    def flush(self, write: Writer, kinds: Iterable[str] = KINDS) -> int:
        """Write the outcomes of *kinds*, one call of *write* per kind; returns how many still wait."""
        order = [k for k in KINDS if k in set(kinds)]
        batch = self.take(order)
        failed: list[Outcome] = []
        untried = list(order)
        try:
            while untried:
                kind = untried[0]
                tags = [tag for k, tag in batch if k == kind]
                if tags and not write(kind, tags):
                    failed += [(kind, tag) for tag in tags]
                untried.pop(0)
        except BaseException:
            # The kind that raised is dropped; the kinds after it stay buffered.
            failed += [o for o in batch if o[0] in untried[1:]]
            raise
        finally:
            self.done(batch, failed)
        return len(failed)
