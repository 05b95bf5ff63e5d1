"""Claim rounds and hand-over: fair claims into per-channel buffers, then one delivery at a time."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kombu_akadze.errors import AkadzeError
from kombu_akadze.store import ClaimedMessage, Store
from kombu_akadze.transport.qos import make_tag

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


def buffer_of(channel: Any) -> deque[ClaimedMessage]:
    """Messages claimed for *channel* and not yet handed to its consumer (held, counted as prefetched)."""
    buffered: deque[ClaimedMessage] | None = getattr(channel, "_akadze_claimed", None)
    if buffered is None:
        buffered = deque()
        channel._akadze_claimed = buffered
    return buffered


def free_slots(channel: Any, claim_batch: int) -> int:
    """How many more messages *channel* may hold: its prefetch window minus what it holds and buffers."""
    if not channel._consumers:
        return 0
    qos = channel.qos
    buffered = len(buffer_of(channel))
    if not qos.prefetch_count:
        return max(claim_batch - buffered, 0)
    return max((qos.can_consume_max_estimate() or 0) - buffered, 0)


def split_slots(free: int, queues: int) -> list[int]:
    """Share *free* slots between *queues* as evenly as possible, earlier queues first."""
    base, extra = divmod(free, queues)
    return [base + (1 if i < extra else 0) for i in range(queues)]


def rotate(items: list[str], by: int) -> list[str]:
    if not items:
        return []
    k = by % len(items)
    return items[k:] + items[:k]


@dataclass
class Round:
    """One claim round's plan: slots per queue, the channel each queue's messages go to."""

    wanted: dict[str, int] = field(default_factory=dict)
    owner_of: dict[str, Any] = field(default_factory=dict)
    #: Some channel's window was full: a claim as soon as a slot frees may find more.
    more: bool = False
    #: Some queue got no slot this round (fewer free slots than queues).
    left_out: bool = False


class Deliverer:
    """Owns the claim-buffer-deliver cycle of one transport (one kombu connection)."""

    def __init__(
        self,
        *,
        store: Store,
        claim: Callable[[list[str], list[int]], list[ClaimedMessage]],
        callbacks: dict[str, Callable[[dict[str, Any]], Any]],
        channels: Callable[[], list[Any]],
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

    def has_free_slot(self) -> bool:
        return any(free_slots(c, self.claim_batch) > 0 for c in self.channels())

    def buffered(self) -> int:
        return sum(len(buffer_of(c)) for c in self.channels())

    def plan_round(self) -> Round:
        """What one claim statement should ask for: every consuming channel's free slots, shared fairly
        between its queues (rotated each round). Writes the buffered burials and requeues first; acks
        are left to ride along in the claim statement."""
        plan = Round()
        for channel in self.channels():
            channel.qos.flush(("bury", "requeue"))
            if not channel._consumers:
                continue
            free = free_slots(channel, self.claim_batch)
            if free <= 0:
                plan.more = True
                continue
            queues = rotate(list(dict.fromkeys(channel._active_queues)), self._rotation)
            for queue, n in zip(queues, split_slots(free, len(queues)), strict=True):
                if n <= 0:
                    plan.left_out = True
                elif queue not in plan.wanted:
                    plan.wanted[queue] = n
                    plan.owner_of[queue] = channel
        self._rotation += 1
        return plan

    def finish_round(self, plan: Round, claimed: list[ClaimedMessage]) -> tuple[int, bool]:
        """Buffer what the claim of *plan* got. Returns (claimed, more): *more* when some claim filled
        its slots or some channel's window was full, i.e. a claim as soon as a slot frees may find more."""
        got: dict[str, int] = {}
        for message in claimed:
            buffer_of(plan.owner_of[message.queue]).append(message)
            got[message.queue] = got.get(message.queue, 0) + 1
        more = plan.more or any(got.get(q, 0) >= n for q, n in plan.wanted.items())
        # Slots left free while some queue was not asked: the next round (rotated) asks it at once.
        more = more or (plan.left_out and len(claimed) < sum(plan.wanted.values()))
        return len(claimed), more

    def claim_round(self) -> tuple[int, bool]:
        """One claim statement, on the caller's thread, for every consuming channel (see plan_round)."""
        plan = self.plan_round()
        if not plan.wanted:
            for channel in self.channels():
                channel.qos.flush(("ack",))  # no claim to carry them: write the acks on their own
            return 0, plan.more
        return self.finish_round(plan, self.claim(list(plan.wanted), list(plan.wanted.values())))

    def deliver_one(self) -> bool:
        """Hand one buffered message to its consumer; False when nothing was buffered."""
        for channel in self.channels():
            buffered = buffer_of(channel)
            while buffered:
                message = buffered.popleft()
                callback = self.callbacks.get(message.queue)
                if callback is None:  # the consumer was cancelled meanwhile
                    self.release([message])
                    continue
                callback(payload_of(message))
                return True
        return False

    def release_buffered(self, channel: Any) -> None:
        buffered = buffer_of(channel)
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
