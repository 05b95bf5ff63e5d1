"""Claim rounds and hand-over: fair claims into per-channel buffers, then one delivery at a time."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, cast

from kombu_akadze.consume import rounds
from kombu_akadze.consume.rounds import Round, Window
from kombu_akadze.errors import AkadzeError
from kombu_akadze.store import ClaimedMessage, Store
from kombu_akadze.transport.qos import make_tag

if TYPE_CHECKING:
    from kombu_akadze.transport.channel import Channel

logger = logging.getLogger("kombu_akadze")


def payload_of(message: ClaimedMessage) -> dict[str, Any]:
    """The kombu virtual-transport payload of one claimed row."""
    properties = dict(message.properties)
    delivery_info = dict(properties.get("delivery_info") or {})
    delivery_info["redelivered"] = message.run_count > 1
    # The broker's own facts go with the delivery, never into the producer's headers (as RabbitMQ);
    # a Celery task reads them with kombu_akadze.attempt_of(self.request).
    delivery_info["akadze_message_id"] = message.id
    delivery_info["akadze_attempt"] = message.attempts
    properties["delivery_info"] = delivery_info
    properties["delivery_tag"] = make_tag(message.id, message.run_count)
    properties["body_encoding"] = None
    headers = dict(message.headers)
    if message.run_count > 1 and message.attempts > 1:
        # As a RabbitMQ 4 quorum queue: the failed deliveries before this one, on a redelivery only (a
        # graceful release gives its attempt back, as a quorum queue does not count a return on close).
        headers["x-delivery-count"] = message.attempts - 1
    return {
        "body": message.body,
        "content-type": message.content_type,
        "content-encoding": message.content_encoding,
        "headers": headers,
        "properties": properties,
    }


class Deliverer:
    """Owns the claim-buffer-deliver cycle of one transport (one kombu connection): plans each claim
    round over the consuming channels (consume.rounds), buffers what a claim got on the channel it was
    claimed for, and hands one buffered message at a time to its consumer."""

    def __init__(
        self,
        *,
        store: Store,
        claim: Callable[[list[str], list[int]], list[ClaimedMessage]],
        callbacks: dict[str, Callable[[dict[str, Any]], Any]],
        channels: Callable[[], list[Channel]],
        claim_batch: int,
        owner: str,
    ) -> None:
        self.store = store
        self.owner = owner
        self.claim = claim
        self.callbacks = callbacks
        self.channels = channels
        self.claim_batch = claim_batch
        self._rotation = 0
        #: The windows the last claim said may have more (None: any, after a wake-up). A channel without
        #: a prefetch limit (Celery's remote control) always has free slots, so counting it after its
        #: queue came back empty claimed again and again while the task window was full (a tight loop
        #: of claims for as long as the tasks ran).
        self._may_have_more: set[Any] | None = None
        #: Wake-ups so far, and how many there had been when the claim in flight was planned: one that
        #: came meanwhile may be for a message that claim's snapshot missed, so it keeps every window open.
        #: Wake-ups come from other threads too (LISTEN, the heartbeat's report): _lock keeps the count and
        #: the set together, and the count is read before the plan looks at the set, so a wake-up that
        #: lands while a round is planned counts as after it.
        self._lock = threading.Lock()
        self._woken = 0
        self._planned_at = 0
        #: Windows a report of queues with a claimable message (queues_may_be_ready) opened since the round
        #: in flight was planned: open still once it finishes, whatever it found for its own windows.
        self._opened: set[Any] = set()

    def free_slots(self, channel: Channel) -> int:
        """How many more messages *channel* may hold: its prefetch window less what it holds and buffers
        (claim_batch without a prefetch limit)."""
        buffered = len(channel.claimed)
        qos = channel.qos
        if not qos.prefetch_count:
            return max(self.claim_batch - buffered, 0)
        return max((qos.can_consume_max_estimate() or 0) - buffered, 0)

    def prefetch_windows(self) -> Iterator[tuple[int, int]]:
        """(free slots, prefetch count) of each consuming channel with a prefetch limit (Celery's task
        consumer; its remote control has none), computed as the caller iterates."""
        return (
            (self.free_slots(channel), channel.qos.prefetch_count)
            for channel in self.channels()
            if channel.consuming() and channel.qos.prefetch_count
        )

    def _windows(self, *, woken_only: bool = False) -> list[Window]:
        """Every consuming channel's window; *woken_only*: those that may find more (anything_may_be_ready)."""
        limit = self._may_have_more if woken_only else None
        return [
            Window(owner=channel, queues=channel.consumed_queues(), free=self.free_slots(channel))
            for channel in self.channels()
            if channel.consuming() and (limit is None or channel in limit)
        ]

    def has_free_slot(self) -> bool:
        """Some window that may find more (see anything_may_be_ready) has a free slot."""
        return any(window.free > 0 for window in self._windows(woken_only=True))

    def anything_may_be_ready(self) -> None:
        """A wake-up, the heartbeat's report or the poll: every window may find something again."""
        with self._lock:
            self._woken += 1
            self._may_have_more = None

    def queues_may_be_ready(self, queues: Iterable[str]) -> None:
        """The heartbeat's report: a message is claimable now in *queues*. The windows that consume one of
        them may find more; no other window is opened for it. Opening every window (as a wake-up does)
        made a worker whose task window was full, with a task waiting, claim for Celery's pidbox at every
        beat for nothing. A report that names no queue any consuming window has opens every window."""
        wanted = set(queues)
        owners = {c for c in self.channels() if c.consuming() and not wanted.isdisjoint(c.consumed_queues())}
        if not owners:
            self.anything_may_be_ready()
            return
        with self._lock:
            self._opened |= owners
            if self._may_have_more is not None:
                self._may_have_more |= owners

    def buffered(self) -> int:
        return sum(len(c.claimed) for c in self.channels())

    def plan_round(self, *, woken_only: bool = False) -> Round:
        """What one claim statement should ask for (see consume.rounds.plan), rotated each round. Writes
        the buffered burials and requeues first; acks are left to ride along in the claim statement.
        *woken_only* (the event loop, which tracks wake-ups): only the windows that may find more. One
        whose queues came back empty is parked on them and waits for its wake-up: Celery's pidbox, asked
        at every claim of a busy worker, was claimed and parked on again inside each ack+claim."""
        for channel in self.channels():
            channel.qos.flush(("bury", "requeue"))
        with self._lock:
            self._planned_at = self._woken
            self._opened = set()  # those opened until now are in this plan's windows
        plan = rounds.plan(self._windows(woken_only=woken_only), self._rotation)
        self._rotation += 1
        return plan

    def finish_round(self, plan: Round, claimed: list[ClaimedMessage]) -> tuple[int, bool]:
        """Buffer what the claim of *plan* got on the channels it was claimed for. Returns (claimed, more):
        *more* when claiming again at once may find more (see Round.more)."""
        got: dict[str, int] = {}
        for message in claimed:
            cast("Channel", plan.owner_of[message.queue]).claimed.append(message)
            got[message.queue] = got.get(message.queue, 0) + 1
        owners = plan.more_for(got)
        with self._lock:
            self._may_have_more = (owners | self._opened) if self._woken == self._planned_at else None
        return len(claimed), bool(owners)

    def claim_round(self) -> tuple[int, bool]:
        """One claim statement, on the caller's thread, for every consuming channel (see plan_round)."""
        plan = self.plan_round()
        if not plan.wanted:
            for channel in self.channels():
                channel.qos.flush(("ack",))  # no claim to carry them: write the acks on their own
            return 0, plan.full
        return self.finish_round(plan, self.claim(list(plan.wanted), list(plan.wanted.values())))

    def deliver_one(self) -> bool:
        """Hand one buffered message to its consumer; False when nothing was buffered."""
        for channel in self.channels():
            buffered = channel.claimed
            while buffered:
                message = buffered.popleft()
                callback = self.callbacks.get(message.queue)
                if callback is None:  # the consumer was cancelled meanwhile
                    self.release([message])
                    continue
                callback(payload_of(message))
                return True
        return False

    def release_buffered(self, channel: Channel) -> None:
        buffered = channel.claimed
        messages = list(buffered)
        buffered.clear()
        if messages:
            self.release(messages)

    def release(self, messages: list[ClaimedMessage]) -> None:
        try:
            self.store.message_release([m.tag for m in messages], owner=self.owner)
        except AkadzeError as exc:
            logger.error(
                "kombu-akadze: could not release %d undelivered message(s) (%s); rescued after heartbeat_ttl",
                len(messages),
                exc,
            )
