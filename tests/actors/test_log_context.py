"""Issue 20, friction 2: the JSON log names the app, and says each fact once, by one name.

The real daemon (``rawpeers.monitor``: structlog events captured with ``ddmd.logs``'s context
processors, as ``configure`` runs them) scans ``SimVm``s and scripted peers. Checked: every
line about a VM carries its ``app`` and ``pid`` once known (also after a rename, and from the
VM's other tasks: debuggers, API calls, the supervisor); a VM that goes away logs ``vm.gone``;
the log and the event stream use the same names; a debugger's release is one info line; a
plain JVM's HELO probe and the shutdown's current-VM churn stay below info.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from ddmd.control.events import StreamEvent
from ddmd.logs import Event
from ddmd.protocol.jdwp import CommandPacket
from tests.actors.fakepeers import FakeDebugger
from tests.actors.rawpeers import Harness, RawPeer, free_port_range, monitor, wait_until

CAP = 20  # seconds: absolute cap on every test
WAIT = 5
APP = "com.example.mail"
PID = 5150


def vm_id(port: int) -> str:
    return f"tcp:{port}"


async def ready(h: Harness, port: int, **kw: Any) -> None:
    kw.setdefault("app_name", APP)
    kw.setdefault("package_name", kw["app_name"])
    await h.start_sim(port, pid=kw.pop("pid", PID), threads=4, **kw)
    await h.wait_vm(vm_id(port), lambda v: v["state"] == "ready" and v["debugger_port"])


async def debug_and_leave(h: Harness) -> None:
    """A debugger attaches on the current-VM port, debugs (VirtualMachine.Suspend), leaves."""
    stream = await trio.open_tcp_stream("127.0.0.1", h.started.current_port)
    debugger = FakeDebugger(stream)
    await debugger.handshake()
    await debugger.send(CommandPacket(1, 1, 8, b""))  # VirtualMachine.Suspend
    assert await debugger.receive() is not None
    await stream.aclose()


def about(h: Harness, vm: str) -> list[dict[str, Any]]:
    return [e for e in h.logs if e.get("vm") == vm]


# ------------------------------------------------------------------------------ app and pid


async def test_every_line_about_a_vm_names_its_app_and_pid_and_vm_gone_ends_it(tmp_path):
    (port,) = free_port_range(1)
    vm = vm_id(port)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            await ready(h, port)
            await debug_and_leave(h)  # lines from the debugger's tasks
            await h.wait_event("vm.released", vm=vm)
            # A line logged from an API request's task (not one of the VM's own).
            response = await h.client.post(f"/api/v1/vms/{vm}/gc")
            assert response.status_code == 200, response.text
            await h.wait_event("debugger.listening", vm=vm, via="vm-port")
        lines = about(h, vm)
    names = [e["event"] for e in lines]
    hello = names.index("vm.hello")
    # Before HELO nothing names the VM yet; from HELO on, every line does.
    assert names[:hello] == ["vm.found", "current.changed", "vm.connected"]
    later = lines[hello:]
    for entry in later:
        assert (entry.get("app"), entry.get("pid")) == (APP, PID), entry
    for name in ("debugger.attached", "debugger.detached", "vm.released", "vm.disconnected"):
        assert name in names, names
    # The last line about the VM is vm.gone, with the reason and the VM's identity.
    gone = lines[-1]
    assert gone["event"] == "vm.gone"
    assert (gone["app"], gone["pid"], gone["reason"], gone["log_level"]) == (
        APP,
        PID,
        "stopped",
        "info",
    )


async def test_a_rename_is_vm_renamed_in_the_log_and_on_the_stream_and_rebinds_the_app(tmp_path):
    (port,) = free_port_range(1)
    vm = vm_id(port)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            assert h.started.hub is not None
            with h.started.hub.subscribe() as stream:
                # HELO while the process is still <pre-initialized>; APNM names it later.
                await h.start_sim(port, pid=3131, app_name=APP, package_name=APP, apnm_delay=0.5)
                hello = await h.wait_event("vm.hello", vm=vm)
                renamed = await h.wait_event(Event.VM_RENAMED, vm=vm)
                await debug_and_leave(h)
                await h.wait_event("vm.released", vm=vm)
                received: list[dict[str, Any]] = []
                await wait_until(
                    lambda: received.extend(_drain(stream)) or _names(received) >= {"vm.renamed"},
                    WAIT,
                    what="vm.renamed on the event stream",
                )
        lines = about(h, vm)
    assert renamed["app"] == APP
    assert not [e for e in h.logs if e["event"] == "vm.app_renamed"]
    (on_stream,) = [e for e in received if e["event"] == "vm.renamed"]
    assert (on_stream["vm"], on_stream["app"], on_stream["previous_app"]) == (
        vm,
        APP,
        "<pre-initialized>",
    )
    assert hello["app"] == "<pre-initialized>"
    at = lines.index(renamed)
    before = lines[lines.index(hello) : at]
    assert all((e.get("app"), e.get("pid")) == ("<pre-initialized>", 3131) for e in before)
    after = lines[at:]
    assert after
    assert all((e.get("app"), e.get("pid")) == (APP, 3131) for e in after), after


def _drain(channel: trio.MemoryReceiveChannel[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    while True:
        try:
            out.append(channel.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return out


def _names(events: list[dict[str, Any]]) -> set[str]:
    return {str(e.get("event")) for e in events}


def test_the_stream_and_the_log_name_each_shared_fact_alike():
    """Every stream event the log also reports has the log's name (docs/api.md promises it)."""
    stream_only = {
        "stream.opened",  # the stream's own
        "overflow",
        "vm.changed",  # snapshot differences: the log has the underlying lines instead
        "heap.dumped",
        "ext.updated",
        "device.changed",  # the log's device.online / device.offline say why
        "device.gone",
    }
    logged = {e.value for e in Event}
    for name in StreamEvent:
        if name.value not in stream_only:
            assert name.value in logged, name
    assert "vm.app_renamed" not in logged
    assert {"vm.gone", "vm.renamed", "vm.released"} <= logged


async def test_a_vm_that_goes_away_logs_vm_gone_as_on_the_stream(tmp_path):
    (port,) = free_port_range(1)
    vm = vm_id(port)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            assert h.started.hub is not None
            with h.started.hub.subscribe() as stream:
                await ready(h, port)
                response = await h.client.post(f"/api/v1/vms/{vm}/kill?status=3")
                assert response.status_code == 200, response.text
                gone = await h.wait_event("vm.gone", vm=vm)
                received: list[dict[str, Any]] = []
                await wait_until(
                    lambda: received.extend(_drain(stream)) or "vm.gone" in _names(received),
                    WAIT,
                    what="vm.gone on the event stream",
                )
    assert (gone["app"], gone["pid"], gone["log_level"]) == (APP, PID, "info")
    assert gone["reason"] != "stopped"  # it went away by itself, before the daemon stopped
    assert [e["vm"] for e in received if e["event"] == "vm.gone"] == [vm]


# ------------------------------------------------------------------------------ release


@pytest.mark.parametrize("ack_dbgd", [False, True], ids=["reconnected", "dbgd-acknowledged"])
async def test_a_debuggers_release_is_one_info_line(tmp_path, ack_dbgd):
    (port,) = free_port_range(1)
    vm = vm_id(port)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            await ready(h, port, ack_dbgd=ack_dbgd)
            await debug_and_leave(h)
            released = await h.wait_event("vm.released", vm=vm)
            await trio.sleep(0.3)  # nothing more at info may follow for this release
            lines = about(h, vm)
    start = next(i for i, e in enumerate(lines) if e["event"] == "debugger.detached")
    end = lines.index(released)
    steps = lines[start + 1 : end]
    info = [e["event"] for e in lines[start:] if e["log_level"] != "debug"]
    assert info[:2] == ["debugger.detached", "vm.released"], info
    assert "vm.hello" not in info[2:], info
    assert "vm.connected" not in info[2:], info
    assert all(e["log_level"] == "debug" for e in steps), steps
    step_names = {e["event"] for e in steps}
    assert "ddm.dbgd_sent" in step_names
    if ack_dbgd:
        assert released["how"] == "the VM acknowledged DBGD"
        assert "ddm.dbgd_acknowledged" in step_names
    else:
        assert released["how"] == "its connection was reopened"
        assert {"vm.reconnecting", "vm.connected", "vm.reconnected", "vm.hello"} <= step_names
    assert released["after"] == "debugger closed the connection"
    assert (released["app"], released["pid"], released["log_level"]) == (APP, PID, "info")


# ------------------------------------------------------------------------------ quieter lines


async def test_a_plain_jvms_helo_probe_is_logged_at_debug_level(tmp_path):
    """A VM that refuses HELO (HotSpot's error 99): the probe is a debug line; that it is a
    plain JVM (vm.not_ddm) stays at info."""
    (port,) = free_port_range(1)
    vm = vm_id(port)

    async def script(conn: Any) -> None:
        while (packet := await conn.receive_command()) is not None:
            await conn.reply(packet.id, error=99)

    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            await h.start(RawPeer(port, script))
            await h.wait_vm(vm, lambda v: v["ddm"] is False)
            probe = await h.wait_event("vm.feature_unsupported", vm=vm, feature="HELO")
            not_ddm = await h.wait_event("vm.not_ddm", vm=vm)
    assert probe["log_level"] == "debug"
    assert not_ddm["log_level"] == "info"


async def test_shutdown_does_not_log_a_current_vm_change_per_vm(tmp_path):
    ports = free_port_range(3)
    with trio.fail_after(CAP):
        async with monitor(ports, tmp_path) as h:
            for i, port in enumerate(ports):
                await ready(h, port, app_name=f"com.example.app{i}", pid=4000 + i)
            await h.client.post(f"/api/v1/vms/{vm_id(ports[0])}/select")
            await h.wait_event("current.changed", vm=vm_id(ports[0]))
    names = [e["event"] for e in h.logs]
    stopping = names.index("daemon.stopping")
    after = h.logs[stopping:]
    assert [e["event"] for e in after if e["event"] == "vm.gone"] == ["vm.gone"] * 3
    churn = [e for e in after if e["event"] == "current.changed" and e["log_level"] != "debug"]
    assert churn == []
