"""Claim-round planning without a database: fair shares, rotation, full windows, when to claim again."""

from __future__ import annotations

from kombu_akadze.consume.rounds import Window, plan


def test_one_channel_shares_its_free_slots_between_its_queues() -> None:
    r = plan([Window(owner="c", queues=["a", "b", "c"], free=7)], rotation=0)
    assert r.wanted == {"a": 3, "b": 2, "c": 2}
    assert set(r.owner_of.values()) == {"c"}
    assert not r.full
    assert not r.left_out


def test_rotation_moves_the_extra_slot_so_no_queue_starves() -> None:
    firsts = []
    for rotation in range(3):
        r = plan([Window(owner="c", queues=["a", "b", "c"], free=1)], rotation=rotation)
        assert sum(r.wanted.values()) == 1
        assert r.left_out  # two queues got nothing this round
        firsts.append(next(iter(r.wanted)))
    assert firsts == ["a", "b", "c"]


def test_a_full_window_asks_nothing_and_says_a_freed_slot_may_find_more() -> None:
    r = plan([Window(owner="busy", queues=["a"], free=0), Window(owner="idle", queues=["b"], free=2)], rotation=0)
    assert r.wanted == {"b": 2}
    assert r.owner_of == {"b": "idle"}
    assert r.full


def test_a_queue_two_channels_consume_is_claimed_for_the_first_one_this_round() -> None:
    r = plan([Window(owner="x", queues=["q"], free=1), Window(owner="y", queues=["q", "r"], free=4)], rotation=0)
    assert r.wanted == {"q": 1, "r": 2}
    assert r.owner_of == {"q": "x", "r": "y"}


def test_duplicate_queue_names_of_one_channel_count_once() -> None:
    assert plan([Window(owner="c", queues=["a", "a", "b"], free=4)], rotation=0).wanted == {"a": 2, "b": 2}


def test_claim_again_at_once_when_a_queue_filled_its_slots() -> None:
    r = plan([Window(owner="c", queues=["a", "b"], free=4)], rotation=0)
    assert r.more_for({"a": 2, "b": 0})  # a had more than it was given
    assert not r.more_for({"a": 1, "b": 1})  # both found less than they asked: drained for now


def test_claim_again_when_slots_were_left_free_while_a_queue_was_not_asked() -> None:
    r = plan([Window(owner="c", queues=["a", "b", "c"], free=2)], rotation=0)
    assert r.left_out
    assert r.more_for({"a": 0, "b": 0})  # nothing in a and b: the next round asks c first
    assert plan([Window(owner="c", queues=[], free=3)], rotation=0).wanted == {}


def test_only_the_windows_that_may_find_more_are_named() -> None:
    # Celery with remote control: the task channel's window is full, the pidbox channel (no prefetch
    # limit) asked and found nothing. Only the task window may find more (once a slot frees there):
    # claiming for the pidbox again at once would find it empty again, at every turn of the loop.
    r = plan([Window(owner="tasks", queues=["celery"], free=0), Window(owner="pidbox", queues=["p"], free=100)], 0)
    assert r.more_for({}) == {"tasks"}
    r = plan([Window(owner="tasks", queues=["celery"], free=1), Window(owner="pidbox", queues=["p"], free=100)], 0)
    assert r.more_for({"celery": 1}) == {"tasks"}
    assert r.more_for({}) == set()
    r = plan([Window(owner="c", queues=["a", "b", "c"], free=2)], rotation=0)
    assert r.more_for({"a": 0, "b": 0}) == {"c"}
