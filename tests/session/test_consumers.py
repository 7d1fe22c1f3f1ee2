"""The consumer rules (session/consumers.py, intake.py, ddmshare.py) as Playbooks: sockets handed
over by the adb front next to ddmd itself and debuggers on ddmd's ports. No event loop, no
sockets, no clock.

ddmd's own requests 1-5 are answered by ``ready()``; the first request relayed for a consumer
gets VM-side id 6.
"""

from __future__ import annotations

from ddmd.protocol import ddm
from ddmd.protocol.jdwp import HANDSHAKE, ReplyPacket, encode
from ddmd.session.commands import CloseDebugger, Log, Reconnect, SendToDebugger, SendToVm
from ddmd.session.consumers import DEBUGGER, FRONT
from ddmd.session.ddmshare import DdmShare, Switch
from ddmd.session.inputs import ConsumerBytes, ConsumerJoined, ConsumerLeft, Tick, VmConnected
from tests.session.playbook import Placeholder
from tests.session.test_vm_session import (
    FEAT,
    HELO,
    VERSION,
    Vm,
    answer,
    asks,
    attach,
    cmd,
    push,
    ready,
    reply,
)

STUDIO = 0x40000001  # Google's tools number their requests from 0x40000000
THCR = ddm.ThreadCreated(7, "worker")


def front(vm: Vm, *consumers: int, tool: str = "java (ddmlib)") -> Vm:
    for c in consumers:
        assert (
            vm.book()
            >> ConsumerJoined(c, "front", f"127.0.0.1:{50000 + c}", kind=FRONT, tool=tool)
            >> ConsumerBytes(c, HANDSHAKE)
            << SendToDebugger(c, HANDSHAKE)
        )
    return vm


def ddm_request(packet_id: int, chunk: ddm.Chunk) -> bytes:
    return encode(ddm.ddm_command(packet_id, chunk))


def ddm_reply(packet_id: int, *chunks: ddm.Chunk) -> bytes:
    return encode(ReplyPacket(packet_id, 0, ddm.encode_chunks(chunks)))


def test_a_front_socket_that_speaks_ddm_only_is_listed_but_is_no_debugger() -> None:
    vm = front(ready(), 1)
    router = vm.session.router
    assert router.connected_consumers() == (1,)
    assert router.attached() == ()
    assert router.debugger_count() == 0  # it does not count against [debugger] max_per_vm
    (line,) = router.consumers.peers()
    assert line.startswith("java (ddmlib) 127.0.0.1:50001 via front")


def test_helo_and_feat_are_answered_from_what_ddmd_knows_without_asking_the_vm() -> None:
    vm = front(ready(), 1)
    assert (
        vm.book()
        >> ConsumerBytes(1, ddm_request(STUDIO, ddm.HeloRequest(1)))
        << SendToDebugger(1, ddm_reply(STUDIO, HELO))
        >> ConsumerBytes(1, ddm_request(STUDIO + 2, ddm.FeatRequest()))
        << SendToDebugger(1, ddm_reply(STUDIO + 2, FEAT))
    )
    assert len(vm.session.router.ids) == 0


def test_helo_carries_the_name_the_vm_reported_since() -> None:
    vm = front(ready(helo=ddm.HeloReply(1, 4242, "Dalvik", "<pre-initialized>")), 1)
    assert vm.book() >> push(ddm.AppName("com.example.mail"))
    renamed = ddm.HeloReply(1, 4242, "Dalvik", "com.example.mail")
    assert (
        vm.book()
        >> ConsumerBytes(1, ddm_request(STUDIO, ddm.HeloRequest(1)))
        << SendToDebugger(1, ddm_reply(STUDIO, renamed))
    )


def test_any_other_ddm_request_goes_to_the_vm_under_a_fresh_id_and_its_reply_to_that_consumer() -> (
    None
):
    vm = front(ready(), 1, 2)
    assert (
        vm.book()
        >> ConsumerBytes(1, ddm_request(STUDIO, ddm.ThreadStatusRequest()))
        << asks(6, ddm.ThreadStatusRequest())
        >> ConsumerBytes(2, ddm_request(STUDIO, ddm.ThreadStatusRequest()))  # the same id
        << asks(7, ddm.ThreadStatusRequest())
        >> answer(7, ddm.ThreadStatus(()))
        << SendToDebugger(2, ddm_reply(STUDIO, ddm.ThreadStatus(())))
        >> answer(6, ddm.ThreadStatus(()))
        << SendToDebugger(1, ddm_reply(STUDIO, ddm.ThreadStatus(())))
    )


def test_a_request_the_vm_never_answers_expires_at_its_deadline() -> None:
    vm = front(ready(ddm_request=5.0), 1)
    assert (
        vm.book()
        >> ConsumerBytes(1, ddm_request(STUDIO, ddm.AllocTrackingQuery()))
        << asks(6, ddm.AllocTrackingQuery())
    )
    assert len(vm.session.router.ids) == 1
    assert vm.book() >> Tick(6.0)
    assert len(vm.session.router.ids) == 0


def test_the_vms_pushes_reach_ddmds_model_and_every_consumer_that_speaks_ddm() -> None:
    vm = attach(front(ready(), 1, 2), 3)
    # 1 speaks DDM; 2 (front, silent) and 3 (a debugger on ddmd's port) do not.
    assert (
        vm.book()
        >> ConsumerBytes(1, ddm_request(STUDIO, ddm.HeloRequest(1)))
        << SendToDebugger(1, ddm_reply(STUDIO, HELO))
        >> push(THCR)
        << SendToDebugger(1, encode(ddm.ddm_command(0x80000001, THCR)))
    )
    assert any(t.name == "worker" for t in vm.session.snapshot().threads or ())


def test_thread_notices_on_go_to_the_vm_and_off_is_kept_from_it_while_ddmd_uses_them() -> None:
    vm = front(ready(), 1)
    assert (
        vm.book()
        # On: the VM is asked (it answers with the burst of thread notices everyone gets).
        >> ConsumerBytes(1, ddm_request(STUDIO, ddm.ThreadNotify(True)))
        << asks(6, ddm.ThreadNotify(True))
        >> push(THCR)
        << SendToDebugger(1, encode(ddm.ddm_command(0x80000001, THCR)))
        >> answer(6)
        << SendToDebugger(1, ddm_reply(STUDIO))
        # Off: ddmd keeps thread notices on, so the VM never hears of it; the consumer gets the
        # empty reply VMs that answer it send.
        >> ConsumerBytes(1, ddm_request(STUDIO + 2, ddm.ThreadNotify(False)))
        << SendToDebugger(1, ddm_reply(STUDIO + 2))
    )
    assert Switch.THREADS not in vm.session.router.share.wants(1)


def test_a_switch_turned_off_by_one_stays_on_for_another_and_goes_off_with_the_last() -> None:
    vm = front(ready(), 1, 2)
    assert (
        vm.book()
        >> ConsumerBytes(1, ddm_request(STUDIO, ddm.AllocTrackingEnable(True)))
        << asks(6, ddm.AllocTrackingEnable(True))
        >> ConsumerBytes(2, ddm_request(STUDIO, ddm.AllocTrackingEnable(True)))
        << asks(7, ddm.AllocTrackingEnable(True))
        # 2 turns it off while 1 still wants it: the VM keeps tracking.
        >> ConsumerBytes(2, ddm_request(STUDIO + 2, ddm.AllocTrackingEnable(False)))
        << SendToDebugger(2, ddm_reply(STUDIO + 2))
        # 2 leaving changes nothing; 1 leaving with it on: ddmd turns it off.
        >> ConsumerLeft(2, "gone")
        << CloseDebugger(2, "left")
        >> ConsumerLeft(1, "gone")
        << CloseDebugger(1, "left")
        << asks(8, ddm.AllocTrackingEnable(False))
    )


def test_a_consumer_leaving_never_turns_off_what_ddmd_itself_uses() -> None:
    vm = front(ready(), 1)
    assert (
        vm.book()
        >> ConsumerBytes(1, ddm_request(STUDIO, ddm.HeapInfoRequest(3)))
        << asks(6, ddm.HeapInfoRequest(3))
        >> ConsumerLeft(1, "gone")
        << CloseDebugger(1, "left")
    )  # ddmd subscribed to heap info at every GC itself: nothing is sent


def test_stopping_a_trace_someone_else_started_is_refused_and_the_trace_goes_on() -> None:
    vm = front(ready(), 1, 2)
    fail = ddm.Fail(0, "method tracing was started by another client; it goes on")
    assert (
        vm.book()
        >> ConsumerBytes(1, ddm_request(STUDIO, ddm.MethodTraceStreamStart(8 << 20, 0)))
        << asks(6, ddm.MethodTraceStreamStart(8 << 20, 0))
        >> ConsumerBytes(2, ddm_request(STUDIO, ddm.MethodTraceStreamEnd()))
        << SendToDebugger(2, ddm_reply(STUDIO, fail))
        >> ConsumerBytes(1, ddm_request(STUDIO + 2, ddm.MethodTraceStreamEnd()))
        << asks(7, ddm.MethodTraceStreamEnd())
    )


def test_a_ddm_only_consumer_leaving_releases_nothing() -> None:
    vm = front(ready(), 1)
    assert (
        vm.book(logs=True)
        >> ConsumerBytes(1, ddm_request(STUDIO, ddm.HeloRequest(1)))
        << Log("debugger.ddm_answered", "debug", Placeholder())
        << SendToDebugger(1, ddm_reply(STUDIO, HELO))
        >> ConsumerLeft(1, "debugger closed the connection")
        << CloseDebugger(1, "left")
        << Log("debugger.detached", "info", Placeholder())
    )
    assert vm.session.state == "ready"  # no DBGD, no reconnect: nothing to release


def test_a_front_socket_becomes_a_debugger_with_its_first_debugger_command() -> None:
    vm = front(ready(), 1)
    assert (
        vm.book()
        >> ConsumerBytes(1, cmd(1, VERSION))
        << SendToVm(cmd(6, VERSION))
        >> answer(6)
        << SendToDebugger(1, reply(1))
    )
    assert vm.session.router.attached() == (1,)
    # Now it counts: when it leaves, the VM is released like after any debugger.
    assert vm.book() >> ConsumerLeft(1, "gone") << CloseDebugger(1, "left") << asks(7, ddm.Dbgd())
    assert vm.session.state == "releasing"


def test_a_front_socket_that_would_be_one_debugger_too_many_is_closed_with_the_reason() -> None:
    vm = attach(front(ready(max_debuggers=1), 1), 2)  # 2 debugs through ddmd's port
    assert (
        vm.book(logs=True)
        >> ConsumerBytes(1, cmd(1, VERSION))
        << Log(
            "debugger.rejected",
            "warning",
            {
                "peer": "127.0.0.1:50001",
                "via": "front",
                "reason": "one debugger too many ([debugger] max_per_vm is 1)",
            },
        )
        << CloseDebugger(1, "left")
        << Log("debugger.detached", "info", Placeholder())
    )
    assert vm.session.router.attached() == (2,)


def test_a_release_reconnect_keeps_ddm_only_consumers_and_forgets_their_switches() -> None:
    vm = front(attach(ready(), 2), 1)
    assert (
        vm.book()
        >> ConsumerBytes(1, ddm_request(STUDIO, ddm.AllocTrackingEnable(True)))
        << asks(6, ddm.AllocTrackingEnable(True))
        >> ConsumerLeft(2, "gone")
        << CloseDebugger(2, "left")
        << asks(7, ddm.Dbgd())
        >> Tick(100.0)
        << Reconnect("recycled after the debugger left")
        >> VmConnected(100.0)
        << asks(8, ddm.HeloRequest(1))
    )
    assert vm.session.router.connected_consumers() == (1,)
    assert vm.session.router.share.wants(1) == ()  # the new connection starts with all off


def test_ddm_share_alone_keeps_the_union_of_wants() -> None:
    own = {Switch.THREADS}
    share = DdmShare(lambda switch: switch in own)
    then_off = ddm.encode_chunk(ddm.ThreadNotify(False))
    reae_on = ddm.encode_chunk(ddm.AllocTrackingEnable(True))
    reae_off = ddm.encode_chunk(ddm.AllocTrackingEnable(False))
    assert not share.request(1, then_off).relay  # ddmd wants thread notices
    assert share.request(1, reae_on).relay
    assert share.request(2, reae_off).relay is False  # 1 still wants it
    assert share.request(1, reae_off).relay  # the last one: the VM is told
    assert share.left(1) == []
    assert share.request(1, b"\x00\x01").relay  # unreadable: the VM judges it


def test_a_consumer_s_kind_says_when_it_counts_as_a_debugger():
    # The kind's rules live in the kind (consumers.ConsumerKind), not in branches elsewhere.
    assert DEBUGGER.counts(debugging=False)
    assert DEBUGGER.counts(debugging=True)
    assert not FRONT.counts(debugging=False)
    assert FRONT.counts(debugging=True)
