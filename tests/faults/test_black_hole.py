"""Network faults between one worker and PostgreSQL, through a loopback proxy: a black hole shorter
than heartbeat_ttl changes nothing; a longer one lets the other worker rescue and re-run the cut-off
worker's message, whose late ack is then fenced; resets and latency heal by themselves."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kombu_akadze.options import Options
from kombu_akadze.store import KEEPALIVE_DEFAULTS

from .blackhole_probe import NOWHERE
from .checker import Ledgers, verdict
from .conftest import SCHEMA, Faults
from .jobs import TOUCH
from .pgserver import Proxy

TTL = 6.0
OPTIONS = {"heartbeat_interval": 1.0, "heartbeat_ttl": TTL, "rescue_interval": 0.5}
SHORT = 3.0  # < TTL - heartbeat_interval: the cut-off worker's lease never expires
LONG = TTL + 5.0  # > TTL + rescue_interval: the other worker's rescue must take the lease
FENCED = "changed nothing: that run is not ours any more"


def _runs_of(ledgers: Ledgers, worker: str, n: int) -> list[int | None]:
    runs = ledgers.runs()
    return [r.attempt for r in runs if r.event == "start" and r.n == n and r.source.startswith(f"ledger-{worker}-")]


def _wait_holding(faults: Faults, worker: str, numbers: range) -> int:
    """The first n of *numbers* that *worker* has started."""
    found = faults.until(
        lambda: [n for n in numbers if _runs_of(faults.ledgers, worker, n)],
        timeout=90,
        interval=0.05,
        what=f"worker {worker} starts one of {numbers}",
    )
    return found[0]


@pytest.fixture
def proxy(own: Faults) -> Iterator[Proxy]:
    assert own.server is not None
    p = Proxy(own.server.port)
    yield p
    p.close()


@pytest.mark.slow
def test_black_hole_shorter_than_heartbeat_ttl_causes_no_redelivery(own: Faults, proxy: Proxy) -> None:
    own.options = OPTIONS
    assert own.server is not None
    own.start_worker("a", concurrency=2, url=own.server.url(port=proxy.port))  # behind the proxy
    own.start_worker("b", concurrency=2)
    app = own.producer()
    numbers = range(60)
    for n in numbers:
        app.send_task(TOUCH, args=[n], kwargs={"seconds": 0.3})
    _wait_holding(own, "a", numbers)

    proxy.pause()
    paused = time.monotonic()
    while time.monotonic() - paused < SHORT:  # the outage itself
        time.sleep(0.05)
    proxy.resume()
    resumed = time.time()

    own.until(lambda: own.ledgers.all_done(numbers), timeout=120, interval=0.2, what="every task completed")
    own.until(lambda: own.queued() == 0, timeout=60, interval=0.2, what="every message acked")
    runs = own.ledgers.runs()
    after = [r.at for r in runs if r.event == "start" and r.source.startswith("ledger-a-") and r.at > resumed]
    result = verdict(
        "black hole < heartbeat_ttl (proxy paused)",
        injected=f"{SHORT:g} s black hole of worker a, heartbeat_ttl {TTL:g} s",
        published=numbers,
        ledgers=own.ledgers,
        recovery=(after[0] - resumed) if after else None,
    )
    assert result.lost == 0
    assert result.duplicated == 0
    starts = [r for r in runs if r.event == "start"]
    assert len(starts) == len(numbers), "a message ran twice: a lease expired during a short outage"
    assert {r.attempt for r in starts} == {1}


@pytest.mark.slow
def test_black_hole_longer_than_heartbeat_ttl_is_rescued_once_and_the_late_ack_is_fenced(
    own: Faults, proxy: Proxy
) -> None:
    own.options = OPTIONS
    assert own.server is not None
    a = own.start_worker("a", concurrency=1, url=own.server.url(port=proxy.port))  # behind the proxy
    app = own.producer()
    # Long on the first attempt (still running when the network returns), at once when run again.
    cut = 0
    app.send_task(TOUCH, args=[cut], kwargs={"seconds": LONG + 6.0, "later_seconds": 0.0})
    _wait_holding(own, "a", range(1))
    b = own.start_worker("b", concurrency=1)  # only now: the long task is a's
    own.until(lambda: len(own.server.sessions("akadze-heartbeat")) >= 2, timeout=90, what="worker b is up")

    proxy.pause()
    paused = time.time()
    rerun = own.until(
        lambda: [r for r in own.ledgers.started(cut) if r.source.startswith("ledger-b-")],
        timeout=LONG + 30,
        interval=0.1,
        what=f"worker b rescues and re-runs task {cut} while worker a is cut off",
    )[0]
    rescued_after = rerun.at - paused
    others = range(1, 11)  # traffic during the black hole: worker b takes it
    for n in others:
        app.send_task(TOUCH, args=[n])
    while time.time() - paused < LONG:  # keep worker a cut off for the whole outage
        time.sleep(0.05)
    proxy.resume()

    published = [cut, *others]
    own.until(lambda: own.ledgers.all_done(published), timeout=120, interval=0.2, what="every task completed")
    own.until(lambda: own.queued() == 0, timeout=60, interval=0.2, what="every message acked")
    # a's first run ends after the network is back; its ack carries run_count 1, the row is gone (or
    # held by run 2): the ack changes nothing, and says so.
    own.until(lambda: FENCED in a.output(), timeout=60, interval=0.2, what="worker a's late ack is fenced")
    result = verdict(
        "black hole > heartbeat_ttl (proxy paused)",
        injected=f"{LONG:g} s black hole of worker a, heartbeat_ttl {TTL:g} s, 1 message in flight",
        published=published,
        ledgers=own.ledgers,
        recovery=rescued_after,
    )
    assert result.lost == 0
    assert result.duplicated == 1, "exactly the message in flight at the black hole runs twice"
    starts = [r for r in own.ledgers.runs() if r.event == "start" and r.n == cut]
    assert [(r.source.split("-")[1], r.attempt) for r in starts] == [("a", 1), ("b", 2)], "one rescue, one rerun"
    # The lease ends heartbeat_ttl after a's last heartbeat, which was up to one interval before the cut.
    assert TTL - OPTIONS["heartbeat_interval"] <= rescued_after < TTL + 20
    assert a.alive
    assert b.alive
    # And worker a, reconnected, takes work again.
    app.send_task(TOUCH, args=[100], kwargs={"seconds": 1.0})
    app.send_task(TOUCH, args=[101], kwargs={"seconds": 1.0})
    own.until(
        lambda: _runs_of(own.ledgers, "a", 100) or _runs_of(own.ledgers, "a", 101),
        timeout=60,
        what="worker a runs tasks again",
    )


@pytest.mark.slow
def test_connection_resets_and_latency_between_worker_and_database_heal(own: Faults, proxy: Proxy) -> None:
    own.options = OPTIONS
    assert own.server is not None
    a = own.start_worker("a", concurrency=2, url=own.server.url(port=proxy.port))
    app = own.producer()
    flow = range(40)
    for n in flow:
        app.send_task(TOUCH, args=[n], kwargs={"seconds": 0.02})
    own.until(lambda: len(own.ledgers.done()) >= 10, timeout=90, what="worker a runs tasks")
    proxy.delay(0.05)  # 50 ms each way on every chunk
    own.until(lambda: own.ledgers.all_done(flow), timeout=120, interval=0.2, what="tasks complete at 50 ms latency")
    proxy.delay(0.0)

    # Reset every connection while a task runs and a slot is free: the next claim meets a dead session.
    recoveries = []
    resets = 0
    for k, n in enumerate((1000, 1001)):
        app.send_task(TOUCH, args=[n], kwargs={"seconds": 3.0})
        own.until(lambda n=n: own.ledgers.started(n), timeout=60, what=f"worker a starts task {n}")
        resets += proxy.reset()
        began = time.monotonic()
        probe = 2000 + k
        app.send_task(TOUCH, args=[probe])
        own.until(
            lambda p=probe: own.ledgers.all_done([p]), timeout=90, interval=0.05, what="a task after the reset runs"
        )
        recoveries.append(time.monotonic() - began)

    published = [*flow, 1000, 1001, 2000, 2001]
    own.until(lambda: own.ledgers.all_done(published), timeout=120, interval=0.2, what="every task completed")
    own.until(lambda: own.queued() == 0, timeout=60, interval=0.2, what="every message acked")
    result = verdict(
        "TCP resets + 50 ms latency (proxy)",
        injected=f"50 ms delay; 2 resets ({resets} connections RST) with a task running",
        published=published,
        ledgers=own.ledgers,
        recovery=max(recoveries),
    )
    assert result.lost == 0
    twice = {n for n, count in own.ledgers.done().items() if count > 1}
    assert twice <= {1000, 1001}, "only a task running at a reset may run again (its channel was closed)"
    assert a.alive


def _can_make_namespaces() -> bool:
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("ip")):
        return False
    probe = subprocess.run(
        ["unshare", "--net", "ip", "link", "add", "t0", "type", "veth", "peer", "name", "t1"],
        capture_output=True,
        timeout=30,
        check=False,
    )
    return probe.returncode == 0


@pytest.mark.slow
def test_tcp_defaults_detect_a_kernel_level_black_hole_within_heartbeat_ttl(own: Faults) -> None:
    """Not a proxy pause (the proxy's kernel still ACKs): frames are dropped on a veth link, so TCP itself
    sees silence. A session waiting on a statement fails by tcp_user_timeout, an idle one by keepalive."""
    if not _can_make_namespaces():
        pytest.skip("needs root, unshare and veth support to black-hole a link at layer 2")
    assert own.server is not None
    ttl = Options().heartbeat_ttl  # the default: 30 s
    net = f"10.213.{random.randrange(1, 250)}"
    host_ip, client_ip = f"{net}.1", f"{net}.2"
    iface = f"akzh{os.getpid() % 100000}"
    tests = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(tests), os.environ.get("PYTHONPATH")) if p)}
    probe = subprocess.Popen(
        ["unshare", "--net", sys.executable, "-m", "faults.blackhole_probe"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tests,
    )
    proxy = None
    try:
        ours = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + 30
        while os.readlink(f"/proc/{probe.pid}/ns/net") == ours:  # unshare has not switched yet
            assert time.monotonic() < deadline, "the probe never got a network namespace of its own"
            time.sleep(0.01)
        # Our end in this namespace, the probe's end in its own; both go away with the probe.
        subprocess.run(
            ["ip", "link", "add", iface, "type", "veth", "peer", "name", "akzc", "netns", str(probe.pid)],
            check=True,
            timeout=30,
        )
        subprocess.run(["ip", "addr", "add", f"{host_ip}/30", "dev", iface], check=True, timeout=30)
        subprocess.run(["ip", "link", "set", iface, "up"], check=True, timeout=30)
        proxy = Proxy(own.server.port, bind=host_ip)  # plain forwarding: the fault is on the link
        url = f"postgresql://postgres@{host_ip}:{proxy.port}/postgres"
        assert probe.stdin is not None
        assert probe.stdout is not None
        spec = {"url": url, "schema": SCHEMA, "iface": "akzc", "client_ip": client_ip, "host_ip": host_ip}
        probe.stdin.write(json.dumps(spec) + "\n")
        probe.stdin.flush()
        assert probe.stdout.readline().strip() == "ready", probe.stderr.read() if probe.stderr else ""
        # Both directions, as a cut cable: frames to the probe go to a MAC address nobody has.
        nowhere = ["lladdr", NOWHERE, "dev", iface, "nud", "permanent"]
        subprocess.run(["ip", "neigh", "replace", client_ip, *nowhere], check=True, timeout=30)
        probe.stdin.write("go\n")
        probe.stdin.flush()
        line = probe.stdout.readline()
        assert line, f"the probe died: {probe.stderr.read() if probe.stderr else ''}"
        result = json.loads(line)
    finally:
        probe.kill()
        probe.wait(30)
        for pipe in (probe.stdin, probe.stdout, probe.stderr):
            if pipe is not None:
                pipe.close()
        subprocess.run(["ip", "link", "del", iface], capture_output=True, timeout=30, check=False)  # gone already
        if proxy is not None:
            proxy.close()
    print(f"\nkernel black hole: {result} (TCP defaults {KEEPALIVE_DEFAULTS}, heartbeat_ttl {ttl:g} s)")
    detected = max(result["busy_seconds"], result["idle_seconds"])
    verdict(
        "kernel-level black hole (veth, frames dropped)",
        injected="1 link black-holed under 1 busy + 1 idle (LISTEN) session",
        published=[],
        ledgers=own.ledgers,
        recovery=detected,
    )
    assert "TransientDatabaseError" in (result["busy_error"] or ""), result
    assert "TransientDatabaseError" in (result["idle_error"] or ""), result
    # tcp_user_timeout (20 s) ends the busy session, keepalive (10 s idle + 3 x 5 s) the idle one; both
    # well before the default heartbeat_ttl, so a worker reconnects before its leases can be rescued.
    assert 10 <= result["busy_seconds"] < ttl, result
    assert 5 <= result["idle_seconds"] < ttl, result
