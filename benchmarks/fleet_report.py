"""The fleet run's results: the targets checked, results.json, results.md and a chart."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

from publishers import TITLES, VARIANTS

#: The issue's targets, as (what, limit); checked against figures of the same run.
MAX_XACTS_PER_TASK = 3.0
MAX_P50_RATIO = 1.5
MAX_P99_RATIO = 2.0
BIG_FLEETS = (16, 32)
MIN_VS_INSERT = 0.6
MIN_VS_RABBIT_AT_8 = 1.5


def idle_limit(workers: int) -> float:
    """Idle transactions/s a fleet of *workers* may cost: 0.2 per worker + 1."""
    return 0.2 * workers + 1.0


class FleetResults:
    """Fleet rows (one per broker and size), publish samples, the headroom check, errors and notes."""

    def __init__(self, meta: dict[str, Any]) -> None:
        self.meta = meta
        self.fleet: list[dict[str, Any]] = []
        self.publish: dict[str, dict[int, list[float]]] = {v: {} for v in VARIANTS}
        #: CPU microseconds per message, publishers' and server's: variant -> processes -> samples.
        self.publish_cpu: dict[str, dict[int, list[tuple[float | None, float | None]]]] = {v: {} for v in VARIANTS}
        self.publish_errors: list[str] = []
        self.headroom: dict[str, Any] = {}
        self.errors: list[dict[str, Any]] = []
        self.notes: list[str] = []

    def row(self, broker: str, size: int) -> dict[str, Any]:
        return next((r for r in self.fleet if r.get("broker") == broker and r.get("size") == size), {})

    def sizes(self) -> list[int]:
        return sorted({r["size"] for r in self.fleet})

    def publish_median(self, variant: str, processes: int) -> float | None:
        samples = self.publish.get(variant, {}).get(processes)
        return statistics.median(samples) if samples else None

    def publish_cpu_median(self, variant: str, processes: int) -> tuple[float | None, float | None]:
        """Median CPU microseconds per message: (publishers, server)."""
        samples = self.publish_cpu.get(variant, {}).get(processes, [])
        client = [c for c, _ in samples if c is not None]
        server = [s for _, s in samples if s is not None]
        return (statistics.median(client) if client else None, statistics.median(server) if server else None)

    def publish_processes(self) -> list[int]:
        return sorted({p for by_p in self.publish.values() for p in by_p})

    def latency_ratio(self, size: int, key: str) -> float | None:
        mine = self.row("akadze", size).get("latency", {}).get(key)
        ref = self.row("rabbitmq", size).get("latency", {}).get(key)
        return mine / ref if mine is not None and ref else None

    def _split(self, size: int, pct: str) -> str:
        """What akadze's latency at *pct* is made of, beside RabbitMQ's whole: its send (the durable commit
        and Celery's send_task), what follows the send, and the bare commit of the same run."""
        la, lr = self.row("akadze", size).get("latency", {}), self.row("rabbitmq", size).get("latency", {})
        send, after, floor = (la.get(f"{k}_{pct}_ms") for k in ("send", "after_send", "floor"))
        if send is None or after is None or floor is None or not lr.get(f"{pct}_ms"):
            return ""
        theirs, their_after = lr[f"{pct}_ms"], lr.get(f"after_send_{pct}_ms")
        return (f" (akadze's send {_f(send)} ms, after the send {_f(after)} ms, bare INSERT commit {_f(floor)} ms; "
                f"RabbitMQ's whole {_f(theirs)} ms, after its send {_f(their_after)} ms)")  # fmt: skip

    def publish_ratio(self, variant: str, reference: str, processes: int) -> float | None:
        mine, ref = self.publish_median(variant, processes), self.publish_median(reference, processes)
        return mine / ref if mine is not None and ref else None

    def targets(self) -> list[tuple[str, str, bool | None]]:
        """(target, what was measured, met?) for every target this run has figures for; None: not measured."""
        out: list[tuple[str, str, bool | None]] = []
        for size in [s for s in self.sizes() if s in BIG_FLEETS]:
            x = self.row("akadze", size).get("trickle_xacts", {}).get("per_task_raw")
            out.append((f"{size} workers: <= {MAX_XACTS_PER_TASK:g} transactions per task", _f(x),
                        None if x is None else x <= MAX_XACTS_PER_TASK))  # fmt: skip
            for key, limit in (("p50_ms", MAX_P50_RATIO), ("p99_ms", MAX_P99_RATIO)):
                r = self.latency_ratio(size, key)
                seen = _x(r) + self._split(size, key[:3])
                out.append((f"{size} workers: latency {key[:3]} <= {limit:g}x RabbitMQ's", seen,
                            None if r is None else r <= limit))  # fmt: skip
        for size in self.sizes():
            idle = self.row("akadze", size).get("idle", {}).get("per_s")
            out.append((f"{size} idle workers: <= {idle_limit(size):g} transactions/s", _f(idle),
                        None if idle is None else idle <= idle_limit(size)))  # fmt: skip
        if self.headroom:
            h = self.headroom
            errors = h.get("workers_with_connection_errors", 0) + len(h.get("publish", {}).get("errors", []))
            ok = h.get("ready") == h.get("workers") and errors == 0 and "error" not in h
            out.append((f"{h.get('workers')} workers + {h.get('publishers')} publishers, no connection error",
                        f"{h.get('ready', 0)} ready, {errors} with errors", ok))  # fmt: skip
        for p in self.publish_processes():
            r = self.publish_ratio("akadze", "insert", p)
            out.append((f"publish at {p}: >= {MIN_VS_INSERT:g}x the bare INSERT", _x(r),
                        None if r is None else r >= MIN_VS_INSERT))  # fmt: skip
        if 8 in self.publish_processes():
            r = self.publish_ratio("akadze", "rabbitmq_confirm", 8)
            # the ceiling of a kombu transport writing one row per message, against the same reference: a
            # target above it cannot be met by any such transport on this machine
            c = self.publish_ratio("kombu_insert", "rabbitmq_confirm", 8)
            seen = _x(r) + (f" (ceiling, kombu publish + bare INSERT: {_x(c)})" if c is not None else "")
            out.append((f"publish at 8: >= {MIN_VS_RABBIT_AT_8:g}x RabbitMQ with confirms", seen,
                        None if r is None else r >= MIN_VS_RABBIT_AT_8))  # fmt: skip
        return out

    def as_json(self) -> dict[str, Any]:
        return {
            "meta": self.meta,
            "fleet": self.fleet,
            "publish": {
                "samples": {v: {str(p): s for p, s in by_p.items()} for v, by_p in self.publish.items()},
                "median": {v: {str(p): self.publish_median(v, p) for p in by_p} for v, by_p in self.publish.items()},
                "cpu_us": {v: {str(p): s for p, s in by_p.items()} for v, by_p in self.publish_cpu.items()},
                "errors": self.publish_errors,
            },
            "headroom": self.headroom,
            "targets": [{"target": t, "measured": m, "met": ok} for t, m, ok in self.targets()],
            "errors": self.errors,
            "notes": self.notes,
        }


def _f(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _x(r: float | None) -> str:
    return "-" if r is None else f"x{r:.2f}"


def _mark(ok: bool | None) -> str:
    return {True: "met", False: "**missed**", None: "not measured"}[ok]


def _sessions(row: dict[str, Any]) -> str:
    """The workers' akadze-* sessions (the harness's own are akadze-bench-*), in all and per ready worker."""
    found = row.get("sessions", {}).items()
    mine = {k: v for k, v in found if k.startswith("akadze-") and not k.startswith("akadze-bench")}
    total = sum(mine.values())
    ready = row.get("ready") or 1
    detail = ", ".join(f"{k.removeprefix('akadze-')} {v}" for k, v in sorted(mine.items()))
    return f"{total} ({total / ready:.1f}/worker: {detail})" if mine else "-"


def console(results: FleetResults) -> str:
    lines = ["fleet (akadze | rabbitmq)"]
    for size in results.sizes():
        a, r = results.row("akadze", size), results.row("rabbitmq", size)
        x = a.get("trickle_xacts", {})
        lines.append(
            f"  {size:>3} workers: ready {a.get('ready', '-')}|{r.get('ready', '-')}  "
            f"idle {_f(a.get('idle', {}).get('per_s'))}/s  sessions {_sessions(a)}  "
            f"xact/task {_f(x.get('per_task_raw'))} (net {_f(x.get('per_task_net'))})  "
            f"p50 {_f(a.get('latency', {}).get('p50_ms'), 1)}|{_f(r.get('latency', {}).get('p50_ms'), 1)} ms  "
            f"p99 {_f(a.get('latency', {}).get('p99_ms'), 1)}|{_f(r.get('latency', {}).get('p99_ms'), 1)} ms  "
            f"conn errors {a.get('workers_with_connection_errors', '-')}"
        )
    for p in results.publish_processes():
        rates = "  ".join(f"{v} {_f(results.publish_median(v, p), 0)}" for v in VARIANTS)
        lines.append(f"publish x{p}: {rates} msgs/s")
    lines += [f"target: {t}: {m} -> {_mark(ok)}" for t, m, ok in results.targets()]
    return "\n".join(lines)


def markdown(results: FleetResults) -> str:
    m = results.meta
    out = [
        "# Fleet benchmark",
        "",
        f"`{m['command']}` on {m['date']} · {m['machine']} · commit {m['commit']} · "
        f"kombu_akadze code {m.get('kombu_akadze code', '?')}",
        "",
        f"Versions: {m['versions']}",
        "",
        f"PostgreSQL settings: {m.get('postgresql settings', 'not recorded')}",
        "",
        f"Load average (1, 5, 15 min) at start {m.get('loadavg at start', '?')}, at the end "
        f"{m.get('loadavg at the end', '?')}; whole run {m.get('seconds', '?')} s. Sizes: {m.get('sizes', {})}",
        "",
        "![transactions per task, latency, idle cost and publish rates](results.png)",
        "",
        "## Targets",
        "",
        "| target | measured | |",
        "|---|---|---|",
    ]
    out += [f"| {t} | {meas} | {_mark(ok)} |" for t, meas, ok in results.targets()]
    out += _fleet_md(results) + _headroom_md(results) + _publish_md(results) + _problems_md(results) + METHOD
    return "\n".join(out) + "\n"


def _fleet_md(results: FleetResults) -> list[str]:
    if not results.fleet:
        return []
    out = [
        "",
        "## f: a fleet of idle solo workers, then a trickle",
        "",
        "| workers | ready (akadze, RabbitMQ) | akadze sessions | server client backends / max | "
        "idle transactions/s (per worker) | limit | transactions per task (net of idle) | "
        "p50 ms akadze / RabbitMQ | p99 ms akadze / RabbitMQ | send_task call p50, p99 ms akadze / RabbitMQ | "
        "after the send p50, p99 ms akadze / RabbitMQ | bare INSERT commit p50, p99 ms | "
        "first task ms akadze / RabbitMQ | workers with connection errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for size in results.sizes():
        a, r = results.row("akadze", size), results.row("rabbitmq", size)
        idle, x, server = a.get("idle", {}), a.get("trickle_xacts", {}), a.get("server", {})
        la, lr = a.get("latency", {}), r.get("latency", {})
        p50, p99 = results.latency_ratio(size, "p50_ms"), results.latency_ratio(size, "p99_ms")
        out.append(
            f"| {size} | {a.get('ready', a.get('error', '-'))}, {r.get('ready', r.get('error', '-'))} "
            f"| {_sessions(a)} | {server.get('client_backends', '-')} / {server.get('max_connections', '-')} "
            f"| {_f(idle.get('per_s'))} ({_f(idle.get('per_worker_per_s'), 3)}) | {idle_limit(size):g} "
            f"| {_f(x.get('per_task_raw'))} ({_f(x.get('per_task_net'))}) "
            f"| {_f(la.get('p50_ms'), 1)} / {_f(lr.get('p50_ms'), 1)} ({_x(p50)}) "
            f"| {_f(la.get('p99_ms'), 1)} / {_f(lr.get('p99_ms'), 1)} ({_x(p99)}) "
            f"| {_f(la.get('send_p50_ms'), 2)}, {_f(la.get('send_p99_ms'), 2)} / "
            f"{_f(lr.get('send_p50_ms'), 2)}, {_f(lr.get('send_p99_ms'), 2)} "
            f"| {_f(la.get('after_send_p50_ms'), 2)}, {_f(la.get('after_send_p99_ms'), 2)} / "
            f"{_f(lr.get('after_send_p50_ms'), 2)}, {_f(lr.get('after_send_p99_ms'), 2)} "
            f"| {_f(la.get('floor_p50_ms'), 2)}, {_f(la.get('floor_p99_ms'), 2)} "
            f"| {_f(a.get('warmup_ms'), 1)} / {_f(r.get('warmup_ms'), 1)} "
            f"| {a.get('workers_with_connection_errors', '-')} |"
        )
    return out


def _headroom_md(results: FleetResults) -> list[str]:
    h = results.headroom
    if not h:
        return []
    if "error" in h:
        return ["", "## Connection headroom", "", f"failed: {h['error']}"]
    peak, pub = h.get("peak", {}), h.get("publish", {})
    return [
        "",
        "## Connection headroom",
        "",
        f"{h['ready']} of {h['workers']} akadze workers ready ({h.get('exited', 0)} exited, "
        f"{h.get('not_ready', 0)} not ready in time); {pub.get('running', 0)} of {h.get('publishers')} "
        f"publisher processes ran ({_f(pub.get('msgs_per_s'), 0)} msgs/s). Peak client backends on the server "
        f"{peak.get('client_backends', '?')} of max_connections {peak.get('max_connections', '?')} "
        f"({peak.get('superuser_reserved', '?')} reserved for superusers); akadze sessions {_sessions(h)}. "
        f"Workers with connection errors in their log: {h.get('workers_with_connection_errors', 0)}; "
        f"publisher errors: {len(pub.get('errors', []))}.",
    ] + [f"- `{e}`" for e in (h.get("first_errors", []) + pub.get("errors", []))[:10]]


def _publish_md(results: FleetResults) -> list[str]:
    procs = results.publish_processes()
    if not procs:
        return []
    out = [
        "",
        "## g: publish rate (~1 KB persistent messages)",
        "",
        "| processes | " + " | ".join(TITLES[v] for v in VARIANTS) + " | akadze / INSERT | akadze / INSERT+NOTIFY "
        "| akadze / (kombu + INSERT) | akadze / RabbitMQ confirms | (kombu + INSERT) / RabbitMQ confirms |",
        "|---|" + "---|" * (len(VARIANTS) + 5),
    ]
    for p in procs:
        cells = " | ".join(_f(results.publish_median(v, p), 0) for v in VARIANTS)
        pairs = [("akadze", "insert"), ("akadze", "insert_notify"), ("akadze", "kombu_insert"),
                 ("akadze", "rabbitmq_confirm"), ("kombu_insert", "rabbitmq_confirm")]  # fmt: skip
        ratios = " | ".join(_x(results.publish_ratio(mine, ref, p)) for mine, ref in pairs)
        out.append(f"| {p} | {cells} | {ratios} |")
    out += [
        "",
        "CPU per message, microseconds: the publisher processes' own (client) and the server's processes over the "
        "round (server: PostgreSQL's, or RabbitMQ's beam.smp). Every process shares this machine's "
        f"{os.cpu_count()} cores, so {os.cpu_count()} x 1e6 / (client + server) bounds the rate where the "
        "cores are saturated.",
        "",
        "| processes | " + " | ".join(TITLES[v] for v in VARIANTS) + " |",
        "|---|" + "---|" * len(VARIANTS),
    ]
    for p in procs:
        cells = []
        for v in VARIANTS:
            client, server = results.publish_cpu_median(v, p)
            total = None if client is None or server is None else client + server
            bound = (os.cpu_count() or 1) * 1e6 / total if total else None
            cells.append(f"{_f(client, 0)} + {_f(server, 0)} = {_f(total, 0)} (bound {_f(bound, 0)}/s)")
        out.append(f"| {p} | " + " | ".join(cells) + " |")
    return out


def _problems_md(results: FleetResults) -> list[str]:
    if not (results.errors or results.notes or results.publish_errors):
        return []
    out = ["", "## Conditions and problems observed", ""]
    out += [f"- {n}" for n in results.notes]
    out += [f"- publish: `{e}`" for e in results.publish_errors[:20]]
    out += [f"- {e['workload']} {e['broker']}: `{e['error'].splitlines()[0]}`" for e in results.errors]
    return out


METHOD = [
    "",
    "## How it was measured",
    "",
    "- f: for each fleet size, N `celery worker -P solo --prefetch-multiplier 1` (acks_late; gossip, mingle, "
    "heartbeats, events and remote control off) consume one queue, akadze's in a scratch database of its own "
    "(created and dropped by the run) so that pg_stat_database counts the fleet and nothing else. Once all are "
    "ready and 12 s have passed (start-up, and PostgreSQL reporting an idle session's transactions up to 10 s "
    "late), xact_commit+xact_rollback is read around the idle window, minus the sampler's own reads (a window "
    "with no worker, measured first). Sessions are pg_stat_activity client backends of the scratch database by "
    "application_name.",
    "- Then the parent sends latency tasks at a fixed rate through one Celery producer connected beforehand; each "
    "task records its start time minus its send time (same host clock) in Redis. One task goes first, before the "
    "idle window, and is kept apart (the 'first task' column): a process's first send_task loads Celery's result "
    "backend (imports), a one-off that was the run's worst latency. p99 of a full run's 600 tasks is the sixth worst "
    "(of 150, the trickle of the runs up to 2ff7845, it was the second worst, and read x1.09 to x3.27 of "
    "RabbitMQ's from run to run). The send_task column is the producer's call alone: akadze's returns once the "
    "row is committed and flushed to the WAL (a round trip), RabbitMQ's (no confirms) once the frame is written, "
    "and each task's latency is split into its send and what follows the send's return (paired by the send "
    "time the task carries). The bare INSERT commit column is PostgreSQL's durable commit alone on the same "
    "server during akadze's trickle: one single-row INSERT (autocommit, synchronous commit, prepared) into a "
    "table with akadze's columns and indexes, in another database, half-way between each two sends. "
    "Transactions per task: the "
    "counter's delta from the first send until 12 s after the last task started, over the tasks sent; 'net' takes "
    "off the idle rate over the same span and the sampler's reads. It includes the publishing.",
    "- Each publish into idle workers also costs the server one transaction per LISTENing worker: PostgreSQL 15 "
    "signals every LISTENing session of the database at each NOTIFY commit, and each reads the notification "
    "queue in a transaction of its own (counted here since the heartbeat shares that session and reports its "
    "statistics). [latency-floor.md](latency-floor.md) measures that cost with bare sessions (`benchmarks/"
    "latency_floor.py`, run after this by `make bench-fleet`), and PostgreSQL's enqueue -> claimed floor beside "
    "RabbitMQ's.",
    "- RabbitMQ runs the same fleet and trickle (it sends nothing to PostgreSQL); the brokers alternate which "
    "goes first from one size to the next.",
    "- Headroom: that many akadze workers stay idle while that many akadze publisher processes publish to another "
    "queue; client backends of the whole server are sampled every 0.5 s, and worker logs are searched for "
    "connection errors ('too many clients', 'remaining connection slots', ...).",
    "- g: P spawned processes each connect, then all start together and publish one at a time for a fixed time: "
    "a bare single-row INSERT (autocommit, synchronous commit, prepared) into a table with akadze's columns and "
    "indexes; the same with pg_notify in the statement; kombu's Producer.publish into kombu's in-memory transport "
    "followed by the bare INSERT (the ceiling of a kombu transport that writes one row per message: kombu's "
    "client work plus the row); akadze through kombu's Producer.publish (one Connection per process); "
    "RabbitMQ pyamqp with confirm_publish. Every round starts on an empty table or queue "
    "(TRUNCATE, purge); variants are interleaved in a rotated order in each repeat; figures are medians.",
]


def chart(results: FleetResults, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = results.sizes()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    ax = axes[0][0]
    for key, label in (("per_task_raw", "raw"), ("per_task_net", "net of idle")):
        ys = [results.row("akadze", s).get("trickle_xacts", {}).get(key) for s in sizes]
        ax.plot(sizes, [y if y is not None else float("nan") for y in ys], marker="o", label=label)
    ax.axhline(MAX_XACTS_PER_TASK, color="red", linestyle="--", linewidth=0.8, label="target")
    ax.set(title="akadze: transactions per task (trickle)", xlabel="workers")
    ax.legend(fontsize=8)
    ax = axes[0][1]
    for broker, color in (("akadze", "tab:blue"), ("rabbitmq", "tab:orange")):
        for key, style in (("p50_ms", "-"), ("p99_ms", ":")):
            ys = [results.row(broker, s).get("latency", {}).get(key) for s in sizes]
            ax.plot(sizes, [y if y is not None else float("nan") for y in ys], style, marker="o", color=color,
                    label=f"{broker} {key[:3]}")  # fmt: skip
    ax.set(title="enqueue -> start latency (ms)", xlabel="workers")
    ax.legend(fontsize=8)
    ax = axes[1][0]
    ys = [results.row("akadze", s).get("idle", {}).get("per_s") for s in sizes]
    ax.plot(sizes, [y if y is not None else float("nan") for y in ys], marker="o", label="akadze")
    ax.plot(sizes, [idle_limit(s) for s in sizes], "r--", linewidth=0.8, label="target 0.2/worker + 1")
    ax.set(title="idle fleet: transactions/s", xlabel="workers")
    ax.legend(fontsize=8)
    ax = axes[1][1]
    procs = results.publish_processes()
    width = 0.8 / len(VARIANTS)
    for i, v in enumerate(VARIANTS):
        xs = [j + (i - (len(VARIANTS) - 1) / 2) * width for j in range(len(procs))]
        ax.bar(xs, [results.publish_median(v, p) or 0 for p in procs], width, label=TITLES[v])
    ax.set_xticks(range(len(procs)))
    ax.set_xticklabels([f"{p} process(es)" for p in procs])
    ax.set(title="publish msgs/s (~1 KB, persistent)")
    ax.legend(fontsize=7)
    for a in (axes[0][0], axes[0][1], axes[1][0]):
        a.set_xticks(sizes)
    for a in axes.flat:
        a.grid(alpha=0.3)
    fig.suptitle(f"kombu-akadze fleet benchmark, one run ({results.meta['date']})")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write(results: FleetResults, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "results.json", out_dir / "results.md", out_dir / "results.png"]
    paths[0].write_text(json.dumps(results.as_json(), indent=2, default=str) + "\n")
    paths[1].write_text(markdown(results))
    chart(results, paths[2])
    return paths
