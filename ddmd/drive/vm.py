"""VmDriver: the trio side of one VM. It reads sockets, feeds the sans-IO ``VmSession``, carries
out the commands it returns, and keeps time for it.

Layer: trio, structlog, config, registry, errors, logs, ``ddmd.session`` and ``ddmd.drive``;
no chunk parsing and no protocol decision here (mitmproxy's ``server_event``: ask the session,
then act, with no ``await`` in between).

Tasks, all in the driver's nursery (one subtree per VM):

    VM reader ──VmBytes──▶ session ──SendToDebugger──▶ that debugger's outbox, written at once
    debugger reader (each) ──ConsumerBytes──▶ session ──SendToVm──▶ the VM outbox, written at once
    timer ──Tick at the time the session asked (WakeMeAt)──▶ session
    API call ──Call──▶ session ──Resolve/Reject──▶ the waiting caller

A caller that gives up (cancelled) never touches a socket: its call stays data in the session
until its deadline. Only a write that may have sent part of a packet breaks a connection.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog
import trio

from ddmd.config import Config
from ddmd.drive.captures import HIGH_WATER, CaptureFile
from ddmd.drive.ddms import ProfilingDriver
from ddmd.drive.debugger import (
    DIRECT_SEND_LIMIT,
    DebuggerConnection,
    Outbox,
    OutboxBroken,
)
from ddmd.drive.debuggers import DebuggerSide
from ddmd.drive.found import DeviceFiles, Opener, ProcessInfo
from ddmd.drive.jvmtools import JvmTools
from ddmd.drive.ports import VmPorts
from ddmd.drive.threadlane import RECEIVE_SIZE, ThreadLane, socket_of
from ddmd.drive.writes import PendingWrites
from ddmd.errors import DdmFailed, FeatureUnsupported, RequestTimedOut, VmGone, WrongState
from ddmd.logs import Event, bind_vm_identity
from ddmd.protocol.ddm import StackTrace
from ddmd.protocol.errors import RemoteProtocolError
from ddmd.protocol.heap import HeapImage
from ddmd.registry import GcOutcome, VmRegistry, VmSnapshot
from ddmd.session.commands import (
    Capture,
    Changed,
    CloseDebugger,
    Command,
    Log,
    Publish,
    Reconnect,
    Reject,
    Resolve,
    SelectMe,
    SendToDebugger,
    SendToVm,
    WakeMeAt,
)
from ddmd.session.inputs import (
    Call,
    CauseGc,
    DumpHeap,
    GetStack,
    Input,
    RefreshThreads,
    Request,
    Tick,
    VmBytes,
    VmClosed,
    VmConnected,
)
from ddmd.session.vm import SessionSettings, VmSession

log = structlog.get_logger("ddmd.vm")

VM_WRITE_OVERDUE = "a write to the VM took too long"
#: Bytes that may wait for the VM to read them before its connection counts as stuck.
VM_BUDGET = 64 << 20
#: How often the watchdog looks at writes while debuggers are attached (seconds).
WATCHDOG_PERIOD = DIRECT_SEND_LIMIT / 2

_ERRORS: dict[str, type[Exception]] = {
    "unsupported": FeatureUnsupported,
    "timed_out": RequestTimedOut,
    "failed": DdmFailed,
    "gone": VmGone,
    "conflict": WrongState,
}


@dataclass(frozen=True, slots=True)
class VmStatistics:
    packets_in: int
    packets_out: int
    bytes_in: int
    bytes_out: int
    requests_timed_out: int
    outstanding: int


@dataclass(slots=True, eq=False)
class _CallWaiter:
    event: trio.Event
    value: Any = None
    error: Exception | None = None


def settings_from(config: Config) -> SessionSettings:
    return SessionSettings(
        ddm_request=config.timeouts.ddm_request,
        dbgd_ack=config.timeouts.dbgd_ack,
        reconnect=config.timeouts.reconnect,
        thread_poll_interval=config.monitor.thread_poll_interval,
        always_poll_threads=config.monitor.always_poll_threads,
        heap_info=config.monitor.heap_info,
        auto_select_waiting=config.debugger.auto_select_waiting,
        max_packet=config.limits.max_packet_bytes,
        stream_threshold=config.debugger.relay_chunk_bytes,
        max_inflated=config.limits.max_inflated_bytes,
        max_debuggers=config.debugger.max_per_vm,
        poll_phase=random.random(),
        capture=config.timeouts.capture,
    )


def _vm_json(snapshot: VmSnapshot) -> dict[str, Any]:
    return snapshot.to_json()


class VmDriver(DebuggerSide, ProfilingDriver):
    """The one owner of a VM's connections. Serves ``VmHandle`` to the registry and the API."""

    def __init__(
        self,
        *,
        vm_id: str,
        source: str,
        address: str,
        config: Config,
        registry: VmRegistry,
        device: str | None = None,
        expected_pid: int | None = None,
        ports: VmPorts | None = None,
        process: ProcessInfo | None = None,
        handlers: Sequence[Any] = (),
        files: DeviceFiles | None = None,
    ) -> None:
        self._vm_id = vm_id
        self._config = config
        self._registry = registry
        self._ports = ports
        self._session = VmSession(
            vm_id,
            source=source,
            address=address,
            device=device,
            expected_pid=expected_pid,
            process_pid=process.pid if process is not None else None,
            process_name=process.name if process is not None else None,
            settings=settings_from(config),
            handlers=handlers,
            handler_view=_vm_json,
        )
        self.ext_values: dict[str, Any] = {}  # chunk handler name -> what it published
        self._captures: dict[int, CaptureFile] = {}  # call -> the file it brings
        self.capture_dir = config.debugger.state_file.parent / "captures"
        self.device_files = files  # adb VMs: for traces and dumps the VM can only write there
        self.jvm = JvmTools(self, process=process, address=address, config=config)  # plain JVMs
        self._log = log.bind(vm=vm_id)
        self._nursery: trio.Nursery | None = None
        self._vm: Outbox | None = None
        self._conn_scope: trio.CancelScope | None = None
        self._reconnect = False
        self._closed_reason: str | None = None
        self._debuggers: dict[int, DebuggerConnection] = {}
        self._numbers = itertools.count(1)
        self._calls: dict[int, _CallWaiter] = {}
        self._call_ids = itertools.count(1)
        self._wake_at = math.inf
        self._timer_changed = trio.Event()
        self._sleeping_until = -math.inf
        self._writes = PendingWrites(self._debuggers, lambda: self._vm)
        self._dirty = self._writes.dirty
        self._write_now = self._writes.write_now
        self._lane = ThreadLane(self._session, self._writes, log=self._act)
        self._lane.applies = config.debugger.relay_threads
        # Looking for a reply before sleeping (relaythreads.Looking) pays only when replies are
        # quick: never behind adb (an adb server, a device daemon and USB or TCP in between).
        self._lane.spin_ns = config.debugger.relay_spin_us * 1000 if source == "tcp" else 0
        self._port_key: str | None = None
        self._debugger_port: int | None = None
        self._timeouts = 0
        self._slow_debuggers = 0
        bind_vm_identity(vm_id, *_identity(self._session))

    # ------------------------------------------------------------------ VmHandle, sync

    @property
    def vm_id(self) -> str:
        return self._vm_id

    def snapshot(self) -> VmSnapshot:
        return self._session.snapshot(
            current=self._registry.is_current(self._vm_id),
            debugger_port=self._debugger_port,
            debuggers=self._debugger_snapshots(),
        )

    def selection_key(self) -> str | None:
        return self._session.selection_key()

    def cached_id_sizes(self) -> bytes | None:
        return self._session.router.cached_id_sizes()

    def last_heap_images(self) -> tuple[HeapImage, ...]:
        return self._session.model.heap_images

    def statistics(self) -> VmStatistics:
        r = self._session.router.statistics()
        lane = self._lane.counts
        return VmStatistics(
            lane.packets_in,
            r.packets_to_vm,
            lane.bytes_in,
            r.bytes_to_vm,
            self._timeouts,
            r.outstanding,
        )

    def bridge_statistics(self) -> dict[str, int]:
        r = self._session.router.statistics()
        return {
            "packets_to_vm": r.packets_to_vm,
            "packets_to_debugger": r.packets_to_debuggers,
            "bytes_to_vm": r.bytes_to_vm,
            "bytes_to_debugger": r.bytes_to_debuggers,
            "reconnects": self._session.reconnects,
            "slow_debuggers": self._slow_debuggers,
            **self._lane.counts.statistics(),
        }

    # ------------------------------------------------------------------ VmHandle, calls

    async def refresh_threads(self) -> VmSnapshot:
        with contextlib.suppress(FeatureUnsupported, RequestTimedOut, DdmFailed):
            await self._ask(RefreshThreads())
        return self.snapshot()

    async def cause_gc(self) -> GcOutcome:
        if self.jvm.applies():  # a plain JVM: GC.run through the attach API
            return await self.jvm.cause_gc()
        outcome = await self._ask(CauseGc())
        assert isinstance(outcome, GcOutcome)
        return outcome

    async def stack_trace(self, thread_id: int) -> StackTrace:
        if self.jvm.applies():  # a plain JVM: its thread dump (Thread.print)
            return await self.jvm.stack_trace(thread_id)
        trace = await self._ask(GetStack(thread_id))
        assert isinstance(trace, StackTrace)
        return trace

    async def heap_segments(self) -> tuple[HeapImage, ...]:
        images = await self._ask(DumpHeap())
        assert isinstance(images, tuple)
        return images

    def _next_call(self) -> int:
        return next(self._call_ids)

    def _app_name(self) -> str | None:
        snapshot = self.snapshot()
        return snapshot.package or snapshot.app

    async def _ask(self, request: Request, *, number: int | None = None) -> object:
        """One API call: fed to the session; its answer comes with a later input (a reply, a
        push, a Tick at the call's deadline). A caller that is cancelled leaves the call to
        expire in the session; it never writes to a socket itself."""
        number = next(self._call_ids) if number is None else number
        waiter = _CallWaiter(trio.Event())
        self._calls[number] = waiter
        try:
            self._feed(Call(number, request))
            if self._dirty and self._nursery is not None:
                self._nursery.start_soon(self._flush)  # written by a task of the driver's own
            await waiter.event.wait()
        finally:
            self._calls.pop(number, None)
        if waiter.error is not None:
            raise waiter.error
        return waiter.value

    # ------------------------------------------------------------------ lifecycle

    async def run(
        self,
        stream: trio.abc.Stream,
        leftover: bytes = b"",
        opener: Opener | None = None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> str:
        """Serve the VM until its connection ends for good; returns the reason. After a
        debugger leaves, the connection may be reopened with ``opener`` (the session asks for
        it) so the VM drops the debugger's state; the VM keeps its id and port."""
        with structlog.contextvars.bound_contextvars(vm=self._vm_id):
            self._registry.add(self)
            try:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._timer)
                    task_status.started()
                    reason = await self._connection(stream, leftover)
                    while self._reconnect:
                        self._reconnect = False
                        reopened = await _reopen(opener, self._config.timeouts.reconnect, self._log)
                        if reopened is None:
                            reason = "reconnect failed"
                            self._close_session(reason)
                            break
                        reason = await self._connection(*reopened)
                    for debugger in list(self._debuggers.values()):
                        await self._close_debugger(debugger, "the VM disconnected")
                    nursery.cancel_scope.cancel()
                return reason
            finally:
                self._nursery = None
                for waiter in self._calls.values():
                    if not waiter.event.is_set():
                        waiter.error = VmGone(f"{self._vm_id} is gone")
                        waiter.event.set()
                self._registry.remove(self._vm_id)

    async def _connection(self, stream: trio.abc.Stream, leftover: bytes) -> str:
        """One VM connection, from its first byte to its end (reopened after a debugger left:
        a step of the release, logged at debug level; ``vm.released`` is its info line)."""
        # A VM may pause (a GC on a phone): any write to it may take up to a JDWP request's time.
        limit = self._config.timeouts.jdwp_request
        self._vm = Outbox(stream, budget=VM_BUDGET, limit=limit, quick=limit)
        (self._log.debug if self._session.state == "reconnecting" else self._log.info)(
            Event.VM_CONNECTED, address=self._session.address, source=self._session.source
        )
        reason = "closed"
        try:
            with trio.CancelScope() as self._conn_scope:
                broken = self._feed_vm(VmConnected(trio.current_time(), leftover))
                self._session.connected_at = time.time()
                await self._flush(reads=self._vm)
                reason = broken or await self._read(stream)
            if self._vm.broken is not None:
                reason = "a send to the VM failed or was interrupted"
            if self._reconnect:
                reason = "recycled after the debugger left"
        finally:
            self._conn_scope = None
            if not self._reconnect:
                self._close_session(reason)  # also when the daemon stops (cancelled)
            with trio.move_on_after(1) as cleanup:
                cleanup.shield = True
                with contextlib.suppress(Exception):
                    await stream.aclose()
        return reason

    def _close_session(self, reason: str) -> None:
        if self._closed_reason is None:
            self._closed_reason = reason
            self._feed(VmClosed(reason))

    async def _read(self, stream: trio.abc.Stream) -> str:
        sock = socket_of(stream) if self._lane.applies else None
        while True:
            if sock is not None and self._debuggers:  # the relay lane's thread (threadlane.py)
                rests = self._vm_read_rest, self._debugger_read_rest
                try:
                    ended = await self._lane.read_vm(sock, *rests)
                except OSError as exc:
                    return f"connection error: {exc}"
                if ended is not None:
                    return ended
                continue
            try:
                data = await stream.receive_some(RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                return f"connection error: {exc}"
            if not data:
                # The decoder tells a clean end from one in the middle of a packet.
                return self._feed_vm(VmBytes(b"")) or "eof"
            self._lane.counts.packets_in += 1
            self._lane.counts.bytes_in += len(data)
            data = bytes(data)  # trio gives bytes: no copy
            relayed = self._session.relay_vm(data)
            if relayed is not None:
                self._to_debugger(relayed)
            broken = await self._vm_read_rest(data if relayed is None else None)
            if broken is not None:
                return broken

    async def _vm_read_rest(self, data: bytes | None, later: Sequence[Command] = ()) -> str | None:
        """A VM read after the relay lane's try, in the event loop (also for the relay thread):
        ``data`` the session has not seen yet (b"": the end), ``later`` commands a relay thread
        left; then the writes. Why the connection ends, or None."""
        if data == b"":
            return self._feed_vm(VmBytes(b"")) or "eof"
        for command in later:
            self._act(command)
        broken = None if data is None else self._feed_vm(VmBytes(data))
        if self._dirty and not self._write_now():
            await self._flush(reads=self._vm)
        elif data is None and not later:
            await trio.lowlevel.cancel_shielded_checkpoint()  # docs/design.md, relay lane
        for capture in list(self._captures.values()):
            if capture.queued > HIGH_WATER:
                await capture.wait_room()  # the disk is behind: let TCP slow the VM down
        return broken

    def _feed_vm(self, item: VmConnected | VmBytes) -> str | None:
        """Feed bytes from the VM; a broken packet header ends the connection (returns why)."""
        try:
            self._feed(item)
        except RemoteProtocolError as exc:
            self._log.warning(Event.VM_PROTOCOL_ERROR, error=str(exc))
            return f"protocol error: {exc}"
        return None

    async def _timer(self) -> None:
        """Ticks at the times the session asks for; and, while debuggers are attached or a
        write to the VM is under way, the watchdog of writes that take too long."""
        while True:
            wake = self._wake_at
            if self._debuggers or (self._vm is not None and self._vm.busy):
                # A write is (or may soon be) under way: look at it a few times a second. A
                # write of ddmd's own always comes with a request deadline, so the timer is
                # awake to see it even when no debugger is attached.
                wake = min(wake, trio.current_time() + WATCHDOG_PERIOD)
            changed = self._timer_changed = trio.Event()
            self._sleeping_until = wake
            with trio.move_on_at(wake):
                await changed.wait()
            self._sleeping_until = -math.inf  # awake: a new WakeMeAt needs no wake-up call
            if changed.is_set():
                continue
            now = trio.current_time()
            await self._watchdog(now)
            if now >= self._wake_at:
                self._wake_at = math.inf  # the session asks again (WakeMeAt) after every Tick
                self._feed(Tick(now))
                if self._dirty:
                    await self._flush()

    async def _watchdog(self, now: float) -> None:
        """Close a stream whose write is overdue: the write then fails in the task doing it."""
        for debugger in list(self._debuggers.values()):
            outbox = debugger.outbox
            if outbox.overdue(now) and not debugger.gone:
                self._drop_slow(debugger, waited=outbox.allowed)
        vm = self._vm
        if vm is not None and vm.overdue(now) and vm.broken is None:
            vm.broken = VM_WRITE_OVERDUE
            self._log.warning(Event.VM_SEND_FAILED, waited=vm.allowed)
            if self._conn_scope is not None:
                self._conn_scope.cancel()
            with trio.move_on_after(1) as cleanup:
                cleanup.shield = True
                with contextlib.suppress(Exception):
                    await vm.stream.aclose()

    # ------------------------------------------------------------------ ask, then act

    def _feed(self, item: Input) -> None:
        """Hand one input to the session and carry out its commands (no await in between:
        writes are queued in order here and written by ``_flush``)."""
        for command in self._session.handle(item, trio.current_time()):
            self._act(command)

    def _act(self, command: Command) -> None:
        if isinstance(command, SendToDebugger | SendToVm):
            if self._writes.queue(command):
                return
            if isinstance(command, SendToDebugger):
                self._drop_slow(self._debuggers[command.debugger])
            elif (vm := self._vm) is not None and vm.broken is None:
                # The VM has stopped reading: more waits for it than it could ever need.
                vm.broken = "the VM stopped reading"
                self._log.warning(Event.VM_SEND_FAILED, queued_bytes=vm.queued)
                if self._conn_scope is not None:
                    self._conn_scope.cancel()
        elif isinstance(command, Log):
            if command.event == Event.DDM_REQUEST_TIMED_OUT:
                self._timeouts += 1
            if command.event == Event.DEBUGGER_DETACHED:
                self._add_debugger_fields(command)
            self._log.log(_LEVELS.get(command.level, 20), command.event, **command.fields)
        elif isinstance(command, Changed):
            bind_vm_identity(self._vm_id, *_identity(self._session))
            if command.renamed:
                self._registry.key_changed(self._vm_id)
                self._maybe_listen()
            else:
                self._registry.changed(self._vm_id)
        elif isinstance(command, WakeMeAt):
            self._wake_at = command.when
            if command.when < self._sleeping_until:  # earlier than the timer sleeps until
                self._timer_changed.set()
        elif isinstance(command, Resolve | Reject):
            waiter = self._calls.get(command.call)
            if waiter is not None and not waiter.event.is_set():
                if isinstance(command, Resolve):
                    waiter.value = command.value
                else:
                    waiter.error = _ERRORS[command.kind](command.message)
                waiter.event.set()
        elif isinstance(command, CloseDebugger):
            debugger = self._debuggers.get(command.debugger)
            if debugger is not None:
                debugger.gone = True
                if self._nursery is not None:
                    self._nursery.start_soon(self._close_debugger, debugger, command.reason)
        elif isinstance(command, SelectMe):
            self._registry.select(self._vm_id, reason=command.reason)
        elif isinstance(command, Capture):
            capture = self._captures.get(command.call)
            if capture is not None:
                capture.put(command.data, command.last)
        elif isinstance(command, Publish):
            self.ext_values[command.handler] = command.value
            self._registry.ext_updated(self._vm_id)
        elif isinstance(command, Reconnect):
            self._reconnect = True
            if self._conn_scope is not None:
                self._conn_scope.cancel()
        else:
            raise RuntimeError(f"the VM driver cannot carry out {command!r}")

    async def _flush(self, *, reads: Outbox | None = None) -> None:
        """Write every outbox that got bytes, in the order they got them. ``reads``: the
        outbox of the stream this task reads; it is written by a task of its own, so a peer
        that writes to us while we write to it can never deadlock the two of us."""
        dirty = self._dirty
        while dirty:
            outbox = dirty.pop(0)
            if outbox.write_now():
                # The socket took it all at once (a non-blocking write cannot deadlock with a
                # peer that writes to us): no await, no clock.
                continue
            if outbox is reads and self._nursery is not None:
                if not outbox.busy and outbox.queue:
                    self._nursery.start_soon(self._flush_later, outbox)
            elif outbox is self._vm:
                await self._flush_vm(outbox)
            else:
                debugger = outbox.owner
                if isinstance(debugger, DebuggerConnection) and not outbox.busy:
                    try:
                        await outbox.flush(trio.current_time())
                    except OutboxBroken as exc:
                        self._leave(debugger, str(exc))

    async def _flush_later(self, outbox: Outbox) -> None:
        self._dirty.append(outbox)
        await self._flush()

    async def _flush_vm(self, outbox: Outbox) -> None:
        try:
            await outbox.flush(trio.current_time())
        except OutboxBroken as exc:
            if str(exc) != VM_WRITE_OVERDUE:  # the watchdog has said so already
                self._log.warning(Event.VM_SEND_FAILED)
            if self._conn_scope is not None:
                self._conn_scope.cancel()


async def _reopen(
    opener: Opener | None, patience: float, vm_log: structlog.stdlib.BoundLogger
) -> tuple[trio.abc.Stream, bytes] | None:
    """A fresh connection to the VM, tried again (backing off) for ``patience`` seconds; None
    without an opener."""
    if opener is None:
        return None
    delay = 0.01
    last_error = ""
    with trio.move_on_after(patience):
        while True:
            try:
                return await opener()
            except Exception as exc:  # any failure to reopen: try again until the deadline
                last_error = str(exc) or type(exc).__name__
            await trio.sleep(delay)
            delay = min(delay * 2, 0.5)
    vm_log.warning(Event.VM_RECONNECT_FAILED, error=last_error)
    return None


_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


def _identity(session: VmSession) -> tuple[str | None, int | None]:
    """The app and pid every log line about the VM carries (``logs.bind_vm_identity``, bound
    at once and again at every change), named as the VM's snapshot names them."""
    model = session.model
    app, pid = model.app, model.pid
    if model.ddm is False:  # a plain JVM: the process found in /proc, as in the snapshot
        app = session.process_name if app is None else app
        pid = session.process_pid if pid is None else pid
    return app, pid


__all__ = ["VmDriver", "VmStatistics", "settings_from"]
