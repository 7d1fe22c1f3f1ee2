"""The output of a child process, read line by line by a task of the test (shared by the e2e
tests that drive a JVM or a JDI program)."""

from __future__ import annotations

import trio


class ProcessLines:
    """Collects ``process``'s stdout as lines; ``_changed`` fires whenever lines arrive or the
    output ends. Start ``_read`` in a nursery."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.lines: list[str] = []
        self._changed = trio.Event()

    async def _read(self) -> None:
        assert self.process.stdout is not None
        pending = b""
        while True:
            try:
                data = await self.process.stdout.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                break
            pending += data
            *complete, pending = pending.split(b"\n")
            self.lines.extend(line.decode("utf-8", "replace") for line in complete)
            self._changed.set()
            self._changed = trio.Event()
        self._changed.set()
