"""pg_terminate_backend of the workers' heartbeat (which also LISTENs) and claim (command) sessions and of the
producer's publish session, each many times while tasks flow: each heals by itself within seconds,
nothing is lost, only messages in flight at a kill may run twice, and LISTEN keeps waking consumers."""

from __future__ import annotations

import time

import pytest

from .checker import verdict
from .conftest import PRODUCER_APP, Faults, HeldSampler, Stream
from .jobs import TOUCH

ROUNDS = 6
WORKERS = ("a", "b")
#: application_name prefix of each kind of session (store.connect names them akadze-<role>), and how
#: many of them there are at least: one per worker, one for the producer.
ROLES = {
    "heartbeat+listen": ("akadze-heartbeat", len(WORKERS)),
    "claim": ("akadze-command", len(WORKERS)),
    "publish": (PRODUCER_APP, 1),
}
#: Seconds a killed session may take to come back (the heartbeat retries within a second, LISTEN is
#: re-armed at once, a claim or publish session at its next statement). Generous for a loaded machine.
HEAL_WITHIN = 20.0
OPTIONS = {"heartbeat_interval": 0.5, "heartbeat_ttl": 6.0, "rescue_interval": 0.5}


@pytest.mark.slow
def test_terminated_sessions_heal_within_seconds_and_lose_nothing(own: Faults) -> None:
    own.options = OPTIONS
    server = own.server
    assert server is not None
    workers = [own.start_worker(name, concurrency=2) for name in WORKERS]
    producer = Stream(own, rate=50.0, seconds=0.02)
    producer.start()
    sampler = HeldSampler(own)
    sampler.start()
    own.until(
        lambda: all(len(server.sessions(p)) >= n for p, n in ROLES.values()), timeout=90, what="every session is open"
    )
    own.until(lambda: len(own.ledgers.done()) >= 20, timeout=60, what="tasks are flowing")

    heal_times: dict[str, list[float]] = {kind: [] for kind in ROLES}
    kills: list[float] = []
    killed = 0
    for _ in range(ROUNDS):
        for kind, (prefix, expected) in ROLES.items():
            kills.append(time.time())
            ended = set(server.terminate(prefix))
            killed += len(ended)
            began = time.monotonic()
            done_before = len(own.ledgers.done())
            published_before = len(producer.published)

            def healed(prefix: str = prefix, n: int = expected, ended: set[int] = ended) -> bool:
                now = set(server.sessions(prefix))
                return len(now - ended) >= n and not now & ended

            # Healed: sessions of that kind for every worker again, none a killed one, and traffic flowing
            # again end to end (new publishes, new completions).
            own.until(healed, timeout=HEAL_WITHIN, interval=0.05, what=f"{prefix} sessions come back")
            own.until(
                lambda d=done_before, p=published_before: (
                    len(own.ledgers.done()) > d + 5 and len(producer.published) > p + 5
                ),
                timeout=HEAL_WITHIN,
                interval=0.05,
                what=f"tasks are published and complete again after terminating {prefix}",
            )
            heal_times[kind].append(time.monotonic() - began)

    published = producer.finish()
    sampler.stop.set()
    in_flight = {m for at in kills for m in sampler.around(at)}  # held within a second of a kill
    own.until(lambda: own.ledgers.all_done(published), timeout=180, interval=0.5, what="every task completed")
    own.until(lambda: own.queued() == 0, timeout=60, interval=0.2, what="every message acked")
    result = verdict(
        "pg_terminate_backend of heartbeat+listen/claim/publish sessions",
        injected=f"{ROUNDS} rounds x {len(ROLES)} kinds, {killed} backends ended",
        published=published,
        ledgers=own.ledgers,
        recovery=max(t for times in heal_times.values() for t in times),
    )
    for kind, times in heal_times.items():
        print(f"{kind} ({ROLES[kind][0]}): healed in {', '.join(f'{t:.2f}' for t in times)} s")
    print(f"publishes that raised (and were retried): {len(producer.errors)}")
    assert result.lost == 0
    assert result.completed == len(published)
    runs_of = own.ledgers.done()
    twice = {r.message_id for r in own.ledgers.runs() if r.event == "done" and runs_of[r.n] > 1}
    assert twice <= in_flight, f"run twice though not in flight at a kill: {sorted(twice - in_flight)}"
    assert all(w.alive for w in workers), "a worker exited"


@pytest.mark.slow
def test_listen_wakes_an_idle_worker_promptly_after_its_listen_session_is_terminated(own: Faults) -> None:
    """The LISTEN runs on the heartbeat's session: terminated, it is re-armed after the next beat."""
    poll = 20.0  # so only LISTEN can explain a prompt start
    own.options = {**OPTIONS, "poll_interval": poll, "listen_poll_interval": poll}
    server = own.server
    assert server is not None
    own.start_worker("a", concurrency=1)
    app = own.producer()
    own.until(lambda: server.sessions("akadze-heartbeat"), timeout=90, what="worker a listens")

    def latency(n: int) -> float:
        sent = time.time()
        app.send_task(TOUCH, args=[n])
        runs = own.until(lambda: own.ledgers.started(n), timeout=2 * poll + 30, interval=0.02, what=f"{n} starts")
        return runs[0].at - sent

    assert latency(0) < 3.0, "LISTEN does not wake the worker even before the fault"
    after = []
    ended_all: set[int] = set()
    for k in range(3):
        ended = set(server.terminate("akadze-heartbeat"))
        ended_all |= ended
        own.until(
            lambda e=ended: set(server.sessions("akadze-heartbeat")) - e, timeout=2 * poll + 10, what="LISTEN re-armed"
        )
        after.append(latency(k + 1))
    result = verdict(
        "LISTEN session terminated, idle worker",
        injected=f"{len(ended_all)} pg_terminate_backend of akadze-heartbeat",
        published=range(4),
        ledgers=own.ledgers,
        recovery=max(after),
    )
    assert result.lost == 0
    assert max(after) < 3.0, f"start latencies after the LISTEN session was re-armed: {after} (poll {poll} s)"
