"""``drive/relay.py``: one read, as the trio readers and the relay thread both do it. The relay
lane's packet is written first and committed after; a miss goes to the session's general path
once; what the sockets do not take now is left for the flush. Against a real router, with
outboxes that record what the router knew when each write was made."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

from ddmd.drive.relay import WRITTEN, Relay
from ddmd.drive.writes import PendingWrites
from ddmd.session.commands import Changed, Command, SendToDebugger, SendToVm
from ddmd.session.inputs import ConsumerBytes, VmBytes
from ddmd.session.router import Router
from tests.session.test_router import (
    CLASS_BY_SIGNATURE,
    VERSION,
    RouterHarness,
    attached,
    cmd,
    reply,
)


class _RouterSession:
    """What ``Relay`` needs of a session, served by a router (its lane and general path)."""

    def __init__(self, router: Router) -> None:
        self.relay_vm = router.relay_from_vm
        self.relayed_vm = router.relayed_from_vm
        self.relay_debugger = router.relay_from_debugger
        self.relayed_debugger = router.relayed_from_debugger
        self._router = router
        self.fed: list[object] = []

    def handle(self, item: object, now: float) -> list[Command]:
        self.fed.append(item)
        if isinstance(item, VmBytes):
            return self._router.vm_data(item.data)
        assert isinstance(item, ConsumerBytes)
        return self._router.debugger_data(item.consumer, item.data)[0]


@dataclass(eq=False)
class _Outbox:
    """Writes whole at once (``idle``), or is busy (queues); records the router's state at
    every write."""

    router: Router
    idle: bool = True
    wrote: list[tuple[bytes, int, int, int]] = field(default_factory=list)
    queue: list[bytes] = field(default_factory=list)

    def send_now(self, data: bytes) -> bool | None:
        if not self.idle:
            return None
        r = self.router
        self.wrote.append((data, len(r.ids), r.packets_to_vm, r.packets_to_debuggers))
        return True

    def put(self, data: bytes) -> bool:
        self.queue.append(data)
        return True

    def write_now(self) -> bool:
        return self.idle


def _relay(
    h: RouterHarness, done: list[Command] | None = None
) -> tuple[Relay, _RouterSession, _Outbox, _Outbox]:
    vm = _Outbox(h.router)
    debugger = _Outbox(h.router)
    connection = SimpleNamespace(gone=False, outbox=debugger, peer="p", via="v", port=None)
    writes = PendingWrites({1: connection}, lambda: vm)  # type: ignore[dict-item,arg-type,return-value]
    session = _RouterSession(h.router)

    def in_loop(command: Command) -> None:
        if done is None:
            raise AssertionError(f"not expected: {command!r}")
        done.append(command)

    relay = Relay(
        session,  # type: ignore[arg-type]
        writes,
        logger=SimpleNamespace(log=lambda *a, **k: None),  # type: ignore[arg-type]
        in_loop=in_loop,
        on_full=in_loop,
    )
    return relay, session, vm, debugger


def _now() -> float:
    return 0.0


def test_the_lane_s_packet_is_written_before_its_bookkeeping_and_the_session_is_not_fed() -> None:
    h = RouterHarness()
    assert attached(h, 1)
    relay, session, vm, debugger = _relay(h)
    assert relay.from_debugger(1, cmd(7, CLASS_BY_SIGNATURE, b"x"), _now, True) is None
    # Written under the fresh id while nothing was recorded yet; recorded after.
    assert vm.wrote == [(cmd(1, CLASS_BY_SIGNATURE, b"x"), 0, 0, 0)]
    assert (len(h.router.ids), h.router.packets_to_vm) == (1, 1)
    assert relay.from_vm(reply(1, b"answer"), _now, True) is None
    assert debugger.wrote == [(reply(7, b"answer"), 1, 1, 0)]  # its entry still there
    assert (len(h.router.ids), h.router.packets_to_debuggers) == (0, 1)
    assert session.fed == []  # the general path never ran
    assert (relay.counts.packets_in, relay.counts.bytes_in) == (1, 17)


def test_a_miss_goes_to_the_general_path_once_and_a_busy_outbox_queues_in_order() -> None:
    h = RouterHarness()
    assert attached(h, 1)
    relay, session, vm, _ = _relay(h)
    # Version is the intake's (read to fill the cache): the session is fed, the lane not taken.
    assert relay.from_debugger(1, cmd(8, VERSION), _now, True) is WRITTEN
    assert session.fed == [ConsumerBytes(1, cmd(8, VERSION))]
    assert vm.queue == [cmd(1, VERSION)]  # queued by the one executor, then written
    # A busy outbox: the lane's packet is queued behind what waits (committed all the same).
    vm.idle = False
    in_thread = relay.from_debugger(1, cmd(9, CLASS_BY_SIGNATURE), _now, False)
    assert in_thread == []  # the flush is the event loop's
    assert vm.queue == [cmd(1, VERSION), cmd(2, CLASS_BY_SIGNATURE)]
    assert len(h.router.ids) == 2


def test_the_one_executor_does_the_event_loop_s_commands_only_there() -> None:
    h = RouterHarness()
    assert attached(h, 1)
    done: list[Command] = []
    relay, _, vm, debugger = _relay(h, done)
    commands: list[Command] = [SendToVm(b"a"), Changed(), SendToDebugger(1, b"b")]
    # In the relay thread: the packets up to the first command only the event loop does.
    assert relay.carry_out(commands, loop=False) == commands[1:]
    assert (vm.queue, debugger.queue, done) == ([b"a"], [], [])
    # In the event loop: all of them, in order.
    assert relay.carry_out(commands[1:]) == []
    assert (vm.queue, debugger.queue, done) == ([b"a"], [b"b"], [Changed()])
