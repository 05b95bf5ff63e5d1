"""Benchmark kombu-akadze against RabbitMQ (with and without confirms), Redis, kombu's sqla and pgmq in one run.

    .venv/bin/pip install -e '.[bench]'
    .venv/bin/python benchmarks/run.py [--only a,b,c,d,e] [--repeat N] [--quick] [--out docs/benchmarks]

a kombu-level rates · b celery worker throughput · c enqueue->start latency · d idle worker cost on
PostgreSQL · e claim latency and table size behind a large backlog. See docs/benchmarks/results.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import hashlib
import importlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

NEEDED = {
    "redis": "redis",
    "sqlalchemy": "sqlalchemy",
    "psycopg2": "psycopg2-binary",
    "matplotlib": "matplotlib",
    "pgmq": "kombu[pgmq]",
}
WORKLOADS = "abcde"


@dataclass(frozen=True)
class Sizes:
    kombu_n: int
    kombu_cap: float
    noop: int
    sleep: int
    celery_cap: float
    latency_rate: float
    latency_seconds: float
    idle_seconds: float
    idle_baseline: float
    backlog: int
    samples: int
    sample_cap: float
    drain_cap: float


FULL = Sizes(500, 8.0, 10_000, 500, 8.0, 20.0, 10.0, 30.0, 5.0, 1_000_000, 200, 20.0, 30.0)
QUICK = Sizes(100, 3.0, 100, 24, 3.0, 20.0, 1.0, 4.0, 2.0, 20_000, 50, 5.0, 20.0)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--only", default=",".join(WORKLOADS), help="workloads to run, e.g. a,b (default: all)")
    p.add_argument("--repeat", type=int, default=None, help="repeats per broker; medians (default 3, 1 with --quick)")
    p.add_argument("--quick", action="store_true", help="small sizes for a smoke run (~2 minutes)")
    p.add_argument("--out", default=str(ROOT / "docs" / "benchmarks"), help="where results.{json,md,png} go")
    p.add_argument("--brokers", default="akadze,rabbitmq,rabbitmq_confirm,redis,sqla,pgmq", help="brokers to compare")
    p.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    p.add_argument("--amqp-url", default=os.environ.get("BENCH_AMQP_URL", "pyamqp://guest:guest@127.0.0.1:5672//"))
    p.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = p.parse_args(argv)
    args.only = [w.strip() for w in args.only.split(",") if w.strip()]
    bad = [w for w in args.only if w not in WORKLOADS]
    if bad:
        p.error(f"unknown workload(s) {bad}; choose from {','.join(WORKLOADS)}")
    args.repeat = args.repeat or (1 if args.quick else 3)
    return args


def check_dependencies() -> None:
    missing = []
    for module, package in NEEDED.items():
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(package)
    if missing:
        sys.exit(f"benchmarks need {', '.join(missing)}: run `.venv/bin/pip install -e '.[bench]'`")


class Bench:
    """One run: its id, brokers, sizes and results; every workload is guarded so one failure never stops the rest."""

    def __init__(self, args: argparse.Namespace, workdir: Path, code: str) -> None:
        import brokers
        import report

        self.args = args
        self.sizes = QUICK if args.quick else FULL
        self.run_id = uuid.uuid4().hex[:8]
        self.ends = brokers.Endpoints(pg=args.pg_url, amqp=args.amqp_url, redis=args.redis_url)
        names = [n.strip() for n in args.brokers.split(",") if n.strip()]
        unknown = sorted(set(names) - set(brokers.ALL))
        if unknown:
            sys.exit(f"unknown broker(s) {unknown}; choose from {','.join(brokers.ALL)}")
        self.brokers = brokers.make(names, self.run_id, self.ends)
        self.logdir = workdir
        self.code = code
        self.results = report.Results(meta(args, self.ends), names)
        self.results.meta["kombu_akadze code"] = f"{code} (sha256 of the snapshot taken at start)"
        self.results.meta["sizes"] = dataclasses.asdict(self.sizes)

    def log(self, text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)

    def guarded(self, workload: str, broker: str, repeat: int, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:
            trace = traceback.format_exc()
            self.log(f"!! workload {workload} on {broker} (repeat {repeat}) failed: {type(exc).__name__}: {exc}")
            print(trace, file=sys.stderr, flush=True)
            self.results.error(workload, broker, repeat, f"{type(exc).__name__}: {exc}", trace)
            return None

    def rotation(self, repeat: int) -> list[Any]:
        """Brokers in a different order each repeat, so no broker always runs first (or after the slowest)."""
        k = repeat % len(self.brokers)
        return self.brokers[k:] + self.brokers[:k]

    # -- workloads ------------------------------------------------------------

    def kombu(self, repeat: int) -> None:
        import kombu_level

        for broker in self.rotation(repeat):
            self.log(f"a  {broker.name}")
            out = self.guarded(
                "a",
                broker.name,
                repeat,
                lambda b=broker: kombu_level.run(
                    b, run_id=self.run_id, n=self.sizes.kombu_n, cap=self.sizes.kombu_cap, log=self.log
                ),
            )
            for phase, value in (out or {}).items():
                self.results.add(f"a.{phase}", broker.name, value)

    def celery(self, repeat: int, *, throughput: bool, latency: bool) -> None:
        import celery_level

        s = self.sizes
        # (task, how many, prefetch multiplier, remote control): the last row runs Celery's default.
        specs = [
            ("noop", s.noop, 1, False), ("noop", s.noop, 4, False),
            ("sleep", s.sleep, 1, False), ("sleep", s.sleep, 4, False),
            ("noop", s.noop, 1, True),
        ]  # fmt: skip
        if not throughput:
            specs = [("noop", 0, 1, False)]
        for broker in self.rotation(repeat):
            for i, (kind, total, prefetch, rc) in enumerate(specs):
                with_latency = (s.latency_rate, s.latency_seconds) if latency and i == 0 else None
                self.log(
                    f"{'b' if total else 'c'}  {broker.name} {kind} x{total} prefetch x{prefetch}"
                    + (" remote control on" if rc else "")
                    + (" + latency" if with_latency else "")
                )
                out = self.guarded(
                    "b" if total else "c",
                    broker.name,
                    repeat,
                    lambda b=broker, k=kind, t=total, p=prefetch, lat=with_latency, r=rc: celery_level.drain(
                        b, run_id=self.run_id, kind=k, total=t, prefetch=p, cap=s.celery_cap,
                        redis_url=self.ends.redis, logdir=self.logdir, latency=lat, log=self.log,
                        remote_control=r,
                    ),
                )  # fmt: skip
                if not out:
                    continue
                if total and "tasks_per_s" in out:
                    self.results.add(
                        f"b.{kind}_p{prefetch}{'_rc' if rc else ''}",
                        broker.name,
                        out["tasks_per_s"],
                        capped=bool(out.get("partial")),
                    )
                if "latency" in out:
                    self.results.add("c.p50", broker.name, out["latency"]["p50_ms"])
                    self.results.add("c.p99", broker.name, out["latency"]["p99_ms"])

    def worker_errors(self) -> None:
        import celery_level

        celery_level.settle()
        for log_path, lines in celery_level.WORKER_ERRORS:
            name = Path(log_path).name
            for line in lines:
                self.results.notes.append(f"worker log {name}: `{line.strip()}`")
        celery_level.WORKER_ERRORS.clear()

    def idle(self) -> None:
        """In a scratch database of its own: pg_stat_database then counts this worker and nothing else."""
        import brokers
        from pgstats import Pg

        name = f"akadze_bench_{self.run_id}"
        scratch = brokers.Endpoints(pg=with_database(self.ends.pg, name), amqp=self.ends.amqp, redis=self.ends.redis)
        candidates = [b.name for b in self.brokers if b.kind in ("akadze", "sqla")]
        # pgmq already runs in a database of its own that nothing else uses: measured there.
        alone = [(b, with_database(self.ends.pg, b.database)) for b in self.brokers if b.kind == "pgmq" and b.database]
        if candidates:
            with Pg(self.ends.pg) as pg:
                pg.run("database_create", database=name)
            scratch_brokers = brokers.make(candidates, self.run_id, scratch)
            try:
                brokers.prepare(scratch_brokers, scratch)
                self._idle([(b, scratch.pg) for b in scratch_brokers])
            finally:
                brokers.dispose_sqla_engines()
                with Pg(self.ends.pg) as pg:
                    pg.run("database_drop", database=name)
        self._idle(alone)

    def _idle(self, measured: list[tuple[Any, str]]) -> None:
        import idle

        for broker, dsn in measured:
            s = self.sizes
            self.log(f"d  {broker.name}: {s.idle_baseline:.0f} s baseline, {s.idle_seconds:.0f} s idle worker")
            out = self.guarded(
                "d",
                broker.name,
                0,
                lambda b=broker, dsn=dsn: idle.run(
                    b, run_id=self.run_id, pg_dsn=dsn, seconds=self.sizes.idle_seconds,
                    baseline_seconds=self.sizes.idle_baseline, redis_url=self.ends.redis, logdir=self.logdir,
                    log=self.log,
                ),
            )  # fmt: skip
            self.results.idle[broker.name] = out if out is not None else {"error": self.results.errors[-1]["error"]}
            if out:
                self.log(
                    f"   {out['per_s']:.2f}/s net ({out['counted']} counted, {out['sampler_count']} by the sampler)"
                )

    def backlog(self) -> None:
        import backlog

        for broker in self.brokers:
            self.log(f"e  {broker.name}: get+ack latency, near-empty queue")
            out = self.guarded(
                "e",
                broker.name,
                0,
                lambda b=broker: backlog.get_ack_latency(
                    b, run_id=self.run_id, samples=self.sizes.samples, sample_cap=self.sizes.sample_cap
                ),
            )
            if out:
                self.results.add("e.getack_p50", broker.name, out["p50_ms"])
                self.results.add("e.getack_p99", broker.name, out["p99_ms"])
        if not any(b.kind == "akadze" for b in self.brokers):
            return
        self.log(f"e  akadze: backlog of {self.sizes.backlog:,}")
        out = self.guarded(
            "e",
            "akadze",
            0,
            lambda: backlog.run(
                self.ends, run_id=self.run_id, total=self.sizes.backlog, samples=self.sizes.samples,
                sample_cap=self.sizes.sample_cap, drain_cap=self.sizes.drain_cap, log=self.log,
            ),
        )  # fmt: skip
        self.results.backlog = out if out is not None else {"error": self.results.errors[-1]["error"]}

    def neighbours(self, when: str) -> None:
        """Note other clients of the database and the load: on 2 cores they move every figure."""
        from pgstats import Pg

        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        self.results.meta[f"loadavg {when}"] = load
        try:
            with Pg(self.ends.pg) as pg:
                others = pg.client_sessions()
        except Exception as exc:
            others = {f"(could not list: {exc})": 0}
        if others:
            text = ", ".join(f"{k}: {v}" for k, v in others.items())
            self.results.notes.append(f"other sessions on the benchmark database {when} (load {load}): {text}")
            self.log(f"other sessions on the database {when}: {text}; load average {load}")

    # -- the run --------------------------------------------------------------

    def run(self) -> int:
        import brokers
        import report

        only = self.args.only
        started = time.monotonic()
        self.log(f"run {self.run_id}: workloads {','.join(only)}, {self.args.repeat} repeat(s), "
                 f"{'quick' if self.args.quick else 'full'} sizes; worker logs in {self.logdir}")  # fmt: skip
        self.neighbours("at start")
        try:
            brokers.prepare(self.brokers, self.ends)
            if "a" in only:
                for r in range(self.args.repeat):
                    self.kombu(r)
            if "b" in only or "c" in only:
                for r in range(self.args.repeat):
                    self.celery(r, throughput="b" in only, latency="c" in only)
                self.worker_errors()
            if "d" in only:
                self.idle()
            if "e" in only:
                self.backlog()
        finally:
            problems = brokers.cleanup(self.brokers, self.ends, self.run_id)
            for problem in problems:
                self.log(f"!! cleanup: {problem}")
                self.results.notes.append(f"cleanup: {problem}")
        self.neighbours("at the end")
        live = digest(ROOT / "kombu_akadze")
        if live != self.code:
            self.results.notes.append(
                f"kombu_akadze changed in the work tree during the run ({self.code} -> {live}); "
                f"every process of this run used the snapshot {self.code} taken at start"
            )
        self.results.meta["seconds"] = round(time.monotonic() - started, 1)
        print()
        print(report.console(self.results))
        paths = report.write(self.results, Path(self.args.out))
        self.log(f"done in {self.results.meta['seconds']:.0f} s; wrote {', '.join(str(p) for p in paths)}")
        return 1 if self.results.errors else 0


def with_database(url: str, database: str) -> str:
    """The same PostgreSQL URL pointing at another database."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path="/" + database))


def meta(args: argparse.Namespace, ends: Any) -> dict[str, Any]:
    return {
        "command": "benchmarks/run.py " + " ".join(sys.argv[1:]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{os.cpu_count()} cores, {platform.system()} {platform.machine()}, "
        f"Python {platform.python_version()}",
        "commit": commit(),
        "repeat": args.repeat,
        "quick": args.quick,
        "versions": versions(ends),
        "postgresql settings": server_settings(ends),
    }


def server_settings(ends: Any) -> str:
    with contextlib.suppress(Exception):
        from pgstats import Pg

        with Pg(ends.pg) as pg:
            rows = pg.rows("server_settings")
        return ", ".join(f"{r['name']}={r['setting']}" + (f" ({r['unit']} units)" if r["unit"] else "") for r in rows)
    return "unknown"


def commit() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "kombu_akadze"], cwd=ROOT, capture_output=True, text=True, check=False
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("+uncommitted kombu_akadze changes" if dirty.stdout.strip() else "")


def versions(ends: Any) -> str:
    import celery
    import kombu

    import kombu_akadze

    found = {"kombu-akadze": kombu_akadze.__version__, "kombu": kombu.__version__, "celery": celery.__version__}
    with contextlib.suppress(Exception):
        from pgstats import Pg

        with Pg(ends.pg) as pg:
            found["PostgreSQL"] = pg.one("server_version")["version"]
    with contextlib.suppress(Exception), kombu.Connection(ends.amqp, connect_timeout=5) as conn:
        conn.connect()
        found["RabbitMQ"] = conn.connection.server_properties.get("version", "?")
    with contextlib.suppress(Exception):
        import redis

        found["Redis"] = redis.Redis.from_url(ends.redis).info("server")["redis_version"]
    with contextlib.suppress(Exception):
        import sqlalchemy

        found["SQLAlchemy"] = sqlalchemy.__version__
    return ", ".join(f"{k} {v}" for k, v in found.items())


def snapshot(workdir: Path) -> str:
    """Copy kombu_akadze as it is now and import only that copy, here and in every worker.

    The package is being changed while benchmarks run; without this, workers started later
    in a run would measure newer code than the ones before them.
    """
    target = workdir / "src"
    shutil.copytree(ROOT / "kombu_akadze", target / "kombu_akadze", ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(0, str(target))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(target), os.environ.get("PYTHONPATH", "")) if p)
    return digest(target / "kombu_akadze")


def digest(folder: Path) -> str:
    """sha256 (12 hex digits) of the package's .py and .sql files, to tell two states of the code apart."""
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.suffix in (".py", ".sql") and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    check_dependencies()
    workdir = Path(tempfile.mkdtemp(prefix="akadze-bench-"))
    code = snapshot(workdir)
    if "kombu_akadze" in sys.modules:
        sys.exit("kombu_akadze was imported before the snapshot; run benchmarks/run.py as a script")
    return Bench(args, workdir, code).run()


if __name__ == "__main__":
    sys.exit(main())
