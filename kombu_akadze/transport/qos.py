"""QoS: kombu's prefetch window; delivery tags are (row id, run_count); outcomes are buffered (consume.outcomes)
and written as fenced statements on the row the tag names, never a copy."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kombu.transport import virtual

from kombu_akadze.consume.outcomes import KINDS, OutcomeBuffer
from kombu_akadze.errors import AkadzeError, TransientDatabaseError
from kombu_akadze.store import Tag

if TYPE_CHECKING:
    from kombu_akadze.transport.channel import Channel

logger = logging.getLogger("kombu_akadze")

REJECT_REASON = "rejected by consumer (requeue=False)"


def make_tag(message_id: int, run_count: int) -> str:
    return f"{message_id}:{run_count}"


def parse_tag(delivery_tag: Any) -> Tag:
    """'id:run_count' back to its parts; anything else is a programming error, said loudly."""
    try:
        message_id, run_count = str(delivery_tag).split(":")
        return int(message_id), int(run_count)
    except ValueError:
        raise ValueError(
            f"{delivery_tag!r} is not a kombu-akadze delivery tag (expected 'message_id:run_count')"
        ) from None


class QoS(virtual.QoS):
    """Prefetch accounting from kombu; outcomes written to the row the tag names, never a copy.

    Outcomes (ack, requeue, bury) are buffered and written in one fenced statement per kind: at once
    without an event loop, at the end of the event-loop tick with one (batched acks). A lost buffered
    ack only means a redelivery, as with RabbitMQ's unconfirmed acks; a graceful stop flushes them.
    """

    channel: Channel

    def __init__(self, channel: Channel, prefetch_count: int = 0) -> None:
        super().__init__(channel, prefetch_count)
        self.outcomes = OutcomeBuffer()
        # Kept past the channel's close (kombu sets channel.connection to None): a task that was running
        # when Celery dropped a broken connection still settles its message, fenced, on this transport.
        self._transport = channel.connection

    def ack(self, delivery_tag: str) -> None:
        self._settle("ack", delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        self._settle("requeue" if requeue else "bury", delivery_tag)

    def forget(self, delivery_tag: str) -> None:
        """A delivery to a no_ack consumer: its row goes at once, as RabbitMQ forgets the message when it
        sends it; it never took a prefetch slot, so there is none to free."""
        self._settle("ack", delivery_tag, tracked=False)

    def _settle(self, kind: str, delivery_tag: str, *, tracked: bool = True) -> None:
        parse_tag(delivery_tag)  # a foreign tag fails here, loudly, before anything is buffered
        self.outcomes.add(kind, delivery_tag)
        if tracked:
            self._quick_ack(delivery_tag)  # the prefetch slot is free now; the row follows at the flush
        if self.channel.connection is None:
            self._flush_after_close()
        elif not self._transport.outcome_flush_scheduled():
            self.flush()

    def _flush_after_close(self) -> None:
        """The channel closed under a running task: nobody flushes for us any more, so write now on the
        transport's session (opened again for this, and closed again if the whole connection is closed).
        Fenced as ever: a run released at the close, or rescued since, changes nothing and runs again.
        An outcome that cannot be written now stays buffered and is written with the next outcome settled
        on this channel; meanwhile its message stays held, and is rescued after heartbeat_ttl once this
        consumer's heartbeat stops (one more run), after which the late write changes nothing. Nothing is
        cleared here: another thread may have buffered an outcome of its own while this write failed."""
        try:
            self.flush()
        finally:
            if not self._transport.channels:
                self._transport.store.close()

    def due(self, batch: int, delay: float) -> bool:
        """Whether buffered outcomes should be written now: *batch* of them, or the oldest *delay* s old."""
        return self.outcomes.due(batch, delay)

    def holds_unsettled(self) -> bool:
        """Some message was delivered to this channel and not acked, rejected or requeued yet."""
        return len(self._delivered) > len(self._dirty)

    @property
    def pending(self) -> int:
        return self.outcomes.pending

    def held_ids(self) -> set[int]:
        """Row ids this channel holds: delivered and not settled, or settled with the outcome not yet
        written (buffered, or being written). The heartbeat's reconcile leaves them alone."""
        return {parse_tag(tag)[0] for tag in [*self.outcomes.tags(), *list(self._delivered)]}

    def flush(self, kinds: tuple[str, ...] = KINDS) -> int:
        """Write the buffered outcomes of *kinds*, one statement per kind; returns how many still wait."""
        return self.outcomes.flush(self._write, kinds)

    def flush_and_wait(self, timeout: float) -> None:
        """Write what is buffered, and wait (up to *timeout* seconds) for what another thread is writing
        (the heartbeat's flush, DelayedFlush): afterwards every outcome settled so far is written, or
        failed and buffered again, then written once more here."""
        self.flush()
        if self.outcomes.wait_written(timeout) and self.outcomes.pending:
            self.flush()

    def _write(self, kind: str, dtags: list[str]) -> bool:
        tags = [parse_tag(d) for d in dtags]
        store = self._transport.store
        try:
            if kind == "ack":
                done = store.message_ack(tags, owner=self._transport.consumer_id)
            elif kind == "bury":
                done = store.message_bury(tags, reason=REJECT_REASON, owner=self._transport.consumer_id)
            else:
                outcome = store.message_requeue(
                    tags, max_attempts=self._transport.options.max_attempts, owner=self._transport.consumer_id
                )
                done = set(outcome.ready | outcome.dead)
                for message_id in sorted(outcome.dead):
                    logger.warning(
                        "kombu-akadze: message id=%s used up its attempts; moved to dead letters", message_id
                    )
        except TransientDatabaseError as exc:
            logger.error(
                "kombu-akadze: %s of %d message(s) failed (%s); they stay held and the %s is retried "
                "while their leases are ours",
                kind,
                len(tags),
                exc,
                kind,
            )
            return False
        self.report(kind, tags, done)
        return True

    def report(self, kind: str, tags: list[tuple[int, int]], done: set[int]) -> None:
        """Log every outcome that changed nothing (fenced: the run is not ours any more)."""
        for message_id, run_count in tags:
            if message_id not in done:
                logger.warning(
                    "kombu-akadze: %s of message id=%s run_count=%s changed nothing: that run is not ours any "
                    "more (its lease was rescued after a missed heartbeat, or the message is gone); the "
                    "newer run stands",
                    kind,
                    message_id,
                    run_count,
                )
                self._transport.fenced_outcomes += 1

    def flush_at_close(self) -> None:
        """Write what is buffered before the channel closes. An error no retry fixes is logged, not raised:
        the close must go on (held messages released, heartbeat stopped); the outcomes it could not write
        stay held until rescue after heartbeat_ttl, which means one more run."""
        try:
            self.flush()
        except AkadzeError as exc:
            logger.error("kombu-akadze: buffered outcomes could not be written at close (%s); closing anyway", exc)

    def restore_unacked_once(self, stderr: Any = None) -> None:
        """At close: write buffered outcomes even when nothing is left unacked (kombu skips then)."""
        self.flush_at_close()
        super().restore_unacked_once(stderr)

    def restore_unacked(self) -> list[tuple[BaseException, Any]]:
        """Give back every held, unsettled message in place, attempt not spent (one statement)."""
        self.flush_at_close()
        self._flush()
        delivered = self._delivered
        tags = [parse_tag(dtag) for dtag in list(delivered) if dtag not in self._dirty]
        delivered.clear()
        if not tags:
            return []
        try:
            released = self.channel.store.message_release(tags, owner=self._transport.consumer_id)
        except AkadzeError as exc:
            logger.error(
                "kombu-akadze: could not release %d held message(s) (%s); they stay held and are "
                "rescued once this consumer's heartbeat is older than heartbeat_ttl",
                len(tags),
                exc,
            )
            return []
        stale = len(tags) - len(released)
        logger.info("kombu-akadze: released %d held message(s) in place", len(released))
        if stale:
            logger.info("kombu-akadze: %d held message(s) were no longer ours at release", stale)
        return []
