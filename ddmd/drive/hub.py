"""The VMs ddmd holds, as the adb front sees them (``ddmd.front.hub.VmHub``): by device serial
and pid, each able to take one more consumer.

Layer: trio and the supervisor's table of VM drivers; nothing of the front is imported (the
front's ``VmHub`` protocol is structural).
"""

from __future__ import annotations

import trio

from ddmd.drive.supervisor import Supervisor
from ddmd.drive.vm import VmDriver

__all__ = ["DeviceVms"]

#: How often ``wait_for`` looks again (discovery opens a new pid within a fraction of a second).
POLL = 0.05


class DeviceVms:
    """``find``/``wait_for`` over the supervisor's drivers (device VMs are "SERIAL/PID")."""

    def __init__(self, supervisor: Supervisor) -> None:
        self._supervisor = supervisor

    def find(self, serial: str, pid: int) -> VmDriver | None:
        return self._supervisor.actors.get(f"{serial}/{pid}")

    async def wait_for(self, serial: str, pid: int) -> VmDriver | None:
        """The driver once discovery has opened ``jdwp:PID`` (the caller sets the deadline)."""
        while True:
            driver = self.find(serial, pid)
            if driver is not None:
                return driver
            await trio.sleep(POLL)
