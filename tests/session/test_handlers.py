"""Chunk handlers on one VM session (``session/handlers.py``, the host of ``ddmd.ext``), as
Playbooks: who sees which chunk, whose replies reach whom, failures and publishing."""

from __future__ import annotations

from typing import Any

import pytest

from ddmd.protocol import ddm
from ddmd.protocol.jdwp import CommandPacket, ReplyPacket, encode
from ddmd.session.commands import Log, Publish, SendToVm
from ddmd.session.handlers import FAILURE_LIMIT
from ddmd.session.inputs import Tick, VmBytes, VmClosed
from ddmd.session.vm import SessionSettings, VmSession
from tests.session.test_vm_session import (
    ADDRESS,
    FEAT,
    HEAP_INFO,
    HELO,
    THREADS,
    Vm,
    answer,
    push,
)

XTST = ddm.chunk_type_code("XTST")


class Recorder:
    """A handler that records every call; ``on_connect`` runs inside ``connected``."""

    def __init__(self, name: str, types: tuple[str, ...], on_connect: Any = None) -> None:
        self.name = name
        self.chunk_types = types
        self.calls: list[tuple[Any, ...]] = []
        self.on_connect = on_connect
        self.fail = False

    def connected(self, vm: Any) -> None:
        self.calls.append(("connected", vm.id))
        if self.on_connect is not None:
            self.on_connect(vm)

    def disconnected(self, vm: Any) -> None:
        self.calls.append(("disconnected", vm.id))

    def handle_chunk(
        self, vm: Any, chunk_type: str, data: bytes, is_reply: bool, msg_id: int
    ) -> None:
        self.calls.append(("chunk", chunk_type, data, is_reply, msg_id))
        if self.fail:
            raise ValueError("plugin bug")

    def chunks(self) -> list[tuple[Any, ...]]:
        return [c[1:] for c in self.calls if c[0] == "chunk"]


def with_handlers(*handlers: Any, **settings: Any) -> Vm:
    vm = Vm()
    vm.session = VmSession(
        "vm-1",
        source="tcp",
        address=ADDRESS,
        settings=SessionSettings(**settings),
        handlers=handlers,
    )
    return vm


def ready(vm: Vm) -> list[Any]:
    """The same conversation as ``test_vm_session.ready`` (ddmd's requests 1-5 answered),
    returning every command, the handlers' requests among them."""
    from ddmd.session.inputs import VmConnected

    out: list[Any] = []
    for item in (
        VmConnected(0.0),
        answer(1, HELO),
        answer(2, FEAT),
        answer(3),
        answer(4),
        push(HEAP_INFO),
        answer(5),
    ):
        out += vm.session.handle(item, 0.0)
    assert vm.session.state == "ready"
    return out


def custom(packet_id: int, chunk_type: int, data: bytes, *, reply: bool = False) -> VmBytes:
    raw = ddm.raw_chunk(chunk_type, data)
    if reply:
        return VmBytes(encode(ReplyPacket(packet_id, 0, raw)))
    return VmBytes(encode(CommandPacket(packet_id, 199, 1, raw)))


def test_connected_after_ddmd_s_own_set_up_and_the_handler_s_request_goes_out_next() -> None:
    sent: list[int] = []
    h = Recorder("probe", ("XTST",), on_connect=lambda vm: sent.append(vm.send_chunk("XTST")))
    vm = with_handlers(h)
    out = ready(vm)  # requests 1-5 are ddmd's: the handler's request is 6, after them
    assert h.calls[0] == ("connected", "vm-1")
    assert sent == [6]
    requests = [c for c in out if isinstance(c, SendToVm)]
    assert requests[5] == SendToVm(encode(CommandPacket(6, 199, 1, ddm.raw_chunk(XTST, b""))))


def test_a_handler_gets_its_own_reply_and_never_anyone_else_s() -> None:
    sent: list[int] = []
    mine = Recorder("mine", ("XTST",), on_connect=lambda vm: sent.append(vm.send_chunk("XTST")))
    other = Recorder("other", ("XTST",))
    vm = with_handlers(mine, other)
    ready(vm)
    vm.session.handle(custom(sent[0], XTST, b"answer", reply=True), 0.1)
    assert mine.chunks() == [("XTST", b"answer", True, sent[0])]
    assert other.chunks() == []
    # ddmd's own request (a thread-state poll) and its reply: no handler sees the reply.
    from ddmd.session.inputs import Call, RefreshThreads

    out = vm.session.handle(Call(1, RefreshThreads()), 0.2)
    (poll,) = [c for c in out if isinstance(c, SendToVm)]
    poll_id = int.from_bytes(poll.data[4:8], "big")
    vm.session.handle(answer(poll_id, THREADS), 0.3)
    assert [c[0] for c in mine.chunks()] == ["XTST"]
    assert other.chunks() == []
    assert vm.session.snapshot().threads


def test_pushes_of_a_handler_s_types_reach_it_and_star_sees_everything() -> None:
    typed = Recorder("typed", ("XTST",))
    star = Recorder("star", ("*",))
    vm = with_handlers(typed, star)
    ready(vm)
    assert vm.book() >> custom(0x80000010, XTST, b"one") >> push(ddm.ThreadCreated(9, "worker"))
    assert typed.chunks() == [("XTST", b"one", False, 0x80000010)]
    assert [c[0] for c in star.chunks()] == ["HPIF", "XTST", "THCR"]  # HPIF: during ready()
    # ddmd's own model still got the thread notice.
    threads = vm.session.snapshot().threads or ()
    assert [t.name for t in threads] == ["worker"]


def test_an_empty_reply_arrives_as_the_request_s_type_and_silence_as_nothing() -> None:
    sent: list[int] = []
    h = Recorder("h", ("XTST",), on_connect=lambda vm: sent.extend([vm.send_chunk("XTST")] * 1))
    vm = with_handlers(h)
    ready(vm)
    assert vm.book() >> answer(sent[0])
    assert h.chunks() == [("XTST", b"", True, sent[0])]


def test_a_handler_that_raises_is_logged_then_switched_off_and_nothing_else_changes() -> None:
    bad = Recorder("bad", ("XTST",))
    bad.fail = True
    vm = with_handlers(bad)
    ready(vm)
    out: list[Any] = []
    for i in range(FAILURE_LIMIT + 2):
        out += vm.session.handle(custom(0x80000020 + i, XTST, b"x"), 1.0)
    failed = [c for c in out if isinstance(c, Log) and c.event == "ext.handler_failed"]
    disabled = [c for c in out if isinstance(c, Log) and c.event == "ext.handler_disabled"]
    assert len(failed) == FAILURE_LIMIT
    assert failed[0].fields["handler"] == "bad"
    assert "plugin bug" in str(failed[0].fields["error"])
    assert len(disabled) == 1
    # The VM carries on: its thread states still come in and are applied.
    vm.session.handle(push(ddm.ThreadCreated(1, "main")), 1.0)
    poll = vm.session.handle(Tick(1.0), 1.0)
    del poll
    assert vm.session.snapshot().state == "ready"
    assert len(bad.chunks()) == FAILURE_LIMIT  # nothing delivered after it was switched off


def test_publish_becomes_a_command_and_must_be_json() -> None:
    errors: list[str] = []

    def on_connect(vm: Any) -> None:
        vm.publish({"answer": 42})
        try:
            vm.publish({1, 2})
        except TypeError as exc:
            errors.append(str(exc))

    h = Recorder("pub", (), on_connect=on_connect)
    vm = with_handlers(h)
    commands = ready(vm)
    assert Publish("pub", {"answer": 42}) in commands
    assert errors
    assert "JSON" in errors[0]


def test_sending_outside_a_callback_is_refused_with_words() -> None:
    kept: list[Any] = []
    h = Recorder("late", (), on_connect=kept.append)
    vm = with_handlers(h)
    ready(vm)
    with pytest.raises(RuntimeError, match=r"inside connected\(\) and handle_chunk\(\)"):
        kept[0].send_chunk("XTST")


def test_disconnected_when_the_connection_ends_and_pending_requests_are_dropped() -> None:
    sent: list[int] = []
    h = Recorder("h", ("XTST",), on_connect=lambda vm: sent.append(vm.send_chunk("XTST")))
    vm = with_handlers(h)
    ready(vm)
    vm.session.handle(VmClosed("eof"), 1.0)
    assert h.calls[-1] == ("disconnected", "vm-1")
    assert len(vm.session.router.ids) == 0


def test_a_handler_s_silent_request_expires_quietly() -> None:
    sent: list[int] = []
    h = Recorder("h", ("XTST",), on_connect=lambda vm: sent.append(vm.send_chunk("XTST")))
    vm = with_handlers(h)
    ready(vm)
    out = vm.session.handle(Tick(60.0), 60.0)
    assert not [c for c in out if isinstance(c, Log) and c.event == "ddm.request_timed_out"]
    assert h.chunks() == []
    assert vm.session.router.ids.get(sent[0]) is None
    # ddmd's own poll (THST) still works after.
