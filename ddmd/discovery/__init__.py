"""Discovery: finds VMs and hands their open JDWP connections to the supervisor.

Layer: this file re-exports the messages of `drive.found` (discovery sits above drive); the
discoverers (`scan`, `adb`) import config, logs, netaddr, protocol/ and drive's messages and
stream helpers, never the registry. Each
discoverer is an ``async run(send_channel)`` loop that sends ``VmFound`` (with the connection
already past its JDWP handshake: the probe *is* the VM's one connection) and ``VmLost``.

Modules: `scan` (the localhost port range), `adb` (Android devices) with `adbserver` (the adb
server exchanges, the only adbutils user), `connect` (the JDWP handshake, closing, back-off
both use), `lookups` (the scan's shared readings of /proc, through `ddmd.host`).
"""

from __future__ import annotations

from ddmd.drive.found import Opener, VmFound, VmLost

__all__ = ["Opener", "VmFound", "VmLost"]
