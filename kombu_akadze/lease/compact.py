"""Compaction: give back the index space a drained backlog leaves behind (VACUUM only makes it reusable)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from kombu_akadze.errors import PermissionDeniedError
from kombu_akadze.store import Store, TableSize

logger = logging.getLogger("kombu_akadze")

#: While REINDEX reads the heap, writes to the table and every use of the index it rebuilds (claims
#: included) wait: only a heap this small (bytes) is rebuilt, which takes milliseconds. A big heap
#: (a backlog, or dead rows autovacuum has not yet truncated) waits for a later check.
MAX_HEAP_BYTES = 8 * 1024 * 1024
#: Indexes smaller than this (bytes) are left alone whatever their bloat.
MIN_INDEX_BYTES = 16 * 1024 * 1024
#: Indexes this many times larger than the heap they index are bloated.
BLOAT_RATIO = 4
#: Seconds the REINDEX waits for its lock before giving up until the next check; claims and
#: publishes queue behind a waiting REINDEX, so this bounds the stall it can cause them.
LOCK_TIMEOUT = 0.1


@dataclass(frozen=True)
class CompactResult:
    compacted: bool
    before: TableSize
    after: TableSize
    #: Why nothing was done, or "" when the indexes were rebuilt.
    skipped: str = ""
    #: Nothing was done because the table's lock was not granted within the lock timeout.
    busy: bool = False


def due(
    size: TableSize, *, max_heap: int = MAX_HEAP_BYTES, min_index: int = MIN_INDEX_BYTES, ratio: float = BLOAT_RATIO
) -> str:
    """ "" when *size* calls for a REINDEX, else the reason it does not."""
    if size.heap_bytes > max_heap:
        return f"heap is {_mb(size.heap_bytes)} (rebuilt only below {_mb(max_heap)}, under a short lock)"
    if size.index_bytes < min_index:
        return f"indexes are {_mb(size.index_bytes)} (below {_mb(min_index)})"
    if size.index_bytes < ratio * max(size.heap_bytes, 1):
        return f"indexes ({_mb(size.index_bytes)}) are under {ratio:g}x the heap ({_mb(size.heap_bytes)})"
    return ""


def run_once(
    store: Store,
    *,
    force: bool = False,
    max_heap: int = MAX_HEAP_BYTES,
    min_index: int = MIN_INDEX_BYTES,
    ratio: float = BLOAT_RATIO,
    lock_timeout: float = LOCK_TIMEOUT,
) -> CompactResult:
    """Rebuild the messages indexes when they are bloated and the heap is small (*force*: whenever the
    heap is small). Rows are untouched. Raises PermissionDeniedError when the role does not own the table."""
    before = store.messages_size()
    if force:
        reason = due(before, max_heap=max_heap, min_index=0, ratio=0)
    else:
        reason = due(before, max_heap=max_heap, min_index=min_index, ratio=ratio)
    if reason:
        return CompactResult(False, before, before, reason)
    if not store.messages_reindex(lock_timeout=lock_timeout):
        return CompactResult(False, before, before, f"the table was busy for {lock_timeout:g} s; next check", busy=True)
    after = store.messages_size()
    logger.info(
        "kombu-akadze compaction: messages indexes %s -> %s (heap %s)",
        _mb(before.index_bytes),
        _mb(after.index_bytes),
        _mb(after.heap_bytes),
    )
    return CompactResult(True, before, after)


class Compactor:
    """The periodic check a consumer's heartbeat thread runs; stops for good when the role may not REINDEX."""

    def __init__(
        self,
        store: Store,
        *,
        interval: float,
        max_heap: int = MAX_HEAP_BYTES,
        min_index: int = MIN_INDEX_BYTES,
        ratio: float = BLOAT_RATIO,
    ) -> None:
        self.store = store
        self.interval = interval
        self.max_heap = max_heap
        self.min_index = min_index
        self.ratio = ratio
        self.disabled = ""
        self.runs = 0
        self.last: CompactResult | None = None

    def check(self) -> CompactResult | None:
        """One check; database errors propagate (the caller logs them and tries at the next interval)."""
        if self.disabled:
            return None
        self.runs += 1
        try:
            self.last = run_once(self.store, max_heap=self.max_heap, min_index=self.min_index, ratio=self.ratio)
            return self.last
        except PermissionDeniedError as exc:
            self.disabled = str(exc)
            logger.warning("kombu-akadze compaction is off for this worker: %s", exc)
            return None


def _mb(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MB"
