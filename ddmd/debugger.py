"""DebuggerSession: one accepted debugger connection (jdb, Android Studio) bridged to one VM.

Layer: imports protocol/, config, errors, logs. It talks to the VM only through the small
``BridgeTarget`` API of its VmActor; it never touches the VM stream or the id map.

    debugger ──handshake (answered here)──▶ session
    debugger ──commands──▶ session.reader ──▶ actor.forward()  (ids rewritten by the actor)
    actor reader ──replies/events──▶ session.deliver() ──bounded queue──▶ writer ──▶ debugger

VirtualMachine.Dispose is answered here (empty reply) and ends the session; the actor then
releases the VM (DBGD, or close and reopen). Reply packets sent by a debugger are dropped and
logged (a VM never expects replies). When the outbound queue is full the debugger is too slow:
it is disconnected (``debugger.slow_consumer``) instead of stalling the VM reader.
"""

from __future__ import annotations

from typing import Protocol

import structlog
import trio

from ddmd.config import Config
from ddmd.errors import VmGone
from ddmd.logs import Event
from ddmd.protocol.errors import RemoteProtocolError
from ddmd.protocol.jdwp import (
    EOF,
    HANDSHAKE,
    NEED_DATA,
    CommandPacket,
    CommandSet,
    Handshake,
    PacketDecoder,
    ReplyPacket,
    VirtualMachineCommand,
    encode,
)

log = structlog.get_logger("ddmd.debugger")

RECEIVE_SIZE = 65536
DIRECT_SEND_MAX = 65536  # larger packets always go through the queue
DIRECT_SEND_LIMIT = 0.25  # seconds a direct send may wait for a debugger that stopped reading
ROOM_PIECES = 4  # a streamed packet waits while more than this many pieces are queued
#: The end reason of a session dropped for not reading (counted by the VM actor).
SLOW_CONSUMER = "slow consumer"


class BridgeTarget(Protocol):
    """What a session needs from its VM actor."""

    async def wait_debugger_ready(self, session: DebuggerSession) -> None:
        """Wait (bounded) until the VM is connected; then hand over held events."""
        ...

    async def forward(self, session: DebuggerSession, packet: CommandPacket) -> None:
        """Write the debugger's command to the VM with a rewritten id."""
        ...

    def cached_id_sizes(self) -> bytes | None: ...

    def detach(self, session: DebuggerSession, reason: str) -> None:
        """The session ended; release the VM."""
        ...


class DebuggerSession:
    def __init__(
        self,
        stream: trio.abc.Stream,
        *,
        peer: str,
        via: str,
        port: int | None,
        target: BridgeTarget,
        config: Config,
        vm_id: str,
    ) -> None:
        self.peer = peer
        self.via = via
        self.port = port
        self._stream = stream
        self._target = target
        self._config = config
        self._send, self._receive = trio.open_memory_channel[bytes](config.debugger.queue_packets)
        self._scope = trio.CancelScope()
        self._mid_packet = False
        self._deferred: list[bytes] = []
        self._queued_bytes = 0
        self._room = trio.Event()
        self._write_lock = trio.StrictFIFOLock()  # the writer task or a direct send
        self._packet_done = trio.Event()
        self._end_reason: str | None = None
        self.attached = False
        self.packets_in = 0
        self.packets_out = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self._log = log.bind(vm=vm_id, peer=peer, via=via, port=port)

    def __repr__(self) -> str:
        return f"<debugger {self.peer} via {self.via}>"

    # ------------------------------------------------------------------ from the VM side (sync)

    def deliver(self, data: bytes) -> None:
        """Queue one whole encoded packet for the debugger."""
        if self._mid_packet:
            self._deferred.append(data)
            return
        self._put(data)

    async def deliver_now(self, data: bytes) -> None:
        """Send a small packet straight from the VM reader when nothing is queued.

        Saves the hop through the writer task (the common reply/event case). It can only wait
        when the debugger's socket buffer is full, i.e. it has stopped reading; that wait is
        capped at ``DIRECT_SEND_LIMIT`` and the debugger is then dropped as a slow consumer,
        so the VM reader is never held longer.
        """
        if (
            len(data) > DIRECT_SEND_MAX
            or self._mid_packet
            or self._queued_bytes
            or self._end_reason is not None
            or not self.attached
        ):
            self.deliver(data)
            return
        try:
            self._write_lock.acquire_nowait()
        except trio.WouldBlock:
            self.deliver(data)
            return
        try:
            with trio.move_on_after(DIRECT_SEND_LIMIT) as scope:
                await self._stream.send_all(data)
            if scope.cancelled_caught:
                self._log.warning(Event.DEBUGGER_SLOW_CONSUMER, waited=DIRECT_SEND_LIMIT)
                self.end(SLOW_CONSUMER)
                return
            self.packets_out += 1
            self.bytes_out += len(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self.end(f"connection error: {exc}")
        finally:
            self._write_lock.release()

    def deliver_start(self, header: bytes) -> None:
        """Start relaying a large packet in pieces; nothing else is interleaved until it ends."""
        self._put(header)
        self._mid_packet = True

    def deliver_piece(self, data: bytes, *, last: bool) -> None:
        self._put(data)
        if last:
            self._mid_packet = False
            deferred, self._deferred = self._deferred, []
            for item in deferred:
                self._put(item)
            self._packet_done.set()

    async def deliver_piece_when_room(self, data: bytes, *, last: bool) -> None:
        """As ``deliver_piece``, but first wait (bounded by ``[timeouts] jdwp_request``) until
        less than ``ROOM_PIECES`` relay pieces' worth of bytes is queued for the debugger."""
        limit = max(ROOM_PIECES * self._config.debugger.relay_chunk_bytes, 1 << 20)
        if self._queued_bytes > limit and self._end_reason is None:
            with trio.move_on_after(self._config.timeouts.jdwp_request) as scope:
                while self._queued_bytes > limit and self._end_reason is None:
                    self._room = trio.Event()
                    await self._room.wait()
            if scope.cancelled_caught:
                self._log.warning(
                    Event.DEBUGGER_SLOW_CONSUMER,
                    queued_bytes=self._queued_bytes,
                    waited=self._config.timeouts.jdwp_request,
                )
                self.end(SLOW_CONSUMER)
        self.deliver_piece(data, last=last)

    def _put(self, data: bytes) -> None:
        if self._end_reason is not None:
            return
        self._queued_bytes += len(data)
        try:
            self._send.send_nowait(data)
        except trio.WouldBlock:
            self._queued_bytes -= len(data)
            self._log.warning(
                Event.DEBUGGER_SLOW_CONSUMER, queue=self._config.debugger.queue_packets
            )
            self.end(SLOW_CONSUMER)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self._queued_bytes -= len(data)

    def end(self, reason: str) -> None:
        """Disconnect this debugger (from any task)."""
        if self._end_reason is None:
            self._end_reason = reason
        self._scope.cancel()
        self._room.set()

    # ------------------------------------------------------------------ the session task

    async def run(self) -> None:
        reason = "closed"
        try:
            with self._scope:
                reason = await self._run()
        finally:
            reason = self._end_reason or reason
            if self.attached:
                self._log.info(
                    Event.DEBUGGER_DETACHED,
                    reason=reason,
                    packets_in=self.packets_in,
                    packets_out=self.packets_out,
                )
            # Free the VM's debugger slot before closing: a debugger that reconnects as soon
            # as it sees EOF must not be rejected in favour of this finished session.
            try:
                self._target.detach(self, reason)
            finally:
                with trio.move_on_after(1) as cleanup:
                    cleanup.shield = True
                    await self._stream.aclose()

    async def _run(self) -> str:
        decoder = PacketDecoder(
            max_length=self._config.limits.max_packet_bytes, expect_handshake=True
        )
        try:
            with trio.fail_after(self._config.timeouts.handshake):
                while True:
                    event = decoder.next_event()
                    if isinstance(event, Handshake):
                        break
                    if event is EOF:
                        return "closed before the handshake"
                    data = await self._stream.receive_some(RECEIVE_SIZE)
                    decoder.receive_data(data)
                await self._target.wait_debugger_ready(self)
                await self._stream.send_all(HANDSHAKE)
        except trio.TooSlowError:
            self._log.warning(Event.DEBUGGER_HANDSHAKE_TIMED_OUT)
            return "handshake timed out"
        except RemoteProtocolError as exc:
            self._log.warning(Event.DEBUGGER_HANDSHAKE_FAILED, error=str(exc))
            return f"bad handshake: {exc}"
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            return f"connection error: {exc}"
        except VmGone as exc:
            self._log.warning(Event.DEBUGGER_REJECTED, reason=str(exc))
            return str(exc)
        self.attached = True
        self._log.info(Event.DEBUGGER_ATTACHED)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._writer)
            reason = await self._reader(decoder)
            # A large packet still being relayed is finished first (the Dispose reply is
            # queued behind it), within the slow-consumer bound.
            with trio.move_on_after(self._config.timeouts.jdwp_request):
                while self._mid_packet and self._end_reason is None:
                    self._packet_done = trio.Event()
                    await self._packet_done.wait()
            # Let the writer flush what is queued (the Dispose reply), then stop it; a
            # debugger that does not read gets a short grace only.
            self._send.close()
            nursery.cancel_scope.deadline = trio.current_time() + self._config.timeouts.handshake
        return reason

    async def _writer(self) -> None:
        async with self._receive:
            async for data in self._receive:
                try:
                    async with self._write_lock:
                        await self._stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    self.end(f"connection error: {exc}")
                    return
                self.packets_out += 1
                self.bytes_out += len(data)
                self._queued_bytes -= len(data)
                if not self._room.is_set():
                    self._room.set()

    async def _reader(self, decoder: PacketDecoder) -> str:
        while True:
            try:
                while True:
                    event = decoder.next_event()
                    if event is NEED_DATA:
                        break
                    if event is EOF:
                        return "debugger closed the connection"
                    if isinstance(event, CommandPacket):
                        self.packets_in += 1
                        self.bytes_in += event.length
                        if await self._on_command(event):
                            return "VirtualMachine.Dispose"
                    elif isinstance(event, ReplyPacket):
                        self._log.info(
                            Event.DEBUGGER_REPLY_DROPPED, id=event.id, error=event.error_code
                        )
            except RemoteProtocolError as exc:
                self._log.warning(Event.DEBUGGER_PROTOCOL_ERROR, error=str(exc))
                return f"protocol error: {exc}"
            try:
                data = await self._stream.receive_some(RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                return f"connection error: {exc}"
            decoder.receive_data(data)

    async def _on_command(self, packet: CommandPacket) -> bool:
        """Handle one command; True when the debugger is leaving (Dispose)."""
        if packet.command_set == CommandSet.VIRTUAL_MACHINE:
            if packet.command == VirtualMachineCommand.DISPOSE:
                self._log.info(Event.DEBUGGER_DISPOSE)
                self.deliver(encode(ReplyPacket(packet.id, 0)))
                return True
            if packet.command == VirtualMachineCommand.ID_SIZES:
                cached = self._target.cached_id_sizes()
                if cached is not None:
                    self.deliver(encode(ReplyPacket(packet.id, 0, cached)))
                    return False
        await self._target.forward(self, packet)
        return False
