"""What discovery hands the supervisor: a VM found (its connection already past the JDWP
handshake: the probe *is* the VM's one connection) or lost, and how to reopen it.

Layer: trio (stream types) and the standard library. Discovery imports these; drive/ never
imports discovery.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import trio

# Opens a fresh connection to the same VM (handshake done); returns the stream and any bytes
# received after the handshake. Used to reconnect after a debugger leaves.
Opener = Callable[[], Awaitable[tuple[trio.abc.Stream, bytes]]]


class ProcessInfo(Protocol):
    """The local process behind a VM found by the port scan (``discovery.localproc``)."""

    @property
    def pid(self) -> int: ...

    @property
    def name(self) -> str | None: ...


class DeviceFiles(Protocol):
    """Files on the VM's device (adb VMs): a trace or heap dump the VM wrote there."""

    def device_path(self, name: str) -> str:
        """Where on the device the VM should write ``name``."""
        ...

    async def fetch(self, remote: str, local: Path) -> int:
        """Copy ``remote`` to ``local`` and remove it from the device; the bytes written."""
        ...


@dataclass(frozen=True, slots=True, eq=False)
class VmFound:
    vm_id: str
    source: str  # "tcp" or "adb"
    address: str
    stream: trio.abc.Stream
    leftover: bytes
    opener: Opener
    key: object  # what the discoverer uses to recognise this VM again (port, (serial, pid))
    device: str | None = None
    pid: int | None = None
    process: ProcessInfo | None = None  # the local process listening (port scan, Linux)
    files: DeviceFiles | None = None  # its device's files (adb VMs)


@dataclass(frozen=True, slots=True)
class VmLost:
    vm_id: str
    reason: str
