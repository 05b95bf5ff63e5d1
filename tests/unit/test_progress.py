"""Progress output of `akadze move` and the demo: click's bar on a terminal, one line per interval in a log."""

from __future__ import annotations

import io

from kombu_akadze.ops.progress import Bar, MoveProgress
from kombu_akadze.ops.rabbitmq import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_one_plain_line_per_interval_and_the_final_count() -> None:
    log = io.StringIO()
    bar = Bar(log, total=10, label="moved", every=3600)
    for done in range(1, 11):
        bar.update(done, detail=f"{done} msgs/s")
    bar.close()
    assert log.getvalue().splitlines() == ["moved 1/10, 1 msgs/s", "moved 10/10, 10 msgs/s"]
    assert "\r" not in log.getvalue()


def test_a_log_gets_no_repeat_of_a_final_line_already_written() -> None:
    log = io.StringIO()
    bar = Bar(log, total=2, label="tasks", every=0)
    bar.update(1)
    bar.update(2)
    bar.close()
    assert log.getvalue().splitlines() == ["tasks 1/2", "tasks 2/2"]


def test_a_terminal_gets_clicks_bar_with_position_percent_and_the_detail() -> None:
    tty = Terminal()
    bar = Bar(tty, total=10, label="moved", every=3600)
    bar.update(3, detail="120 msgs/s")
    drawn = tty.getvalue()
    assert drawn.startswith("\r")  # one line, redrawn in place
    assert "moved" in drawn
    assert "3/10" in drawn
    assert "30%" in drawn
    assert "120 msgs/s" in drawn
    assert "\n" not in drawn
    bar.update(10)
    bar.close()
    assert tty.getvalue().endswith("\n")
    assert "10/10" in tty.getvalue()


def test_move_progress_shows_the_rate_and_the_count_per_queue() -> None:
    log = io.StringIO()
    report = MoveProgress(log, every=0)
    report(Progress(moved=30, expected=50, seconds=2.0, per_queue={"celery": 20, "emails": 10}))
    report.done()
    assert log.getvalue().splitlines() == ["moved 30/50, 15 msgs/s (celery: 20, emails: 10)"]


def test_move_progress_says_nothing_when_nothing_was_reported() -> None:
    log = io.StringIO()
    MoveProgress(log).done()
    assert log.getvalue() == ""
