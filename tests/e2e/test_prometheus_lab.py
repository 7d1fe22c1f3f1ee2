"""Issue 32: a real Prometheus scrapes a lab of three ddmd daemons, and what it stores names
every VM and app by host, device and app.

The lab (`tests.e2e.promrig`): three ``ddmd run`` processes, ``[metrics] host`` "lab-a",
"lab-b" and "lab-c". lab-a and lab-b each scan a port range holding two simulated VMs of their
own (``device="local"``); lab-c follows a private real adb server that has adopted the demo's
simulated Android device (`ddmd.sim.demodevice`: two apps that log live lines and crash on
``adb shell demo crash APP``), with ``[logcat] keep = true`` so it reads the device's log.
Debian's Prometheus 2.x scrapes the three every second (job ``ddmd``, ``honor_labels: true``),
and its HTTP API is asked, as a dashboard or an alert rule would, that:

- all three targets are up, each under its own ``host`` label, and ``ddmd_vms`` counts each
  one's VMs;
- ``ddmd_vm_info`` has one series per VM with the right ``host``/``device``/``app``/``vm``
  labels (``device`` is "local" for scanned VMs, the adb serial for the device's), and the
  per-VM gauges name no other VM;
- a crash on the device shows in ``increase(ddmd_app_crashes_total{...,kind="java"}[1m]) > 0``
  (the counter was there at 0 before, for every kind, only for the device's apps), in lab-c's
  own log as ``app.crashed``, and the app's start under a new pid in
  ``ddmd_app_restarts_total``; lab-c counts the log lines it reads;
- a VM that goes away leaves no series at all once a scrape that began after it left has run;
- every daemon's ``/metrics`` passes ``promtool check metrics``.

Every wait has a deadline that fails the test with the query and what it last returned;
everything (Prometheus, the daemons, the adb server, the device and its VMs) is stopped at the
end, also on failure, and the test checks that no process or port of the lab is left.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from ddmd.sim import SimConfig, SimVm
from ddmd.sim.demodevice import DemoDevice, DeviceInfo
from tests.actors.rawpeers import free_port_range, wait_until
from tests.adb.device import adb_env
from tests.e2e.promrig import (
    Daemon,
    Prometheus,
    Rows,
    now,
    prometheus,
    promtool_check_metrics,
    require_program,
    start_daemon,
)

CAP = 90  # seconds: the whole test, start-up and shut-down included, on a busy machine
WAIT = 20  # seconds: one thing to show up (a VM in a daemon, a series in Prometheus)
CRASHING = "com.example.chat"  # the device's app that crashes
CALM = "com.example.shop"  # the device's app that does not
LOCAL = {
    "lab-a": (("com.lab.a.mail", 3101), ("com.lab.a.maps", 3102)),
    "lab-b": (("com.lab.b.notes", 3201), ("com.lab.b.music", 3202)),
}
LEAVING = "com.lab.a.maps"  # the lab-a VM that goes away
CRASH_KINDS = {"java", "native", "anr", "died"}
PER_VM = (
    "ddmd_vm_heap_size_bytes",
    "ddmd_vm_heap_allocated_bytes",
    "ddmd_vm_threads",
    "ddmd_vm_debuggers",
    "ddmd_vm_suspended_seconds",
    "ddmd_vm_round_trip_seconds",
)
Key = tuple[str, str, str, str]  # host, device, app, vm


@dataclass
class LocalVm:
    host: str
    app: str
    sim: SimVm
    scope: trio.CancelScope


@dataclass
class Lab:
    daemons: dict[str, Daemon]
    prom: Prometheus
    device: DemoDevice
    info: DeviceInfo
    local: list[LocalVm]
    adb: str
    home: Path  # HOME of the adb client (its keys go there)

    @property
    def instances(self) -> dict[str, str]:
        """Scrape target (Prometheus's ``instance``) -> host label."""
        return {d.target: host for host, d in self.daemons.items()}

    async def device_shell(self, *words: str) -> str:
        """``adb -P SERVER -s SERIAL shell WORDS`` through the real adb server; its output."""
        args = [self.adb, "-P", str(self.info.adb_port), "-s", self.info.serial, "shell", *words]
        with trio.fail_after(WAIT):
            done = await trio.run_process(
                args, capture_stdout=True, capture_stderr=True, check=False, env=adb_env(self.home)
            )
        return (done.stdout + done.stderr).decode(errors="replace")


async def _run_sim(sim: SimVm, scope: trio.CancelScope, *, task_status: Any) -> None:
    with scope:
        await sim.run(task_status=task_status)


@dataclass(frozen=True, slots=True)
class Tools:
    adb: str
    prometheus: str
    promtool: str


@pytest.fixture
def tools() -> Tools:
    # A plain (sync) fixture: skip/fail reach pytest directly, not through a nursery.
    return Tools(
        require_program("adb", "adb"),
        require_program("prometheus", "prometheus"),
        require_program("promtool", "prometheus"),
    )


@asynccontextmanager
async def lab(tmp_path: Path, tools: Tools) -> AsyncIterator[Lab]:
    """The device, the local VMs, the three daemons and Prometheus; all stopped at exit."""
    adb = tools.adb
    # One block of consecutive free ports: two scan ranges of two, then per daemon four
    # debugger ports and a current-VM port.
    block = free_port_range(4 + 3 * 5)
    scans = {"lab-a": block[0:2], "lab-b": block[2:4]}
    own = {host: block[4 + 5 * i : 9 + 5 * i] for i, host in enumerate(("lab-a", "lab-b", "lab-c"))}
    async with trio.open_nursery() as nursery:
        device = DemoDevice(adb=adb)  # no java: the device's two simulated apps are enough
        info: DeviceInfo = await nursery.start(device.run)
        local = []
        for host, apps in LOCAL.items():
            for (app, pid), port in zip(apps, scans[host], strict=True):
                config = SimConfig(
                    port=port,
                    pid=pid,
                    app_name=app,
                    package_name=app,
                    churn_interval=0,
                    gc_interval=0,
                    heap_mb=1,
                )
                sim, scope = SimVm(config), trio.CancelScope()
                await nursery.start(_run_sim, sim, scope)
                local.append(LocalVm(host, app, sim, scope))

        def ports(host: str) -> dict[str, Any]:
            return {"debugger_ports": own[host][:4], "current_port": own[host][4]}

        try:
            async with (
                start_daemon(tmp_path, "lab-a", scan=scans["lab-a"], **ports("lab-a")) as a,
                start_daemon(tmp_path, "lab-b", scan=scans["lab-b"], **ports("lab-b")) as b,
                start_daemon(
                    tmp_path, "lab-c", adb_port=info.adb_port, adb_path=adb, **ports("lab-c")
                ) as c,
                prometheus(
                    tmp_path, [a.target, b.target, c.target], program=tools.prometheus
                ) as prom,
            ):
                daemons = {"lab-a": a, "lab-b": b, "lab-c": c}
                home = tmp_path / "adb-home"
                home.mkdir()
                yield Lab(daemons, prom, device, info, local, adb, home)
        finally:
            nursery.cancel_scope.cancel()


# --------------------------------------------------------------------------------------------
# Helpers


async def daemon_vms(daemon: Daemon) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=daemon.url, trust_env=False, timeout=5) as client:
        response = await client.get("/api/v1/vms")
    assert response.status_code == 200, response.text
    vms: list[dict[str, Any]] = response.json()
    return vms


async def ready_vms(daemon: Daemon, apps: set[str]) -> dict[str, str]:
    """app -> VM id of ``apps`` once ``daemon`` holds each of them ready (deadline `WAIT`)."""
    found: dict[str, str] = {}
    with trio.move_on_after(WAIT):
        while True:
            found = {
                vm["app"]: vm["id"]
                for vm in await daemon_vms(daemon)
                if vm.get("state") == "ready" and vm.get("app") in apps
            }
            if set(found) == apps:
                return found
            await trio.sleep(0.1)
    raise AssertionError(
        f"ddmd {daemon.host} did not hold {sorted(apps)} ready within {WAIT} s "
        f"(ready: {found}); its output:\n{daemon.output()}"
    )


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def keys(rows: Rows) -> set[Key]:
    return {
        (r["metric"].get("host", ""), r["metric"].get("device", ""), r["metric"].get("app", ""),
         r["metric"].get("vm", ""))
        for r in rows
    }  # fmt: skip


def values(rows: Rows, label: str) -> dict[str, float]:
    """``label``'s value -> the sample's value."""
    return {r["metric"].get(label, ""): float(r["value"][1]) for r in rows}


# --------------------------------------------------------------------------------------------
# The test


async def test_prometheus_scrapes_a_lab_of_three_daemons(tmp_path: Path, tools: Tools) -> None:
    with trio.fail_after(CAP):
        async with lab(tmp_path, tools) as rig:
            await _check_lab(rig, tools.promtool)
    # Nothing left behind: the daemons and Prometheus ended on SIGTERM, and no port of the lab
    # (Prometheus, the control APIs, the adb server, the device) still listens.
    for child in [rig.prom.child, *(d.child for d in rig.daemons.values())]:
        assert child.process.returncode == 0, f"{child.name}: {child.process.returncode}"
    device_port = int(rig.info.serial.rpartition(":")[2])
    ports = [rig.prom.port, rig.info.adb_port, device_port]
    ports += [d.control_port for d in rig.daemons.values()]
    assert not [p for p in ports if listening(p)], ports


async def _check_lab(rig: Lab, promtool: str) -> None:
    prom, serial = rig.prom, rig.info.serial
    a, c = rig.daemons["lab-a"], rig.daemons["lab-c"]

    # The VMs each daemon holds, as its own API says: the series must name exactly these.
    expected: set[Key] = set()
    vm_ids: dict[str, dict[str, str]] = {}
    for host, daemon in rig.daemons.items():
        apps = {app for app, _ in LOCAL[host]} if host in LOCAL else {CRASHING, CALM}
        vm_ids[host] = await ready_vms(daemon, apps)
        device = "local" if host in LOCAL else serial
        expected |= {(host, device, app, vm) for app, vm in vm_ids[host].items()}

    # Every target up; each one's series under its own host label.
    up = await prom.wait_for(
        'up{job="ddmd"}',
        lambda rows: values(rows, "instance") == dict.fromkeys(rig.instances, 1.0),
        "the three daemons scraped and up",
        WAIT,
    )
    assert len(up) == 3, up
    await prom.wait_for(
        'sum by (instance, source) (ddmd_vms{job="ddmd"})',
        lambda rows: (
            {(r["metric"]["instance"], r["metric"]["source"]): float(r["value"][1]) for r in rows}
            == {
                (a.target, "tcp"): 2.0,
                (a.target, "adb"): 0.0,
                (rig.daemons["lab-b"].target, "tcp"): 2.0,
                (rig.daemons["lab-b"].target, "adb"): 0.0,
                (c.target, "tcp"): 0.0,
                (c.target, "adb"): 2.0,
            }
        ),
        "ddmd_vms: two scanned VMs in lab-a and lab-b, the device's two apps in lab-c",
        WAIT,
    )
    info = await prom.query('ddmd_info{job="ddmd"}')
    assert {r["metric"]["instance"]: r["metric"].get("host") for r in info} == rig.instances, info

    # One ddmd_vm_info series per VM, labelled with its host, device, app and VM id.
    rows = await prom.wait_for(
        'ddmd_vm_info{job="ddmd"}',
        lambda rows: keys(rows) == expected,
        f"ddmd_vm_info naming exactly {sorted(expected)}",
        WAIT,
    )
    for row in rows:
        labels = row["metric"]
        assert float(row["value"][1]) == 1.0, row
        assert labels["source"] == ("tcp" if labels["device"] == "local" else "adb"), row
        assert labels["ddm"] == "yes", row
        assert labels.get("kind"), row
    # The per-VM gauges name only those VMs, with the same labels; the debugger count is
    # there for every VM (none attached).
    for name in PER_VM:
        rows = await prom.query(f'{name}{{job="ddmd"}}')
        assert keys(rows) <= expected, (name, rows)
    debuggers = await prom.query('ddmd_vm_debuggers{job="ddmd"}')
    assert keys(debuggers) == expected, debuggers
    assert {float(r["value"][1]) for r in debuggers} == {0.0}, debuggers

    await _check_crash(rig)
    await _check_vm_gone(rig, vm_ids["lab-a"])

    # Each daemon's exposition passes promtool's checks.
    for host, daemon in rig.daemons.items():
        async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
            text = (await client.get(f"{daemon.url}/metrics")).text
        checked = await promtool_check_metrics(promtool, text)
        said = (checked.stdout + checked.stderr).decode(errors="replace")
        assert checked.returncode == 0, f"{host}: promtool says:\n{said}"
        assert not said.strip(), f"{host}: promtool says:\n{said}"


async def _check_crash(rig: Lab) -> None:
    prom, serial = rig.prom, rig.info.serial
    c = rig.daemons["lab-c"]
    where = f'host="lab-c",device="{serial}"'

    # The crash counters are there at 0 for the device's apps (a first sample for increase()),
    # and only where ddmd reads a device's log.
    await prom.wait_for(
        f'ddmd_app_crashes_total{{{where},app=~"{CRASHING}|{CALM}"}}',
        lambda rows: (
            {(r["metric"]["app"], r["metric"]["kind"]): float(r["value"][1]) for r in rows}
            == {(app, kind): 0.0 for app in (CRASHING, CALM) for kind in CRASH_KINDS}
        ),
        "ddmd_app_crashes_total at 0 for every kind of both device apps",
        WAIT,
    )
    assert await prom.query('ddmd_app_crashes_total{host=~"lab-a|lab-b"}') == []
    await prom.wait_for(
        f"ddmd_logcat_lines_read_total{{{where}}} > 0",
        lambda rows: len(rows) == 1,
        "lab-c reading the device's log",
        WAIT,
    )
    reconnects = await prom.query(f"ddmd_logcat_stream_reconnects_total{{{where}}}")
    assert len(reconnects) == 1, reconnects

    # The crash, asked of the device through the real adb server.
    said = await rig.device_shell("demo", "crash", CRASHING)
    assert f"demo: crash {CRASHING}" in said, said

    # ddmd saw it in the device's log ...
    crashed = await wait_until(
        lambda: c.events("app.crashed", app=CRASHING),
        WAIT,
        what=f"app.crashed for {CRASHING} in lab-c's log",
    )
    assert crashed[0]["kind"] == "java", crashed
    assert crashed[0]["device"] == serial, crashed
    # ... and Prometheus has it as an increase of the right kind, and of that one only.
    rows = await prom.wait_for(
        f'increase(ddmd_app_crashes_total{{host="lab-c",app="{CRASHING}",kind="java"}}[1m]) > 0',
        lambda rows: len(rows) == 1,
        f"the crash of {CRASHING} counted in lab-c",
        WAIT,
    )
    assert rows[0]["metric"]["device"] == serial, rows
    others = await prom.query(
        f'ddmd_app_crashes_total{{{where},app="{CRASHING}",kind!="java"}} > 0 '
        f'or ddmd_app_crashes_total{{{where},app="{CALM}"}} > 0'
    )
    assert others == [], others
    # Android started the app again under a new pid: a restart of the same app.
    await prom.wait_for(
        f'ddmd_app_restarts_total{{{where},app="{CRASHING}"}} >= 1',
        lambda rows: len(rows) == 1,
        f"the restart of {CRASHING} counted",
        WAIT,
    )


async def _check_vm_gone(rig: Lab, lab_a: dict[str, str]) -> None:
    prom, a = rig.prom, rig.daemons["lab-a"]
    leaving, staying = lab_a[LEAVING], next(v for k, v in lab_a.items() if k != LEAVING)
    assert await prom.query(f'{{job="ddmd",vm="{leaving}"}}') != []
    (vm,) = [v for v in rig.local if v.app == LEAVING]
    vm.scope.cancel()

    async def dropped() -> bool:
        return not any(v["id"] == leaving for v in await daemon_vms(a))

    await wait_until(dropped, WAIT, what=f"lab-a dropping {leaving}")
    gone_at = now()
    # A scrape of lab-a that started after the daemon had dropped the VM (Prometheus may move
    # a scrape's timestamp up to a few milliseconds towards its schedule: hence the margin).
    await prom.wait_for(
        f'timestamp(up{{job="ddmd",instance="{a.target}"}}) > {gone_at + 0.1:.3f}',
        lambda rows: len(rows) == 1,
        "a scrape of lab-a after the VM left",
        WAIT,
    )
    assert await prom.query(f'{{job="ddmd",vm="{leaving}"}}') == [], "series of a VM gone"
    assert await prom.query(f'ddmd_vm_info{{vm="{staying}"}}') != [], "the other VM's series"
    assert values(await prom.query(f'ddmd_vms{{instance="{a.target}",source="tcp"}}'), "ddm") == {
        "yes": 1.0,
        "no": 0.0,
        "unknown": 0.0,
    }
