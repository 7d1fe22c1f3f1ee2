"""Child processes of the benches.

A ``Child`` runs a command with threads draining its output: stdout lines go into a queue with
the wall-clock time they were read, the last 50 stderr lines are kept for error messages.
``Children`` stops every child it started, in reverse order, however the run ends.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import IO

from . import ROOT


class Child:
    def __init__(self, name: str, argv: Sequence[str], *, stdout: IO[str] | None = None) -> None:
        self.name = name
        self.lines: queue.Queue[tuple[float, str]] = queue.Queue()
        self.stderr: list[str] = []
        self.proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.PIPE,
            stdout=stdout if stdout is not None else subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        threads = [threading.Thread(target=self._drain_stderr, daemon=True)]
        if stdout is None:
            threads.append(threading.Thread(target=self._drain_stdout, daemon=True))
        for t in threads:
            t.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _drain_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put((time.time(), line.rstrip("\n")))

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line.rstrip("\n"))
            del self.stderr[:-50]

    def wait_match(self, pattern: str, timeout: float) -> tuple[float, re.Match[str]]:
        """The first stdout line matching the regex ``pattern``, and when it was read."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while True:
            self.check_alive()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.name}: no line matching {pattern!r} in {timeout:g} s")
            with contextlib.suppress(queue.Empty):
                stamp, line = self.lines.get(timeout=min(left, 0.2))
                match = regex.search(line)
                if match:
                    return stamp, match

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def check_alive(self) -> None:
        code = self.proc.poll()
        if code is not None:
            tail = "\n".join(self.stderr[-15:])
            raise RuntimeError(f"{self.name} exited with code {code}:\n{tail}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 8 s (ddmd's shutdown grace is 5 s)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(8)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


class Children:
    """Every process started, stopped in reverse order however the run ends."""

    def __init__(self) -> None:
        self.items: list[Child] = []

    def start(self, name: str, argv: Sequence[str], *, stdout: IO[str] | None = None) -> Child:
        child = Child(name, argv, stdout=stdout)
        self.items.append(child)
        return child

    def stop(self, child: Child) -> None:
        child.stop()
        if child in self.items:
            self.items.remove(child)

    def stop_all(self) -> None:
        """SIGTERM to all at once, then each stopped (waited for) in reverse order."""
        for child in self.items:
            with contextlib.suppress(OSError):
                if child.proc.poll() is None:
                    child.proc.terminate()
        while self.items:
            child = self.items.pop()
            with contextlib.suppress(Exception):
                child.stop()
