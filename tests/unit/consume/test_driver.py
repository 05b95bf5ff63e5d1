"""The event-loop driver's state machine without a database or kombu: a recording hub, a scripted claim
statement, and LISTEN as the driver sees it (armed or not; its wake-ups come through the waker, as the
heartbeat's thread sends them). One claim in flight at a time; a wake-up during it is not lost; a stop
settles what is in flight."""

from __future__ import annotations

import select
import threading
from collections.abc import Callable
from typing import Any

from kombu_akadze.consume.driver import REPARK_DELAY, HubDriver
from kombu_akadze.consume.wakeups import Waker

CLAIM_FD = 901


class Hub:
    def __init__(self) -> None:
        self.readers: dict[int, Callable[..., Any]] = {}
        self.timers: list[Timer] = []
        self.on_tick: set[Callable[[], Any]] = set()

    def add_reader(self, fd: int, callback: Callable[..., Any], *args: Any) -> None:
        self.readers[fd] = callback

    def remove_reader(self, fd: int) -> None:
        self.readers.pop(fd, None)

    def call_later(self, delay: float, callback: Callable[[], Any]) -> Timer:
        timer = Timer(delay, callback)
        self.timers.append(timer)
        return timer

    def fire(self, fd: int) -> None:
        self.readers[fd]()

    def iterate(self, waker: Waker) -> None:
        """One turn of kombu's loop: the on_tick callbacks, then the poll (here: the waker, if written)."""
        for callback in list(self.on_tick):
            callback()
        if readable(waker) and waker.fileno() in self.readers:
            self.fire(waker.fileno())


def readable(waker: Waker) -> bool:
    return bool(select.select([waker.fileno()], [], [], 0)[0])


class Timer:
    def __init__(self, delay: float, callback: Callable[[], Any]) -> None:
        self.delay, self.callback, self.cancelled = delay, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class Socket:
    """The LISTEN as the driver sees it: armed or not. A wake-up is driver.wake(ready=True) (see notify)."""

    def __init__(self) -> None:
        self.armed = True


def notify(driver: HubDriver, hub: Hub) -> None:
    """A NOTIFY read on the heartbeat's thread: it wakes the loop (through the waker), which runs its
    next tick."""
    other = threading.Thread(target=driver.wake, kwargs={"ready": True})
    other.start()
    other.join()
    assert readable(driver.waker)
    hub.iterate(driver.waker)


class Statement:
    """The ack+claim statement. start_claim() sends it (None) unless there is nothing to do; it completes
    when the test says so (arrive()); finish_claim() buffers *batch* messages for delivery."""

    def __init__(self) -> None:
        self.sent: list[bool] = []
        self.in_flight = False
        self.arrived = False
        self.inline = False
        self.batch = 1
        self.more = False
        self.buffered: list[str] = []
        self.settled: list[float] = []
        self.n = 0
        #: Run inside start_claim() once the statement is sent (what another thread does meanwhile).
        self.during: Callable[[], None] = lambda: None
        #: Whether an ack is buffered (what the next statement would write anyway).
        self.acks = False
        #: What batch_wait() answers: seconds the next statement waits for more acks.
        self.wait = 0.0

    def acks_waiting(self) -> bool:
        return self.acks

    def batch_wait(self) -> float:
        return self.wait

    def start_claim(self, *, claim: bool) -> bool | None:
        assert not self.in_flight, "a second claim while one is in flight"
        self.sent.append(claim)
        if not claim:
            return False  # no acks in this script: nothing to write, nothing sent
        self.in_flight, self.arrived = True, self.inline
        self.during()
        return None

    def claim_fd(self) -> int | None:
        return None if self.arrived else CLAIM_FD

    def claim_progress(self) -> bool:
        return self.arrived

    def claim_done(self) -> bool:
        return self.in_flight and self.arrived

    def finish_claim(self) -> bool:
        assert self.in_flight
        assert self.arrived
        self.in_flight = self.arrived = False
        for _ in range(self.batch):
            self.n += 1
            self.buffered.append(f"m{self.n}")
        return self.more

    def settle_claim(self, timeout: float) -> None:
        self.settled.append(timeout)
        self.in_flight = False

    def arrive(self) -> None:
        self.arrived = True


def rig(*, free: bool = True) -> tuple[HubDriver, Hub, Socket, Statement, list[str]]:
    hub, socket, statement, delivered = Hub(), Socket(), Statement(), []
    waker = Waker()

    def deliver_one() -> bool:
        if statement.buffered:
            delivered.append(statement.buffered.pop(0))
            return True
        return False

    driver = HubDriver(
        hub=hub,
        listener=socket,
        claims=statement,
        deliver_one=deliver_one,
        buffered=lambda: len(statement.buffered),
        has_free_slot=lambda: free,
        poll_interval=1.0,
        listen_poll_interval=10.0,
        waker=waker,
    )
    driver.start()
    return driver, hub, socket, statement, delivered


def claim_lands(driver: HubDriver, hub: Hub, statement: Statement) -> None:
    """A turn of the loop sends a claim; its result arrives and the loop's reader of its socket runs."""
    tick(driver, hub)
    statement.arrive()
    hub.fire(CLAIM_FD)


def tick(driver: HubDriver, hub: Hub) -> None:
    """One loop iteration: a wake() on the loop's thread (rig() calls start() on it) is run by on_tick."""
    hub.iterate(driver.waker)


def test_start_watches_the_waker_only_and_schedules_the_safety_poll() -> None:
    driver, hub, _, _, _ = rig()
    assert set(hub.readers) == {driver.waker.fileno()}
    assert len(hub.timers) == 1
    assert 5.0 <= hub.timers[0].delay <= 10.0  # the LISTEN-armed poll, jittered into its upper half
    assert driver.maybe_ready


def test_a_claim_is_sent_then_its_socket_watched_and_its_messages_delivered_when_it_arrives() -> None:
    driver, hub, _, statement, delivered = rig()
    tick(driver, hub)
    assert statement.sent == [True]
    assert CLAIM_FD in hub.readers  # the loop goes on; the statement's socket tells when rows arrive
    statement.arrive()
    hub.fire(CLAIM_FD)
    assert delivered == ["m1"]
    assert CLAIM_FD not in hub.readers


def test_a_wake_on_the_loop_thread_is_run_before_the_next_poll_without_the_pipe() -> None:
    driver, hub, _, statement, _ = rig()
    assert not readable(driver.waker)  # start()'s own wake-up: on_tick runs it, nothing written
    for callback in list(hub.on_tick):
        callback()
    assert statement.sent == [True]
    statement.arrive()
    hub.fire(CLAIM_FD)
    sent = len(statement.sent)
    driver.wake()  # an ack from a pool result, on the loop thread
    assert not readable(driver.waker)
    assert len(statement.sent) == sent  # nothing yet: the acks of this turn go out together
    tick(driver, hub)
    assert statement.sent[sent:] == [False]  # the acks written (no window may find more: no claim)
    driver.stop()
    assert driver._on_hub_tick not in hub.on_tick


def test_after_the_last_buffered_message_the_next_claim_goes_out_in_the_same_tick() -> None:
    driver, hub, _, statement, delivered = rig()
    statement.more = True  # the claim came back full: more may be ready
    claim_lands(driver, hub, statement)
    assert delivered == ["m1"]
    assert statement.sent == [True, True]  # claimed again at once, no turn of the loop in between
    assert not readable(driver.waker)


def test_with_several_buffered_one_message_per_turn_of_the_loop() -> None:
    driver, hub, _, statement, delivered = rig()
    statement.batch = 3
    claim_lands(driver, hub, statement)
    assert delivered == ["m1"]
    assert readable(driver.waker)  # Celery may stop (warm shutdown) between two deliveries
    tick(driver, hub)
    tick(driver, hub)
    assert delivered == ["m1", "m2", "m3"]


def test_on_tick_delivers_nothing_and_leaves_the_delivery_to_the_next_turn_of_the_loop() -> None:
    """Celery checks for a warm shutdown between two turns of its loop: a message handed over in on_tick
    (before the poll) would start a task after the stop was asked for."""
    driver, hub, _, statement, delivered = rig()
    tick(driver, hub)
    statement.arrive()  # its result is in before the loop's reader saw it (another statement read it)
    driver.wake()
    for callback in list(hub.on_tick):
        callback()
    assert delivered == []
    assert readable(driver.waker)  # the next turn delivers it
    hub.fire(driver.waker.fileno())
    assert delivered == ["m1"]


def test_one_claim_in_flight_at_a_time_whatever_wakes_the_loop() -> None:
    driver, hub, _, statement, _ = rig()
    tick(driver, hub)
    notify(driver, hub)
    driver.wake(ready=True)
    tick(driver, hub)
    assert statement.sent == [True]


def test_a_notify_that_arrives_during_a_claim_makes_the_next_round_claim_again() -> None:
    driver, hub, _, statement, delivered = rig()
    tick(driver, hub)
    notify(driver, hub)  # a message published after the claim's snapshot was taken
    statement.batch = 0  # the claim in flight found nothing
    statement.arrive()
    hub.fire(CLAIM_FD)
    assert statement.sent == [True, True], "the wake-up was lost: the message waits for the safety poll"
    assert delivered == []


def test_a_notify_that_arrives_while_an_idle_loop_waits_for_its_claim_is_not_lost() -> None:
    # An idle loop waits for its claim where it sent it (inline). The claim parked on the queue and
    # committed; a publish right after that wakes this consumer, on the LISTEN thread, before the loop
    # is back from the wait. Clearing maybe_ready after the claim unconditionally lost that wake-up:
    # the message waited for the heartbeat's report (heartbeat_interval, 5 s by default).
    driver, hub, _, statement, _ = rig()
    statement.inline, statement.batch = True, 0  # the claim finds nothing and parks
    woken = []

    def publish_meanwhile() -> None:
        if not woken:
            woken.append(True)
            other = threading.Thread(target=driver.wake, kwargs={"ready": True})
            other.start()
            other.join()

    statement.during = publish_meanwhile
    tick(driver, hub)  # the claim, then the turn the wake-up's pipe write makes
    assert woken
    assert statement.sent == [True, True], "the wake-up was lost: the message waits for the heartbeat"


def test_an_empty_claim_that_filled_nothing_does_not_claim_again_until_woken() -> None:
    driver, hub, _, statement, _ = rig()
    statement.batch = 0
    claim_lands(driver, hub, statement)
    tick(driver, hub)  # an ack's wake-up: outcomes only, no claim
    assert True not in statement.sent[1:]


def test_a_claim_that_completed_inline_is_delivered_in_the_same_tick() -> None:
    driver, hub, _, statement, delivered = rig()
    statement.inline = True  # an idle worker waits for its claim where it sent it
    tick(driver, hub)
    assert delivered == ["m1"]
    assert CLAIM_FD not in hub.readers


def test_with_every_slot_busy_a_tick_writes_outcomes_without_claiming() -> None:
    driver, hub, _, statement, _ = rig(free=False)
    tick(driver, hub)
    assert statement.sent == [False]


def test_stop_settles_the_claim_in_flight_and_leaves_the_hub_clean() -> None:
    driver, hub, _socket, statement, _ = rig()
    tick(driver, hub)
    driver.stop()
    assert statement.settled == [30.0]
    assert hub.readers == {}
    assert hub.timers[0].cancelled


def test_the_poll_interval_follows_whether_listen_is_armed() -> None:
    driver, hub, socket, _, _ = rig()
    socket.armed = False  # the session was lost: until the heartbeat's thread re-arms, the loop polls
    hub.timers[-1].callback()
    assert 0.5 <= hub.timers[-1].delay <= 1.0  # poll_interval, jittered
    assert driver.maybe_ready
    socket.armed = True
    hub.timers[-1].callback()
    assert 5.0 <= hub.timers[-1].delay <= 10.0  # listen_poll_interval
    driver.stop()


def test_claim_soon_schedules_one_claim_and_does_not_stack() -> None:
    driver, hub, _, statement, _ = rig()
    statement.batch = 0
    tick(driver, hub)
    statement.arrive()
    hub.fire(CLAIM_FD)  # an empty claim: nothing more to claim until something wakes the loop
    driver.claim_soon(0.01)
    driver.claim_soon(0.01)  # a second retry before the first fired: still one timer
    soon = [t for t in hub.timers if t.delay == 0.01]
    assert len(soon) == 1
    soon[0].callback()
    tick(driver, hub)
    assert statement.sent[0] is True
    assert statement.sent[-1] is True  # the scheduled claim ran
    assert statement.sent.count(True) == 2
    driver.stop()
    assert hub.readers == {}


def test_the_safety_poll_of_an_armed_driver_claims_nothing_and_of_a_polling_one_claims() -> None:
    driver, hub, _, statement, _ = rig()
    statement.batch = 0
    tick(driver, hub)
    statement.arrive()
    hub.fire(CLAIM_FD)  # idle: the empty claim is behind it
    sent = len(statement.sent)
    hub.timers[-1].callback()  # the poll, LISTEN armed: the heartbeat reports lost wake-ups instead
    tick(driver, hub)
    assert True not in statement.sent[sent:]
    polling, hub2, socket2, statement2, _ = rig()
    socket2.armed = False  # no LISTEN (listen=False, or the session is down): the poll is what claims
    statement2.batch = 0
    tick(polling, hub2)
    statement2.arrive()
    hub2.fire(CLAIM_FD)
    sent = len(statement2.sent)
    hub2.timers[-1].callback()
    tick(polling, hub2)
    assert statement2.sent[sent:].count(True) == 1


def repark_from_another_thread(driver: HubDriver, hub: Hub) -> None:
    """A handoff that took the window's last parked slot, read on the heartbeat's thread."""
    other = threading.Thread(target=driver.repark)
    other.start()
    other.join()
    hub.iterate(driver.waker)


def test_a_handoff_that_unparks_a_window_claims_with_the_next_ack_in_one_statement() -> None:
    driver, hub, _, statement, _ = rig()
    claim_lands(driver, hub, statement)
    sent = len(statement.sent)
    repark_from_another_thread(driver, hub)
    assert statement.sent[sent:] == [False]  # no ack yet: no claim of its own (the task acks in a moment)
    [timer] = [t for t in hub.timers if t.delay == REPARK_DELAY]
    statement.acks = True
    driver.wake()  # the ack, on the loop thread
    tick(driver, hub)
    assert statement.sent[sent:] == [False, True]  # the ack's statement claims, and so parks again
    assert timer.cancelled


def test_a_handoff_that_unparks_a_window_claims_on_its_own_if_no_ack_comes_soon() -> None:
    driver, hub, _, statement, _ = rig()
    claim_lands(driver, hub, statement)
    sent = len(statement.sent)
    repark_from_another_thread(driver, hub)
    [timer] = [t for t in hub.timers if t.delay == REPARK_DELAY]
    assert statement.sent[sent:] == [False]
    timer.callback()  # a long task: nothing acked within REPARK_DELAY
    tick(driver, hub)
    assert statement.sent[sent:] == [False, True]


def test_acks_that_wait_for_more_send_nothing_until_their_timer_then_one_statement() -> None:
    driver, hub, _, statement, _ = rig()
    claim_lands(driver, hub, statement)
    sent = len(statement.sent)
    statement.acks, statement.wait = True, 0.0015  # an ack, and a task waiting for a pool process
    driver.wake(ready=True)  # a wake-up too: it must survive the wait
    tick(driver, hub)
    tick(driver, hub)
    assert statement.sent[sent:] == []
    [timer] = [t for t in hub.timers if t.delay == 0.0015]
    assert driver.maybe_ready
    statement.wait = 0.0  # the delay is over
    timer.callback()
    tick(driver, hub)
    assert statement.sent[sent:] == [True]  # the acks and the claim in one statement
    assert [t for t in hub.timers if t.delay == 0.0015] == [timer]  # one timer for the whole wait


def test_stop_cancels_the_timer_of_acks_that_wait() -> None:
    driver, hub, _, statement, _ = rig()
    claim_lands(driver, hub, statement)
    statement.acks, statement.wait = True, 0.002
    driver.wake()
    tick(driver, hub)
    [timer] = [t for t in hub.timers if t.delay == 0.002]
    driver.stop()
    assert timer.cancelled
