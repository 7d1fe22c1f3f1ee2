"""VmDriver: the trio side of one VM. It reads sockets, feeds the sans-IO ``VmSession``, carries
out the commands it returns, and keeps time for it.

Layer: trio, structlog, config, registry, errors, logs, ``ddmd.session`` and ``ddmd.drive``;
no chunk parsing and no protocol decision here (mitmproxy's ``server_event``: ask the session,
then act, with no ``await`` in between).

Tasks, all in the driver's nursery (one subtree per VM):

    VM reader ──relay lane, else VmBytes──▶ session ──SendToDebugger──▶ that debugger's outbox,
        written at once (``relay.Relay``, the same code in the relay thread, ``threadlane.py``)
    debugger reader (each, ``debuggers.py``) ──relay lane, else ConsumerBytes──▶ session
        ──SendToVm──▶ the VM outbox, written at once
    timer ──Tick at the time the session asked (WakeMeAt)──▶ session
    API call ──Call──▶ session ──Resolve/Reject──▶ the waiting caller

The driver is composed of parts, each seeing it through a ``core.Core`` (feed, carry out,
flush, ask, the nursery, the log): ``debuggers.Debuggers`` (the debuggers' table, the per-VM
port, their accept and reader tasks) and ``profiling.Profiling`` (tracing, dumps, the files
under way); ``relay.Relay`` is the one executor of the session's commands.

A caller that gives up (cancelled) never touches a socket: its call stays data in the session
until its deadline. Only a write that may have sent part of a packet breaks a connection.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import trio

from ddmd.config import Config
from ddmd.drive.captures import CaptureResult
from ddmd.drive.core import Core
from ddmd.drive.debugger import (
    DebuggerConnection,
    Outbox,
    OutboxBroken,
)
from ddmd.drive.debuggers import Debuggers
from ddmd.drive.found import DeviceFiles, Opener, ProcessInfo
from ddmd.drive.jvmtools import JvmTools
from ddmd.drive.ports import VmPorts
from ddmd.drive.profiling import Profiling
from ddmd.drive.relay import Left, Relay
from ddmd.drive.threadlane import RECEIVE_SIZE, ThreadLane, socket_of
from ddmd.drive.timer import Timer
from ddmd.drive.waiters import Waiters
from ddmd.drive.writes import PendingWrites
from ddmd.errors import DdmFailed, FeatureUnsupported, RequestTimedOut, VmGone
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
    Publish,
    Reconnect,
    Reject,
    Resolve,
    SelectMe,
    SendToDebugger,
    SendToVm,
    WakeMeAt,
)
from ddmd.session.consumers import DEBUGGER, FRONT, ConsumerKind
from ddmd.session.inputs import (
    CauseGc,
    DumpHeap,
    GetStack,
    Input,
    RefreshThreads,
    VmBytes,
    VmClosed,
    VmConnected,
)
from ddmd.session.vm import SessionSettings, VmSession

log = structlog.get_logger("ddmd.vm")

VM_WRITE_OVERDUE = "a write to the VM took too long"
#: Bytes that may wait for the VM to read them before its connection counts as stuck.
VM_BUDGET = 64 << 20


@dataclass(frozen=True, slots=True)
class VmStatistics:
    packets_in: int
    packets_out: int
    bytes_in: int
    bytes_out: int
    requests_timed_out: int
    outstanding: int


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
        speculate=config.debugger.speculate,
        speculate_rtt=config.debugger.speculate_rtt_ms / 1000,
        speculate_max_inflight=config.debugger.speculate_max_inflight,
        speculate_max_bytes=config.debugger.speculate_max_bytes,
    )


def _vm_json(snapshot: VmSnapshot) -> dict[str, Any]:
    return snapshot.to_json()


class VmDriver:
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
        self.jvm = JvmTools(self, process=process, address=address, config=config)  # plain JVMs
        self._log = log.bind(vm=vm_id)
        self._nursery: trio.Nursery | None = None
        self._vm: Outbox | None = None
        self._conn_scope: trio.CancelScope | None = None
        self._reconnect = False
        self._closed_reason: str | None = None
        self._writes = writes = PendingWrites({}, lambda: self._vm)
        self._waiters = Waiters(
            feed=self._feed, flush=self._flush, nursery=lambda: self._nursery, writes=writes
        )
        self._relay = relay = Relay(
            self._session, writes, logger=self._log, in_loop=self._in_loop, on_full=self._full
        )
        self._lane = ThreadLane(relay, writes.debuggers)
        self._lane.applies = config.debugger.relay_threads
        # Looking for a reply before sleeping (relaythreads.Looking) pays only when replies are
        # quick: never behind adb (an adb server, a device daemon and USB or TCP in between).
        self._lane.spin_ns = config.debugger.relay_spin_us * 1000 if source == "tcp" else 0
        core = Core(
            feed=self._feed,
            carry_out=relay.carry_out,
            flush=self._flush,
            ask=self._waiters.ask,
            next_call=self._waiters.next_call,
            nursery=lambda: self._nursery,
            log=self._log,
        )
        self._timer = Timer(core, watching=self._writing, watchdog=self._watchdog)
        self._debuggers = Debuggers(
            core,
            self._session,
            vm_id=vm_id,
            config=config,
            registry=registry,
            ports=ports,
            writes=writes,
            relay=relay,
            lane=self._lane,
            wake_timer=self._timer.wake,
        )
        self._profiling = Profiling(
            core,
            self._session,
            self.jvm,
            capture_dir=config.debugger.state_file.parent / "captures",
            device_files=files,  # adb VMs: for traces and dumps the VM can only write there
            app_name=self._app_name,
        )
        bind_vm_identity(vm_id, *_identity(self._session))

    # ------------------------------------------------------------------ VmHandle, sync

    @property
    def vm_id(self) -> str:
        return self._vm_id

    def snapshot(self) -> VmSnapshot:
        return self._session.snapshot(
            current=self._registry.is_current(self._vm_id),
            debugger_port=self._debuggers.port,
            debuggers=self._debuggers.snapshots(),
        )

    def selection_key(self) -> str | None:
        return self._session.selection_key()

    @property
    def capture_dir(self) -> Path:
        """Where the files of traces and dumps go (``JvmTools`` writes there too)."""
        return self._profiling.capture_dir

    def last_heap_images(self) -> tuple[HeapImage, ...]:
        return self._session.model.heap_images

    def statistics(self) -> VmStatistics:
        r = self._session.relay_statistics()
        lane = self._relay.counts
        return VmStatistics(
            lane.packets_in,
            r.packets_to_vm,
            lane.bytes_in,
            r.bytes_to_vm,
            self._relay.timeouts,
            r.outstanding,
        )

    def bridge_statistics(self) -> dict[str, int]:
        r = self._session.relay_statistics()
        return {
            "packets_to_vm": r.packets_to_vm,
            "packets_to_debugger": r.packets_to_debuggers,
            "bytes_to_vm": r.bytes_to_vm,
            "bytes_to_debugger": r.bytes_to_debuggers,
            "reconnects": self._session.reconnects,
            "slow_debuggers": self._debuggers.slow,
            **self._foresight_counts(),
            **self._relay.counts.statistics(),
        }

    def _foresight_counts(self) -> dict[str, int]:
        f = self._session.router.foresight.statistics()
        return {
            "answered_cache": f.answered_cache,
            "answered_speculation": f.answered_speculation,
            "speculation_wasted": f.wasted,
        }

    # ------------------------------------------------------------------ VmHandle, calls

    async def refresh_threads(self) -> VmSnapshot:
        with contextlib.suppress(FeatureUnsupported, RequestTimedOut, DdmFailed):
            await self._waiters.ask(RefreshThreads())
        return self.snapshot()

    async def cause_gc(self) -> GcOutcome:
        if self.jvm.applies():  # a plain JVM: GC.run through the attach API
            return await self.jvm.cause_gc()
        outcome = await self._waiters.ask(CauseGc())
        assert isinstance(outcome, GcOutcome)
        return outcome

    async def stack_trace(self, thread_id: int) -> StackTrace:
        if self.jvm.applies():  # a plain JVM: its thread dump (Thread.print)
            return await self.jvm.stack_trace(thread_id)
        trace = await self._waiters.ask(GetStack(thread_id))
        assert isinstance(trace, StackTrace)
        return trace

    async def heap_segments(self) -> tuple[HeapImage, ...]:
        images = await self._waiters.ask(DumpHeap())
        assert isinstance(images, tuple)
        return images

    # Issue 13's features (drive/profiling.py)

    def profiling(self) -> dict[str, Any]:
        return self._profiling.profiling()

    async def start_trace(self, sampling_us: int | None = None) -> dict[str, Any]:
        return await self._profiling.start_trace(sampling_us)

    async def trace_state(self) -> dict[str, Any]:
        return await self._profiling.trace_state()

    async def stop_trace(self) -> CaptureResult:
        return await self._profiling.stop_trace()

    async def dump_hprof(self) -> CaptureResult:
        return await self._profiling.dump_hprof()

    async def alloc_tracker(self, action: str) -> dict[str, Any]:
        return await self._profiling.alloc_tracker(action)

    async def kill(self, status: int = 1) -> dict[str, Any]:
        return await self._profiling.kill(status)

    # Debuggers (drive/debuggers.py)

    def adopt_debugger(
        self,
        stream: trio.abc.Stream,
        peer: str,
        *,
        via: str,
        kind: ConsumerKind = DEBUGGER,
        tool: str | None = None,
    ) -> None:
        """Take an accepted debugger connection (sync; the driver runs it)."""
        self._debuggers.adopt_debugger(stream, peer, via=via, kind=kind, tool=tool)

    def adopt_consumer(
        self, stream: trio.SocketStream, peer: str, *, via: str, tool: str | None = None
    ) -> None:
        """Take a socket from the adb front (``ddmd.front.hub.ConsumerTarget``): a consumer of
        this VM that may speak DDM only, or debug too (session/consumers.py)."""
        self._debuggers.adopt_debugger(stream, peer, via=via, kind=FRONT, tool=tool)

    def _app_name(self) -> str | None:
        snapshot = self.snapshot()
        return snapshot.package or snapshot.app

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
                    nursery.start_soon(self._timer.run)
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
                    await self._debuggers.close_all("the VM disconnected")
                    nursery.cancel_scope.cancel()
                return reason
            finally:
                self._nursery = None
                self._waiters.fail_all(VmGone(f"{self._vm_id} is gone"))
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
                broken = self._feed_vm(VmConnected(trio.current_time(), leftover, time.time()))
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
        from_vm, table = self._relay.from_vm, self._debuggers.table
        while True:
            if sock is not None and table:  # the relay lane's thread (threadlane.py)
                try:
                    ended = await self._lane.read_vm(
                        sock, self._vm_read_rest, self._debuggers.read_rest
                    )
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
            try:
                left = from_vm(bytes(data), trio.current_time, True)  # trio gives bytes: no copy
            except RemoteProtocolError as exc:
                self._log.warning(Event.VM_PROTOCOL_ERROR, error=str(exc))
                return f"protocol error: {exc}"
            await self._after_vm_read(left)

    async def _after_vm_read(self, left: Left) -> None:
        """A VM read in the event loop, after ``Relay.from_vm``: what is left written (the
        relay lane's packet: one yield first), then the disk's back-pressure."""
        if left is None:
            await trio.lowlevel.cancel_shielded_checkpoint()  # docs/design.md, relay lane
        elif type(left) is list and self._writes.dirty and not self._writes.write_now():
            await self._flush(reads=self._vm)
        await self._profiling.wait_room()  # the disk is behind: let TCP slow the VM down

    async def _vm_read_rest(self, data: bytes | None, later: Sequence[Command] = ()) -> str | None:
        """A VM read the relay thread hands to the event loop (``VmRest``): b"" at the end of
        the stream, else the commands it left; then the writes. Why the connection ends, or
        None."""
        if data == b"":
            return self._feed_vm(VmBytes(b"")) or "eof"
        if later:
            self._relay.carry_out(list(later))
        if self._writes.dirty and not self._writes.write_now():
            await self._flush(reads=self._vm)
        elif not later:
            await trio.lowlevel.cancel_shielded_checkpoint()  # docs/design.md, relay lane
        await self._profiling.wait_room()  # the disk is behind: let TCP slow the VM down
        return None

    def _feed_vm(self, item: VmConnected | VmBytes) -> str | None:
        """Feed bytes from the VM; a broken packet header ends the connection (returns why)."""
        try:
            self._feed(item)
        except RemoteProtocolError as exc:
            self._log.warning(Event.VM_PROTOCOL_ERROR, error=str(exc))
            return f"protocol error: {exc}"
        return None

    def _writing(self) -> bool:
        """A write is (or may soon be) under way: the timer's watchdog looks at it."""
        return bool(self._debuggers.table) or (self._vm is not None and self._vm.busy)

    async def _watchdog(self, now: float) -> None:
        """Close a stream whose write is overdue: the write then fails in the task doing it."""
        self._debuggers.watchdog(now)
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
        self._relay.carry_out(self._session.handle(item, trio.current_time()))

    def _full(self, command: SendToDebugger | SendToVm) -> None:
        """The one executor's rule for a packet whose queue is full."""
        if isinstance(command, SendToDebugger):
            self._debuggers.drop_slow(command.debugger)
        elif (vm := self._vm) is not None and vm.broken is None:
            # The VM has stopped reading: more waits for it than it could ever need.
            vm.broken = "the VM stopped reading"
            self._log.warning(Event.VM_SEND_FAILED, queued_bytes=vm.queued)
            if self._conn_scope is not None:
                self._conn_scope.cancel()

    def _in_loop(self, command: Command) -> None:
        """The one executor's commands that only the event loop carries out (``Relay``)."""
        if isinstance(command, Changed):
            bind_vm_identity(self._vm_id, *_identity(self._session))
            if command.renamed:
                self._registry.key_changed(self._vm_id)
                self._debuggers.maybe_listen()
            else:
                self._registry.changed(self._vm_id)
        elif isinstance(command, WakeMeAt):
            self._timer.wake_me_at(command.when)
        elif isinstance(command, Resolve | Reject):
            self._waiters.settle(command)
        elif isinstance(command, CloseDebugger):
            self._debuggers.close(command.debugger, command.reason)
        elif isinstance(command, SelectMe):
            self._registry.select(self._vm_id, reason=command.reason)
        elif isinstance(command, Capture):
            self._profiling.put(command)
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
        dirty = self._writes.dirty
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
                        self._debuggers.leave(debugger, str(exc))

    async def _flush_later(self, outbox: Outbox) -> None:
        self._writes.dirty.append(outbox)
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
