"""/metrics as Prometheus' own linter reads it (``promtool check metrics``), and only names of
FAMILIES in it: a real daemon's scrape with a simulated VM held suspended by a debugger (its
``suspended_since`` in the API, ``ddmd_vm_suspended_seconds`` on /metrics, both cleared by the
resume), and a scrape of every area at once (VMs, a device's log, the adb front) that shows
every family of FAMILIES.

promtool is Debian's ``prometheus`` package; outside CI a missing promtool skips these tests,
under ``CI=true`` it fails them."""

from __future__ import annotations

import shutil
import subprocess
from functools import partial

import prometheus_client
import trio
import trio.testing

from ddmd.config import Config
from ddmd.control.events import EventHub
from ddmd.control.metrics import FAMILIES, DaemonCollector, RelayTotals, make_registry
from ddmd.front.stats import FrontStatistics
from ddmd.logcat.device import LogcatSettings
from ddmd.logcat.hub import LogcatHub
from ddmd.logcat.lines import LineFilter
from ddmd.peers import PeerGuard, PeerPolicy
from ddmd.protocol.jdwp import CommandSet, ReplyPacket, VirtualMachineCommand
from ddmd.session.model import DebuggerSnapshot, ForesightSnapshot
from tests.actors.fakepeers import FakeDebugger
from tests.actors.needs import skip_or_fail
from tests.actors.rawpeers import free_port_range, monitor, wait_until
from tests.logcat.test_backlog_crashes import live_java_crash
from tests.logcat.test_device_stream import FakeAdb, opened

from .fakes import FakeVm
from .fakes import make_registry as make_vm_registry
from .test_metrics import parse, value

CAP = 30
#: A host label with quotes and a backslash: escaped in the text format.
HOST = 'lab "7" \\ west'


async def promtool_check(text: str) -> None:
    """``promtool check metrics`` on ``text``: no problem at all (not even a lint warning). Run
    in a worker thread (the daemon under test shares this event loop), bounded by the
    process's own real-time timeout (a trio deadline would fire at once under autojump)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        skip_or_fail("promtool is not installed (Debian package prometheus)")
        return
    argv = [promtool, "check", "metrics"]
    run = partial(subprocess.run, argv, input=text, capture_output=True, text=True, timeout=60)
    done = await trio.to_thread.run_sync(run)
    out, err = done.stdout, done.stderr
    assert done.returncode == 0, out + err
    assert out.strip() == "", out
    assert err.strip() == "", err


async def test_a_real_scrape_passes_promtool_and_shows_a_held_suspension(tmp_path):
    (port,) = free_port_range(1)
    vm_id = f"tcp:{port}"
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path, metrics={"host": "lab-9"}) as h:
            await h.start_sim(port, pid=5150, threads=4)
            await h.wait_vm(vm_id, lambda v: v["state"] == "ready" and v["debugger_port"])
            stream = await trio.open_tcp_stream("127.0.0.1", h.started.current_port)
            debugger = FakeDebugger(stream)
            await debugger.handshake()
            await h.wait_event("debugger.attached", vm=vm_id)
            await debugger.command(1, CommandSet.VIRTUAL_MACHINE, VirtualMachineCommand.SUSPEND)
            assert isinstance(await debugger.receive(), ReplyPacket)

            held = await h.wait_vm(
                vm_id, lambda v: v["debuggers"] and v["debuggers"][0]["suspended_since"]
            )
            since = held["debuggers"][0]["suspended_since"]
            assert held["debuggers"][0]["suspensions"] == 1
            r = await h.client.get("/metrics")
            assert r.status_code == 200
            await promtool_check(r.text)
            samples = parse(r.text, "lab-9")[0]  # every name in FAMILIES, [metrics] host
            labels = {"device": "local", "app": held["name"], "vm": vm_id}
            suspended = value(samples, "ddmd_vm_suspended_seconds", **labels)
            assert suspended > 0
            assert held["connected_at"] <= since  # stamped while connected, not before
            assert value(samples, "ddmd_vm_debuggers", **labels) == 1
            assert value(samples, "ddmd_vm_threads", **labels) >= 4

            await debugger.command(2, CommandSet.VIRTUAL_MACHINE, VirtualMachineCommand.RESUME)
            assert isinstance(await debugger.receive(), ReplyPacket)
            await h.wait_vm(vm_id, lambda v: v["debuggers"][0]["suspended_since"] is None)

            async def resumed() -> bool:
                samples = parse((await h.client.get("/metrics")).text, "lab-9")[0]
                return value(samples, "ddmd_vm_suspended_seconds", **labels) == 0

            await wait_until(resumed, 5, what="suspended seconds back at 0")
            await stream.aclose()


async def test_every_area_at_once_passes_promtool_and_shows_every_family(nursery, autojump_clock):
    app = FakeVm.android(
        "A/4400",
        app="com.example.live",
        package="com.example.live",
        connected_at=1.0,
        debuggers=(DebuggerSnapshot("127.0.0.1:1", "vm-port", 8600, 1.0, suspended_since=2.0),),
        foresight=ForesightSnapshot(True, 0.01, 0, 0, 0, 0),
    )
    registry = make_vm_registry(app, FakeVm.plain_jvm())
    registry.set_device("A", "device")
    adb = FakeAdb()
    logcat = LogcatHub(registry, adb.open, LogcatSettings(keep=True), lambda name, fields: None)
    front = FrontStatistics(port=5038, connections=2, forwards_by_device={"A": 1})
    collector = DaemonCollector(
        registry,
        vms=list,
        retired=RelayTotals(),
        hub=EventHub(),
        peers=PeerGuard(PeerPolicy.from_config(Config.default().security)),
        host=HOST,
        logcat=logcat,
        front=lambda: front,
    )
    nursery.start_soon(logcat.run)
    await opened(adb, 1)
    with logcat.device("A").subscribe(LineFilter()):
        await adb.end("A").send_all(live_java_crash(4400, "com.example.live"))
        await trio.sleep(1)
        text = prometheus_client.generate_latest(make_registry(collector)).decode()
    await promtool_check(text)
    samples = parse(text, HOST)[0]
    assert {name for name, _ in samples} == set(FAMILIES)
    crash = {"device": "A", "app": "com.example.live", "kind": "java"}
    assert value(samples, "ddmd_app_crashes_total", **crash) == 1
