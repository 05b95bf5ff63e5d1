"""Claim rounds: what one claim statement asks for, shared fairly between channels and their queues.

Pure planning: the transport describes each consuming channel as a Window (its queues, its free
prefetch slots) and gets back a Round (slots per queue, the window each queue's messages go to); after
the claim, more() says whether claiming again at once may find more.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Window:
    """One consuming channel as a round sees it."""

    owner: Hashable
    queues: Sequence[str]
    #: How many more messages it may hold: its prefetch window less what it holds and buffers.
    free: int


@dataclass
class Round:
    """One claim round's plan."""

    wanted: dict[str, int] = field(default_factory=dict)
    owner_of: dict[str, Hashable] = field(default_factory=dict)
    #: The windows that were full (a claim as soon as a slot frees may find more), and those with a
    #: queue that got no slot this round (fewer free slots than queues).
    full_owners: set[Hashable] = field(default_factory=set)
    left_out_owners: set[Hashable] = field(default_factory=set)

    @property
    def full(self) -> bool:
        """Some window was full."""
        return bool(self.full_owners)

    @property
    def left_out(self) -> bool:
        """Some queue got no slot this round."""
        return bool(self.left_out_owners)

    def more_for(self, got: dict[str, int]) -> set[Hashable]:
        """After the claim got *got* messages per queue, the windows for which claiming again at once may
        find more: a full window, one with a queue that filled its slots, and one with a queue left out
        while slots went unused (the next round, rotated, asks it first). A window whose queues all came
        back short found them empty, and claiming for it again at once would only find them empty again
        (it waits for a wake-up, as a consumer parked on them)."""
        owners = set(self.full_owners)
        owners.update(self.owner_of[q] for q, n in self.wanted.items() if got.get(q, 0) >= n)
        if self.left_out and sum(got.values()) < sum(self.wanted.values()):
            owners.update(self.left_out_owners)
        return owners


def split_slots(free: int, queues: int) -> list[int]:
    """Share *free* slots between *queues* as evenly as possible, earlier queues first."""
    base, extra = divmod(free, queues)
    return [base + (1 if i < extra else 0) for i in range(queues)]


def rotate(items: Sequence[str], by: int) -> list[str]:
    if not items:
        return []
    k = by % len(items)
    return [*items[k:], *items[:k]]


def plan(windows: Sequence[Window], rotation: int) -> Round:
    """Every window's free slots, shared between its queues starting at queue *rotation* (the caller
    rotates each round, so no queue of a channel starves when slots are fewer than queues). A queue
    consumed by two windows is claimed for the first one only, in this round."""
    result = Round()
    for window in windows:
        if window.free <= 0:
            result.full_owners.add(window.owner)
            continue
        queues = rotate(list(dict.fromkeys(window.queues)), rotation)
        if not queues:
            continue
        for queue, n in zip(queues, split_slots(window.free, len(queues)), strict=True):
            if n <= 0:
                result.left_out_owners.add(window.owner)
            elif queue not in result.wanted:
                result.wanted[queue] = n
                result.owner_of[queue] = window.owner
    return result
