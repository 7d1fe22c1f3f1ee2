"""The monitor over real loopback sockets: ``ddmd.daemon.run`` scanning simulated VMs.

Each test starts the real daemon (scan range of free ports, real control port) and ``SimVm``s
in the shipped and draft formats and the "modern" flavor, then checks what the control API,
``ddmd clients --json`` and the log events say. Every test has an absolute ``fail_after``
cap; conditions are polled with ``wait_until``, never slept on.
"""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
import trio

from ddmd import daemon
from ddmd.errors import PortInUse
from ddmd.sim import ART_FEATURES, SimConfig, SimVm
from tests.actors.rawpeers import (
    QUIET_SIM,
    RawPeer,
    free_port,
    free_port_range,
    make_config,
    monitor,
    wait_until,
)
from tests.contract import CLIENT_KEYS

CAP = 15  # seconds: absolute cap on every test
NEVER = 1e6  # seconds: an apnm_delay that outlasts any test (the test renames the sim itself)

REQUIRED_KEYS = CLIENT_KEYS

FORMATS = [pytest.param(False, id="shipped"), pytest.param(True, id="draft")]


def vm_id(port: int) -> str:
    return f"tcp:{port}"


@pytest.mark.parametrize("draft", FORMATS)
async def test_identity_rename_and_wait(draft: bool, tmp_path) -> None:
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path, scan={"interval": 0.05}) as h:
            sim = await h.start_sim(
                port,
                pid=3131,
                app_name="com.example.late",
                package_name="com.example.late.pkg",
                user_id=10,
                vm_ident="Dalvik v2.1.0",
                abi="64-bit (arm64)",
                jvm_flags="CheckJNI=true",
                draft=draft,
                wait_for_debugger=True,
                # Unnamed at first; its own APNM timer never fires during the test: the test
                # renames it below, once HELO has been seen, so the order never depends on
                # how quickly the daemon scans and identifies.
                apnm_delay=NEVER,
            )
            # HELO came while the process was still <pre-initialized>.
            hello = await h.wait_event("vm.hello", vm=vm_id(port))
            assert hello["pid"] == 3131
            assert hello["app"] == "<pre-initialized>"
            assert hello["vm_ident"] == "Dalvik v2.1.0"
            assert hello["package"] == (None if draft else "<pre-initialized>")
            # APNM renames it.
            await sim.rename("com.example.late", "com.example.late.pkg")
            vm = await h.wait_vm(vm_id(port), lambda v: v["app"] == "com.example.late")
            renamed = await h.wait_event("vm.renamed", vm=vm_id(port))
            assert renamed["app"] == "com.example.late"

            assert vm.keys() >= REQUIRED_KEYS
            assert vm["source"] == "tcp"
            assert vm["address"] == f"127.0.0.1:{port}"
            assert vm["pid"] == 3131
            assert vm["ddm"] is True
            assert vm["vm_ident"] == "Dalvik v2.1.0"
            assert vm["features"] == list(ART_FEATURES)
            assert vm["waiting_for_debugger"] is True
            assert vm["debugger"] is None
            assert isinstance(vm["current"], bool)
            if draft:  # the draft HELO/APNM carry no trailers
                assert vm["package"] is None
                assert vm["user_id"] is None
                assert vm["abi"] is None
                assert vm["jvm_flags"] is None
            else:
                assert vm["package"] == "com.example.late.pkg"
                assert renamed["package"] == "com.example.late.pkg"
                assert vm["user_id"] == 10
                assert vm["abi"] == "64-bit (arm64)"
                assert vm["jvm_flags"] == "CheckJNI=true"
            assert h.events("vm.waiting_for_debugger", vm=vm_id(port))
            assert h.events("vm.connected", vm=vm_id(port))
            # HPIF: heap info arrives during identification (a push, or the draft's reply).
            vm = await h.wait_vm(vm_id(port), lambda v: bool(v["heaps"]))
            assert vm["heaps"][0]["size"] == 1 << 20

            # The same through `ddmd clients --json`.
            result = await h.cli("clients", "--json")
            assert result.exit_code == 0, result.output
            (listed,) = json.loads(result.output)
            assert listed.keys() >= REQUIRED_KEYS
            for key in ("id", "pid", "app", "package", "vm_ident", "features", "ddm"):
                assert listed[key] == vm[key], key
            assert listed["waiting_for_debugger"] is True

        for name in ("daemon.started", "control.listening", "daemon.stopped"):
            assert h.events(name), name


@pytest.mark.parametrize("draft", FORMATS)
async def test_threads_change_over_time(draft: bool, tmp_path) -> None:
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            await h.start_sim(port, draft=draft, threads=10)
            url = f"/api/v1/vms/{vm_id(port)}/threads"
            await h.wait_vm(vm_id(port), lambda v: v["threads"] == 10)

            response = await h.client.get(url)
            assert response.status_code == 200, response.text
            body = response.json()
            assert body["supported"] is True
            first = {t["id"]: t for t in body["threads"]}
            assert len(first) == 10
            assert first[1]["name"] == "main"  # the name from THCR, states from THST
            for thread in first.values():
                assert thread["state"] is not None
                if draft:  # draft THST: state + suspended byte, no tid or CPU times
                    assert thread["suspended"] is not None
                    assert thread["tid"] is None
                else:
                    assert thread["tid"] is not None
                    assert thread["utime"] is not None
                    assert thread["daemon"] is not None

            async def a_state_changed() -> bool:
                now = (await h.client.get(url)).json()["threads"]
                return any(t["id"] in first and t["state"] != first[t["id"]]["state"] for t in now)

            await wait_until(a_state_changed, 8, what="a thread state changed", step=0.1)


@pytest.mark.parametrize("draft", FORMATS)
async def test_heap_segments_gc_and_stack(draft: bool, tmp_path) -> None:
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            sim = await h.start_sim(port, draft=draft, heap_mb=2)
            await h.wait_vm(vm_id(port), lambda v: v["state"] == "ready" and bool(v["heaps"]))
            base = f"/api/v1/vms/{vm_id(port)}"

            response = await h.client.get(f"{base}/heap", params={"segments": "1"})
            assert response.status_code == 200, response.text
            body = response.json()
            assert body["heaps"], "HPIF data missing"
            (image,) = body["images"]
            assert image["complete"] is True
            assert image["problems"] == []
            assert image["segments"]
            summary = image["summary"]
            assert summary["bytes_used"] + summary["bytes_free"] > 0
            assert sum(summary["bytes_by_kind"].values()) == summary["bytes_used"]
            assert summary["bytes_used"] + summary["bytes_free"] == 2 << 20

            gcs = sim.statistics().gcs
            response = await h.client.post(f"{base}/gc")
            assert response.status_code == 200, response.text
            assert response.json()["gc"] == "done"
            assert sim.statistics().gcs == gcs + 1  # confirmed by the GC's heap info push

            response = await h.client.get(f"{base}/threads/1/stack")
            assert response.status_code == 200, response.text
            frames = response.json()["frames"]
            assert frames[0]["class_name"] == "android.os.MessageQueue"
            assert frames[0]["line"] == -2
            # By name, as 'ddmd stack TARGET main' asks.
            response = await h.client.get(f"{base}/threads/main/stack")
            assert response.status_code == 200, response.text
            assert response.json()["thread_id"] == 1
            assert response.json()["thread_name"] == "main"
            # An id the VM does not list is refused before the VM is asked, with the known ids.
            response = await h.client.get(f"{base}/threads/999/stack")
            assert response.status_code == 404
            assert response.json()["error"] == f"no thread 999 in VM {vm_id(port)}"
            assert "1 main" in response.json()["candidates"]


async def test_vm_gone_then_port_scanned_again(tmp_path) -> None:
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            first_sim = trio.CancelScope()
            h.peers.start_soon(_run_in_scope, first_sim, port, 1001)
            await h.wait_vm(vm_id(port), lambda v: v["pid"] == 1001)
            first_sim.cancel()  # the VM process ends: its listener and connection close
            await wait_until(
                lambda: h.events("vm.disconnected", vm=vm_id(port)), 5, what="disconnect"
            )
            await wait_until(_vm_absent(h, vm_id(port)), 5, what="VM dropped")
            assert h.events("vm.disconnected", vm=vm_id(port))[0]["reason"]

            await h.start_sim(port, pid=2002)  # a new VM on the same port
            vm = await h.wait_vm(vm_id(port), lambda v: v["pid"] == 2002)
            assert vm["ddm"] is True
            assert len(h.events("vm.connected", vm=vm_id(port))) == 2


async def _run_in_scope(scope: trio.CancelScope, port: int, pid: int) -> None:
    with scope:  # the sim runs inside `scope`, so cancelling it ends the VM process
        await SimVm(SimConfig(port=port, pid=pid, **QUIET_SIM)).run()


def _vm_absent(h: Any, vm: str) -> Any:
    async def check() -> bool:
        return await h.vm(vm) is None

    return check


async def test_plain_jdwp_vm_is_not_ddm(tmp_path) -> None:
    """A VM refusing HELO with error 99 (as HotSpot does) is kept as a plain JDWP VM."""
    (port,) = free_port_range(1)
    description = b"Java Debug Wire Protocol (Reference Implementation) version 17.0"

    async def refuse_ddm(conn, packet, data) -> None:
        await conn.reply(packet.id, error=99)

    async def script(conn) -> None:
        while (packet := await conn.receive_command()) is not None:
            if packet.command_set == 1 and packet.command == 1:  # VirtualMachine.Version
                body = len(description).to_bytes(4, "big") + description
                body += (1).to_bytes(4, "big") + (17).to_bytes(4, "big")
                body += b"\x00\x00\x00\x0217" + b"\x00\x00\x00\x02VM"
                await conn.reply(packet.id, body)
            else:
                await refuse_ddm(conn, packet, b"")

    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            peer = await h.start(RawPeer(port, script))
            vm = await h.wait_vm(vm_id(port), lambda v: v["description"] is not None)
            assert vm["ddm"] is False
            assert vm["description"].startswith("Java Debug Wire Protocol")
            assert vm["unsupported"] == ["HELO"]
            response = await h.client.get(f"/api/v1/vms/{vm_id(port)}/threads")
            assert response.json()["supported"] is False
            response = await h.client.post(f"/api/v1/vms/{vm_id(port)}/gc")
            assert response.status_code == 501
            assert len(h.events("vm.not_ddm", vm=vm_id(port))) == 1
            # After the refused HELO no more DDM: the Version command, then the thread list's
            # IDSizes (over JDWP, issue 20), which this VM refuses: no thread list. The next
            # poll asks IDSizes again, which a slow run may see before this line.
            types = peer.ddm_types()
            assert types[:3] == ["HELO", "1/1", "1/7"]
            assert set(types[3:]) <= {"1/7"}


async def test_graceful_stop_closes_vm_connections(tmp_path) -> None:
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            sim = await h.start_sim(port)
            await h.wait_vm(vm_id(port), lambda v: v["state"] == "ready")
            assert sim.statistics().connected
            h.started.stop()
            await wait_until(lambda: not sim.statistics().connected, 5, what="sim sees close")
            await h.wait_event("daemon.stopped")
        assert h.events("daemon.stopping")
        (gone,) = h.events("vm.disconnected", vm=vm_id(port))
        assert gone["reason"]
        # A healthy VM is not taken for a broken one when the daemon stops.
        assert not h.events("scan.backoff")
        assert not h.events("vm.crashed")


async def test_a_vm_over_max_vms_is_refused_and_logged_once(tmp_path) -> None:
    first, second = free_port_range(2)
    with trio.fail_after(CAP):
        async with monitor([first, second], tmp_path, limits={"max_vms": 1}) as h:
            await h.start_sim(first, pid=1)
            await h.wait_vm(vm_id(first), lambda v: v["state"] == "ready")
            sim = await h.start_sim(second, pid=2)
            await h.wait_event("vm.rejected", vm=vm_id(second))
            # The scan (every 0.2 s here) finds it again and again: refused, logged once.
            await wait_until(lambda: sim.statistics().connections_accepted >= 4, 10)
            assert len(h.events("vm.rejected", vm=vm_id(second))) == 1
            assert await h.vm(vm_id(second)) is None


async def test_control_port_in_use_fails_start_up(tmp_path) -> None:
    (port,) = free_port_range(1)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        control_port = taken.getsockname()[1]
        config = make_config([port], tmp_path, control={"port": control_port})
        # daemon.run raises from its nursery, so PortInUse arrives inside an ExceptionGroup
        # (the CLI unwraps it for its one-line message).
        with (
            trio.fail_after(CAP),
            pytest.RaisesGroup(PortInUse, flatten_subgroups=True) as caught,
        ):
            await daemon.run(config, install_signal_handlers=False)
    (error,) = caught.value.exceptions
    message = str(error)
    assert str(control_port) in message
    assert "[control] port" in message


def test_free_port_helpers_give_distinct_ports() -> None:
    ports = free_port_range(3)
    assert ports == list(range(ports[0], ports[0] + 3))
    assert free_port() not in ports
