"""Every python example of docs/urls.md connects (or, for TLS, builds the DSN it documents)."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

import kombu
import pytest

import kombu_akadze  # noqa: F401  (registers the aliases)

PAGE = Path(__file__).resolve().parents[2] / "docs" / "urls.md"
EXAMPLES = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_page_has_examples_of_both_forms_tls_and_failover() -> None:
    text = "".join(EXAMPLES)
    assert "akadze://" in text
    assert "akadze+postgresql://" in text
    assert "ssl=" in text
    assert "DEAD" in text


@pytest.mark.parametrize("example", EXAMPLES, ids=[f"example{i}" for i in range(len(EXAMPLES))])
def test_a_documented_url_connects(example: str, tcp_pg: Any, schema: str) -> None:
    live = tcp_pg
    user = live.username + (f":{live.password}" if live.password else "")
    code = (
        example.replace("USER@HOST", f"{user}@{live.hostname}")
        .replace(":PORT/", f":{live.port or 5432}/")
        .replace(":DEAD/", f":{free_port()}/")
        .replace("/DB", live.path)
    )
    made: list[kombu.Connection] = []

    def connection(*args: Any, **kwargs: Any) -> kombu.Connection:
        conn = kombu.Connection(*args, transport_options={"schema": schema, "connect_timeout": 5}, **kwargs)
        made.append(conn)
        return conn

    namespace: dict[str, Any] = {"Connection": connection}
    code = code.replace("from kombu import Connection\n", "")
    try:
        exec(compile(code, str(PAGE), "exec"), namespace)
        conn = namespace["conn"]
        if conn.ssl:
            assert "sslmode=require" in conn.transport.dsn
            return
        conn.ensure_connection(max_retries=30, interval_start=0, interval_step=0.1, interval_max=0.2)
        simple = conn.SimpleQueue("docs")
        simple.put({"from": "docs/urls.md"})
        msg = simple.get(timeout=20)
        assert msg.payload == {"from": "docs/urls.md"}
        msg.ack()
        simple.close()
        if "?" not in code and "akadze+" not in code:
            assert (conn.hostname, conn.port) == (live.hostname, live.port or 5432)
    finally:
        for conn in made:
            conn.release()
