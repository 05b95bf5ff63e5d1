"""The host's wake-up relay, without a database: each consumer's LISTEN session is the fake of
test_listener (a socket pair), the relay sockets are real. One consumer of a host becomes the hub and
LISTENs for the others, each wake-up reaches the consumer it was meant for and nobody else, and when
the hub goes its consumers claim and one of them takes its place."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Iterator

import pytest

from kombu_akadze.consume import relay
from kombu_akadze.consume.listener import Listener
from kombu_akadze.integrations.testing import eventually
from tests.unit.consume.test_listener import Session

pytestmark = pytest.mark.skipif(not relay.supported(), reason="the wake-up relay needs Linux's abstract sockets")


class Consumer:
    """One consumer: its session, its listener, and its heartbeat thread's waits in a loop."""

    def __init__(self, key: str, name: str) -> None:
        self.key = key
        self.session = Session()
        self.woken = 0
        self.listener = Listener(
            self.session, channel=f"akadze.{name}", enabled=True, on_wakeup=self._woke, relay_key=key
        )
        self._stop = threading.Event()
        self.listener.arm()
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _woke(self) -> None:
        self.woken += 1

    def _pump(self) -> None:
        while not self._stop.is_set():
            self.listener.wait(0.05)

    def close(self) -> None:
        self._stop.set()
        self.listener.interrupt()
        self._thread.join(10)
        self.listener.close()
        self.session.lose()


@pytest.fixture
def host() -> Iterator[list[Consumer]]:
    """Consumers of one host, server and schema (a relay key of this test's own)."""
    key = f"test\0{uuid.uuid4()}"
    made = [Consumer(key, name) for name in ("a", "b", "c")]
    yield made
    for consumer in made:
        if not consumer._stop.is_set():
            consumer.close()


def test_one_consumer_listens_for_the_host_and_each_wakeup_reaches_only_its_consumer(host: list[Consumer]) -> None:
    hub, *linked = host
    assert [c.listener.role for c in host] == ["hub", "linked", "linked"]
    # The hub's session LISTENs on every consumer's channel; the others' sessions never open.
    eventually(lambda: sorted(hub.session.channels) == ["akadze.a", "akadze.b", "akadze.c"], timeout=10, what="LISTEN")
    assert [c.session.starts for c in host] == [1, 0, 0]
    eventually(lambda: all(c.listener.armed for c in host), timeout=10, what="every consumer armed")
    before = [c.woken for c in host]

    hub.session.notify("akadze.b")
    eventually(lambda: linked[0].woken == before[1] + 1, timeout=10, what="b woken through the hub")
    hub.session.notify("akadze.a")
    eventually(lambda: hub.woken == before[0] + 1, timeout=10, what="the hub's own wake-up")
    assert linked[1].woken == before[2], "c was not parked: nothing for it"
    assert linked[0].listener.wakeups == 1
    assert hub.listener.relayed == 1


def test_a_consumer_that_goes_is_unlistened(host: list[Consumer]) -> None:
    hub, b, _ = host
    eventually(lambda: len(hub.session.channels) == 3, timeout=10, what="LISTEN for all three")
    b.close()
    eventually(lambda: sorted(hub.session.channels) == ["akadze.a", "akadze.c"], timeout=10, what="UNLISTEN of b")


def test_when_the_hub_goes_its_consumers_claim_and_one_takes_its_place(host: list[Consumer]) -> None:
    hub, b, c = host
    eventually(lambda: b.listener.armed and c.listener.armed, timeout=10, what="armed through the hub")
    woken = (b.woken, c.woken)
    hub.close()
    eventually(lambda: b.woken > woken[0] and c.woken > woken[1], timeout=10, what="both claim: wake-ups may be lost")
    eventually(
        lambda: sorted(x.listener.role for x in (b, c)) == ["hub", "linked"], timeout=10, what="a new hub, linked to"
    )
    new_hub, other = (b, c) if b.listener.role == "hub" else (c, b)
    eventually(lambda: sorted(new_hub.session.channels) == ["akadze.b", "akadze.c"], timeout=10, what="LISTEN again")
    eventually(lambda: other.listener.armed, timeout=10, what="armed through the new hub")
    before = other.woken
    new_hub.session.notify(other.listener.channel)
    eventually(lambda: other.woken == before + 1, timeout=10, what="a wake-up through the new hub")


def test_a_lost_hub_session_disarms_its_consumers_until_it_is_listening_again(host: list[Consumer]) -> None:
    hub, b, _ = host
    eventually(lambda: b.listener.armed, timeout=10, what="armed")
    assert hub.session.far is not None
    hub.session.far.close()  # the server ended the hub's session
    eventually(lambda: hub.session.starts == 2, timeout=10, what="the hub's LISTEN session opened again")
    eventually(lambda: b.listener.armed, timeout=10, what="armed again")
    assert sorted(hub.session.channels) == ["akadze.a", "akadze.b", "akadze.c"]


def test_a_forked_child_does_not_keep_the_hub_socket(host: list[Consumer]) -> None:
    hub = host[0]
    assert hub.listener.hub is not None
    pid = os.fork()
    if pid == 0:  # the child: the relay sockets it inherited are closed, the parent's hub stands
        os._exit(0 if hub.listener.hub is None and hub.listener.role != "hub" else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert hub.listener.role == "hub"
    # The child closing its copy did not take the address: a consumer still links to the parent's hub.
    late = Consumer(hub.key, "d")
    try:
        assert late.listener.role == "linked"
        eventually(lambda: "akadze.d" in hub.session.channels, timeout=10, what="LISTEN for d")
    finally:
        late.close()


def test_another_relay_key_is_another_hub() -> None:
    one = Consumer(f"test\0{uuid.uuid4()}", "x")
    two = Consumer(f"test\0{uuid.uuid4()}", "y")
    try:
        assert (one.listener.role, two.listener.role) == ("hub", "hub")
    finally:
        one.close()
        two.close()


def test_a_stranger_on_the_socket_is_dropped(host: list[Consumer]) -> None:
    hub = host[0]
    stranger = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stranger.connect(hub_key_address(hub))
    stranger.sendall(b"X nonsense\n")
    stranger.settimeout(10)
    assert stranger.recv(16) == b"", "the hub hangs up on what is not a registration"
    stranger.close()
    assert sorted(hub.session.channels) == ["akadze.a", "akadze.b", "akadze.c"]


def hub_key_address(consumer: Consumer) -> bytes:
    assert consumer.listener.relay is not None
    return consumer.listener.relay


def test_a_link_reads_handoff_frames_whole_however_the_bytes_arrive() -> None:
    near, far = socket.socketpair()
    link = relay.Link(near)
    near.setblocking(False)
    payload = '{"akadze_handoff" : 1, "body" : "AWDH"}' + "é" * 3000  # code letters and multi-byte text inside
    data = payload.encode()
    frame = relay.HANDOFF + len(data).to_bytes(4, "big") + data
    stream = relay.ARMED + frame + relay.WAKE + frame + relay.DISARMED
    events: list[tuple[bytes, str | None]] = []
    try:
        for cut in range(0, len(stream), 997):  # frames split across reads, lengths included
            far.sendall(stream[cut : cut + 997])
            got = link.read()
            assert got is not None
            events += got
        assert events == [
            (relay.ARMED, None), (relay.HANDOFF, payload), (relay.WAKE, None), (relay.HANDOFF, payload),
            (relay.DISARMED, None),
        ]  # fmt: skip
        assert link.read() == []  # nothing more yet
        far.close()
        assert link.read() is None  # the hub went
    finally:
        link.close()


def test_a_hub_drops_a_peer_that_cannot_take_a_whole_handoff() -> None:
    """A frame cut short would garble the peer's stream: a peer whose socket buffer is full is dropped
    (it links again and claims; its reconcile gives the message back)."""
    hub = relay.Hub.bind(relay.address(f"test\0{uuid.uuid4()}"))
    assert hub is not None
    link = relay.Link.connect(hub.sock.getsockname(), "akadze.p")
    assert link is not None
    try:
        eventually(lambda: (hub.accept(), hub.peer_fds())[1], timeout=10, what="the peer accepted")
        [fd] = hub.peer_fds()
        eventually(lambda: hub.read(fd)[0] == "akadze.p", timeout=10, what="the peer registered")
        assert hub.hand("akadze.p", "small") is True
        assert link.read() == [(relay.HANDOFF, "small")]
        big = "x" * 60000
        sent = 0
        while hub.hand("akadze.p", big):  # the peer does not read: its buffer fills
            sent += 1
            assert sent < 1000
        assert hub.channels() == []  # dropped
        assert hub.hand("akadze.p", "after") is False
        received: list[tuple[bytes, str | None]] = []
        while (got := link.read()) is not None:  # every whole frame it was sent, then the end
            received += got
        assert received == [(relay.HANDOFF, big)] * sent
    finally:
        link.close()
        hub.close()
