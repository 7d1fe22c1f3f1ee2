"""Discovery: finds VMs and hands their open JDWP connections to the supervisor.

Layer: this file imports trio (stream types) and `discovery.localproc`; the discoverers
(`scan`, `adb`) import config, logs, netaddr and protocol/, never the registry. Each
discoverer is an ``async run(send_channel)`` loop that sends ``VmFound`` (with the connection
already past its JDWP handshake: the probe *is* the VM's one connection) and ``VmLost``.

Modules: `scan` (the localhost port range), `adb` (Android devices) with `adbserver` (the adb
server exchanges, the only adbutils user), `connect` (the JDWP handshake, closing, back-off
both use), `localproc` (a local VM's pid and name from /proc).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from ddmd.discovery.localproc import LocalProcess

# Opens a fresh connection to the same VM (handshake done); returns the stream and any bytes
# received after the handshake. Used to reconnect after a debugger leaves.
Opener = Callable[[], Awaitable[tuple[trio.abc.Stream, bytes]]]


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
    process: LocalProcess | None = None  # the local process listening (port scan, Linux)


@dataclass(frozen=True, slots=True)
class VmLost:
    vm_id: str
    reason: str
