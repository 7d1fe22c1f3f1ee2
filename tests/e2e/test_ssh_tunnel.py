"""Issue 32, the device lab (docs/lab.md): remote debugging through an ssh tunnel, end to end
with real peers on one machine. The "lab" is a real adb server (private port) that adopts
ddmd's fake device, with a HotSpot JVM behind the device's pid; the "link" is a real OpenSSH
sshd on a private loopback port and real ``ssh -N -L`` clients (tests/e2e/sshrig.py); the
developer's tools are the real ``adb`` CLI and the real ``jdb``.

1. The developer's ddmd uses the lab's adb server through ``ssh -L``: its ``[adb] host/port``
   name the tunnel's local end (and nothing else: it could not start a server of its own).
   ddmd finds the device's VM there, and a jdb on ddmd's per-VM port stops at a breakpoint in
   the JVM. sshd's own log shows the channels it opened to the lab's adb port.
2. The developer's adb client reaches the lab's ddmd front through ``ssh -L``
   (``ADB_SERVER_SOCKET=tcp:127.0.0.1:TUNNEL``): ``adb devices`` lists the device, ``adb forward
   tcp:0 jdwp:PID`` binds a port on the lab's side, a second tunnel brings that port over, and
   a jdb through both stops at a breakpoint. The front's peer-uid check admitted every
   connection: they came from sshd's session process, which runs as the ssh login user, and
   ddmd names that process as the debugger's client.
"""

from __future__ import annotations

import os
import pwd
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio

import ddmd.front.server
from ddmd.sim.adbd import FakeDevice
from tests.actors.rawpeers import Harness, free_port_range, monitor, wait_until
from tests.adb.device import AdbDevice, adb, adb_env, open_adb_device, pick_port
from tests.e2e.conftest import jdk
from tests.e2e.frontrig import front_rig
from tests.e2e.jdbdriver import open_jdb
from tests.e2e.sshrig import Sshd, listener_pid, open_sshd, ssh_tools
from tests.e2e.test_bridge_jvm import BREAK_LINE, BREAKPOINT_HIT, classes, run_jvm
from tests.e2e.test_front_sharing import stop_once

__all__ = ["adb", "classes", "jdk", "ssh_tools"]  # the fixtures

pytestmark = pytest.mark.jvm

CAP = 120  # seconds: a JVM, an adb server, sshd, one or two tunnels, ddmd and a jdb session
WAIT = 20  # seconds: cap on one condition


def channels_to(sshd: Sshd, port: int) -> int:
    """How many forwarded connections sshd opened to 127.0.0.1:PORT (its debug log)."""
    return sshd.log.count(f"target 127.0.0.1 port {port}\n")


async def wait_ready(h: Harness, vm_id: str) -> dict[str, Any]:
    """The VM, once ddmd holds it and has opened its per-VM debugger port."""

    async def ready() -> dict[str, Any] | None:
        vm = await h.vm(vm_id)
        return vm if vm and vm.get("state") == "ready" and vm.get("debugger_port") else None

    vm: dict[str, Any] = await wait_until(ready, WAIT, what=f"{vm_id} ready in ddmd")
    return vm


async def named_debugger(h: Harness, vm_id: str, via: str) -> dict[str, Any]:
    """The VM's one debugger that came through ``via``, once ddmd has named its program."""

    async def named() -> dict[str, Any] | None:
        vm = await h.vm(vm_id)
        found = [d for d in (vm or {}).get("debuggers") or [] if d["via"] == via]
        return found[0] if len(found) == 1 and found[0]["tool"] else None

    debugger: dict[str, Any] = await wait_until(named, WAIT, what=f"a named {via} debugger")
    return debugger


async def developer_adb(lab: AdbDevice, server: tuple[str, ...], *args: str) -> str:
    """The adb CLI aimed at ``server`` (``-P PORT``, or ``ADB_SERVER_SOCKET=tcp:...`` as
    docs/lab.md writes it); its stdout. HOME is the lab server's temporary one: no keys or
    settings of the user's."""
    env = adb_env(lab.home)
    if server[0].startswith("tcp:"):
        env["ADB_SERVER_SOCKET"] = server[0]
        server = ()
    with trio.fail_after(WAIT):
        done = await trio.run_process(
            [lab.adb, *server, *args],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert done.returncode == 0, (args, done.stderr.decode(errors="replace"))
    assert b"daemon not running" not in done.stderr, done.stderr  # it started no server
    return done.stdout.decode()


def process_facts(pid: int) -> tuple[str, int, int]:
    """(command line, real uid, parent pid) of a process."""
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return cmdline, int(fields["Uid"].split()[0]), int(fields["PPid"].strip())


def descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        pid = process_facts(pid)[2]
    return False


# --------------------------------------------------------------------------------------------
# 1. The developer's ddmd, the lab's adb server


async def test_a_developers_ddmd_debugs_a_lab_device_through_the_labs_adb_server_over_ssh(
    jdk,
    classes,
    adb,
    ssh_tools,
    tmp_path,
):
    (jvm_port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with run_jvm(jdk, classes, jvm_port) as jvm:
            pid = jvm.process.pid
            device = FakeDevice({pid: ("127.0.0.1", jvm_port)})
            async with (
                open_adb_device(device, adb=adb) as lab,
                open_sshd(ssh_tools, tmp_path / "ssh") as sshd,
                sshd.tunnel(lab.adb_port) as tunnel,
            ):
                assert tunnel != lab.adb_port
                scan_port, state = free_port_range(1), tmp_path / "developer"
                front_port = pick_port()
                state.mkdir()
                async with monitor(
                    scan_port,
                    state,
                    scan={"enabled": False},
                    # The tunnel is the only adb server this ddmd knows, and it has no adb
                    # program to start one of its own.
                    adb={
                        "enabled": "on",
                        "host": "127.0.0.1",
                        "port": tunnel,
                        "path": str(tmp_path / "no-adb"),
                    },
                    front={"port": front_port},
                ) as h:
                    connected = await h.wait_event("adb.connected", timeout=WAIT)
                    assert connected["server"] == f"127.0.0.1:{tunnel}"
                    assert connected["started_by_ddmd"] is False
                    vm_id = f"{lab.serial}/{pid}"
                    vm = await wait_ready(h, vm_id)

                    async with open_jdb(jdk.jdb, vm["debugger_port"], name="developer") as jdb:
                        await jdb.attached()
                        n = await stop_once(jdb, BREAK_LINE, BREAKPOINT_HIT, "n")
                        debugger = await named_debugger(h, vm_id, "vm-port")
                        assert debugger["tool"] == "jdb", debugger
                        assert await jdb.quit() == 0, jdb.transcript
                    await jvm.wait_counter_above(n + 5)  # released: the program runs on

                    # The developer's adb tools go through the developer's ddmd front: the
                    # device list is the lab's; a jdwp forward is bound here, by ddmd.
                    listed = await developer_adb(lab, ("-P", str(front_port)), "devices")
                    assert f"{lab.serial}\tdevice" in listed.splitlines(), listed
                    made = await developer_adb(
                        lab,
                        ("-P", str(front_port)),
                        "-s",
                        lab.serial,
                        "forward",
                        "tcp:0",
                        f"jdwp:{pid}",
                    )
                    forward = int(made.strip())
                    assert await trio.to_thread.run_sync(listener_pid, forward) == os.getpid()
                    assert not h.events("adb.lost")

                # Every connection ddmd made to "its" adb server was a channel sshd opened to
                # the lab's server: the device list, the device's pids, the VM itself.
                assert channels_to(sshd, lab.adb_port) >= 3, sshd.log
                assert f"Accepted publickey for {sshd.user} from 127.0.0.1" in sshd.log


# --------------------------------------------------------------------------------------------
# 2. The developer's adb client, the lab's ddmd front


async def test_a_developers_adb_and_jdb_reach_the_labs_ddmd_front_over_ssh(
    jdk,
    classes,
    adb,
    ssh_tools,
    tmp_path,
):
    (jvm_port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with run_jvm(jdk, classes, jvm_port) as jvm:
            pid = jvm.process.pid
            device = FakeDevice({pid: ("127.0.0.1", jvm_port)})
            async with (
                front_rig(tmp_path, device) as rig,
                open_sshd(ssh_tools, tmp_path / "ssh") as sshd,
                sshd.tunnel(rig.front_port) as tunnel,
            ):
                await rig.wait_vm(pid)
                stats = ddmd.front.server.statistics()
                assert stats is not None
                before = stats.connections

                via_tunnel = (f"tcp:127.0.0.1:{tunnel}",)  # ADB_SERVER_SOCKET
                listed = await developer_adb(rig.adb, via_tunnel, "devices")
                assert f"{rig.serial}\tdevice" in listed.splitlines(), listed
                pids = await developer_adb(rig.adb, via_tunnel, "-s", rig.serial, "jdwp")
                assert str(pid) in pids.split(), pids
                made = await developer_adb(
                    rig.adb, via_tunnel, "-s", rig.serial, "forward", "tcp:0", f"jdwp:{pid}"
                )
                forward = int(made.strip())
                forwards = await developer_adb(rig.adb, via_tunnel, "forward", "--list")
                assert f"{rig.serial} tcp:{forward} jdwp:{pid}" in forwards, forwards
                # The front bound the forward on ITS side (the lab's): a developer on another
                # machine reaches it through a second tunnel.
                async with (
                    sshd.tunnel(forward) as forward_tunnel,
                    open_jdb(jdk.jdb, forward_tunnel, name="developer") as jdb,
                ):
                    await jdb.attached()
                    n = await stop_once(jdb, BREAK_LINE, BREAKPOINT_HIT, "n")
                    debugger = await named_debugger(rig.h, rig.vm_id(pid), "front-forward")
                    # The front's client is sshd's session process for the login user, which
                    # the peer-uid check admitted: the user's own uid (or one allowed_uids
                    # lists).
                    cmdline, uid, _ = process_facts(debugger["pid"])
                    assert debugger["tool"].startswith("sshd: "), debugger
                    # "sshd: USER" (a root login), "sshd: USER@notty" (the others)
                    assert re.match(rf"sshd: {re.escape(sshd.user)}\b", cmdline), cmdline
                    assert uid == pwd.getpwnam(sshd.user).pw_uid == os.getuid()
                    assert descends_from(debugger["pid"], sshd.process.pid)
                    assert await jdb.quit() == 0, jdb.transcript
                await jvm.wait_counter_above(n + 5)

                after = ddmd.front.server.statistics()
                assert after is not None
                # devices (with the version check before it), jdwp, forward, forward --list
                assert after.connections >= before + 4, (before, after)
                assert after.forward_connections >= 1, after
                assert after.forward_refused == 0, after
                assert not rig.h.events("security.peer_refused")
                assert channels_to(sshd, rig.front_port) >= 4, sshd.log
                assert channels_to(sshd, forward) == 1, sshd.log
