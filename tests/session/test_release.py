"""The release part alone (``session/release.py``), against a fake host: consumers joining,
waiting and leaving, and the release of the VM after the last debugger leaves, rule by rule.

The router is the real one (its consumer table is the part's collaborator); the lifecycle is
set to ready. ``Handshake(n)`` is consumer n's JDWP handshake, fed to the router as the session
feeds it (the part hears ``attached`` once the router attached it); ``Tick(t)`` lets waits
expire. ``Recycled`` marks where the release asks the session to drop the old connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ddmd.protocol import ddm
from ddmd.protocol.jdwp import HANDSHAKE
from ddmd.session.commands import (
    Changed,
    CloseDebugger,
    Command,
    Log,
    Reconnect,
    SendToDebugger,
)
from ddmd.session.consumers import FRONT
from ddmd.session.inputs import ConsumerJoined, ConsumerLeft, Tick
from ddmd.session.lifecycle import Lifecycle
from ddmd.session.release import Release
from ddmd.session.router import Router
from ddmd.session.settings import SessionSettings
from tests.session.parts import Answer, Applied, Ask, FakeHost, Silence
from tests.session.playbook import Placeholder

LEFT = "debugger closed the connection"
RECYCLED = "recycled after the debugger left"


@dataclass(frozen=True)
class Handshake:
    consumer: int


@dataclass(frozen=True)
class Recycled:
    why: str


class Released:
    """One release part, its host, router and lifecycle; the VM connected and identified."""

    def __init__(self, **settings: Any) -> None:
        self.host = FakeHost(settings=SessionSettings(**settings))
        self.host.model.ddm = True
        self.router = Router(on_reply=lambda p, r: [], on_push=lambda p: [])
        self.lifecycle = Lifecycle("vm-1")
        self.release = Release(self.host, self.lifecycle, self.router, self._recycle)
        self.lifecycle.goto("connected")
        self.router.connected()
        self.lifecycle.identify()

    def _recycle(self, why: str) -> None:
        self.host.emit(Recycled(why))  # type: ignore[arg-type]

    def feed(self, item: Any) -> None:
        if isinstance(item, ConsumerJoined):
            self.release.join(item, 0.0)
        elif isinstance(item, Handshake):
            before, handshakes = self.router.attached_count, self.router.handshakes
            commands, _ = self.router.debugger_data(item.consumer, HANDSHAKE)
            self._emit(commands)
            if self.router.attached_count > before:
                self.release.attached(item.consumer)
            elif self.router.handshakes > handshakes:
                self.host.emit(Changed())  # a consumer that speaks DDM only, listed now
        elif isinstance(item, ConsumerLeft):
            self.release.leave(item.consumer, item.reason)
        elif isinstance(item, Tick):
            self.release.expire(item.now)
        else:
            raise AssertionError(f"no such input {item!r}")

    def _emit(self, commands: list[Command]) -> None:
        for command in commands:
            self.host.emit(command)

    def book(self, **kw: Any) -> Any:
        return self.host.book(self.feed, **kw)

    def attach(self, consumer: int, **kw: Any) -> None:
        assert (
            self.book()
            >> ConsumerJoined(consumer, "vm-port", f"127.0.0.1:{40000 + consumer}", **kw)
            >> Handshake(consumer)
            << SendToDebugger(consumer, HANDSHAKE)
            << Changed()
        )


def test_the_last_debugger_leaving_sends_dbgd_and_its_acknowledgement_frees_the_vm() -> None:
    r = Released()
    r.attach(1)
    assert (
        r.book(logs=True)
        >> ConsumerLeft(1, LEFT)
        << CloseDebugger(1, "left")
        << Log(
            "debugger.detached",
            "info",
            {"debugger": 1, "reason": LEFT, "packets_in": 0, "packets_out": 0},
        )
        << Changed()
        << Log("ddm.dbgd_sent", "debug", {"after": LEFT})
        << Ask(ddm.Dbgd(), timeout=1.0)  # [timeouts] dbgd_ack, not the DDM request timeout
        >> Answer("DBGD", ddm.Dbgd())
        << Applied(ddm.Dbgd())
        << Log("ddm.dbgd_acknowledged", "debug", {})
        << Log("vm.released", "info", {"how": "the VM acknowledged DBGD", "after": LEFT})
        << Changed()
    )
    assert r.lifecycle.state == "ready"
    assert r.router.ready
    assert not r.release.under_way


def test_no_acknowledgement_recycles_the_connection() -> None:
    r = Released()
    r.attach(1)
    assert (
        r.book()
        >> ConsumerLeft(1, LEFT)
        << CloseDebugger(1, "left")
        << Changed()
        << Ask(ddm.Dbgd(), timeout=1.0)
        >> Silence("DBGD")
        << Recycled(RECYCLED)
        << Reconnect(RECYCLED)
        << Changed()
    )
    assert r.lifecycle.state == "reconnecting"
    assert r.release.under_way  # until the new connection is identified


def test_an_answer_without_dbgd_is_no_acknowledgement() -> None:
    r = Released()
    r.attach(1)
    assert (
        r.book()
        >> ConsumerLeft(1, LEFT)
        << CloseDebugger(1, "left")
        << Changed()
        << Ask(ddm.Dbgd(), timeout=1.0)
        >> Answer("DBGD")  # an empty reply: the VM had no handler to acknowledge with
        << Recycled(RECYCLED)
        << Reconnect(RECYCLED)
        << Changed()
    )


def test_a_consumer_that_never_debugged_leaves_without_a_release() -> None:
    r = Released()
    r.attach(1, kind=FRONT)  # a socket of the adb front: DDM only until it debugs
    assert r.book() >> ConsumerLeft(1, LEFT) << CloseDebugger(1, "left") << Changed()
    assert r.lifecycle.state == "ready"
    assert not r.release.under_way


def test_a_debugger_joining_during_the_release_waits_and_is_attached_once_acknowledged() -> None:
    r = Released()
    r.attach(1)
    assert (
        r.book()
        >> ConsumerLeft(1, LEFT)
        << CloseDebugger(1, "left")
        << Changed()
        << Ask(ddm.Dbgd(), timeout=1.0)
        >> ConsumerJoined(2, "vm-port", "127.0.0.1:40002")
        >> Handshake(2)  # held: the connection is not usable while the VM is released
    )
    assert r.release.waiting() == (2,)
    assert (
        r.book()
        >> Answer("DBGD", ddm.Dbgd())
        << Applied(ddm.Dbgd())
        << SendToDebugger(2, HANDSHAKE)  # the held handshake completes now
        << Changed()  # 2 attached
        << Changed()
    )
    assert r.release.waiting() == ()
    assert r.router.attached() == (2,)


def test_a_debugger_waiting_longer_than_the_reconnect_timeout_is_closed() -> None:
    r = Released(reconnect=10.0)
    r.attach(1)
    assert (
        r.book(ignore=(Changed, Ask, Recycled, Reconnect, CloseDebugger))
        >> ConsumerLeft(1, LEFT)
        >> Silence("DBGD")
        >> ConsumerJoined(2, "vm-port", "127.0.0.1:40002")  # the VM is being reopened: it waits
    )
    assert r.release.next_deadline() == 10.0
    assert (
        r.book(logs=True)
        >> Tick(9.9)
        >> Tick(10.0)
        << Log(
            "debugger.rejected",
            "warning",
            {"debugger": 2, "reason": "vm-1 did not come back within [timeouts] reconnect"},
        )
        << CloseDebugger(2, "the VM did not come back")
    )
    assert r.release.next_deadline() is None


def test_a_debugger_over_the_limit_is_rejected_and_the_holder_named() -> None:
    r = Released(max_debuggers=1)
    r.attach(1)
    holder = Placeholder("holder")
    assert (
        r.book(logs=True)
        >> ConsumerJoined(2, "vm-port", "127.0.0.1:40002")
        << Log(
            "debugger.rejected",
            "warning",
            {
                "peer": "127.0.0.1:40002",
                "via": "vm-port",
                "reason": "vm-1 already has a debugger",
                "holder": holder,
                "holder_via": "vm-port",
            },
        )
        << CloseDebugger(2, "rejected")
    )
    assert holder.value == "127.0.0.1:40001"


def test_the_vm_going_away_closes_every_consumer_and_every_wait() -> None:
    r = Released(max_debuggers=2)
    r.attach(1)
    r.router.ready = False  # as while the connection is reopened: 2 waits for it
    assert r.book() >> ConsumerJoined(2, "vm-port", "127.0.0.1:40002")
    r.release.vm_gone()
    assert r.host.take() == [
        Log("debugger.detached", "info", {"debugger": 1, "reason": "the VM disconnected"}),
        CloseDebugger(1, "the VM disconnected"),
        CloseDebugger(2, "the VM disconnected"),
    ]
    assert r.release.waiting() == ()
