"""The release of a VM without DDM on its kept connection (issue 30, item 1), the release part
alone against a fake host, rule by rule: when the last debugger leaves a plain JVM, ddmd clears
its event requests, resumes its suspensions and re-enables its pins with commands of its own,
and keeps the connection once the VM has answered every one; a refusal or silence past
``[timeouts] dbgd_ack`` falls back to a reconnect, logged with why. Also: a command that a
consumer sends during the release is held and taken after it (issue 31, item 9b).

The router is the real one; the VM's replies (``FromVm``) go through it to their owner as in
the session (``Own.owner``); ``Tick(t)`` expires what the id map and the part wait for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ddmd.protocol.idmap import Pending
from ddmd.protocol.jdwp import HANDSHAKE, ReplyPacket
from ddmd.session.commands import (
    Changed,
    CloseDebugger,
    Command,
    Log,
    Reconnect,
    SendToDebugger,
    SendToVm,
)
from ddmd.session.consumers import FRONT
from ddmd.session.host import Own
from ddmd.session.inputs import ConsumerJoined, ConsumerLeft, Tick
from ddmd.session.lifecycle import Lifecycle
from ddmd.session.release import Release
from ddmd.session.router import Router
from ddmd.session.settings import SessionSettings
from tests.session.parts import FakeHost
from tests.session.playbook import Placeholder
from tests.session.test_bridge import ALL, SIZES, T1, bp, clear, cmd, composite, int4, reply, tid
from tests.session.test_release import RECYCLED, Handshake, Recycled

LEFT = "debugger closed the connection"
HOW = "ddmd released what the debugger held; the connection is kept"
ID_SIZES, SET, CLEAR, RESUME = (1, 7), (15, 1), (15, 2), (1, 9)
HOLD, RELEASE_EVENTS, ALL_THREADS = (1, 15), (1, 16), (1, 4)
DISABLE, ENABLE = (9, 7), (9, 8)
BREAKPOINT = 2
O1 = 0x77


@dataclass(frozen=True)
class Bytes:
    """Bytes from consumer ``consumer``."""

    consumer: int
    data: bytes


@dataclass(frozen=True)
class FromVm:
    data: bytes


class Kept:
    """The release part of a plain JVM (HELO refused), the VM connected and identified."""

    def __init__(self, **settings: Any) -> None:
        self.host = FakeHost(settings=SessionSettings(**settings))
        self.host.model.ddm = False
        self.router = Router(on_reply=self._on_reply, on_push=lambda p: [], max_debuggers=4)
        self.lifecycle = Lifecycle("vm-1")
        self.release = Release(self.host, self.lifecycle, self.router, self._recycle)
        self.lifecycle.goto("connected")
        self.router.connected()
        self.lifecycle.identify()

    def _on_reply(self, pending: Pending, packet: ReplyPacket) -> list[Command]:
        origin = pending.origin
        if isinstance(origin, Own) and origin.owner is not None:
            origin.owner.answered(origin, packet)
        return []

    def _recycle(self, why: str) -> None:
        self.router.disconnected()
        self.host.emit(Recycled(why))  # type: ignore[arg-type]

    def feed(self, item: Any) -> None:
        if isinstance(item, ConsumerJoined):
            self.release.join(item, 0.0)
        elif isinstance(item, Handshake | Bytes):
            data = HANDSHAKE if isinstance(item, Handshake) else item.data
            before, handshakes = self.router.attached_count, self.router.handshakes
            commands, leaving = self.router.debugger_data(item.consumer, data)
            self._emit(commands)
            if leaving is not None:
                self.release.leave(item.consumer, leaving)
            elif self.router.attached_count > before:
                self.release.attached(item.consumer)
            elif self.router.handshakes > handshakes:
                self.host.emit(Changed())
        elif isinstance(item, ConsumerLeft):
            self.release.leave(item.consumer, item.reason)
        elif isinstance(item, FromVm):
            self._emit(self.router.vm_data(item.data))
        elif isinstance(item, Tick):
            for entry in self.router.ids.expire(item.now):
                origin = entry.origin
                if isinstance(origin, Own) and origin.owner is not None:
                    origin.owner.expired(origin)
            self.release.expire(item.now)
        else:
            raise AssertionError(f"no such input {item!r}")

    def _emit(self, commands: list[Command]) -> None:
        for command in commands:
            self.host.emit(command)

    def book(self, **kw: Any) -> Any:
        kw.setdefault("ignore", (Changed,))
        return self.host.book(self.feed, **kw)

    def attach(self, consumer: int, **kw: Any) -> None:
        assert (
            self.book()
            >> ConsumerJoined(consumer, "vm-port", f"127.0.0.1:{40000 + consumer}", **kw)
            >> Handshake(consumer)
            << SendToDebugger(consumer, HANDSHAKE)
        )

    def stopped(self, consumer: int = 1) -> None:
        """``consumer`` learns the id sizes (VM id 1), sets a suspend-all breakpoint (VM id 2,
        request 5), pins O1 twice (VM ids 3, 4) and stops at its breakpoint."""
        assert (
            self.book()
            >> Bytes(consumer, cmd(1, ID_SIZES))
            << SendToVm(cmd(1, ID_SIZES))
            >> FromVm(reply(1, SIZES))
            << SendToDebugger(consumer, reply(1, SIZES))
            >> Bytes(consumer, cmd(3, SET, bytes([BREAKPOINT, ALL]) + int4(0)))
            << SendToVm(cmd(2, SET, bytes([BREAKPOINT, ALL]) + int4(0)))
            >> FromVm(reply(2, int4(5)))
            << SendToDebugger(consumer, reply(3, int4(5)))
            >> Bytes(consumer, cmd(5, DISABLE, tid(O1)))
            << SendToVm(cmd(3, DISABLE, tid(O1)))
            >> FromVm(reply(3))
            << SendToDebugger(consumer, reply(5))
            >> Bytes(consumer, cmd(7, DISABLE, tid(O1)))
            << SendToVm(cmd(4, DISABLE, tid(O1)))
            >> FromVm(reply(4))
            << SendToDebugger(consumer, reply(7))
            >> FromVm(composite(ALL, bp(5)))
            << SendToDebugger(consumer, composite(ALL, bp(5)))
        )

    def leaves(self, consumer: int = 1) -> Any:
        """``consumer`` leaves after ``stopped``: the release's four commands (VM ids 5-8)."""
        return (
            self.book()
            >> ConsumerLeft(consumer, LEFT)
            << CloseDebugger(consumer, "left")
            << SendToVm(cmd(5, CLEAR, clear(BREAKPOINT, 5)))
            << SendToVm(cmd(6, RESUME))
            << SendToVm(cmd(7, ENABLE, tid(O1)))  # as often as it pinned O1
            << SendToVm(cmd(8, ENABLE, tid(O1)))
        )


def test_the_last_debugger_s_holdings_are_released_and_the_connection_kept() -> None:
    k = Kept()
    k.attach(1)
    k.stopped()
    assert k.leaves()
    assert k.lifecycle.state == "releasing"
    assert not k.router.ready
    assert (
        k.book(logs=True)
        >> FromVm(reply(5))
        >> FromVm(reply(6))
        >> FromVm(reply(7))
        >> FromVm(reply(8))  # the last answer: the VM is free again
        << Log("vm.released", "info", {"how": HOW, "after": LEFT})
    )
    assert k.lifecycle.state == "ready"
    assert k.router.ready
    assert not k.release.under_way
    assert k.router.bridge.requests.by_id() == {}
    assert k.router.bridge.pins.held_by(1) == 0
    k.attach(2)  # answered at once, on the same connection


def test_what_was_released_is_logged_step_by_step() -> None:
    k = Kept()
    k.attach(1)
    k.stopped()
    assert (
        k.book(logs=True, ignore=(Changed, SendToVm))
        >> ConsumerLeft(1, LEFT)
        << CloseDebugger(1, "left")
        << Log("debugger.detached", "info", Placeholder())
        << Log(
            "debugger.released",
            "debug",
            {"debugger": 1, "requests": 1, "suspensions": 1, "pins": 2},
        )
    )


def test_a_refused_reply_falls_back_to_a_reconnect_and_says_why() -> None:
    k = Kept()
    k.attach(1)
    k.stopped()
    assert k.leaves()
    assert (
        k.book(logs=True)
        >> FromVm(reply(5))
        >> FromVm(reply(6, error=10))  # INVALID_THREAD
        << Log(
            "vm.release_unconfirmed",
            "warning",
            {
                "why": "the VM refused 1/9 (resume all): JDWP error 10",
                "then": "reconnecting",
            },
        )
        << Recycled(RECYCLED)
        << Log("vm.reconnecting", "debug", {})
        << Reconnect(RECYCLED)
    )
    assert k.lifecycle.state == "reconnecting"
    assert k.release.under_way  # until the new connection is identified


def test_silence_past_the_dbgd_ack_timeout_falls_back_to_a_reconnect() -> None:
    k = Kept(dbgd_ack=1.0)
    k.attach(1)
    k.stopped()
    assert k.leaves()
    assert (
        k.book(logs=True)
        >> FromVm(reply(5))
        >> FromVm(reply(6))
        >> Tick(0.9)
        >> Tick(1.0)
        << Log(
            "vm.release_unconfirmed",
            "warning",
            {
                "why": "no answer within 1 s ([timeouts] dbgd_ack) to "
                "9/8 (enable collection), 9/8 (enable collection)",
                "then": "reconnecting",
            },
        )
        << Recycled(RECYCLED)
        << Log("vm.reconnecting", "debug", {})
        << Reconnect(RECYCLED)
    )
    assert k.lifecycle.state == "reconnecting"


def test_a_debugger_that_held_nothing_leaves_the_vm_ready_at_once() -> None:
    k = Kept()
    k.attach(1)
    assert (
        k.book()
        >> Bytes(1, cmd(1, HOLD))  # HoldEvents is ddmd's own: the VM never holds events
        << SendToDebugger(1, reply(1))
        >> ConsumerLeft(1, LEFT)
        << CloseDebugger(1, "left")  # nothing to tell the VM
    )
    assert k.lifecycle.state == "ready"
    assert k.router.ready


def test_a_debugger_joining_during_the_release_waits_and_attaches_after_it() -> None:
    k = Kept()
    k.attach(1)
    k.stopped()
    assert (
        k.leaves()
        >> ConsumerJoined(2, "vm-port", "127.0.0.1:40002")
        >> Handshake(2)  # held: the VM is being released
        >> FromVm(reply(5))
        >> FromVm(reply(6))
        >> FromVm(reply(7))
        >> FromVm(reply(8))
        << SendToDebugger(2, HANDSHAKE)
    )
    assert k.router.attached() == (2,)
    assert k.release.waiting() == ()


def test_an_event_of_a_cleared_request_arriving_during_the_release_is_resumed() -> None:
    k = Kept()
    k.attach(1)
    k.stopped()
    assert (
        k.leaves()
        >> FromVm(composite(ALL, bp(5, T1), packet_id=0x101))  # fired before the Clear
        << SendToVm(cmd(9, RESUME))  # nobody holds it: released at once
        >> FromVm(reply(5))
        >> FromVm(reply(6))
        >> FromVm(reply(7))
        >> FromVm(reply(8))
        >> FromVm(reply(9))
    )
    assert k.lifecycle.state == "ready"


def test_a_first_command_during_the_release_is_held_and_taken_after_it_in_order() -> None:
    k = Kept()
    k.attach(1)
    k.attach(2, kind=FRONT)  # a front socket that has not debugged yet
    k.stopped()
    assert (
        k.leaves()
        >> Bytes(2, cmd(11, ALL_THREADS))  # held, not "the VM is not connected"
        >> Bytes(2, cmd(13, (11, 1), tid(T1)))  # ThreadReference.Name: held after it
        >> FromVm(reply(5))
        >> FromVm(reply(6))
        >> FromVm(reply(7))
        >> FromVm(reply(8))
        << SendToVm(cmd(9, ALL_THREADS))
        << SendToVm(cmd(10, (11, 1), tid(T1)))
        >> FromVm(reply(9, int4(0)))
        << SendToDebugger(2, reply(11, int4(0)))
    )
    assert k.router.attached() == (2,)


def test_held_commands_wait_for_the_reconnect_when_the_release_falls_back() -> None:
    k = Kept()
    k.attach(1)
    k.attach(2, kind=FRONT)
    k.stopped()
    assert (
        k.leaves()
        >> Bytes(2, cmd(11, ALL_THREADS))
        >> FromVm(reply(5, error=99))
        << Recycled(RECYCLED)
        << Reconnect(RECYCLED)
    )
    # The new connection (the session's VmConnected): held commands go out on it.
    k._emit(k.router.connected())
    k.release.connection_usable()
    assert k.host.take() == [SendToVm(cmd(9, ALL_THREADS))]


def test_held_commands_are_refused_when_the_vm_goes_away() -> None:
    k = Kept()
    k.attach(1)
    k.attach(2, kind=FRONT)
    k.stopped()
    assert k.leaves() >> Bytes(2, cmd(11, ALL_THREADS))
    k.release.vm_gone()
    assert k.host.take() == [
        SendToDebugger(2, reply(11, error=112)),  # VM_DEAD
        Log("debugger.detached", "info", {"debugger": 2, "reason": "the VM disconnected"}),
        CloseDebugger(2, "the VM disconnected"),
    ]
