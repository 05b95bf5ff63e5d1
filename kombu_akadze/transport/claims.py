"""The ack+claim statement of one connection: run on the caller's thread (drain_events, basic_get), or
sent without waiting on Celery's event loop, one at a time. The acks buffered since the last statement
ride in it; requeues and rejects are written before it, as RabbitMQ's channel applies them in order."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from kombu_akadze.consume.batching import batch_wait
from kombu_akadze.consume.outcomes import Outcome
from kombu_akadze.consume.rounds import Round
from kombu_akadze.errors import AkadzeError, TransientDatabaseError
from kombu_akadze.store import ClaimedMessage, Store
from kombu_akadze.transport.consumer import ConsumerLease
from kombu_akadze.transport.delivery import Deliverer
from kombu_akadze.transport.qos import QoS, parse_tag

logger = logging.getLogger("kombu_akadze")

Taken = list[tuple[QoS, list[Outcome]]]

#: After a claim that could not park (a publish to its queue was committing), claim again after this
#: long, doubling while it keeps happening (a user's transaction may hold an enqueue open) up to RETRY_MAX.
RETRY_FIRST = 0.01
RETRY_MAX = 1.0


def celery_tasks_waiting() -> bool:
    """Whether Celery's worker in this process holds a task it received that waits for a pool process.
    celery.worker.state keeps every request the worker reserved and those a pool process accepted (a
    subset); a task received and not accepted yet waits. Outside a worker (that module not loaded, or
    its sets empty) nothing does."""
    state = sys.modules.get("celery.worker.state")
    if state is None:
        return False
    try:
        return len(state.reserved_requests) > len(state.active_requests)
    except (AttributeError, TypeError):  # another Celery's state: never wait on a guess
        return False


def _tags_of(taken: Taken) -> list[tuple[int, int]]:
    return [parse_tag(tag) for _, batch in taken for _, tag in batch]


class ClaimCycle:
    """Implements consume.driver.Claims for the event loop, and claim() for everyone else."""

    def __init__(
        self,
        *,
        store: Store,
        deliverer: Deliverer,
        lease: ConsumerLease,
        qoses: Callable[[], list[QoS]],
        flush_outcomes: Callable[..., None],
        owner: str,
        ack_batch_delay: float = 0.0,
    ) -> None:
        self.store = store
        self.deliverer = deliverer
        self.lease = lease
        self.qoses = qoses
        self.flush_outcomes = flush_outcomes
        self.owner = owner
        #: The longest an outcome waits for more to ride in the same statement (see batch_wait()).
        self.ack_batch_delay = ack_batch_delay
        #: Whether a task this process received waits for a pool process (a test sets its own).
        self.tasks_waiting: Callable[[], bool] = celery_tasks_waiting
        #: The claim round in flight on the command session, and the acks riding in it (event-loop path).
        self._pending: tuple[Round, Taken] | None = None
        #: Its outcome once read: (True, (claimed, acked ids)) or (False, the error it raised).
        self._outcome: tuple[bool, Any] | None = None
        #: How many messages the last event-loop claim got (acks-only rounds leave it alone).
        self._last_claimed = 0
        #: Seconds until the next claim when the last one could not park on some queue; None otherwise.
        self.retry_delay: float | None = None
        #: Told that delay on the event-loop path (the driver schedules a claim).
        self.on_retry: Callable[[float], None] = lambda delay: None

    def claim(self, queues: list[str], limits: list[int]) -> list[ClaimedMessage]:
        """Claim on this thread, carrying the buffered acks of every channel (one round trip)."""
        if not self.lease.may_claim():
            return []
        self.flush_outcomes(kinds=("bury", "requeue"))
        taken = self._take_acks()
        self.lease.claim_started()
        try:
            outcome = self.store.message_ack_claim(
                acks=_tags_of(taken), queues=queues, limits=limits, owner=self.owner, park=self.lease.park_channel()
            )
        except AkadzeError:
            self._acks_failed(taken)  # still ours to write: retried with the next claim or flush
            raise
        finally:
            self.lease.claim_ended()
        self._acks_written(taken, outcome.acked)
        self._note_retry(bool(outcome.retry))
        return self.lease.received(outcome.claimed)

    # -- the event loop's claims (see consume.driver.HubDriver) ---------------

    def start_claim(self, *, claim: bool) -> bool | None:
        """Send the next ack+claim statement on the command session without waiting and return None; or,
        when there is nothing to write or claim, return at once whether more may be ready. *claim* False
        writes outcomes only. The loop watches claim_fd() and calls claim_progress() as data arrives;
        finish_claim() collects the outcome once claim_done()."""
        if self._pending is not None:
            raise RuntimeError("a claim is already in flight")
        if not claim and not self.acks_waiting():
            return False  # nothing to write: the tick after each delivery, while the windows are full
        if claim:
            plan = self.deliverer.plan_round(woken_only=True)
        else:
            self.flush_outcomes(kinds=("bury", "requeue"))
            plan = Round()
        taken = self._take_acks()
        if plan.wanted and not self.lease.may_claim():
            plan = Round()
        if not plan.wanted and not taken:
            return plan.full
        self.lease.claim_started()
        self._pending = (plan, taken)
        self._outcome = None
        store = self.store
        try:
            queues, limits = list(plan.wanted), list(plan.wanted.values())
            store.message_ack_claim_start(
                acks=_tags_of(taken), queues=queues, limits=limits, owner=self.owner, park=self.lease.park_channel()
            )
            if self._loop_idle():  # nothing for the loop to do meanwhile: wait here, claim_done() is True now
                self._outcome = (True, store.message_ack_claim_wait(None))
        except AkadzeError as exc:
            self._outcome = (False, exc)  # raised by finish_claim(), on the loop, like a late error
        return None

    def batch_wait(self) -> float:
        """Seconds the event loop's next statement waits so that more outcomes ride in it (0.0: send it
        now): see consume.batching. The windows are read only if the rule gets that far."""
        buffered = [t for t in (qos.outcomes.oldest() for qos in self.qoses()) if t is not None]
        return batch_wait(
            oldest=min(buffered, default=None),
            now=time.monotonic(),
            delay=self.ack_batch_delay,
            windows=self.deliverer.prefetch_windows(),
            tasks_waiting=self.tasks_waiting(),
        )

    def acks_waiting(self) -> bool:
        """Some ack is buffered, to be written with the next statement."""
        return any(qos.outcomes.pending for qos in self.qoses())

    def claim_fd(self) -> int | None:
        """The socket of the claim in flight (readable: call claim_progress()); None when it is done."""
        if self._pending is None or self._outcome is not None:
            return None
        return self.store.fileno_in_flight()

    def claim_progress(self) -> bool:
        """Read what arrived for the claim in flight; True once its outcome is in (claim_done())."""
        if self._pending is None:
            return False
        if self._outcome is None:
            try:
                outcome = self.store.message_ack_claim_read()
            except AkadzeError as exc:
                self._outcome = (False, exc)
            else:
                if outcome is not None:
                    self._outcome = (True, outcome)
        return self._outcome is not None

    def claim_done(self) -> bool:
        """The claim in flight has its outcome. Reads no socket (only the loop's reader does, after it
        stopped watching it), but takes an outcome another statement on the session read first."""
        if self._pending is None:
            return False
        if self._outcome is None and self.store.claim_landed():
            self.claim_progress()
        return self._outcome is not None

    def finish_claim(self) -> bool:
        """Collect the statement start_claim() sent (it must be done): buffer the claimed messages, report
        the acks; returns whether more may be ready. Raises what the statement raised."""
        pending, self._pending = self._pending, None
        outcome, self._outcome = self._outcome, None
        if pending is None:
            return False
        plan, taken = pending
        self.lease.claim_ended()
        if outcome is None:
            raise RuntimeError("finish_claim() before the claim was done")
        ok, value = outcome
        if not ok:
            self._acks_failed(taken)  # still ours to write: retried with the next claim or flush
            raise value
        self._acks_written(taken, value.acked)
        if plan.wanted:
            self._last_claimed = len(value.claimed)
            self._note_retry(bool(value.retry))
            if self.retry_delay is not None:
                self.on_retry(self.retry_delay)
        return self.deliverer.finish_round(plan, self.lease.received(value.claimed))[1]

    def settle_claim(self, timeout: float) -> None:
        """At stop: wait for a statement in flight and buffer its messages, so closing the channel gives
        them back in place (attempt not spent) instead of leaving them to rescue."""
        if self._pending is None:
            return
        if self._outcome is None:
            try:
                outcome = self.store.message_ack_claim_wait(timeout)
            except AkadzeError as exc:
                self._outcome = (False, exc)
            else:
                if outcome is None:
                    logger.error(
                        "kombu-akadze: a claim was still running after %.0f s at stop; what it claims is "
                        "rescued after heartbeat_ttl",
                        timeout,
                    )
                    self.store.close()
                    self._outcome = (False, TransientDatabaseError("claim abandoned at stop"))
                else:
                    self._outcome = (True, outcome)
        try:
            self.finish_claim()
        except AkadzeError as exc:
            logger.warning("kombu-akadze: the last claim before stop failed: %s", exc)

    def _note_retry(self, retry: bool) -> None:
        """A queue the claim came back short for could not be parked on: a publish to it is committing
        (or a transaction that enqueued to it is still open), so no wake-up will come for that message;
        claim again soon, backing off while it lasts."""
        if not retry:
            self.retry_delay = None
        else:
            self.retry_delay = RETRY_FIRST if self.retry_delay is None else min(2 * self.retry_delay, RETRY_MAX)

    def _loop_idle(self) -> bool:
        """No message delivered and unsettled, none buffered, and the last claim found nothing: a task
        arriving now waits on the claim alone, so going back to the loop would only add latency."""
        if self._last_claimed or self.deliverer.buffered():
            return False
        return not any(qos.holds_unsettled() for qos in self.qoses())

    def _take_acks(self) -> Taken:
        taken = [(qos, qos.outcomes.take(("ack",))) for qos in self.qoses()]
        return [(qos, batch) for qos, batch in taken if batch]

    @staticmethod
    def _acks_failed(taken: Taken) -> None:
        for qos, batch in taken:
            qos.outcomes.done(batch, failed=batch)

    @staticmethod
    def _acks_written(taken: Taken, done: set[int]) -> None:
        for qos, batch in taken:
            qos.outcomes.done(batch)
            qos.report("ack", [parse_tag(tag) for _, tag in batch], done)
