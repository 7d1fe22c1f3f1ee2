"""Files the VM sends (a method trace, a heap dump), written to disk as they arrive.

Layer: trio only; no protocol decisions (the session says which bytes belong to which call).

A heap dump can be hundreds of MB and arrives as one DDM chunk: the session passes it on in
pieces (``Capture`` commands) and ``CaptureFile`` writes them in a task of its own, in a worker
thread, so the VM reader never waits on the disk. The reader waits only while more than
``HIGH_WATER`` bytes are queued: then the VM's socket fills and TCP slows the VM down. Memory
stays bounded by that mark whatever the size of the file.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import trio

__all__ = ["HIGH_WATER", "CaptureFile", "CaptureResult", "capture_name"]

#: Bytes queued for the disk before the VM reader waits.
HIGH_WATER = 8 << 20
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True, slots=True)
class CaptureResult:
    """A file the VM sent (or the attach API wrote), complete on disk."""

    path: Path
    size: int

    def to_json(self) -> dict[str, Any]:
        return {"file": self.path.name, "bytes": self.size}


def capture_name(app: str | None, suffix: str, when: dt.datetime | None = None) -> str:
    """``APP-YYYYmmdd-HHMMSS.SUFFIX`` (DDMS's naming), safe as a file name anywhere."""
    stem = _UNSAFE.sub("_", app or "vm").strip("._") or "vm"
    stamp = (when or dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
    return f"{stem}-{stamp}.{suffix}"


class CaptureFile:
    """One file being received: ``put`` (sync, from the session's commands), ``run`` (the
    writer task), ``wait_room`` (back-pressure for the reader), ``finished`` (the file is
    complete on disk, or failed)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.size = 0
        self.error: str | None = None
        self._queue: deque[bytes] = deque()
        self._queued = 0
        self._last = False
        self._wake = trio.Event()
        self._room = trio.Event()
        self._done = trio.Event()

    @property
    def queued(self) -> int:
        return self._queued

    def put(self, data: bytes, last: bool) -> None:
        if data:
            self._queue.append(data)
            self._queued += len(data)
        self._last = self._last or last
        self._wake.set()

    async def wait_room(self) -> None:
        """Wait while the disk is behind by more than the high-water mark."""
        while self._queued > HIGH_WATER and not self._done.is_set():
            self._room = trio.Event()
            await self._room.wait()

    async def finished(self) -> None:
        await self._done.wait()

    def abandon(self, why: str) -> None:
        """The VM connection ended first: the file stays incomplete."""
        self.error = self.error or why
        self._last = True
        self._wake.set()

    async def run(self) -> None:
        """Write the pieces as they come; close the file after the last one."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle = await trio.to_thread.run_sync(_open_new, self.path)
        except OSError as exc:
            self.error = f"cannot write {self.path}: {exc.strerror or exc}"
            self._queue.clear()
            self._queued = 0
            self._room.set()
            self._done.set()
            return
        try:
            while True:
                while self._queue:
                    data = self._queue.popleft()
                    await trio.to_thread.run_sync(handle.write, data)
                    self._queued -= len(data)
                    self.size += len(data)
                    if self._queued <= HIGH_WATER:
                        self._room.set()
                if self._last:
                    break
                self._wake = trio.Event()
                if not self._queue and not self._last:
                    await self._wake.wait()
        except OSError as exc:
            self.error = f"cannot write {self.path}: {exc.strerror or exc}"
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(handle.close)
            self._queue.clear()
            self._queued = 0
            self._room.set()
            self._done.set()


def _open_new(path: Path) -> BinaryIO:
    """Open ``path`` for writing, owner-only (a heap dump holds the app's data)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    return os.fdopen(fd, "wb", buffering=1 << 20)
