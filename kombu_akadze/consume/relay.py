"""The host's wake-up relay: the consumers of one host share one LISTEN session.

PostgreSQL 15 signals every session that LISTENs in a database at each NOTIFY, whatever its channel,
and each of them reads the notification queue in a transaction of its own: N listening consumers
cost the server N transactions per wake-up although exactly one is woken. So on one host the first
consumer to bind an abstract Unix socket named after (user, server, database, schema) becomes the
hub: its heartbeat session LISTENs for every consumer that connects to it, and it forwards each
wake-up to its consumer. The others connect to the hub and LISTEN nowhere. When the hub goes (its
worker stops or dies), the socket closes under its consumers: each claims (wake-ups may have been
missed meanwhile) and one of them binds in its place.

A wake-up is a hint, never the only way a message is found: one lost on the way (a hub frozen, a
peer slow to read) costs delay up to the next heartbeat, which reports claimable messages.

The wire (bytes over a stream socket): a consumer sends ``L <channel>\\n`` once; the hub answers
``A`` once LISTEN runs for that channel (and again after its session was replaced: claim, wake-ups
may have been missed), ``W`` for each wake-up, ``D`` while its LISTEN session is lost (poll), and
``H`` with a 4-byte big-endian length and that many bytes of payload for each message handed over
(the notification's payload, see store.handoff_message). Both ends check that the other runs as the
same user (SO_PEERCRED).

A handoff is the message itself, already held by the consumer it is for: one the hub cannot pass on
whole (the peer went, or its socket buffer is full) drops that peer, which links again and claims;
the reconcile (lease_orphans) gives the message back, a delay, never a loss.

Linux only (the abstract socket namespace, one per network namespace: containers that do not share
the host's network have a hub each); elsewhere every consumer LISTENs for itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import struct
import sys

logger = logging.getLogger("kombu_akadze")

ARMED = b"A"
WAKE = b"W"
DISARMED = b"D"
HANDOFF = b"H"

#: A handoff frame's length prefix.
_LENGTH = 4

#: Longest registration line a hub reads (channels are short digests, see store.wake_channel).
_MAX_LINE = 256


def supported() -> bool:
    return sys.platform.startswith("linux") and hasattr(socket, "SO_PEERCRED")


def address(key: str) -> bytes:
    """The abstract socket address of the hub for *key* (server, database and schema) and this user."""
    digest = hashlib.sha256(f"{os.getuid()}\0{key}".encode()).hexdigest()[:32]
    return b"\0kombu-akadze-relay-" + digest.encode()


def _same_user(sock: socket.socket) -> bool:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return bool(uid == os.getuid())


class _Peer:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.channel: str | None = None


class Hub:
    """The bound end: accepts the host's consumers and tracks which channel each one waits on."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._peers: dict[int, _Peer] = {}
        self._by_channel: dict[str, _Peer] = {}

    @classmethod
    def bind(cls, addr: bytes) -> Hub | None:
        """The hub of *addr*, or None when another process holds it."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(addr)
            sock.listen(128)
        except OSError:
            sock.close()
            return None
        sock.setblocking(False)
        return cls(sock)

    def fileno(self) -> int:
        return self.sock.fileno()

    def peer_fds(self) -> list[int]:
        return list(self._peers)

    def channels(self) -> list[str]:
        return list(self._by_channel)

    def accept(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        if not _same_user(conn):
            logger.warning("kombu-akadze relay: refused a connection from another user")
            conn.close()
            return
        conn.setblocking(False)
        self._peers[conn.fileno()] = _Peer(conn)

    def read(self, fd: int) -> tuple[str | None, str | None]:
        """Read what peer *fd* sent: (the channel it registered, the channel it left as it went), each
        None when nothing of the kind happened."""
        peer = self._peers.get(fd)
        data = b"-" if peer is None else self._recv(peer)
        if peer is None or data == b"-":
            return None, None
        if data:
            peer.buf += data
            if peer.channel is None and b"\n" in peer.buf:
                return self._register(peer), None
            if len(peer.buf) <= _MAX_LINE and peer.channel is None:
                return None, None
        return None, self._drop(peer)  # gone, or talking out of turn

    @staticmethod
    def _recv(peer: _Peer) -> bytes:
        """What the peer sent (b"" once it went), or b"-" for nothing yet."""
        try:
            return peer.sock.recv(_MAX_LINE)
        except BlockingIOError:
            return b"-"
        except OSError:
            return b""

    def _register(self, peer: _Peer) -> str | None:
        line, _, peer.buf = peer.buf.partition(b"\n")
        verb, _, channel = line.decode("ascii", "replace").partition(" ")
        if verb != "L" or not channel or channel in self._by_channel:
            self._drop(peer)
            return None
        peer.channel = channel
        self._by_channel[channel] = peer
        return channel

    def send(self, channel: str, code: bytes) -> bool:
        """Tell the consumer waiting on *channel*; False when none does (or it went)."""
        peer = self._by_channel.get(channel)
        if peer is None:
            return False
        try:
            peer.sock.send(code)
        except BlockingIOError:
            return True  # its buffer is full of unread wake-ups: one more adds nothing
        except OSError:
            self._drop(peer)
            return False
        return True

    def hand(self, channel: str, payload: str) -> bool:
        """Pass a handoff on to the consumer waiting on *channel*, whole or not at all: False when none
        does, or when it could not take the frame now (that peer is dropped: a frame cut short would
        garble its stream)."""
        peer = self._by_channel.get(channel)
        if peer is None:
            return False
        data = payload.encode("utf-8")
        frame = HANDOFF + len(data).to_bytes(_LENGTH, "big") + data
        try:
            sent = peer.sock.send(frame)
        except OSError:  # BlockingIOError included: a peer that does not read
            sent = -1
        if sent != len(frame):
            logger.warning(
                "kombu-akadze relay: a consumer of this host did not take a handed-over message; dropping "
                "its link (it links again; its reconcile gives the message back)"
            )
            self._drop(peer)
            return False
        return True

    def send_all(self, code: bytes) -> None:
        for channel in list(self._by_channel):
            self.send(channel, code)

    def _drop(self, peer: _Peer) -> str | None:
        self._peers.pop(peer.sock.fileno(), None)
        channel = peer.channel
        if channel is not None and self._by_channel.get(channel) is peer:
            del self._by_channel[channel]
        with contextlib.suppress(OSError):
            peer.sock.close()
        return channel

    def close(self) -> None:
        for peer in list(self._peers.values()):
            with contextlib.suppress(OSError):
                peer.sock.close()
        self._peers.clear()
        self._by_channel.clear()
        with contextlib.suppress(OSError):
            self.sock.close()


class Link:
    """A consumer's connection to its host's hub."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buf = b""

    @classmethod
    def connect(cls, addr: bytes, channel: str) -> Link | None:
        """Connected and registered on *channel*, or None when no hub holds *addr* (or it is not ours)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(addr)
            if not _same_user(sock):
                logger.warning("kombu-akadze relay: the hub runs as another user; LISTENing here instead")
                sock.close()
                return None
            sock.sendall(f"L {channel}\n".encode("ascii"))
        except OSError:
            sock.close()
            return None
        sock.setblocking(False)
        return cls(sock)

    def fileno(self) -> int:
        return self.sock.fileno()

    def read(self) -> list[tuple[bytes, str | None]] | None:
        """What the hub sent, in order: (code, None) for ARMED, WAKE and DISARMED, (HANDOFF, payload) for a
        handoff; [] for nothing yet (or part of a frame), None once the hub went."""
        try:
            data = self.sock.recv(65536)
        except BlockingIOError:
            return []
        except OSError:
            return None
        if not data:
            return None
        buf = self._buf + data
        events: list[tuple[bytes, str | None]] = []
        while buf:
            code = buf[:1]
            if code != HANDOFF:
                events.append((code, None))
                buf = buf[1:]
                continue
            if len(buf) < 1 + _LENGTH:
                break
            end = 1 + _LENGTH + int.from_bytes(buf[1 : 1 + _LENGTH], "big")
            if len(buf) < end:
                break
            events.append((HANDOFF, buf[1 + _LENGTH : end].decode("utf-8", "replace")))
            buf = buf[end:]
        self._buf = buf
        return events

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
