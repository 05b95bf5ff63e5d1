"""The deliverer's windows without a database or kombu: which consuming channels a claim round asks for,
and that a wake-up from another thread (LISTEN, the heartbeat's report) reopens every window even when
it lands while a round is being planned."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from kombu_akadze.transport.delivery import Deliverer


class QoS:
    def __init__(self, prefetch: int) -> None:
        self.prefetch_count = prefetch
        #: Slots free: all of them, until a test fills the window.
        self.free = prefetch
        self.flushed: list[tuple[str, ...]] = []
        #: Run when the planner asks how many slots are free (what another thread does meanwhile).
        self.on_ask: Callable[[], None] = lambda: None

    def can_consume_max_estimate(self) -> int:
        self.on_ask()
        return self.free

    def flush(self, kinds: tuple[str, ...]) -> None:
        self.flushed.append(kinds)


class Channel:
    def __init__(self, queue: str, prefetch: int = 2) -> None:
        self.queue = queue
        self.qos = QoS(prefetch)
        self.claimed: deque[Any] = deque()

    def consuming(self) -> bool:
        return True

    def consumed_queues(self) -> list[str]:
        return [self.queue]


def rig() -> tuple[Deliverer, Channel, Channel]:
    a, b = Channel("qa"), Channel("qb")
    deliverer = Deliverer(
        store=None,  # type: ignore[arg-type]  # planning only: nothing is released
        claim=lambda queues, limits: [],
        callbacks={},
        channels=lambda: [a, b],  # type: ignore[list-item]  # the accessors the planner uses only
        claim_batch=10,
        owner="c1",
    )
    return deliverer, a, b


def messages(queue: str, n: int) -> list[Any]:
    return [SimpleNamespace(queue=queue) for _ in range(n)]


def test_a_window_whose_queue_came_back_short_waits_for_a_wake_up() -> None:
    deliverer, a, _ = rig()
    plan = deliverer.plan_round(woken_only=True)
    assert plan.wanted == {"qa": 2, "qb": 2}
    deliverer.finish_round(plan, messages("qa", 2))  # qa filled its slots, qb came back empty
    a.claimed.clear()
    assert deliverer.plan_round(woken_only=True).wanted == {"qa": 2}
    deliverer.anything_may_be_ready()
    assert deliverer.plan_round(woken_only=True).wanted == {"qa": 2, "qb": 2}


def test_a_wake_up_that_lands_while_a_round_is_planned_reopens_every_window() -> None:
    # qb's window is closed (its queue came back empty). A publish to qb wakes this consumer on the
    # LISTEN thread while the loop plans a round for qa only: that round's claim does not ask qb, so
    # the wake-up must outlive it. Counted as before the plan, it was taken as seen and qb's window
    # stayed closed until the heartbeat's report.
    deliverer, a, _ = rig()
    plan = deliverer.plan_round(woken_only=True)
    deliverer.finish_round(plan, messages("qa", 2))
    a.claimed.clear()
    landed: list[bool] = []

    def wake_meanwhile() -> None:
        if not landed:
            landed.append(True)
            deliverer.anything_may_be_ready()

    a.qos.on_ask = wake_meanwhile
    plan = deliverer.plan_round(woken_only=True)
    assert landed
    assert plan.wanted == {"qa": 2}
    deliverer.finish_round(plan, [])  # qa empty now too
    assert deliverer.has_free_slot(), "the wake-up for qb was lost: its message waits for the heartbeat"
    assert deliverer.plan_round(woken_only=True).wanted == {"qa": 2, "qb": 2}


def test_the_heartbeats_report_opens_only_the_windows_of_the_queues_it_names() -> None:
    # qa's window is full, with a message waiting in qa; qb (Celery's pidbox, say) came back empty. The
    # heartbeat reports qa: no window with a free slot consumes it, so there is nothing to claim. Opening
    # every window, as a wake-up does, made the worker claim qb at every beat for as long as the task ran.
    deliverer, a, _ = rig()
    plan = deliverer.plan_round(woken_only=True)
    deliverer.finish_round(plan, messages("qa", 2))  # qa filled its window; qb came back empty
    a.claimed.clear()
    a.qos.free = 0  # the window is full: both delivered, neither settled
    deliverer.queues_may_be_ready(["qa"])
    assert not deliverer.has_free_slot()
    assert deliverer.plan_round(woken_only=True).wanted == {}
    a.qos.free = 1  # a task acked: qa's window claims again
    assert deliverer.plan_round(woken_only=True).wanted == {"qa": 1}


def test_the_heartbeats_report_reopens_a_window_that_waits_for_a_wake_up() -> None:
    deliverer, a, _ = rig()
    plan = deliverer.plan_round(woken_only=True)
    deliverer.finish_round(plan, messages("qa", 2))  # qb came back empty: its window waits
    a.claimed.clear()
    deliverer.queues_may_be_ready(["qb"])  # a lost wake-up: the heartbeat finds qb's message
    assert deliverer.plan_round(woken_only=True).wanted == {"qa": 2, "qb": 2}


def test_a_report_that_lands_while_a_round_is_planned_outlives_that_round() -> None:
    # As a wake-up (above): the round planned before it does not ask qb, so qb's window stays open after it.
    deliverer, a, _ = rig()
    plan = deliverer.plan_round(woken_only=True)
    deliverer.finish_round(plan, messages("qa", 2))
    a.claimed.clear()
    landed: list[bool] = []

    def report_meanwhile() -> None:
        if not landed:
            landed.append(True)
            deliverer.queues_may_be_ready(["qb"])

    a.qos.on_ask = report_meanwhile
    plan = deliverer.plan_round(woken_only=True)
    assert landed
    deliverer.finish_round(plan, [])  # qa came back empty too
    assert deliverer.plan_round(woken_only=True).wanted == {"qb": 2}, "the report for qb was lost"


def test_a_report_of_queues_no_window_consumes_opens_every_window() -> None:
    deliverer, _, _ = rig()
    plan = deliverer.plan_round(woken_only=True)
    deliverer.finish_round(plan, [])  # both came back empty
    assert not deliverer.has_free_slot()
    deliverer.queues_may_be_ready(["elsewhere"])
    assert deliverer.plan_round(woken_only=True).wanted == {"qa": 2, "qb": 2}
