"""Collects samples, takes medians and ratios against RabbitMQ, and writes results.json, results.md and a chart."""

from __future__ import annotations

import json
import statistics
import textwrap
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brokers import REFERENCE


@dataclass(frozen=True)
class Figure:
    workload: str
    title: str
    unit: str
    higher_is_better: bool


FIGURES = {
    "a.publish": Figure("a", "kombu publish (persistent)", "msgs/s", True),
    "a.get_ack": Figure("a", "kombu basic_get + ack", "msgs/s", True),
    "a.consume_p1": Figure("a", "kombu consume + ack, prefetch 1", "msgs/s", True),
    "a.consume_p100": Figure("a", "kombu consume + ack, prefetch 100", "msgs/s", True),
    "b.noop_p1": Figure("b", "celery worker, no-op tasks, prefetch x1", "tasks/s", True),
    "b.noop_p4": Figure("b", "celery worker, no-op tasks, prefetch x4", "tasks/s", True),
    "b.sleep_p1": Figure("b", "celery worker, 10 ms tasks, prefetch x1", "tasks/s", True),
    "b.sleep_p4": Figure("b", "celery worker, 10 ms tasks, prefetch x4", "tasks/s", True),
    "b.noop_p1_rc": Figure(
        "b", "celery worker, no-op tasks, prefetch x1, remote control on (Celery's default)", "tasks/s", True
    ),
    "c.p50": Figure("c", "enqueue->start latency p50 (20 tasks/s)", "ms", False),
    "c.p99": Figure("c", "enqueue->start latency p99 (20 tasks/s)", "ms", False),
    "e.getack_p50": Figure("e", "single get+ack latency p50, near-empty queue", "ms", False),
    "e.getack_p99": Figure("e", "single get+ack latency p99, near-empty queue", "ms", False),
}


class Results:
    """Every sample by figure and broker, plus the single-shot workloads d and e."""

    def __init__(self, meta: dict[str, Any], brokers: list[str]) -> None:
        self.meta = meta
        self.brokers = brokers
        self.samples: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        self.capped: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.idle: dict[str, Any] = {}
        self.backlog: dict[str, Any] = {}
        self.errors: list[dict[str, Any]] = []
        self.notes: list[str] = []

    def add(self, figure: str, broker: str, value: float, *, capped: bool = False) -> None:
        self.samples[figure][broker].append(float(value))
        if capped:
            self.capped[figure][broker] += 1

    def error(self, workload: str, broker: str, repeat: int, message: str, trace: str) -> None:
        self.errors.append(
            {"workload": workload, "broker": broker, "repeat": repeat, "error": message, "traceback": trace}
        )

    def medians(self) -> dict[str, dict[str, float]]:
        return {
            fig: {b: statistics.median(v) for b, v in by_broker.items() if v} for fig, by_broker in self.samples.items()
        }

    def ratios(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for fig, by_broker in self.medians().items():
            ref = by_broker.get(REFERENCE)
            if ref:
                out[fig] = {b: v / ref for b, v in by_broker.items()}
        return out

    def as_json(self) -> dict[str, Any]:
        return {
            "meta": self.meta,
            "brokers": self.brokers,
            "reference": REFERENCE,
            "figures": {
                fig: {
                    "workload": FIGURES[fig].workload,
                    "title": FIGURES[fig].title,
                    "unit": FIGURES[fig].unit,
                    "higher_is_better": FIGURES[fig].higher_is_better,
                    "samples": dict(self.samples[fig]),
                    "median": self.medians().get(fig, {}),
                    "ratio_vs_rabbitmq": self.ratios().get(fig, {}),
                    "capped_repeats": dict(self.capped.get(fig, {})),
                }
                for fig in FIGURES
                if fig in self.samples
            },
            "idle": self.idle,
            "backlog": self.backlog,
            "errors": self.errors,
            "notes": self.notes,
        }


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "ms":
        return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def cell(results: Results, fig: str, broker: str) -> str:
    value = results.medians().get(fig, {}).get(broker)
    if value is None:
        return "failed" if any(e["broker"] == broker and fig.startswith(e["workload"]) for e in results.errors) else "-"
    text = fmt(value, FIGURES[fig].unit)
    ratio = results.ratios().get(fig, {}).get(broker)
    if ratio is not None and broker != REFERENCE:
        text += f" (x{ratio:.2f})" if ratio >= 0.01 else f" (x{ratio:.4f})"
    if results.capped.get(fig, {}).get(broker):
        text += " †"
    return text


def console(results: Results) -> str:
    lines = []
    for fig, spec in FIGURES.items():
        if fig not in results.samples:
            continue
        lines.append(f"{fig:16} {spec.title} [{spec.unit}]")
        for broker in results.brokers:
            lines.append(f"    {broker:18} {cell(results, fig, broker)}")
    return "\n".join(lines)


def _mb(n: int | float) -> str:
    return f"{n / 1_048_576:,.1f}"


def markdown(results: Results) -> str:
    m = results.meta
    out = [
        "# Benchmark results",
        "",
        f"`{m['command']}` on {m['date']} · {m['machine']} · commit {m['commit']} · "
        f"kombu_akadze code {m.get('kombu_akadze code', '?')}",
        "",
        f"Versions: {m['versions']}",
        "",
        f"PostgreSQL settings: {m.get('postgresql settings', 'not recorded')}",
        "",
        f"Load average (1, 5, 15 min) at start {m.get('loadavg at start', '?')}, "
        f"at the end {m.get('loadavg at the end', '?')}; whole run {m.get('seconds', '?')} s.",
        "",
        "Sizes and caps (counts, seconds): " + ", ".join(f"{k} {v:,}" for k, v in m.get("sizes", {}).items()),
        "",
        f"Median of {m['repeat']} repeat(s); brokers interleaved within each repeat. `(xN)` is the broker's median "
        "over RabbitMQ's (pyamqp, no publisher confirms) in the same run: for rates above 1 is faster, for latencies "
        "above 1 is slower. † = at least one repeat hit the time cap; the rate is what it reached in the cap.",
        "",
        "| | figure | unit | " + " | ".join(results.brokers) + " |",
        "|---|---|---|" + "---|" * len(results.brokers),
    ]
    for fig, spec in FIGURES.items():
        if fig in results.samples:
            cells = " | ".join(cell(results, fig, b) for b in results.brokers)
            out.append(f"| {spec.workload} | {spec.title} | {spec.unit} | {cells} |")
    out += _idle_md(results) + _backlog_md(results) + _problems_md(results) + METHOD
    return "\n".join(out) + "\n"


def _idle_md(results: Results) -> list[str]:
    if not results.idle:
        return []
    out = [
        "",
        "## d: idle worker cost on PostgreSQL",
        "",
        "| broker | per s (net of the sampler) | per s (raw) | sampler's own count per window | "
        "sessions held by the worker | counter |",
        "|---|---|---|---|---|---|",
    ]
    for broker, r in results.idle.items():
        if "error" in r:
            out.append(f"| {broker} | failed | | | | {r['error']} |")
            continue
        sessions = ", ".join(f"{k}: {v}" for k, v in sorted(r["worker_sessions"].items())) or "-"
        out.append(
            f"| {broker} | {r['per_s']:.2f} | {r['raw_per_s']:.2f} | {r['sampler_count']} | {sessions} "
            f"| {r['method']} |"
        )
    out.append("")
    out.append(
        "RabbitMQ and Redis send nothing to PostgreSQL. Measured over "
        f"{next(iter(results.idle.values())).get('seconds', 0):.0f} s with one idle `celery worker -c 2`."
    )
    return out


def _backlog_md(results: Results) -> list[str]:
    b = results.backlog
    if not b or "latency" not in b:
        return [] if not b else ["", "## e: claim latency behind a backlog", "", f"failed: {b.get('error')}"]
    lat = b["latency"]
    sizes = b["sizes"]
    out = [
        "",
        f"## e: akadze claim latency behind a backlog of {b['total']:,} messages",
        "",
        "| state of the queue | get+ack p50 ms | get+ack p99 ms |",
        "|---|---|---|",
    ]
    labels = {
        "empty": "near-empty (publish one, get it)",
        "backlog": f"{b['total']:,} ready, right after the bulk insert",
        "backlog_analyzed": f"{b['total']:,} ready, after ANALYZE",
        "after_vacuum": "near-empty again, after drain + VACUUM",
    }
    for k, label in labels.items():
        if k in lat:
            out.append(f"| {label} | {lat[k]['p50_ms']:.2f} | {lat[k]['p99_ms']:.2f} |")
    drain = b.get("drain", {})
    out += [
        "",
        f"Bulk insert (message_insert_many, batches of 10,000): {b.get('insert_per_s', 0):,.0f} rows/s. "
        f"Drain (claim {5000:,} + ack per round trip): {drain.get('per_s', 0):,.0f} rows/s, "
        f"{drain.get('claimed', 0):,.0f} claimed, {drain.get('purged', 0):,.0f} purged after the cap.",
        "",
        "| messages table | total MB | heap MB | indexes MB | live tuples | dead tuples |",
        "|---|---|---|---|---|---|",
    ]
    steps = (
        ("before", "before"),
        ("peak", "at peak"),
        ("drained", "drained"),
        ("vacuumed", "after VACUUM"),
        ("compacted", "after the compaction check (compact.run_once, what a worker runs every compact_interval)"),
    )
    for k, label in steps:
        if k in sizes:
            s = sizes[k]
            out.append(
                f"| {label} | {_mb(s['total_bytes'])} | {_mb(s['heap_bytes'])} | {_mb(s['index_bytes'])} "
                f"| {s['live_tuples']:,} | {s['dead_tuples']:,} |"
            )
    if "compact" in b:
        c = b["compact"]
        what = f"rebuilt in {c['seconds'] * 1000:.0f} ms" if c["compacted"] else f"nothing done: {c['skipped']}"
        out += ["", f"Compaction check: {what}."]
    return out


def _problems_md(results: Results) -> list[str]:
    if not results.errors and not results.notes:
        return []
    out = ["", "## Conditions and problems observed", ""]
    out += [f"- {note}" for note in results.notes]
    for e in results.errors:
        first = e["error"].splitlines()[0] if e["error"] else "?"
        out.append(f"- workload {e['workload']}, {e['broker']}, repeat {e['repeat']}: `{first}`")
    return out


METHOD = [
    "",
    "## How it was measured",
    "",
    "- a: one kombu connection per broker; persistent JSON messages of ~230 bytes through a direct exchange; "
    "publish N, then basic_get+ack them; then N more consumed by a Consumer (ack in the callback) via "
    "drain_events at prefetch 1 and 100. Each phase is capped in time.",
    "- b: the tasks are enqueued through Celery first, then `celery worker -P prefork -c 2` with acks_late and "
    "the prefetch multiplier starts; the rate runs from the worker_ready signal (just before its event loop) "
    "to the task that brings a Redis INCR counter to the batch size. Gossip, mingle, heartbeats, events and "
    "remote control are off for every broker.",
    "- c: on the prefetch x1 worker, once its batch is done: tasks sent at 20/s, each records "
    "time.time() at start minus the send time passed as its argument (same host clock), pushed to a Redis list.",
    "- d: in a scratch database of its own (created and dropped by the run), the activity counter is read "
    "around 30 s of one idle worker (prefetch x4), opened 12 s after the worker is ready (PostgreSQL reports an "
    "idle session's transactions up to 10 s late, so an earlier window counts start-up), minus what the "
    "sampler's own two reads add (measured over "
    "a window with no worker). The counter is pg_stat_statements calls when that is loaded, else "
    "xact_commit+xact_rollback of the database: one per statement for an autocommit session such as akadze's.",
    "- e: rows copied from one really published message, inserted with the store's message_insert_many; "
    "latency is one kombu basic_get + ack on the backlogged queue (each phase capped in time); drain by "
    "claim+ack rounds of 5,000 for at most the drain cap, the rest purged; plain VACUUM (as autovacuum), "
    "then one compaction check with the defaults a worker uses.",
    "- Every process of a run imports one snapshot of kombu_akadze copied at start (its sha256 is in the "
    "header), so edits to the work tree during a run do not split it between two versions.",
    "- Counters, the ready stamp and latencies live in Redis for every broker, so each task costs the same "
    "one extra Redis round trip whichever broker runs it.",
]


def chart(results: Results, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    medians, ratios = results.medians(), results.ratios()
    rates = [f for f in FIGURES if f in ratios and FIGURES[f].higher_is_better]
    lats = [f for f in FIGURES if f in medians and not FIGURES[f].higher_is_better]
    fig, axes = plt.subplots(2, 1, figsize=(13, 9))
    width = 0.8 / max(len(results.brokers), 1)
    for ax, figs, values, ylabel in (
        (axes[0], rates, ratios, "throughput / RabbitMQ's (log; higher is better)"),
        (axes[1], lats, medians, "latency ms (log; lower is better)"),
    ):
        for i, broker in enumerate(results.brokers):
            ys = [values.get(f, {}).get(broker, 0) or 0 for f in figs]
            xs = [j + (i - (len(results.brokers) - 1) / 2) * width for j in range(len(figs))]
            ax.bar(xs, [max(y, 1e-4) if y else 0 for y in ys], width, label=broker)
        ax.set_yscale("log")
        ax.set_xticks(range(len(figs)))
        ax.set_xticklabels([textwrap.fill(FIGURES[f].title, 24) for f in figs], fontsize=8)
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", which="both", alpha=0.3)
    axes[0].axhline(1.0, color="black", linewidth=0.8)
    axes[0].legend(ncol=len(results.brokers), fontsize=8, loc="upper right")
    fig.suptitle(
        f"kombu-akadze vs other brokers, same run, median of {results.meta['repeat']} ({results.meta['date']})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(results: Results, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "results.json", out_dir / "results.md", out_dir / "results.png"]
    paths[0].write_text(json.dumps(results.as_json(), indent=2, default=str) + "\n")
    paths[1].write_text(markdown(results))
    chart(results, paths[2])
    return paths
