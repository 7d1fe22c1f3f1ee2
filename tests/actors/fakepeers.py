"""Scripted in-memory peers for the debugger bridge, built only from ``ddmd.protocol``.

No sockets: each peer owns one end of a ``trio.testing`` stream pair and the code under test
(``VmActor`` / ``DebuggerSession``) owns the other.

- ``FakeVm``: the VM end of a JDWP connection that is already past its handshake (as a probe
  hands it to ``VmActor.run``). It records every packet it receives and answers DDM requests by
  chunk type as its ``VmScript`` says (``reply``, ``empty``, ``error`` (JDWP 99), ``fail``
  (a FAIL chunk), ``silence``; DBGD also ``ack``). Non-DDM commands get ``jdwp_reply``'s
  answer (IDSizes, Version, otherwise an echo of the command data). Commands matching
  ``hold`` are parked in ``held`` for the test to answer later, in any order. Tests can push
  chunks, send events and write raw bytes at any time (all writes share one lock).
- ``FakeDebugger``: a debugger client. It must ``handshake()`` first, then sends commands,
  raw bytes or reply packets, and reads packets (or raw bytes) back.

Waiting is event-driven (``wait_for``, ``wait_bytes``): every new packet or byte wakes the
waiters, so tests never sleep. Callers put a ``fail_after`` around the waits.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from ddmd.protocol import ddm
from ddmd.protocol.jdwp import (
    EOF,
    HANDSHAKE,
    NEED_DATA,
    CommandPacket,
    CommandSet,
    ErrorCode,
    Handshake,
    Packet,
    PacketDecoder,
    ReplyPacket,
    VirtualMachineCommand,
    encode,
)

RECEIVE_SIZE = 65536
BIG = 1 << 30

ID_SIZES_64 = struct.pack(">iiiii", 8, 8, 8, 8, 8)


def jstring(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">I", len(raw)) + raw


def vm_start_composite(thread_id: int = 1, *, packet_id: int = 0) -> CommandPacket:
    """Event.Composite with one VM_START (V27 shape: suspend all, request id 0, 8-byte thread)."""
    data = struct.pack(">BiBiQ", 2, 1, 90, 0, thread_id)
    return CommandPacket(packet_id, CommandSet.EVENT, 100, data)


def thread_start_composite(thread_id: int, *, packet_id: int) -> CommandPacket:
    """Event.Composite with one THREAD_START (kind 6) for an 8-byte thread id."""
    data = struct.pack(">BiBiQ", 0, 1, 6, 7, thread_id)
    return CommandPacket(packet_id, CommandSet.EVENT, 100, data)


class _Progress:
    """Wake every waiter whenever something new arrived (a fresh Event per generation)."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def bump(self) -> None:
        self._event.set()
        self._event = trio.Event()

    async def wait(self) -> None:
        await self._event.wait()


# --------------------------------------------------------------------------------------------
# FakeVm


@dataclass
class VmScript:
    """How a ``FakeVm`` answers. ``answers`` maps a chunk type name ("HELO", "THST", ...) to
    ``reply`` | ``empty`` | ``error`` | ``fail`` | ``silence`` (DBGD: also ``ack``)."""

    ddm: bool = True  # False: every DDM command gets JDWP error 99 (a HotSpot VM)
    answers: dict[str, str] = field(default_factory=dict)
    pid: int = 4242
    app_name: str = "com.example.app"
    package_name: str = "com.example.app"
    threads: tuple[int, ...] = (1, 2)

    def answer_for(self, type_name: str) -> str:
        default = "silence" if type_name == "DBGD" else "reply"
        return self.answers.get(type_name, default)


class FakeVm:
    """The VM end of one JDWP connection (already past the handshake)."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        script: VmScript | None = None,
        *,
        hold: Callable[[CommandPacket], bool] | None = None,
    ) -> None:
        self.stream = stream
        self.script = script or VmScript()
        self.hold = hold
        self.received: list[Packet] = []
        self.held: list[CommandPacket] = []
        self.closed = trio.Event()  # the other side closed (EOF) or the stream broke
        self.bytes_received = 0
        self._lock = trio.Lock()
        self._progress = _Progress()
        self._next_push_id = 0x10000000

    # ------------------------------------------------------------------ reading

    async def run(self) -> None:
        """Read and answer until the actor closes the connection."""
        decoder = PacketDecoder(max_length=BIG)
        try:
            while True:
                event = decoder.next_event()
                if event is NEED_DATA:
                    try:
                        data = await self.stream.receive_some(RECEIVE_SIZE)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        data = b""
                    self.bytes_received += len(data)
                    decoder.receive_data(data)
                    continue
                if event is EOF:
                    return
                assert isinstance(event, CommandPacket | ReplyPacket), event
                self.received.append(event)
                self._progress.bump()
                if isinstance(event, CommandPacket):
                    if self.hold is not None and self.hold(event):
                        self.held.append(event)
                        self._progress.bump()
                    else:
                        try:
                            await self.answer(event)
                        except (trio.BrokenResourceError, trio.ClosedResourceError):
                            return  # the actor closed the connection first
        finally:
            self.closed.set()
            self._progress.bump()

    def commands(self) -> list[CommandPacket]:
        return [p for p in self.received if isinstance(p, CommandPacket)]

    def ddm_requests(self, type_name: str | None = None) -> list[tuple[CommandPacket, ddm.Chunk]]:
        """Every DDM command received (optionally of one chunk type), with its first chunk."""
        out = []
        for p in self.commands():
            if not ddm.is_ddm(p):
                continue
            chunks = ddm.chunks_of(p, ddm.Direction.TO_VM)
            if chunks and (type_name is None or ddm.type_name(chunks[0].chunk_type) == type_name):
                out.append((p, chunks[0]))
        return out

    async def wait_for(
        self, predicate: Callable[[FakeVm], object], *, closed_ok: bool = False
    ) -> None:
        """Wait until ``predicate(self)`` is true (re-checked after every received packet)."""
        while not predicate(self):
            if self.closed.is_set() and not closed_ok:
                raise AssertionError("the VM connection closed while waiting")
            await self._progress.wait()

    async def wait_ddm(
        self, type_name: str, count: int = 1
    ) -> list[tuple[CommandPacket, ddm.Chunk]]:
        await self.wait_for(lambda vm: len(vm.ddm_requests(type_name)) >= count)
        return self.ddm_requests(type_name)

    async def wait_held(self, count: int) -> list[CommandPacket]:
        await self.wait_for(lambda vm: len(vm.held) >= count)
        return list(self.held)

    # ------------------------------------------------------------------ writing

    async def send_raw(self, data: bytes) -> None:
        async with self._lock:
            await self.stream.send_all(data)

    async def send(self, packet: Packet) -> None:
        await self.send_raw(encode(packet))

    async def push(self, chunk: ddm.Chunk) -> int:
        """Push one DDM chunk (a VM-originated command); returns its id."""
        self._next_push_id += 1
        await self.send(ddm.ddm_command(self._next_push_id, chunk))
        return self._next_push_id

    async def reply(self, packet: CommandPacket, data: bytes = b"", error: int = 0) -> None:
        await self.send(ReplyPacket(packet.id, error, b"" if error else data))

    async def answer(self, packet: CommandPacket) -> None:
        """Answer one command the way the script says (used for held packets too)."""
        if ddm.is_ddm(packet):
            await self._answer_ddm(packet)
            return
        data = self.jdwp_reply(packet)
        if data is not None:
            await self.reply(packet, data)

    def jdwp_reply(self, packet: CommandPacket) -> bytes | None:
        """Reply data for a non-DDM command (None: stay silent)."""
        if packet.command_set == CommandSet.VIRTUAL_MACHINE:
            if packet.command == VirtualMachineCommand.ID_SIZES:
                return ID_SIZES_64
            if packet.command == VirtualMachineCommand.VERSION:
                return (
                    jstring("Fake VM 1.0")
                    + struct.pack(">ii", 1, 8)
                    + jstring("1.0")
                    + jstring("FakeVM")
                )
        return b"echo:" + packet.data

    async def _answer_ddm(self, packet: CommandPacket) -> None:
        if not self.script.ddm:
            await self.reply(packet, error=ErrorCode.NOT_IMPLEMENTED)
            return
        (chunk,) = ddm.chunks_of(packet, ddm.Direction.TO_VM)
        name = ddm.type_name(chunk.chunk_type)
        how = self.script.answer_for(name)
        if how == "silence":
            return
        if how == "error":
            await self.reply(packet, error=ErrorCode.NOT_IMPLEMENTED)
        elif how == "empty":
            await self.reply(packet)
        elif how == "fail":
            await self.reply(packet, ddm.encode_chunk(ddm.Fail(1, f"{name} failed")))
        elif how == "ack":
            await self.reply(packet, ddm.encode_chunk(ddm.Dbgd()))
        else:
            answer = self.ddm_answer(packet, chunk)
            await self.reply(packet, b"" if answer is None else ddm.encode_chunk(answer))

    def ddm_answer(self, packet: CommandPacket, chunk: ddm.Chunk) -> ddm.Chunk | None:
        """The ``reply`` answer to a DDM request (None: an empty reply)."""
        s = self.script
        if isinstance(chunk, ddm.HeloRequest):
            return ddm.HeloReply(
                1, s.pid, "Dalvik v2.1.0", s.app_name, 0, "64-bit (x86_64)", "CheckJNI=false",
                False, s.package_name,
            )  # fmt: skip
        if isinstance(chunk, ddm.FeatRequest):
            return ddm.FeatReply(("hprof-heap-dump", "method-trace-profiling"))
        if isinstance(chunk, ddm.ThreadStatusRequest):
            infos = tuple(ddm.ThreadInfo(t, 1, 1000 + t, 0, 0, False) for t in s.threads)
            return ddm.ThreadStatus(infos)
        if isinstance(chunk, ddm.StackTraceRequest):
            # The reply names the VM-side request id, so tests can check who got which reply.
            frame = ddm.StackFrame("Fake", f"request{packet.id}", "Fake.java", packet.id & 0x7FFF)
            return ddm.StackTrace(chunk.thread_id, (frame,))
        if isinstance(chunk, ddm.Dbgd):
            return ddm.Dbgd()
        return None


# --------------------------------------------------------------------------------------------
# FakeDebugger


class FakeDebugger:
    """A JDWP debugger client (jdb-like) on one end of a stream pair."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.decoder = PacketDecoder(max_length=BIG, expect_handshake=True)
        self.bytes_received = 0
        self.eof = False
        self._progress = _Progress()

    async def handshake(self) -> None:
        await self.stream.send_all(HANDSHAKE)
        while True:
            event = self.decoder.next_event()
            if isinstance(event, Handshake):
                return
            if event is EOF:
                raise AssertionError("ddmd closed the connection instead of the handshake")
            await self._fill()

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def send(self, packet: Packet) -> None:
        await self.send_raw(encode(packet))

    async def command(
        self, packet_id: int, command_set: int, command: int, data: bytes = b""
    ) -> None:
        await self.send(CommandPacket(packet_id, command_set, command, data))

    async def _fill(self) -> None:
        try:
            data = await self.stream.receive_some(RECEIVE_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if not data:
            self.eof = True
        self.bytes_received += len(data)
        self.decoder.receive_data(data)
        self._progress.bump()

    async def receive(self) -> Packet | None:
        """The next whole packet, or None when ddmd closed the connection."""
        while True:
            event = self.decoder.next_event()
            if event is EOF:
                return None
            if isinstance(event, CommandPacket | ReplyPacket):
                return event
            await self._fill()

    async def receive_until_eof(self) -> list[Packet]:
        out: list[Packet] = []
        while (packet := await self.receive()) is not None:
            out.append(packet)
        return out

    async def pump(self) -> None:
        """Read raw bytes into the decoder until EOF (run as a task; see ``wait_bytes``)."""
        while not self.eof:
            await self._fill()

    async def wait_bytes(self, count: int) -> None:
        """With ``pump`` running: wait until ``count`` bytes arrived in total."""
        while self.bytes_received < count:
            if self.eof:
                raise AssertionError(f"EOF after {self.bytes_received} of {count} bytes")
            await self._progress.wait()

    def buffered_packets(self) -> list[Packet]:
        """Decode what ``pump`` collected (packets only; stops at NEED_DATA or EOF)."""
        out: list[Packet] = []
        while True:
            event = self.decoder.next_event()
            if isinstance(event, CommandPacket | ReplyPacket):
                out.append(event)
            else:
                return out
