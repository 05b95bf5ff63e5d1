"""Progress of a count towards a total: click's progress bar on a terminal, one plain line per interval in logs."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, TextIO

import click

if TYPE_CHECKING:
    from click._termui_impl import ProgressBar

    from kombu_akadze.ops.rabbitmq import Progress


class Bar:
    """On a terminal, click's progress bar (bar, position, percent, ETA, a detail such as the rate);
    elsewhere (a log file, a pipe) one line per *every* seconds, which click's bar does not draw."""

    def __init__(self, stream: TextIO, *, total: int, label: str, every: float = 0.5) -> None:
        self.stream = stream
        self.label = label
        self.every = every
        self.done = 0
        self.detail = ""
        self.last: float | None = None  # the first update is always written
        self.shown = False
        self.last_written: tuple[int, str] | None = None
        self._bar: ProgressBar[int] | None = (
            click.progressbar(
                length=total,
                label=label,
                file=stream,
                show_pos=True,
                show_percent=True,
                show_eta=True,
                item_show_func=lambda _item: self.detail or None,
            )
            if stream.isatty()
            else None
        )
        self.total = total

    def update(self, done: int, *, total: int | None = None, detail: str = "") -> None:
        """Move to *done* (absolute); at most one rendering per *every* seconds."""
        if total is not None:
            self.total = total
        step, self.done, self.detail = done - self.done, done, detail
        if self._bar is not None:
            self._bar.length = self.total
            self._bar.update(step)  # every step: click's ETA averages the time per step; it redraws on change
            self.shown = True
            return
        now = time.monotonic()
        if self.last is not None and now - self.last < self.every:
            return
        self.last = now
        self._line()

    def close(self) -> None:
        """End the bar's line on a terminal; in a log, write the final count unless it was the last line."""
        if self._bar is not None:
            if self.shown:
                self._bar.render_finish()
            return
        if self.shown and self.last_written != (self.done, self.detail):
            self._line()

    def _line(self) -> None:
        text = f"{self.label} {self.done}/{self.total}" + (f", {self.detail}" if self.detail else "")
        self.stream.write(text + "\n")
        self.stream.flush()
        self.shown = True
        self.last_written = (self.done, self.detail)


class MoveProgress:
    """The progress callback of ``akadze move``: moved/expected, rate and the count per queue. A dry run
    moves nothing, so its progress says "counted"."""

    def __init__(self, stream: TextIO, *, every: float = 0.5, dry_run: bool = False) -> None:
        self.stream = stream
        self.every = every
        self.verb = "counted" if dry_run else "moved"
        self.bar: Bar | None = None

    def __call__(self, p: Progress) -> None:
        if self.bar is None:
            self.bar = Bar(self.stream, total=p.expected, label=self.verb, every=self.every)
        per_queue = ", ".join(f"{q}: {n}" for q, n in p.per_queue.items())
        self.bar.update(
            p.moved, total=p.expected, detail=f"{p.rate:.0f} msgs/s" + (f" ({per_queue})" if per_queue else "")
        )

    def done(self) -> None:
        if self.bar is not None:
            self.bar.close()
