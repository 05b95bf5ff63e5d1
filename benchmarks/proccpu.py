"""CPU seconds of processes from /proc (Linux), for the benchmarks that charge CPU to a side."""

from __future__ import annotations

import os
from collections.abc import Callable


def cpu_by_pid(keep: Callable[[int, str, int], bool]) -> dict[int, float] | None:
    """CPU seconds (user + system, every thread) of each live process for which keep(pid, comm, ppid) is true,
    by pid; None where /proc cannot tell."""
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[int, float] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                text = f.read()
            comm = text[text.index("(") + 1 : text.rindex(")")]
            fields = text.rsplit(")", 1)[1].split()
            if keep(pid, comm, int(fields[1])):  # ppid: field 4 of stat
                found[pid] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime: fields 14 and 15
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile, or not ours to read
    return found


def named(names: tuple[str, ...]) -> dict[int, float] | None:
    """cpu_by_pid of the processes whose command name is one of *names* (a server's processes)."""
    return cpu_by_pid(lambda pid, comm, ppid: comm in names)


def cpu_used(before: dict[int, float] | None, after: dict[int, float] | None) -> float | None:
    """CPU seconds between two snapshots; a process that started meanwhile counts from zero."""
    if before is None or after is None:
        return None
    return sum(used - before.get(pid, 0.0) for pid, used in after.items())
