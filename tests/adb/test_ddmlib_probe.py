"""``tests/e2e/java/DdmlibProbe.java`` (the classic ddmlib 25.2.2 of Debian's
libandroid-ddms-java, driven as DDMS does) against a REAL adb server with a `FakeDevice`
exposing two VMs, WITHOUT ddmd: ddmlib talks to the device itself. This proves the probe works;
the same probe can then be pointed at ddmd's adb front instead of the server.

Behind the device: (a) a ``ddmd sim`` VM (default ``art`` flavour, in this process), mapped
under its own pid so the device's pid and its HELO pid agree; (b) a real HotSpot JVM (no DDM),
mapped under the JVM's process id.

Every wait is bounded: ``CAP`` for a whole test, ``WAIT`` for one condition.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from ddmd.sim import SimConfig, SimVm
from ddmd.sim.adbd import FakeDevice
from tests.actors.needs import skip_or_fail
from tests.actors.rawpeers import free_port_range
from tests.adb.device import AdbDevice, HotSpot, adb, hotspot_jvm, open_adb_device
from tests.e2e.conftest import Jdk, jdk, require_tool
from tests.e2e.lines import ProcessLines

__all__ = ["adb", "jdk"]  # fixtures

pytestmark = pytest.mark.jvm

CAP = 90  # seconds: absolute cap on every test (a JVM, an adb server, ddmlib's start-up)
WAIT = 40  # seconds: one condition (ddmlib polls the server once a second at worst)
JAVA_DIR = Path(__file__).resolve().parent.parent / "e2e" / "java"
JARS = [
    Path("/usr/share/java") / name
    for name in (
        "com.android.tools.ddms.ddmlib.jar",
        "com.android.tools.common.jar",
        "guava.jar",
        "kxml2.jar",
    )
]
SIM_PID = 4321
SIM_APP = "com.example.probe"
SIM_THREADS = 8  # SimConfig's default thread count


@pytest.fixture(scope="module")
def probe_classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    """DdmlibProbe compiled against the Debian ddmlib jar, once per module: the classpath."""
    missing = [str(jar) for jar in JARS if not jar.exists()]
    if missing:
        skip_or_fail(f"{', '.join(missing)} missing (Debian: apt install libandroid-ddms-java)")
    javac = require_tool("javac")
    out = tmp_path_factory.mktemp("probe")
    subprocess.run(
        [javac, "-cp", str(JARS[0]), "-d", str(out), str(JAVA_DIR / "DdmlibProbe.java")],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return ":".join([*map(str, JARS), str(out)])


# --------------------------------------------------------------------------------------------
# The probe process


class Probe(ProcessLines):
    """The running probe: its JSON events as they arrive."""

    eof = False

    async def _read(self) -> None:
        await super()._read()
        self.eof = True

    def events(self, name: str | None = None, **match: object) -> list[dict[str, Any]]:
        found = []
        for line in self.lines:
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            if (name is None or event["event"] == name) and all(
                event.get(k) == v for k, v in match.items()
            ):
                found.append(event)
        return found

    async def wait_for(
        self, what: str, predicate: Callable[[], Any], patience: float = WAIT
    ) -> Any:
        try:
            with trio.fail_after(patience):
                while True:
                    value = predicate()
                    if value:
                        return value
                    if self.eof:
                        raise AssertionError(
                            f"the probe's output ended before {what}: {self.lines}"
                        )
                    await self._changed.wait()
        except trio.TooSlowError:
            raise AssertionError(f"no {what} within {patience} s: {self.lines}") from None


@dataclass(frozen=True, slots=True)
class Rig:
    adb: AdbDevice
    sim: SimVm
    jvm: HotSpot
    jvm_pid: int


@asynccontextmanager
async def rig_with_two_vms(adb: str, jdk: Jdk, tmp_path: Path) -> AsyncIterator[Rig]:
    sim = SimVm(SimConfig(pid=SIM_PID, app_name=SIM_APP, churn_interval=0, gc_interval=0))
    async with trio.open_nursery() as nursery:
        sim_port = await nursery.start(sim.run)
        async with hotspot_jvm(jdk, tmp_path) as jvm:
            jvm_pid = jvm.process.pid
            device = FakeDevice(
                {SIM_PID: ("127.0.0.1", sim_port), jvm_pid: ("127.0.0.1", jvm.port)},
                process_names={SIM_PID: SIM_APP, jvm_pid: "Counter"},
            )
            async with open_adb_device(device, adb=adb) as rig:
                yield Rig(rig, sim, jvm, jvm_pid)
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def run_probe(rig: Rig, classpath: str, *args: str) -> AsyncIterator[Probe]:
    """The probe on ``rig``'s adb server, ddmlib's debugger ports on free ports (never its
    defaults 8600+/8700); killed on the way out if it is still running."""
    base, _, selected = free_port_range(3)
    argv = [
        require_tool("java"),
        f"-DANDROID_ADB_SERVER_PORT={rig.adb.adb_port}",
        "-cp",
        classpath,
        "DdmlibProbe",
        "--base",
        str(base),
        "--selected",
        str(selected),
        "--clients",
        "2",
        "--ddm-clients",
        "1",
        "--timeout",
        str(WAIT),
        *args,
    ]
    process = await trio.lowlevel.open_process(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, env=rig.adb.env
    )
    probe = Probe(process)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe._read)
            try:
                yield probe
            finally:
                with trio.move_on_after(10) as cleanup:
                    cleanup.shield = True
                    if process.returncode is None:
                        process.kill()
                    await process.wait()
    finally:
        if process.returncode is None:
            process.kill()


def check_what_ddmlib_saw(probe: Probe, rig: Rig) -> None:
    serial = rig.adb.serial
    assert probe.events("device", serial=serial, state="ONLINE"), probe.lines
    clients = {e["pid"]: e for e in probe.events("client", serial=serial)}  # the last of each
    assert set(clients) == {SIM_PID, rig.jvm_pid}, probe.lines
    sim = clients[SIM_PID]
    assert (sim["name"], sim["ddm"], sim["vm"]) == (SIM_APP, True, "Dalvik v2.1.0"), sim
    hotspot = clients[rig.jvm_pid]
    assert (hotspot["name"], hotspot["ddm"]) == (None, False), hotspot
    assert sim["debugPort"] != hotspot["debugPort"]
    threads = probe.events("threads", pid=SIM_PID)[-1]["threads"]
    assert threads[0] == "main", threads
    assert len(threads) == SIM_THREADS, threads
    heap = probe.events("heap", pid=SIM_PID)[-1]["heaps"]
    (vm_heap,) = heap.values()
    assert vm_heap["sizeInBytes"] == 4 * 1024 * 1024  # SimConfig.heap_mb
    assert 0 < vm_heap["bytesAllocated"] <= vm_heap["sizeInBytes"]
    assert vm_heap["objectsAllocated"] > 0
    assert rig.sim.statistics().gcs >= 1  # the heap info came from the GC ddmlib asked for
    # HotSpot has no DDM: no threads, no heap from it.
    assert not probe.events("threads", pid=rig.jvm_pid)
    assert not probe.events("heap", pid=rig.jvm_pid)


async def test_probe_lists_both_vms_with_the_sims_name_threads_and_heap(
    adb, jdk, tmp_path, probe_classpath
):
    with trio.fail_after(CAP):
        async with (
            rig_with_two_vms(adb, jdk, tmp_path) as rig,
            run_probe(rig, probe_classpath) as probe,
        ):
            with trio.fail_after(WAIT):
                status = await probe.process.wait()
            await probe.wait_for("the bye line", lambda: probe.events("bye"))
            assert status == 0, probe.lines
            assert probe.events("done"), probe.lines
            check_what_ddmlib_saw(probe, rig)
            stats = rig.adb.device.statistics()
            assert stats.services["jdwp-relay"] == 2, stats
            # Made without an adb path, the bridge started and killed no server.
            assert (await rig.adb.devices()).get(rig.adb.serial) == "device"


async def test_probe_stays_connected_until_stdin_closes(adb, jdk, tmp_path, probe_classpath):
    with trio.fail_after(CAP):
        async with (
            rig_with_two_vms(adb, jdk, tmp_path) as rig,
            run_probe(rig, probe_classpath, "--stay") as probe,
        ):
            await probe.wait_for("done", lambda: probe.events("done"))
            check_what_ddmlib_saw(probe, rig)
            # ddmlib holds both VMs: another jdwp:PID is accepted and dropped (ART's rule).
            device = rig.adb.device
            assert device.open_jdwp_streams(SIM_PID) == 1
            assert device.open_jdwp_streams(rig.jvm_pid) == 1
            forwarded = await rig.adb.run_adb(
                "-s", rig.adb.serial, "forward", "tcp:0", f"jdwp:{SIM_PID}"
            )
            assert forwarded.returncode == 0, forwarded.stderr
            with trio.fail_after(WAIT):
                stream = await trio.open_tcp_stream("127.0.0.1", int(forwarded.stdout))
                async with stream:
                    await stream.send_all(b"JDWP-Handshake")
                    assert await stream.receive_some(100) == b""
            assert device.statistics().dropped == 1
            # A command on stdin: another GC, reported as heap info again.
            heaps_before = len(probe.events("heap", pid=SIM_PID))
            assert probe.process.stdin is not None
            await probe.process.stdin.send_all(b"gc\n")
            await probe.wait_for(
                "heap info after the second GC",
                lambda: len(probe.events("heap", pid=SIM_PID)) > heaps_before,
            )
            # Closing stdin ends it cleanly: ddmlib lets go of both VMs.
            await probe.process.stdin.aclose()
            with trio.fail_after(WAIT):
                status = await probe.process.wait()
            await probe.wait_for("the bye line", lambda: probe.events("bye"))
            assert status == 0, probe.lines

            with trio.fail_after(WAIT):
                while True:
                    if not (
                        device.open_jdwp_streams(SIM_PID) or device.open_jdwp_streams(rig.jvm_pid)
                    ):
                        break
                    await trio.sleep(0.05)
