"""The fleet benchmark: fleets of idle solo workers and a trickle (f), connection headroom (h), publish rates (g).

    .venv/bin/python benchmarks/fleet_run.py [--only f,h,g] [--fleet-sizes 1,8,16,32] [--quick] [--out DIR]

akadze against RabbitMQ and against bare PostgreSQL INSERTs, all in the same run. See docs/benchmarks/fleet/results.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import run as harness  # noqa: E402  (snapshot, meta and URLs of the main harness; imports no kombu_akadze)

PARTS = "fhg"


@dataclass(frozen=True)
class Sizes:
    fleet_sizes: tuple[int, ...]
    trickle: int
    trickle_rate: float
    idle_seconds: float
    baseline_seconds: float
    headroom_workers: int
    headroom_publishers: int
    publishers: tuple[int, ...]
    publish_seconds: float
    repeat: int


FULL = Sizes((1, 8, 16, 32), 600, 10.0, 30.0, 5.0, 40, 8, (1, 8), 10.0, 3)
QUICK = Sizes((1, 4), 20, 10.0, 5.0, 2.0, 4, 2, (1, 2), 1.0, 1)


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--only", default=",".join(PARTS), help="parts to run: f fleet, h headroom, g publishers")
    p.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    p.add_argument("--fleet-sizes", type=ints, help="workers per fleet (default 1,8,16,32; --quick 1,4)")
    p.add_argument("--trickle", type=int, help="tasks in the trickle (default 600; --quick 20)")
    p.add_argument("--trickle-rate", type=float, help="tasks/s of the trickle (default 10)")
    p.add_argument("--idle-seconds", type=float, help="idle window (default 30; --quick 5)")
    p.add_argument("--headroom", type=int, help="workers held during the headroom check (default 40; 0: skip)")
    p.add_argument("--headroom-publishers", type=int, help="publisher processes during it (default 8)")
    p.add_argument("--publishers", type=ints, help="publisher processes per round (default 1,8; --quick 1,2)")
    p.add_argument("--publish-seconds", type=float, help="seconds per publish round (default 10; --quick 1)")
    p.add_argument("--repeat", type=int, help="publish rounds per variant; medians (default 3; --quick 1)")
    p.add_argument("--out", default=str(harness.ROOT / "docs" / "benchmarks" / "fleet"), help="results folder")
    p.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    p.add_argument("--amqp-url", default=os.environ.get("BENCH_AMQP_URL", "pyamqp://guest:guest@127.0.0.1:5672//"))
    p.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = p.parse_args(argv)
    args.only = [w.strip() for w in args.only.split(",") if w.strip()]
    if set(args.only) - set(PARTS):
        p.error(f"unknown part(s) {sorted(set(args.only) - set(PARTS))}; choose from {','.join(PARTS)}")
    base = QUICK if args.quick else FULL
    given = {
        "fleet_sizes": args.fleet_sizes, "trickle": args.trickle, "trickle_rate": args.trickle_rate,
        "idle_seconds": args.idle_seconds, "headroom_workers": args.headroom,
        "headroom_publishers": args.headroom_publishers, "publishers": args.publishers,
        "publish_seconds": args.publish_seconds, "repeat": args.repeat,
    }  # fmt: skip
    args.sizes = dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})
    args.repeat = args.sizes.repeat
    return args


class FleetBench:
    """One run: a scratch database for everything akadze does, RabbitMQ beside it; always cleaned up."""

    def __init__(self, args: argparse.Namespace, workdir: Path, code: str) -> None:
        import brokers
        import fleet_report

        self.args = args
        self.sizes: Sizes = args.sizes
        self.run_id = uuid.uuid4().hex[:8]
        self.ends = brokers.Endpoints(pg=args.pg_url, amqp=args.amqp_url, redis=args.redis_url)
        self.database = f"akadze_fleet_{self.run_id}"
        self.scratch = brokers.Endpoints(
            pg=harness.with_database(args.pg_url, self.database), amqp=args.amqp_url, redis=args.redis_url
        )
        self.akadze = brokers.make(["akadze"], self.run_id, self.scratch)[0]
        self.rabbit, self.confirm = brokers.make(["rabbitmq", "rabbitmq_confirm"], self.run_id, self.ends)
        self.logdir = workdir
        self.results = fleet_report.FleetResults(harness.meta(args, self.ends))
        self.results.meta["command"] = "benchmarks/fleet_run.py " + " ".join(sys.argv[1:])
        self.results.meta["kombu_akadze code"] = f"{code} (sha256 of the snapshot taken at start)"
        self.results.meta["sizes"] = dataclasses.asdict(self.sizes)

    def log(self, text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)

    def guarded(self, part: str, broker: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:
            self.log(f"!! {part} on {broker} failed: {type(exc).__name__}: {exc}")
            print(traceback.format_exc(), file=sys.stderr, flush=True)
            error = {"workload": part, "broker": broker, "error": f"{type(exc).__name__}: {exc}"}
            self.results.errors.append({**error, "traceback": traceback.format_exc()})
            return None

    def sampler_count(self) -> int:
        """What the sampler's own two reads add to the scratch database's counter, with nothing else there."""
        from pgstats import Pg

        with Pg(self.scratch.pg) as pg:
            first = pg.activity_counter(use_statements=False)
            time.sleep(self.sizes.baseline_seconds)
            return pg.activity_counter(use_statements=False) - first

    # -- parts ----------------------------------------------------------------

    def fleets(self, sampler: int) -> None:
        import fleet

        s = self.sizes
        for i, size in enumerate(s.fleet_sizes):
            for broker in (self.akadze, self.rabbit)[:: 1 if i % 2 == 0 else -1]:
                self.log(f"f  {broker.name}: {size} solo worker(s), trickle of {s.trickle} at {s.trickle_rate:g}/s")
                out = self.guarded(
                    "f",
                    broker.name,
                    lambda b=broker, n=size: fleet.run_size(
                        b, size=n, run_id=self.run_id, pg_dsn=self.scratch.pg if b.kind == "akadze" else None,
                        sampler_count=sampler, idle_seconds=s.idle_seconds, tasks=s.trickle, rate=s.trickle_rate,
                        redis_url=self.ends.redis, logdir=self.logdir, log=self.log,
                        floor_dsn=self.ends.pg if b.kind == "akadze" else None,
                    ),
                )  # fmt: skip
                self.results.fleet.append(out or {"broker": broker.name, "size": size, "error": "failed"})
                if out and "latency" in out:
                    lat, x = out["latency"], out.get("trickle_xacts", {})
                    self.log(f"   p50 {lat.get('p50_ms', 0):.1f} ms, p99 {lat.get('p99_ms', 0):.1f} ms, "
                             f"send_task p50 {lat.get('send_p50_ms', 0):.2f} p99 {lat.get('send_p99_ms', 0):.2f} ms, "
                             f"after the send p50 {lat.get('after_send_p50_ms', 0):.2f} "
                             f"p99 {lat.get('after_send_p99_ms', 0):.2f} ms, "
                             + (f"bare commit p50 {lat['floor_p50_ms']:.2f} p99 {lat['floor_p99_ms']:.2f} ms, "
                                if "floor_p50_ms" in lat else "") +
                             f"first task {out.get('warmup_ms') or 0:.1f} ms "
                             f"({lat['count']} of {lat['sent']})"
                             + (f"; {x['per_task_raw']:.2f} transactions/task, {x['per_task_net']:.2f} net"
                                if x else ""))  # fmt: skip

    def headroom(self) -> None:
        import fleet
        import publishers

        s = self.sizes
        target = dataclasses.replace(
            publishers.targets(self.akadze, self.confirm, dsn=self.scratch.pg, run_id=self.run_id)["akadze"],
            queue=self.akadze.queue_name("headroom-publish", self.run_id),
        )
        self.log(f"h  {s.headroom_workers} akadze workers + {s.headroom_publishers} publishers")
        out = self.guarded(
            "h",
            "akadze",
            lambda: fleet.headroom(
                self.akadze, workers=s.headroom_workers, run_id=self.run_id, pg_dsn=self.scratch.pg,
                publish=lambda: publishers.run_round(
                    target, processes=s.headroom_publishers, seconds=max(s.publish_seconds, 3.0)
                ),
                redis_url=self.ends.redis, logdir=self.logdir, log=self.log,
            ),
        )  # fmt: skip
        self.results.headroom = {**(out or {"error": self.results.errors[-1]["error"]}),
                                 "workers": s.headroom_workers, "publishers": s.headroom_publishers}  # fmt: skip
        if out:
            self.log(f"   peak {out['peak'].get('client_backends')} client backends; "
                     f"{out['workers_with_connection_errors']} worker(s) with connection errors")  # fmt: skip

    def publish(self) -> None:
        import publishers
        from pgstats import Pg

        s = self.sizes
        found = publishers.targets(self.akadze, self.confirm, dsn=self.scratch.pg, run_id=self.run_id)
        with Pg(self.scratch.pg) as pg:
            publishers.prepare(found, pg)
        variants = list(publishers.VARIANTS)
        for r in range(s.repeat):
            for j, processes in enumerate(s.publishers):
                k = (r + j) % len(variants)
                for variant in variants[k:] + variants[:k]:
                    target = found[variant]
                    out = self.guarded("g", variant, lambda t=target, p=processes: self._round(t, p))
                    if not out:
                        continue
                    self.results.publish_errors += [f"{variant} x{processes}: {e}" for e in out["errors"]]
                    if out["running"] == processes:
                        self.results.publish[variant].setdefault(processes, []).append(out["msgs_per_s"])
                        cpu = (out.get("client_us"), out.get("server_us"))
                        self.results.publish_cpu[variant].setdefault(processes, []).append(cpu)
                    self.log(f"g  {variant} x{processes}: {out['msgs_per_s']:,.0f} msgs/s, CPU/msg client "
                             f"{out.get('client_us') or 0:,.0f} us, server {out.get('server_us') or 0:,.0f} us"
                             + (f" ({len(out['errors'])} error(s))" if out["errors"] else ""))  # fmt: skip

    def _round(self, target: Any, processes: int) -> dict[str, Any]:
        import publishers
        from pgstats import Pg

        with Pg(self.scratch.pg) as pg:
            publishers.empty(target, pg, self.akadze.schema or "", self.confirm)
        return publishers.run_round(target, processes=processes, seconds=self.sizes.publish_seconds)

    # -- the run --------------------------------------------------------------

    def server_sessions(self, when: str) -> None:
        """Everyone's connections count against max_connections: note them, with the load."""
        from pgstats import Pg

        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        self.results.meta[f"loadavg {when}"] = load
        try:
            with Pg(self.ends.pg) as pg:
                server = pg.one("server_sessions")
        except Exception as exc:
            server = {"error": str(exc)}
        self.results.notes.append(f"client backends on the server {when} (load {load}): {server}")
        self.log(f"client backends on the server {when}: {server}; load average {load}")

    def run(self) -> int:
        import brokers
        import fleet_report
        from pgstats import Pg

        started = time.monotonic()
        self.log(f"fleet run {self.run_id}: parts {','.join(self.args.only)}; logs in {self.logdir}")
        self.server_sessions("at start")
        with Pg(self.ends.pg) as pg:
            pg.run("database_create", database=self.database)
        try:
            brokers.prepare([self.akadze], self.scratch)
            if "f" in self.args.only:
                sampler = self.sampler_count()
                self.log(f"sampler's own count per window: {sampler}")
                self.fleets(sampler)
            if "h" in self.args.only and self.sizes.headroom_workers > 0:
                self.headroom()
            if "g" in self.args.only:
                self.publish()
        finally:
            for problem in brokers.cleanup([self.rabbit, self.confirm], self.ends, self.run_id):
                self.log(f"!! cleanup: {problem}")
                self.results.notes.append(f"cleanup: {problem}")
            with Pg(self.ends.pg) as pg:
                pg.run("database_drop", database=self.database)
        self.server_sessions("at the end")
        self.results.meta["seconds"] = round(time.monotonic() - started, 1)
        print()
        print(fleet_report.console(self.results))
        paths = fleet_report.write(self.results, Path(self.args.out))
        self.log(f"done in {self.results.meta['seconds']:.0f} s; wrote {', '.join(str(p) for p in paths)}")
        return 1 if self.results.errors else 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    harness.check_dependencies()
    workdir = Path(tempfile.mkdtemp(prefix="akadze-fleet-"))
    code = harness.snapshot(workdir)
    if "kombu_akadze" in sys.modules:
        sys.exit("kombu_akadze was imported before the snapshot; run benchmarks/fleet_run.py as a script")
    return FleetBench(args, workdir, code).run()


if __name__ == "__main__":
    sys.exit(main())
