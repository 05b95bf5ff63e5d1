"""Walk a Markdown page as a reader would: write its files, run its commands in one terminal, compare what
they print with what the page shows. Used by test_docs_walk.py on the quickstart and the migration walk-through.

A page is read as fenced blocks, in order:

* ```python whose first line is ``# path/to/file.py``: that file, written into the terminal's directory;
* ```sh: commands, one a line (a trailing ``\\`` continues one), each expected to exit 0;
* ```console: ``$ command`` lines, each followed by the output the page shows for it;
* ```pycon: an interactive session, run as a doctest in the terminal's directory.

The terminal keeps a shell's state from one command to the next (directory, exported variables, an activated
venv). A ``celery ... worker`` command runs in the background, as in a second terminal, until the walk ends.
Page values that name the reader's servers (``db.internal``, ``rabbit``) are rewritten to the test servers
before running, and back in the output before comparing.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

FENCE = re.compile(r"^```(?P<lang>[a-z]*)[^\n]*\n(?P<body>.*?)^```\s*$", re.M | re.S)
FILE_HEADER = re.compile(r"^# (?P<path>[\w./-]+\.py)\s*$")
WORKER = re.compile(r"(^|\s)celery\s.*\sworker(\s|$)")
PROGRESS = re.compile(r"^(moved|counted) \d+/\d+[ ,]")  # ops.progress: one line per interval off a terminal

#: What varies between two runs of the same command: durations, rates, clock times, ages.
VARIABLE = [
    (re.compile(r"in \d+(\.\d+)? s, \d+ msgs/s"), "in N s, N msgs/s"),
    (re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d( UTC)?"), "TIME"),
    (re.compile(r"(?<=\s)\d+(\.\d+)?[smhd]$"), "AGE"),
]


@dataclass(frozen=True)
class Block:
    lang: str
    body: str


def blocks(markdown: str) -> list[Block]:
    return [Block(m["lang"], m["body"]) for m in FENCE.finditer(markdown)]


def commands(body: str) -> list[str]:
    """The commands of a ```sh block: one a line, a trailing backslash joining the next."""
    joined = body.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def console(body: str) -> list[tuple[str, str]]:
    """The (command, shown output) pairs of a ```console block."""
    pairs: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            pairs.append((line[2:].strip(), []))
        elif pairs:
            pairs[-1][1].append(line)
    return [(cmd, "\n".join(out)) for cmd, out in pairs]


def normal(text: str) -> list[list[str]]:
    """Output as words per line, without progress lines and with what varies between runs replaced."""
    lines = []
    for raw in text.strip().splitlines():
        line = raw.rstrip()
        if not line or PROGRESS.match(line):
            continue
        for pattern, token in VARIABLE:
            line = pattern.sub(token, line)
        lines.append(line.split())
    return lines


@dataclass
class Background:
    command: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    log: IO[bytes]

    def output(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text(encoding="utf-8", errors="replace")


@dataclass
class Terminal:
    """One shell session in *cwd*; *to_real* rewrites the page's values for running, *to_page* back."""

    cwd: Path
    env: dict[str, str]
    to_real: Callable[[str], str]
    to_page: Callable[[str], str]
    timeout: float = 120.0
    background: list[Background] = field(default_factory=list)
    state: Path = field(init=False)

    def __post_init__(self) -> None:
        self.state = self.cwd / ".walk-state"
        self.state.mkdir(exist_ok=True)

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        """Run one command as the page writes it; keep the shell's state for the next one."""
        real = self.to_real(command)
        if WORKER.search(real):
            return self._start_worker(real)
        script = f'{real}\nstatus=$?\nenv -0 > "{self.state}/env"\npwd > "{self.state}/pwd"\nexit $status\n'
        done = subprocess.run(
            ["bash", "-c", script],
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=self.timeout,
            check=False,
        )
        with contextlib.suppress(FileNotFoundError):
            env = (self.state / "env").read_bytes().split(b"\0")
            self.env = dict(e.decode().split("=", 1) for e in env if b"=" in e)
            self.cwd = Path((self.state / "pwd").read_text().strip())
        return subprocess.CompletedProcess(command, done.returncode, self.to_page(done.stdout), None)

    def _start_worker(self, command: str) -> subprocess.CompletedProcess[str]:
        log_path = self.state / f"worker-{len(self.background)}.log"
        log = log_path.open("wb")
        proc = subprocess.Popen(  # its own process group: the pool children go with it
            ["bash", "-c", command],
            cwd=self.cwd,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        worker = Background(command, proc, log_path, log)
        self.background.append(worker)
        deadline = time.monotonic() + self.timeout
        while " ready." not in worker.output():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"`{command}` did not get ready:\n{worker.output()[-3000:]}")
            time.sleep(0.2)
        return subprocess.CompletedProcess(command, 0, "", None)

    def close(self) -> None:
        """Warm shutdown of the background workers (SIGTERM to the group), SIGKILL for what is left."""
        for worker in self.background:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.proc.wait(60)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.proc.pid, signal.SIGKILL)
            worker.proc.wait(60)
            worker.log.close()


def write_file(terminal: Terminal, block: Block) -> bool:
    """Write a ```python block that starts with ``# path.py`` into the terminal's directory."""
    first, _, _ = block.body.partition("\n")
    match = FILE_HEADER.match(first)
    if block.lang != "python" or not match:
        return False
    path = terminal.cwd / match["path"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(terminal.to_real(block.body))
    return True


def doctest_block(terminal: Terminal, block: Block) -> subprocess.CompletedProcess[str]:
    """A ```pycon block as a doctest, with the terminal's python, in the terminal's directory."""
    session = terminal.state / "session.txt"
    session.write_text(terminal.to_real(block.body))
    code = (
        "import doctest, sys; sys.path.insert(0, '.'); "
        f"r = doctest.testfile({str(session)!r}, module_relative=False); sys.exit(1 if r.failed else 0)"
    )
    return terminal.run(f"python -c {shlex.quote(code)}")


def same(shown: str, printed: str) -> bool:
    return normal(shown) == normal(printed)


@contextlib.contextmanager
def terminal(
    cwd: Path, env: dict[str, str], to_real: Callable[[str], str], to_page: Callable[[str], str]
) -> Iterator[Terminal]:
    term = Terminal(cwd, env, to_real, to_page)
    try:
        yield term
    finally:
        term.close()
