"""Which held runs this consumer has seen, so that the ones it never saw can be adopted once its LISTEN
is armed again.

A publish hands a message to a parked consumer by writing the row already held under its id and sending
the message in a notification. A notification sent while the consumer's LISTEN path is being re-armed (its
session was replaced, or the host's relay hub went) reaches nobody, and no claim finds that row: it is
held, not ready. So at every re-arm the consumer asks for the rows held under its id that it does not
hold (store lease_unseen) and delivers them as if they had been handed over: within milliseconds, not
after the reconcile's two passes.

The same run may reach the consumer twice around a re-arm, and must be delivered once:
- a claim that committed before the adoption's query but whose reply is read after it (the query sees
  the row held, the consumer does not know it yet);
- a notification read after the query (a publish that committed between the new LISTEN and the query).
So every run the consumer receives (claimed, handed over, adopted) is remembered for RECENT seconds
(a run held longer is in the transport's own buffers, which the query leaves out), an adoption skips
what was received, and a claim or notification that arrives after its run was adopted is dropped. Pure
logic, thread-safe: claims land on the consuming thread, notifications and adoptions on the heartbeat's.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

from kombu_akadze.store.records import ClaimedMessage, Tag

#: Seconds a received run is remembered: far longer than the gaps it covers (a claim's reply read after
#: its commit, a notification read after its publish committed), which are milliseconds.
RECENT = 10.0


class Adoption:
    def __init__(self, *, clock: Callable[[], float] = time.monotonic, recent: float = RECENT) -> None:
        self._clock = clock
        self._recent = recent
        self._lock = threading.Lock()
        #: Runs received (claimed, handed over or adopted) in the last *recent* seconds, oldest first.
        self._order: deque[tuple[float, Tag]] = deque()
        self._received: set[Tag] = set()
        #: Of those, the runs delivered (or given back) by an adoption: a claim or notification of one is
        #: a second copy.
        self._adopted: set[Tag] = set()
        #: Runs adopted so far.
        self.count = 0

    def claimed(self, messages: list[ClaimedMessage]) -> list[ClaimedMessage]:
        """A claim's messages, less any an adoption took first; the rest remembered as received."""
        with self._lock:
            self._prune()
            fresh = [m for m in messages if m.tag not in self._adopted]
            self._remember(m.tag for m in fresh)
        return fresh

    def handed(self, message: ClaimedMessage) -> bool:
        """A handed-over message: False if an adoption took its run first (drop it), else remembered."""
        with self._lock:
            self._prune()
            if message.tag in self._adopted or message.tag in self._received:
                return False
            self._remember([message.tag])
        return True

    def unseen(self, messages: list[ClaimedMessage]) -> list[ClaimedMessage]:
        """Of the rows found held under this consumer's id (and not in its buffers), those it never
        received: each remembered as adopted, to be delivered (or given back) by the caller."""
        with self._lock:
            self._prune()
            fresh = [m for m in messages if m.tag not in self._received]
            self._remember(m.tag for m in fresh)
            self._adopted.update(m.tag for m in fresh)
            self.count += len(fresh)
        return fresh

    def __len__(self) -> int:
        return len(self._received)

    def _remember(self, tags: Iterable[Tag]) -> None:
        now = self._clock()
        for tag in tags:
            if tag not in self._received:
                self._received.add(tag)
                self._order.append((now, tag))

    def _prune(self) -> None:
        horizon = self._clock() - self._recent
        order = self._order
        while order and order[0][0] < horizon:
            _, tag = order.popleft()
            self._received.discard(tag)
            self._adopted.discard(tag)
