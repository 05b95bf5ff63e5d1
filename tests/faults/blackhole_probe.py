"""Run inside a network namespace of its own (`unshare --net`), linked to the test's by a veth pair:
open a busy and an idle (LISTEN) kombu-akadze session to the test's server, black-hole the link at
layer 2, and report how long each session takes to fail with store.py's TCP defaults.

Protocol: reads one JSON line on stdin {"url", "schema", "iface", "client_ip", "host_ip"}, prints
"ready" once both sessions work, waits for "go" (the test has black-holed its end of the link: a cut
drops both directions), black-holes its own end, prints one JSON line with the result and exits.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import threading
import time
from typing import Any

from kombu_akadze.errors import AkadzeError
from kombu_akadze.store import Store

#: A MAC address nobody has: frames the host's end of the veth receives for it are dropped, so TCP
#: sees silence (no RST, no ICMP), as with a dead switch or a cut cable.
NOWHERE = "02:00:5e:00:53:01"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, stdin=subprocess.DEVNULL, timeout=30)


def main() -> None:
    spec: dict[str, Any] = json.loads(sys.stdin.readline())
    ip("link", "set", "lo", "up")
    ip("addr", "add", f"{spec['client_ip']}/30", "dev", spec["iface"])
    ip("link", "set", spec["iface"], "up")
    busy = Store(spec["url"], schema=spec["schema"], role="probe-busy", connect_timeout=5)
    idle = Store(spec["url"], schema=spec["schema"], role="probe-listen", connect_timeout=5)
    deadline = time.monotonic() + 30
    while True:  # the link takes a moment to come up
        try:
            busy.message_counts()
            fd = idle.listen_start(channel="akadze.probe")
            break
        except AkadzeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    print("ready", flush=True)
    assert sys.stdin.readline().strip() == "go"  # the test's end of the link is black-holed already

    ip("neigh", "replace", spec["host_ip"], "lladdr", NOWHERE, "dev", spec["iface"], "nud", "permanent")
    began = time.monotonic()
    result: dict[str, Any] = {}

    def statement() -> None:
        try:
            busy.message_counts()
            result["busy_error"] = None
        except AkadzeError as exc:
            result["busy_error"] = f"{type(exc).__name__}: {exc}"
        result["busy_seconds"] = time.monotonic() - began

    worker = threading.Thread(target=statement)
    worker.start()
    readable, _, _ = select.select([fd], [], [], 90)
    try:
        idle.listen_notifies()
        result["idle_error"] = None if readable else "still silent after 90 s"
    except AkadzeError as exc:
        result["idle_error"] = f"{type(exc).__name__}: {exc}"
    result["idle_seconds"] = time.monotonic() - began
    worker.join(90)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
