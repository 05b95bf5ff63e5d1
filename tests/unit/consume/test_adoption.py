"""Adoption's bookkeeping: a run that reaches the consumer twice around a re-arm is delivered once."""

from __future__ import annotations

from kombu_akadze.consume.adoption import Adoption
from kombu_akadze.store.records import ClaimedMessage


def msg(message_id: int, run_count: int = 1) -> ClaimedMessage:
    return ClaimedMessage(message_id, "q", 0, b"", None, None, {}, {}, run_count, run_count)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_claimed_or_handed_run_is_not_adopted() -> None:
    adoption = Adoption()
    assert adoption.claimed([msg(1), msg(2)]) == [msg(1), msg(2)]
    assert adoption.handed(msg(3))
    assert adoption.unseen([msg(1), msg(2), msg(3), msg(4)]) == [msg(4)]
    assert adoption.count == 1


def test_a_claim_reply_read_after_its_run_was_adopted_is_dropped() -> None:
    """The adoption's query saw a row a claim had committed before the consumer read that claim's reply."""
    adoption = Adoption()
    assert adoption.unseen([msg(7, 3)]) == [msg(7, 3)]
    assert adoption.claimed([msg(6), msg(7, 3), msg(8)]) == [msg(6), msg(8)]


def test_a_notification_read_after_its_run_was_adopted_is_dropped_and_only_once_adopted() -> None:
    adoption = Adoption()
    assert adoption.unseen([msg(5)]) == [msg(5)]
    assert not adoption.handed(msg(5))
    assert adoption.unseen([msg(5)]) == []  # a second re-arm finds it still held: not delivered twice
    assert adoption.count == 1


def test_a_run_given_back_and_claimed_again_with_the_same_number_is_delivered() -> None:
    """A handoff with no free slot is refused (run_count undone): its next claim has the same (id, run_count)."""
    adoption = Adoption()
    assert adoption.handed(msg(9))
    assert adoption.claimed([msg(9)]) == [msg(9)]


def test_runs_are_forgotten_after_the_recent_window() -> None:
    clock = Clock()
    adoption = Adoption(clock=clock, recent=10.0)
    adoption.claimed([msg(1)])
    assert adoption.unseen([msg(2)]) == [msg(2)]
    assert len(adoption) == 2
    clock.now = 10.5
    assert adoption.claimed([msg(2)]) == [msg(2)]  # the adoption was forgotten with its window
    assert len(adoption) == 1
    assert adoption.unseen([msg(1)]) == [msg(1)]  # a run held this long is in the transport's buffers
