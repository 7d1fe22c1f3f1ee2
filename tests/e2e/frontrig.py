"""A whole adb-front set-up with real peers: a real Debian adb server on a private port, the fake
device daemon (``ddmd.sim.adbd``) adopted by it, and ``ddmd.daemon.run`` following that server
through adb discovery, with its adb front on a free port.

    async with front_rig(tmp_path, device) as rig:
        await rig.wait_vm(pid)                        # ddmd holds SERIAL/PID
        out = await rig.adb_front("-s", rig.serial, "jdwp")
        port = await rig.forward(front=True, pid=pid)  # `adb forward tcp:0 jdwp:PID`
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from ddmd.sim.adbd import FakeDevice
from tests.actors.rawpeers import Harness, free_port_range, monitor, wait_until
from tests.adb.device import AdbDevice, open_adb_device

WAIT = 15  # seconds: cap on one condition


@dataclass
class FrontRig:
    h: Harness
    adb: AdbDevice
    front_port: int

    @property
    def serial(self) -> str:
        return self.adb.serial

    def vm_id(self, pid: int) -> str:
        return f"{self.serial}/{pid}"

    async def run(
        self, port: int, *args: str, patience: float = WAIT
    ) -> subprocess.CompletedProcess[bytes]:
        """The real ``adb`` client, aimed at ``port`` (the front, or the real server)."""
        env = {**os.environ, **self.adb.env}
        env.pop("ANDROID_ADB_SERVER_PORT", None)
        with trio.fail_after(patience):
            return await trio.run_process(
                [self.adb.adb, "-P", str(port), *args],
                env=env,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )

    async def adb_front(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        return await self.run(self.front_port, *args)

    async def adb_real(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        return await self.run(self.adb.adb_port, *args)

    async def forward(self, pid: int, *, front: bool = True, local: str = "tcp:0") -> int:
        """``adb -s SERIAL forward LOCAL jdwp:PID`` through the front or the real server."""
        port = self.front_port if front else self.adb.adb_port
        done = await self.run(port, "-s", self.serial, "forward", local, f"jdwp:{pid}")
        assert done.returncode == 0, done
        return int(done.stdout.decode().strip() or local.split(":")[1])

    async def wait_vm(self, pid: int, *, ready: bool = True) -> dict[str, Any]:
        vm_id = self.vm_id(pid)

        async def found() -> dict[str, Any] | None:
            vm = await self.h.vm(vm_id)
            if vm is None or (
                ready and (vm.get("state") != "ready" or not vm.get("debugger_port"))
            ):
                return None
            return vm

        vm: dict[str, Any] = await wait_until(found, WAIT, what=f"{vm_id} ready in ddmd")
        return vm


@asynccontextmanager
async def front_rig(
    tmp_path: Path, device: FakeDevice, **sections: dict[str, object]
) -> AsyncIterator[FrontRig]:
    """The adb server, the device and ddmd with its front; everything stopped at the end."""
    scan_port, front_port = free_port_range(2)
    async with open_adb_device(device) as adb:
        config: dict[str, Any] = {
            "scan": {"enabled": False},
            "adb": {"enabled": "on", "port": adb.adb_port},
            "front": {"port": front_port},
            "debugger": {"max_per_vm": 4},
        }
        for name, values in sections.items():
            config[name] = {**config.get(name, {}), **values}
        async with monitor([scan_port], tmp_path, **config) as h:
            assert h.started.front_port == front_port, "the front did not start"
            yield FrontRig(h, adb, front_port)
