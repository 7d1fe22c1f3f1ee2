"""Android devices through adb: the real daemon against the fake adb server (tests/adb/fakeadb.py),
with ``ddmd sim`` VMs behind ``jdwp:PID`` and a workstation sim VM found by the port scan.

Every test is capped by ``trio.fail_after``; waits poll conditions (``wait_until``), nothing is
timed. Each fault test also checks that the workstation VM was not disturbed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from ddmd.discovery.adbserver import AdbUnreachable, Records
from ddmd.protocol.adbwire import AdbMalformed
from ddmd.protocol.jdwp import CommandPacket, ReplyPacket
from tests.actors.fakepeers import FakeDebugger
from tests.actors.rawpeers import free_port, wait_until

from .fakeadb import FakeAdb, Rig, adb_rig, record

CAP = 20  # seconds: absolute cap on every test
PHONE = "emulator-5554"
TABLET = "R58M123ABC"


async def attach(port: int) -> FakeDebugger:
    debugger = FakeDebugger(await trio.open_tcp_stream("127.0.0.1", port))
    await debugger.handshake()
    return debugger


async def version_of(debugger: FakeDebugger, packet_id: int = 1) -> str:
    """VirtualMachine.Version through ddmd; the description string of the reply."""
    await debugger.send(CommandPacket(packet_id, 1, 1, b""))
    reply = await debugger.receive()
    assert isinstance(reply, ReplyPacket), reply
    assert reply.id == packet_id, reply
    assert reply.error_code == 0, reply
    size = int.from_bytes(reply.data[:4], "big")
    return reply.data[4 : 4 + size].decode()


async def cli_json(rig: Rig, *args: str) -> Any:
    result = await rig.h.cli(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def ids(vms: list[dict[str, Any]]) -> set[str]:
    return {vm["id"] for vm in vms}


# --------------------------------------------------------------------------------------------
# Records from a trio stream (the parsing itself: tests/protocol/test_adbwire.py)


@settings(max_examples=200)  # each example runs trio streams; the framing is small
@given(st.lists(st.binary(max_size=40), max_size=5), st.data())
async def test_records_split_anywhere(payloads, data):
    wire = b"".join(record(p) for p in payloads)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=6)))
    send, receive = trio.testing.memory_stream_pair()
    records = Records(receive, 5.0)
    with trio.fail_after(5):
        start = 0
        for cut in [*cuts, len(wire)]:
            await send.send_all(wire[start:cut])
            start = cut
        await send.aclose()
        got = []
        while (item := await records.next()) is not None:
            got.append(item)
    assert got == payloads


async def test_records_malformed_and_truncated():
    for wire, error in ((b"zz12abc", AdbMalformed), (b"0010abc", AdbUnreachable)):
        send, receive = trio.testing.memory_stream_pair()
        records = Records(receive, 5.0)
        with trio.fail_after(5):
            await send.send_all(wire)
            await send.aclose()
            with pytest.raises(error):
                await records.next()


# --------------------------------------------------------------------------------------------
# Discovery, listing, debugging


async def test_device_vms_are_found_listed_and_debuggable(tmp_path):
    with trio.fail_after(CAP):
        async with adb_rig(tmp_path) as rig:
            h = rig.h
            one = await rig.device_sim(101, "com.example.one")
            two = await rig.device_sim(102, "com.example.two")
            rig.plug(PHONE, {101: one, 102: two}, model="Pixel_7")
            vm = await rig.wait_ready(f"{PHONE}/101")
            await rig.wait_ready(f"{PHONE}/102")
            assert (vm["source"], vm["device"], vm["pid"]) == ("adb", PHONE, 101)
            assert vm["app"] == "com.example.one"
            assert vm["address"] == f"{PHONE} jdwp:101"

            devices = await cli_json(rig, "devices")
            assert devices == [
                {
                    "serial": PHONE,
                    "state": "device",
                    "model": "Pixel_7",
                    "product": "fake",
                    "vms": 2,
                }
            ]
            table = (await h.cli("devices")).output
            assert f"{PHONE}  device  Pixel_7  2" in table, table
            # Device VMs beside the workstation VM.
            assert ids(await cli_json(rig, "clients")) == {
                rig.desk_id,
                f"{PHONE}/101",
                f"{PHONE}/102",
            }
            assert ids(await cli_json(rig, "clients", "--device", PHONE)) == {
                f"{PHONE}/101",
                f"{PHONE}/102",
            }
            # TARGET forms: SERIAL/PID, an app name.
            threads = await cli_json(rig, "threads", f"{PHONE}/102")
            assert threads["vm"]["id"] == f"{PHONE}/102"
            threads = await cli_json(rig, "threads", "com.example.one", "--device", PHONE)
            assert threads["vm"]["id"] == f"{PHONE}/101"

            # A debugger on the VM's own port; when it leaves, the VM is released by reopening
            # jdwp:101 (the sim does not acknowledge DBGD).
            debugger = await attach(int(vm["debugger_port"]))
            assert "ddmd sim" in await version_of(debugger)
            await debugger.send(CommandPacket(3, 1, 6, b""))  # VirtualMachine.Dispose
            assert isinstance(await debugger.receive(), ReplyPacket)
            await debugger.stream.aclose()
            await h.wait_event("vm.reconnected", vm=f"{PHONE}/101")
            assert rig.fake.requested(f"{PHONE}:jdwp:101") >= 2
            await rig.wait_ready(f"{PHONE}/101")
            for event in ("adb.connected", "device.online", "device.vm_found"):
                assert h.events(event), event
            assert not h.events("adb.unavailable")
            await rig.assert_desk_undisturbed()


async def test_plugged_in_device_appears_within_2s_and_unplugged_disappears(tmp_path):
    with trio.fail_after(CAP):
        async with adb_rig(tmp_path) as rig:
            h = rig.h
            sim = await rig.device_sim(4321, "com.example.plugged")
            assert await cli_json(rig, "devices") == []
            plugged_at = trio.current_time()
            rig.plug(TABLET, {4321: sim})

            async def listed() -> bool:
                return f"{TABLET}/4321" in ids(await cli_json(rig, "clients"))

            await wait_until(listed, 2.0, what="the plugged-in device's VM in `ddmd clients`")
            latency = trio.current_time() - plugged_at
            print(f"plug-in to `ddmd clients`: {latency * 1000:.0f} ms")
            vm = await rig.wait_ready(f"{TABLET}/4321")
            debugger = await attach(int(vm["debugger_port"]))
            assert "ddmd sim" in await version_of(debugger)

            rig.fake.remove_device(TABLET)  # unplugged: its streams close too
            assert await debugger.receive_until_eof() == []

            async def gone() -> bool:
                return f"{TABLET}/4321" not in ids(await cli_json(rig, "clients"))

            await wait_until(gone, 5, what="the unplugged device's VM gone from `ddmd clients`")
            await wait_until(lambda: not h.started.registry.devices(), 5, what="device list")
            offline = await h.wait_event("device.offline", device=TABLET)
            assert "unplugged" in offline["reason"]
            detached = await h.wait_event("debugger.detached", vm=f"{TABLET}/4321")
            assert detached["reason"], detached
            await rig.assert_desk_undisturbed()


async def test_two_devices_with_the_same_pid_are_separate_vms(tmp_path):
    with trio.fail_after(CAP):
        async with adb_rig(tmp_path) as rig:
            h = rig.h
            on_phone = await rig.device_sim(4242, "com.example.app", vm_ident="Dalvik v2.1.0")
            on_tablet = await rig.device_sim(4242, "com.example.app", vm_ident="Dalvik v3.0.0")
            rig.plug(PHONE, {4242: on_phone})
            rig.plug(TABLET, {4242: on_tablet})
            phone = await rig.wait_ready(f"{PHONE}/4242")
            tablet = await rig.wait_ready(f"{TABLET}/4242")
            assert phone["debugger_port"] != tablet["debugger_port"]
            # The same pid and app name on two devices: ambiguous without --device.
            result = await h.cli("select", "4242")
            assert result.exit_code == 2, result.output
            assert "several" in result.output, result.output
            chosen = await cli_json(rig, "select", "4242", "--device", TABLET)
            assert chosen["vm"]["id"] == f"{TABLET}/4242"
            assert [d["vms"] for d in await cli_json(rig, "devices")] == [1, 1]

            # Both debuggable at the same time, each reaching its own VM.
            first = await attach(int(phone["debugger_port"]))
            second = await attach(int(tablet["debugger_port"]))
            assert "2.1.0" in await version_of(first, 11)
            assert "3.0.0" in await version_of(second, 11)
            for debugger in (first, second):
                await debugger.stream.aclose()
            await h.wait_vm(f"{TABLET}/4242", lambda v: v["debugger"] is None)
            # The current-VM port leads to the selected one, the tablet's.
            current = await attach(h.started.current_port)
            assert "3.0.0" in await version_of(current, 13)
            await current.stream.aclose()
            await rig.assert_desk_undisturbed()


async def test_unauthorized_device_is_listed_then_used_once_authorized(tmp_path):
    with trio.fail_after(CAP):
        async with adb_rig(tmp_path, desk=False) as rig:
            h = rig.h
            sim = await rig.device_sim(71, "com.example.locked")
            rig.plug(PHONE, {71: sim}, state="unauthorized")
            offline = await h.wait_event("device.offline", device=PHONE)
            assert "prompt" in offline["hint"], offline
            devices = await cli_json(rig, "devices")
            assert [(d["state"], d["vms"]) for d in devices] == [("unauthorized", 0)]
            assert not rig.fake.requested(f"{PHONE}:track-jdwp")
            rig.fake.set_state(PHONE, "device")  # the user accepted the prompt
            await rig.wait_ready(f"{PHONE}/71")
            await h.wait_event("device.online", device=PHONE)


async def test_an_old_server_without_the_long_device_list_still_works(tmp_path):
    with trio.fail_after(CAP):
        async with adb_rig(tmp_path, desk=False, fake=FakeAdb(long_listing=False)) as rig:
            sim = await rig.device_sim(81, "com.example.old")
            rig.plug(PHONE, {81: sim}, model="Never_Shown")
            await rig.wait_ready(f"{PHONE}/81")
            assert await cli_json(rig, "devices") == [
                {"serial": PHONE, "state": "device", "model": None, "product": None, "vms": 1}
            ]
            assert rig.fake.requested("host:track-devices-l") == 1  # refused: then the short one
            assert rig.fake.requested("host:track-devices") == 1


# --------------------------------------------------------------------------------------------
# Bad input and faults


async def test_refused_transport_leaves_other_devices_alone(tmp_path):
    with trio.fail_after(CAP):
        async with adb_rig(tmp_path) as rig:
            h = rig.h
            good = await rig.device_sim(11, "com.example.good")
            other = await rig.device_sim(12, "com.example.late")
            refusing = rig.plug(PHONE, {}, model="Refuser")
            refusing.refuse_transport("device unauthorized. This adb server's $ADB_VENDOR_KEYS")
            refusing.add_pid(12, ("127.0.0.1", other.port))
            rig.plug(TABLET, {11: good})
            await rig.wait_ready(f"{TABLET}/11")
            failed = await h.wait_event("device.track_failed", device=PHONE)
            assert "unauthorized" in failed["error"], failed
            assert await h.vm(f"{PHONE}/12") is None
            # ddmd keeps trying (with back-off): once the transport is allowed, the VM appears.
            refusing.refuse_transport(None)
            await rig.wait_ready(f"{PHONE}/12")
            assert not h.events("adb.lost")
            await rig.assert_desk_undisturbed()


async def test_malformed_track_jdwp_length_reopens_the_stream(tmp_path):
    with trio.fail_after(CAP):
        async with adb_rig(tmp_path) as rig:
            h = rig.h
            sim = await rig.device_sim(21, "com.example.steady")
            device = rig.plug(PHONE, {21: sim})
            before = await rig.wait_ready(f"{PHONE}/21")
            device.inject_track_jdwp(b"zz!!garbage\n")
            error = await h.wait_event("adb.protocol_error", device=PHONE)
            assert "not 4 hex digits" in error["error"], error
            # The stream is reopened; the listed VM was not disturbed; new pids still arrive.
            await wait_until(lambda: rig.fake.requested(f"{PHONE}:track-jdwp") >= 2, 5)
            late = await rig.device_sim(22, "com.example.late")
            device.add_pid(22, ("127.0.0.1", late.port))
            await rig.wait_ready(f"{PHONE}/22")
            after = await h.vm(f"{PHONE}/21")
            assert after is not None
            assert after["connected_at"] == before["connected_at"]
            assert not h.events("device.vm_gone")
            await rig.assert_desk_undisturbed()


async def test_non_numeric_pids_are_skipped(tmp_path):
    with trio.fail_after(CAP):
        async with adb_rig(tmp_path) as rig:
            h = rig.h
            one = await rig.device_sim(31, "com.example.one")
            two = await rig.device_sim(32, "com.example.two")
            device = rig.plug(PHONE, {31: one})
            await rig.wait_ready(f"{PHONE}/31")
            device.pids[32] = ("127.0.0.1", two.port)  # listed only by the injected record
            device.inject_track_jdwp(record(b"31\nabc\n-5\n32\n"))
            await rig.wait_ready(f"{PHONE}/32")
            errors = [e["error"] for e in h.events("adb.protocol_error", device=PHONE)]
            assert any("'abc'" in e for e in errors), errors
            assert any("'-5'" in e for e in errors), errors
            assert rig.fake.requested(f"{PHONE}:track-jdwp") == 1  # framing intact: no reopen
            assert not h.events("device.vm_gone")
            await rig.assert_desk_undisturbed()


async def test_failing_jdwp_open_is_retried(tmp_path):
    with trio.fail_after(CAP):
        async with adb_rig(tmp_path) as rig:
            h = rig.h
            one = await rig.device_sim(41, "com.example.one")
            two = await rig.device_sim(42, "com.example.two")
            device = rig.plug(PHONE, {})
            device.fail_jdwp(42, "no such process")
            device.add_pid(41, ("127.0.0.1", one.port))
            device.add_pid(42, ("127.0.0.1", two.port))
            await rig.wait_ready(f"{PHONE}/41")
            failed = await h.wait_event("device.vm_open_failed", vm=f"{PHONE}/42")
            assert "no such process" in failed["error"], failed
            assert await h.vm(f"{PHONE}/42") is None
            device.fail_jdwp(42, None)
            await rig.wait_ready(f"{PHONE}/42")
            # A jdwp: stream that opens but is not JDWP (the VM went away meanwhile).
            dead = free_port()
            device.add_pid(43, ("127.0.0.1", dead))
            await h.wait_event("device.vm_open_failed", vm=f"{PHONE}/43")
            assert not h.events("adb.lost")
            await rig.assert_desk_undisturbed()


async def test_device_vanishing_under_a_debugger_disconnects_it_with_the_reason(tmp_path):
    with trio.fail_after(CAP):
        async with adb_rig(tmp_path) as rig:
            h = rig.h
            sim = await rig.device_sim(51, "com.example.debugged")
            rig.plug(PHONE, {51: sim})
            vm = await rig.wait_ready(f"{PHONE}/51")
            debugger = await attach(int(vm["debugger_port"]))
            assert "ddmd sim" in await version_of(debugger)
            await h.wait_vm(f"{PHONE}/51", lambda v: v["debugger"] is not None)
            # The streams stay open: ddmd must act on the device list alone.
            rig.fake.remove_device(PHONE, close_streams=False)
            assert await debugger.receive_until_eof() == []
            lost = await h.wait_event("vm.lost", vm=f"{PHONE}/51")
            assert "unplugged" in lost["reason"], lost
            assert lost["debugger"], lost  # who was disconnected
            gone = await h.wait_event("device.vm_gone", vm=f"{PHONE}/51")
            assert "unplugged" in gone["reason"], gone
            await h.wait_event("debugger.detached", vm=f"{PHONE}/51")
            await wait_until(lambda: f"{PHONE}/51" not in h.started.registry, 5, what="dropped")
            # The sim got its connection back: ddmd closed its side of the jdwp stream.
            await wait_until(lambda: sim.statistics().listening, 5, what="sim listening again")
            await rig.assert_desk_undisturbed()


async def test_adb_server_killed_and_restarted(tmp_path):
    with trio.fail_after(CAP):
        async with adb_rig(tmp_path) as rig:
            h = rig.h
            sim = await rig.device_sim(61, "com.example.survivor")
            rig.plug(PHONE, {61: sim}, model="Pixel_7")
            await rig.wait_ready(f"{PHONE}/61")
            await rig.fake.kill()
            lost = await h.wait_event("adb.lost")
            assert lost["reason"], lost
            await wait_until(lambda: f"{PHONE}/61" not in h.started.registry, 5, what="dropped")
            await wait_until(lambda: h.started.registry.devices() == [], 5, what="no devices")
            await rig.restart_adb()  # same port, same devices
            await h.wait_event("adb.connected", version=41)
            await wait_until(lambda: len(h.events("adb.connected")) == 2, 5)
            await rig.wait_ready(f"{PHONE}/61")
            assert [d["serial"] for d in await cli_json(rig, "devices")] == [PHONE]
            await rig.assert_desk_undisturbed()


async def test_without_adb_it_says_so_once_and_serves_workstation_vms(tmp_path):
    nothing = free_port()  # no adb server there, and no adb program either
    with trio.fail_after(CAP):
        async with adb_rig(tmp_path, adb={"port": nothing, "enabled": "auto"}) as rig:
            h = rig.h
            # Several attempts later, still one warning (the others are at debug level).
            await wait_until(lambda: len(h.events("adb.unavailable")) >= 3, 5, what="retries")
            loud = [e for e in h.events("adb.unavailable") if e["log_level"] != "debug"]
            assert len(loud) == 1, loud
            assert loud[0]["log_level"] == "warning"
            assert "no adb program" in loud[0]["reason"], loud[0]
            assert "apt install adb" in loud[0]["fix"], loud[0]
            assert not h.events("adb.server_starting")
            assert not h.events("adb.connected")
            result = await h.cli("devices")
            assert result.exit_code == 0, result.output
            assert "no Android devices" in result.output
            await rig.assert_desk_undisturbed()


async def test_adb_on_without_a_server_is_loud(tmp_path):
    nothing = free_port()
    with trio.fail_after(CAP):
        async with adb_rig(tmp_path, desk=False, adb={"port": nothing, "enabled": "on"}) as rig:
            first = await rig.h.wait_event("adb.unavailable")
            assert first["log_level"] == "error", first
            assert first["mode"] == "on", first


async def test_adb_off_never_talks_to_adb(tmp_path):
    with trio.fail_after(CAP):
        async with adb_rig(tmp_path, adb={"enabled": "off"}) as rig:
            rig.fake.add_device(PHONE)
            await rig.assert_desk_undisturbed()
            assert rig.fake.connections == 0
            assert not [e for e in rig.h.logs if str(e["event"]).startswith(("adb.", "device."))]


async def test_a_silent_adb_server_times_out_and_its_socket_is_closed(tmp_path):
    """A server that accepts and never answers: each call ends at [timeouts] adb, and the
    worker thread's socket is shut down (the server sees EOF) rather than left blocked."""
    closed = 0
    accepted = 0

    async def silent(stream: trio.SocketStream) -> None:
        nonlocal accepted, closed
        accepted += 1
        async with stream:
            while await stream.receive_some(4096):
                pass
        closed += 1

    with trio.fail_after(CAP):
        async with trio.open_nursery() as servers:
            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
            port = listeners[0].socket.getsockname()[1]
            servers.start_soon(trio.serve_listeners, silent, listeners)
            async with adb_rig(
                tmp_path, adb={"port": port, "enabled": "on"}, timeouts={"adb": 0.5}
            ) as rig:
                h = rig.h
                unavailable = await h.wait_event("adb.unavailable")
                assert "within 0.5 s" in unavailable["reason"], unavailable
                await wait_until(lambda: closed >= 1, 5, what="the silent server sees EOF")
                await rig.assert_desk_undisturbed()
            await wait_until(lambda: closed == accepted, 5, what="every connection closed")
            servers.cancel_scope.cancel()
