"""The real thing behind the Logcat panel, for a browser test: ``ddmd.daemon.run`` following a
real Debian adb server (private port) that has adopted the fake device (``ddmd.sim.adbd``),
whose log ring holds the start of THE recording (`tests.logcat.recording`), with one app VM on
the device (a ``ddmd sim`` VM mapped under its recorded pid) and one workstation JVM (a sim VM
on a scanned TCP port, no device).

Everything runs in a trio thread of its own, so a Playwright (sync API) test can drive the
page from the main thread; `LiveRig.log` hands logcat records to the device from there.

    with live_rig(tmp_path) as rig:
        page.goto(rig.base + "/")
        rig.log(write_record(Record(...)))
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import trio

from ddmd.sim import SimConfig, SimVm
from ddmd.sim.adbd import FakeDevice
from tests.actors.rawpeers import free_port_range, monitor
from tests.adb.device import open_adb_device, require_adb
from tests.logcat import recording as rec

START_CAP = 60.0  # seconds: an adb server, a device, two VMs named in ddmd
APP = rec.MAPS
APP_PID = rec.MAPS_PID
WORKSTATION_APP = "Workbench"
#: The recording up to (not with) the Java crash: two apps starting, a multi-line entry, an ANR.
BACKLOG_RECORDS = 16


@dataclass
class LiveRig:
    base: str  # the control API, http://127.0.0.1:PORT
    serial: str
    app_vm: str  # SERIAL/PID of the app VM
    workstation_vm: str
    _token: trio.lowlevel.TrioToken
    _device: FakeDevice

    def log(self, records: bytes) -> None:
        """``records`` (logcat -B bytes) logged on the device now."""
        trio.from_thread.run_sync(self._device.log, records, trio_token=self._token)

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.base + path, trust_env=False, timeout=10)


async def _wait(condition: Callable[[], Any], what: str) -> Any:
    with trio.move_on_after(START_CAP):
        while True:
            found = await condition()
            if found:
                return found
            await trio.sleep(0.1)
    raise AssertionError(f"timed out after {START_CAP:g} s waiting for {what}")


async def _serve(tmp_path: Path, out: queue.Queue[Any], stop: trio.Event) -> None:
    quiet = {"churn_interval": 0.0, "gc_interval": 0.0, "heap_mb": 1}
    app_sim = SimVm(SimConfig(pid=APP_PID, app_name=APP, package_name=APP, **quiet))
    (desk_port,) = free_port_range(1)
    desk_sim = SimVm(
        SimConfig(pid=8123, app_name=WORKSTATION_APP, package_name="", port=desk_port, **quiet)
    )
    async with trio.open_nursery() as sims:
        app_port = await sims.start(app_sim.run)
        await sims.start(desk_sim.run)
        device = FakeDevice(
            {APP_PID: ("127.0.0.1", app_port)},
            process_names={APP_PID: APP},
            logcat=b"".join(rec.RECORD_BYTES[:BACKLOG_RECORDS]),
        )
        async with (
            open_adb_device(device) as adb,
            monitor(
                [desk_port],
                tmp_path,
                adb={"enabled": "on", "port": adb.adb_port},
                front={"enabled": False},
            ) as h,
        ):
            app_vm = f"{adb.serial}/{APP_PID}"

            async def named() -> dict[str, Any] | None:
                vms = (await h.client.get("/api/v1/vms")).json()
                apps = {vm.get("app"): vm for vm in vms}
                return apps if {APP, WORKSTATION_APP} <= set(apps) else None

            apps = await _wait(named, f"{APP} and {WORKSTATION_APP} named in ddmd")
            assert apps[APP]["id"] == app_vm, apps[APP]
            host, port = h.started.control
            rig = LiveRig(
                f"http://{host}:{port}",
                adb.serial,
                app_vm,
                apps[WORKSTATION_APP]["id"],
                trio.lowlevel.current_trio_token(),
                device,
            )
            out.put(rig)
            await stop.wait()
        sims.cancel_scope.cancel()


@contextmanager
def live_rig(tmp_path: Path) -> Iterator[LiveRig]:
    """The rig in a thread; stopped (daemon, adb server, device, VMs) at the end. Without
    ``adb``: a skip (a failure in CI)."""
    require_adb()
    out: queue.Queue[Any] = queue.Queue()
    stop: list[trio.Event] = []
    token: list[trio.lowlevel.TrioToken] = []

    async def main() -> None:
        stop.append(trio.Event())
        token.append(trio.lowlevel.current_trio_token())
        await _serve(tmp_path, out, stop[0])

    def run() -> None:
        try:
            trio.run(main)
        except BaseException as exc:  # handed to the test thread
            out.put(exc)
        else:
            out.put(None)

    thread = threading.Thread(target=run, name="logcat-rig", daemon=True)
    thread.start()
    first = out.get(timeout=START_CAP * 2)
    if isinstance(first, BaseException):
        raise first
    if first is None:
        raise AssertionError("the rig stopped before it was ready")
    try:
        yield first
    finally:
        trio.from_thread.run_sync(stop[0].set, trio_token=token[0])
        thread.join(timeout=60)
        last = out.get(timeout=1) if not out.empty() else None
        if isinstance(last, BaseException):
            raise last
