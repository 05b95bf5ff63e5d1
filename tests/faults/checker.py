"""The fault suite's ground truth: per-process ledger files outside PostgreSQL, and the verdict line."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

#: Every verdict of this run, for the summary table printed at the end of the session.
VERDICTS: list[Verdict] = []


@dataclass(frozen=True)
class Run:
    """One ledger line: a task run started, finished ("done") or found its input corrupt."""

    event: str
    n: int
    pid: int
    attempt: int | None
    message_id: int | None
    at: float
    source: str


def _int(text: str) -> int | None:
    return None if text == "None" else int(text)


def read_runs(paths: Iterable[Path]) -> list[Run]:
    runs = []
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            parts = line.split()
            if len(parts) != 6:  # a line being written right now by a live worker
                continue
            event, n, pid, attempt, message_id, at = parts
            runs.append(Run(event, int(n), int(pid), _int(attempt), _int(message_id), float(at), path.stem))
    return sorted(runs, key=lambda r: r.at)


class Ledgers:
    """One ledger file per worker process (a restarted worker gets a new one), all in one folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self._made: Counter[str] = Counter()

    def new(self, name: str) -> Path:
        self._made[name] += 1
        path = self.folder / f"ledger-{name}-{self._made[name]}.txt"
        path.touch()
        return path

    def runs(self) -> list[Run]:
        return read_runs(sorted(self.folder.glob("ledger-*.txt")))

    def done(self) -> Counter[int]:
        """How many times each n completed."""
        return Counter(r.n for r in self.runs() if r.event == "done")

    def started(self, n: int) -> list[Run]:
        return [r for r in self.runs() if r.event == "start" and r.n == n]

    def all_done(self, published: Iterable[int]) -> bool:
        return set(published) <= self.done().keys()


@dataclass(frozen=True)
class Verdict:
    fault: str
    injected: str
    published: int
    completed: int
    duplicated: int
    lost: int
    recovery: float | None
    seconds: float = 0.0

    def line(self) -> str:
        recovery = "-" if self.recovery is None else f"{self.recovery:.2f}"
        return (
            f"FAULT {self.fault} | injected: {self.injected} | published: {self.published} | "
            f"completed: {self.completed} | duplicated: {self.duplicated} | lost: {self.lost} | "
            f"recovery s: {recovery}"
        )


def verdict(
    fault: str,
    *,
    injected: str,
    published: Iterable[int],
    ledgers: Ledgers,
    recovery: float | None,
    queued: Iterable[int] = (),
) -> Verdict:
    """Compare what went in with what the ledgers say came out; print the line and remember it.

    lost: published, never completed, and not waiting in the queue or dead letters (*queued*) either.
    """
    sent = set(published)
    done = ledgers.done()
    completed = len(sent & done.keys())
    duplicated = sum(1 for n in sent if done[n] > 1)
    lost = len(sent - done.keys() - set(queued))
    result = Verdict(fault, injected, len(sent), completed, duplicated, lost, recovery)
    print("\n" + result.line())
    VERDICTS.append(result)
    return result


def table(verdicts: Iterable[Verdict]) -> str:
    rows = [("fault", "injected", "published", "completed", "duplicated", "lost", "recovery s")]
    for v in verdicts:
        recovery = "-" if v.recovery is None else f"{v.recovery:.2f}"
        rows.append((v.fault, v.injected, str(v.published), str(v.completed), str(v.duplicated), str(v.lost), recovery))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)
