"""The event-loop driver: Celery's hub runs consumption, one claim statement in flight at a time."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

from kombu_akadze.consume.wakeups import Waker, jittered


class ListenSocket(Protocol):
    """The consumer's LISTEN as the driver sees it (consume.listener.Listener): whether it is armed. Its
    wake-ups reach the loop through the waker (the heartbeat's thread waits on the socket)."""

    @property
    def armed(self) -> bool: ...


class Claims(Protocol):
    """The transport's event-loop claims: one statement at a time, sent without waiting for it."""

    def start_claim(self, *, claim: bool) -> bool | None: ...
    def claim_fd(self) -> int | None: ...
    def claim_progress(self) -> bool: ...
    def claim_done(self) -> bool: ...
    def finish_claim(self) -> bool: ...
    def settle_claim(self, timeout: float) -> None: ...
    def acks_waiting(self) -> bool: ...
    def batch_wait(self) -> float: ...


#: How long a stop waits for the claim statement in flight, so what it claims goes back in place.
SETTLE_TIMEOUT = 30.0

#: After a handoff took a window's last parked slot: how long the window waits for an outcome to carry its
#: claim (which parks it again) before it claims on its own.
REPARK_DELAY = 0.005


class HubDriver:
    """Celery's event loop (kombu hub) drives consumption: a wake-up (the waker, poked by the LISTEN
    wait on the heartbeat's thread) -> claim; while LISTEN is not armed a jittered poll claims. The
    claim statement (which also writes the acks of the ticks since the last one) is sent without
    waiting, one at a time, and its session's socket is a reader of the hub, so the loop keeps handing
    results and tasks to the pool meanwhile and delivers as soon as the result is read."""

    def __init__(
        self,
        *,
        hub: Any,
        listener: ListenSocket,
        claims: Claims,
        deliver_one: Callable[[], bool],
        buffered: Callable[[], int],
        has_free_slot: Callable[[], bool],
        poll_interval: float,
        listen_poll_interval: float,
        waker: Waker,
        check: Callable[[], None] = lambda: None,
        on_ready: Callable[[], None] = lambda: None,
    ) -> None:
        self.hub = hub
        self.waker = waker
        self.listener = listener
        self.claims_of = claims
        self.deliver_one = deliver_one
        self.buffered = buffered
        self.has_free_slot = has_free_slot
        self.poll_interval = poll_interval
        self.listen_poll_interval = listen_poll_interval
        self.check = check
        #: Told when something may be ready anywhere (wake(ready=True)): has_free_slot counts every window.
        self.on_ready = on_ready
        self._claim_fd: int | None = None
        self._loop_thread: int | None = None
        self._timer: Any = None
        self._soon: Any = None
        self._stopped = False
        self._in_flight = False
        #: A wake() on the loop's own thread (an ack from a pool result, a timer): the hub's on_tick
        #: runs the tick before its next poll, with no pipe write, poll wake-up and read for it.
        self._tick_wanted = False
        #: Whether a claim could find something: set by wake-ups, the poll and full claims;
        #: cleared when a claim is sent, so acks alone cost no empty claims. A wake-up that arrives
        #: while a claim is in flight sets it again: that claim's snapshot may predate the message.
        self.maybe_ready = True
        #: Wake-ups with ready=True so far, under _ready_lock with maybe_ready: the loop clears
        #: maybe_ready only if none came since it decided to claim. A wake-up from the LISTEN thread
        #: can land while the loop waits for a claim it sent (an idle loop waits where it sent it);
        #: cleared after it unconditionally, that wake-up was lost until the heartbeat's report.
        self._ready_lock = threading.Lock()
        self._readies = 0
        self.claims = 0
        #: A handoff took the last slot a window was parked with (see repark()); the timer that claims for
        #: it if no outcome carries that claim first.
        self._repark = False
        self._repark_timer: Any = None
        #: The timer that sends the statement whose outcomes wait for more to ride along (see batch_wait).
        self._batch_timer: Any = None

    def start(self) -> None:
        self._loop_thread = threading.get_ident()
        # The waker is a reader of the hub: wake() from a pool-result callback, the heartbeat or
        # this driver itself makes the hub's next poll return at once, never after a poll timeout.
        self.hub.add_reader(self.waker.fileno(), self._on_wake)
        self.hub.on_tick.add(self._on_hub_tick)
        self.wake(ready=True)
        self._schedule_poll()

    @property
    def running(self) -> bool:
        return not self._stopped

    def stop(self) -> None:
        self._stopped = True
        self.hub.remove_reader(self.waker.fileno())
        self.hub.on_tick.discard(self._on_hub_tick)
        for timer in (self._timer, self._soon, self._repark_timer, self._batch_timer):
            if timer is not None:
                timer.cancel()
        self._timer = self._soon = self._repark_timer = self._batch_timer = None
        self.unwatch_claim()
        if self._in_flight:
            self._in_flight = False
            self.claims_of.settle_claim(SETTLE_TIMEOUT)

    def wake(self, *, ready: bool = False, anywhere: bool = True) -> None:
        """Write outcomes and (if anything may be ready) claim at the end of this tick; calls coalesce.
        *anywhere* False: the caller opened the windows that may find something itself (the heartbeat's
        report names its queues), so on_ready is not told."""
        if ready:
            if anywhere:
                self.on_ready()
            with self._ready_lock:
                self.maybe_ready = True
                self._readies += 1
        if self._stopped:
            return
        if self.on_loop_thread():
            self._tick_wanted = True
        else:
            self.waker.wake()

    def repark(self) -> None:
        """A handoff took the last slot a window was parked with (any thread): the window must claim to park
        again. Not at once: the task just handed over acks in a moment (a fast one, before the next tick),
        and its ack statement carries the claim, one statement instead of two; a task that takes longer
        leaves the window unparked REPARK_DELAY s at most, then it claims on its own."""
        self._repark = True
        self.wake()

    def _repark_due(self) -> None:
        self._repark_timer = None
        if self._repark:
            self._repark = False
            self.wake(ready=True)

    def _on_wake(self, *args: Any) -> None:
        self.waker.drain()
        self._tick()

    def _on_hub_tick(self) -> None:
        """The hub's on_tick, right before each poll: the tick a wake() on the loop thread asked for. It
        writes outcomes and sends claims but delivers nothing: Celery checks for a stop between two turns
        of its loop, not here, and the pool may have set its writers for this poll already. A message to
        deliver goes through the waker, to the next turn."""
        if self._tick_wanted:
            self._tick_wanted = False
            self._tick(deliver=False)

    def _tick(self, *, deliver: bool = True) -> None:
        if self._stopped:
            return
        self._collect()
        # One message per turn of the loop, so Celery can stop (warm shutdown) between two of them. After
        # the last one buffered, the next claim goes out in this same turn: a wake-up for it would cost
        # the loop one more turn (a pipe write, a poll, a read) for every message.
        if deliver:
            if self.deliver_one() and self.buffered():
                self.waker.wake()
                return
        elif self.buffered():
            self.waker.wake()
            return
        if self._in_flight:
            return  # its completion wakes the loop; the acks meanwhile ride with the next claim
        wait = self.claims_of.batch_wait()
        if wait > 0:
            self._batch_later(wait)  # more acks ride in the statement; maybe_ready stays as it is
            return
        readies = self._readies  # before the decision: a wake-up from here on keeps maybe_ready set
        claim = self._claim_wanted()
        started = self.claims_of.start_claim(claim=claim)
        if started is not None:
            if claim and not started:
                self._not_ready_since(readies)  # nothing to claim: more only if some window was full
            return
        self._in_flight = True
        if claim:
            self.claims += 1
            self._not_ready_since(readies)
        if self.claims_of.claim_done():  # it ran here (the loop was idle): deliver without another tick
            self._collect()
            # Deliver one and let the next turn see to the rest; from on_tick, leave it all to that turn.
            next_turn = self.deliver_one() if deliver else self.buffered() > 0
            if next_turn:
                self.waker.wake()
        else:
            self._watch_claim()

    def _batch_later(self, wait: float) -> None:
        """The buffered outcomes wait *wait* seconds for more (consume.batching): a tick then, unless one is
        due already (the oldest outcome only gets older, so the first timer is never late)."""
        if self._batch_timer is None and not self._stopped:
            self._batch_timer = self.hub.call_later(wait, self._batch_due)

    def _batch_due(self) -> None:
        self._batch_timer = None
        self.wake()

    def _claim_wanted(self) -> bool:
        """Whether this tick's statement claims: something may be ready, or a window must park again and
        acks are going out anyway (see repark()); and some window that may find more has a free slot."""
        reparking = self._repark
        if reparking and self._repark_timer is None and not self._stopped:
            self._repark_timer = self.hub.call_later(REPARK_DELAY, self._repark_due)
        want = self.maybe_ready or (reparking and self.claims_of.acks_waiting())
        claim = want and self.has_free_slot()
        if claim and reparking:
            self._repark = False
            if self._repark_timer is not None:
                self._repark_timer.cancel()
                self._repark_timer = None
        return claim

    def claim_soon(self, delay: float) -> None:
        """Claim again in *delay* seconds (a claim could not park: no wake-up will come for what is being
        published), unless a claim is due sooner anyway."""
        if self._stopped or self._soon is not None:
            return

        def due() -> None:
            self._soon = None
            self.wake(ready=True)

        self._soon = self.hub.call_later(delay, due)

    def _watch_claim(self) -> None:
        fd = self.claims_of.claim_fd()
        if fd is not None:
            self.hub.add_reader(fd, self._on_claim_readable)
            self._claim_fd = fd

    def on_loop_thread(self) -> bool:
        return threading.get_ident() == self._loop_thread

    def unwatch_claim(self) -> None:
        """Stop watching the claim's socket (before anything may close it: its number can be reused)."""
        fd, self._claim_fd = self._claim_fd, None
        if fd is not None:
            self.hub.remove_reader(fd)

    def _on_claim_readable(self, *args: Any) -> None:
        self.unwatch_claim()  # reading may fail and close the session
        if self._stopped:
            return
        if not self.claims_of.claim_progress():
            self._watch_claim()  # part of the result only: wait for the rest
            return
        self._tick()  # collect, deliver and claim again in this tick: the hot path

    def _collect(self) -> None:
        if self._in_flight and self.claims_of.claim_done():
            self.unwatch_claim()
            self._in_flight = False
            more = self.claims_of.finish_claim()  # raises a connection error: Celery reconnects
            if more:
                with self._ready_lock:
                    self.maybe_ready = True

    def _not_ready_since(self, readies: int) -> None:
        """Clear maybe_ready, unless a wake-up came after the loop read *readies* (self._readies)."""
        with self._ready_lock:
            if self._readies == readies:
                self.maybe_ready = False

    def _on_poll(self) -> None:
        self._timer = None
        if self._stopped:
            return
        try:
            self.check()  # raises a connection error once our leases are lost: Celery reconnects
            if not self.listener.armed:
                # Polling (no LISTEN). While LISTEN is armed the poll claims nothing: the heartbeat
                # reports claimable messages (a lost wake-up), and a re-armed LISTEN wakes the loop.
                self.wake(ready=True)
        finally:
            self._schedule_poll()

    def _schedule_poll(self) -> None:
        if not self._stopped:
            armed = self.listener.armed
            interval = self.listen_poll_interval if armed else self.poll_interval
            self._timer = self.hub.call_later(jittered(interval), self._on_poll)
