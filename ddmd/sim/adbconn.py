"""One adb server's connection to the fake device (`_Connection`: the ``CNXN`` handshake, the
read loop, the deadlines on untrusted input) and its streams (`_Stream`: ``OPEN`` / ``OKAY`` /
``WRTE`` / ``CLSE`` and the flow control of one service). The services themselves are
`ddmd.sim.adbd.FakeDevice`'s, which a connection sees through `DeviceHost`.

The server opens with ``CNXN``; the device answers ``CNXN`` version 0x01000000, maxdata 256 KiB
and its banner (no ``AUTH``: an unlocked, ``ro.adb.secure=0`` device). Streams: the server
sends ``OPEN(its id, 0, "service\\0")``; the device accepts with ``OKAY(our id, its id)`` or
refuses with ``CLSE(0, its id)``; then ``WRTE`` both ways, each answered ``OKAY`` before the
writer sends the next one on that stream; ``CLSE`` ends it. The banner carries no ``shell_v2``
feature, so ``adb shell`` sends the plain ``shell:`` service.

Input from the server is untrusted: a bad header (magic, unknown command, a payload over
256 KiB, a wrong data check), a message out of place, or a server that stalls in the middle
of a message, on a send, or on the ``OKAY`` of a write closes that connection (and every
relay on it), never the device. Waits that are idle by nature have no deadline: between two
messages of a connected server (a real phone's transport idles for hours), and a relay
waiting for a debugger or a VM to say something.

Layer: the simulator; imports trio, structlog, the standard library, `ddmd.sim.adbmsg` and
`ddmd.sim.devicestats`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Protocol

import structlog
import trio

from ddmd.sim.adbmsg import (
    _U32,
    A_CLSE,
    A_CNXN,
    A_OKAY,
    A_OPEN,
    A_VERSION,
    A_WRTE,
    COMMANDS,
    MAX_PAYLOAD,
    MIN_PAYLOAD,
    AdbTransportError,
    Message,
    MessageDecoder,
    encode_message,
)
from ddmd.sim.devicestats import DeviceStatistics

logger = structlog.get_logger()


class DeviceHost(Protocol):
    """What a connection needs of its device (`ddmd.sim.adbd.FakeDevice`): the banner, the
    deadlines, the counters, which service to run for an ``OPEN``, and the ``jdwp:PID`` relays."""

    banner: bytes
    handshake_timeout: float
    message_timeout: float
    send_timeout: float
    okay_timeout: float
    max_streams: int

    @property
    def counters(self) -> DeviceStatistics: ...

    def plan(self, service: str) -> tuple[str, _Handler, int | None] | None:
        """(kind, handler, the pid of a jdwp relay) for a service to accept; None to refuse."""
        ...

    def claim_relay(self, pid: int, stream: _Stream) -> None:
        """``stream`` relays to ``pid`` from now on (before its OKAY goes out)."""
        ...


class _StreamClosed(Exception):
    """The server closed the stream (or the connection went)."""


class _ConnectionLost(Exception):
    """A send on the transport failed or stalled: the connection is being torn down."""


class _Stream:
    """One stream of a connection: ids, the OKAY the next WRTE waits for, and the data the
    server wrote that the service has not taken yet."""

    def __init__(self, conn: _Connection, local_id: int, remote_id: int, consume: bool) -> None:
        self.conn = conn
        self.local_id = local_id
        self.remote_id = remote_id
        self.consume = consume  # False: the service reads nothing; writes are acked and dropped
        self.scope = trio.CancelScope()
        self.closed = False
        self._okay: trio.Event | None = None
        # The server writes one WRTE and waits for our OKAY: one slot is all it may use.
        self._inbox_send, self._inbox = trio.open_memory_channel[bytes](1)

    # --- called by the connection's read loop

    def on_okay(self) -> None:
        if self._okay is not None:
            self._okay.set()

    def on_write(self, data: bytes) -> None:
        """Queue the server's data; `AdbTransportError` if it wrote again before our OKAY."""
        try:
            self._inbox_send.send_nowait(data)
        except trio.WouldBlock:
            raise AdbTransportError(
                f"WRTE on stream {self.local_id} before the OKAY of the last one"
            ) from None
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the service stopped reading: the data has nowhere to go

    def on_close(self) -> None:
        self.closed = True
        self._inbox_send.close()
        if self._okay is not None:
            self._okay.set()
        self.scope.cancel()

    # --- used by the service

    async def write(self, data: bytes) -> None:
        """Send ``data`` in WRTEs of at most the server's maxdata, each after the OKAY of the
        last one. `_StreamClosed` once the server closed the stream."""
        step = self.conn.max_data
        view = memoryview(data)
        for start in range(0, len(view), step):
            if self.closed:
                raise _StreamClosed
            okay = self._okay = trio.Event()
            await self.conn.send(
                A_WRTE, self.local_id, self.remote_id, bytes(view[start : start + step])
            )
            try:
                with trio.fail_after(self.conn.device.okay_timeout):
                    await okay.wait()
            except trio.TooSlowError:
                self.conn.abort(
                    f"no OKAY for a WRTE on stream {self.local_id} within "
                    f"{self.conn.device.okay_timeout:g} s",
                    stalled=True,
                )
                raise _ConnectionLost from None
            finally:
                self._okay = None
            if self.closed:
                raise _StreamClosed

    async def receive(self) -> bytes:
        """The next data the server wrote (call `ack` once it is consumed); `_StreamClosed`
        when the server closed the stream."""
        try:
            return await self._inbox.receive()
        except trio.EndOfChannel:
            raise _StreamClosed from None

    async def ack(self) -> None:
        if not self.closed:
            await self.conn.send(A_OKAY, self.local_id, self.remote_id)

    async def close(self) -> None:
        """Send CLSE unless the stream is closed already (never raises)."""
        if self.closed:
            return
        self.closed = True
        self._inbox_send.close()
        with trio.CancelScope(shield=True), contextlib.suppress(_ConnectionLost):
            await self.conn.send(A_CLSE, self.local_id, self.remote_id)


class _Connection:
    """One server connection: the handshake, the read loop, the streams and their services."""

    def __init__(self, device: DeviceHost, tcp: trio.SocketStream) -> None:
        self.device = device
        self.tcp = tcp
        self.max_data = MAX_PAYLOAD  # what we may send: min(ours, the server's maxdata)
        self.streams: dict[int, _Stream] = {}
        self.remote_ids: set[int] = set()
        self._decoder = MessageDecoder(MAX_PAYLOAD)
        self._send_lock = trio.StrictFIFOLock()
        self._next_id = 1
        self._nursery: trio.Nursery | None = None
        self._broken = False
        self.problem: str | None = None

    # --- sending

    async def send(self, command: int, arg0: int, arg1: int, data: bytes = b"") -> None:
        """One whole message; a failed or stalled send tears the connection down and raises
        `_ConnectionLost`."""
        if self._broken:
            raise _ConnectionLost
        payload = encode_message(command, arg0, arg1, data)
        try:
            async with self._send_lock:
                with trio.fail_after(self.device.send_timeout):
                    await self.tcp.send_all(payload)
        except trio.TooSlowError:
            self.abort(
                f"the server took more than {self.device.send_timeout:g} s to take a "
                f"{COMMANDS[command]}",
                stalled=True,
            )
            raise _ConnectionLost from None
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            self.abort(None)
            raise _ConnectionLost from None

    def abort(self, problem: str | None, *, stalled: bool = False, bad: bool = False) -> None:
        """Tear the connection down (from any task): record why, cancel everything on it."""
        if not self._broken:
            self._broken = True
            if problem is not None:
                self.problem = problem
                stats = self.device.counters
                stats.last_problem = problem
                if stalled:
                    stats.stalled += 1
                if bad:
                    stats.bad_input += 1
                logger.info("adbd.connection_closed", problem=problem)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    # --- receiving

    async def _receive_message(self, idle_timeout: float | None) -> Message | None:
        """The next message; None when the server closed the connection between messages.
        Waits up to ``idle_timeout`` for its first byte (None: no limit), then at most
        ``message_timeout`` for the rest."""
        decoder = self._decoder
        while True:
            message = decoder.next_message()
            if message is not None:
                return message
            timeout = self.device.message_timeout if decoder.buffered else idle_timeout
            with trio.fail_after(timeout) if timeout is not None else trio.CancelScope():
                data = await self.tcp.receive_some(65536)
            if not data:
                if decoder.buffered:
                    raise AdbTransportError("the server closed the connection mid-message")
                return None
            decoder.receive_data(data)

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                try:
                    await self._serve()
                except AdbTransportError as exc:
                    self.abort(str(exc), bad=True)
                except trio.TooSlowError:
                    self.abort("the server stalled (a deadline ran out)", stalled=True)
                except (
                    _ConnectionLost,
                    trio.BrokenResourceError,
                    trio.ClosedResourceError,
                    OSError,
                ):
                    self.abort(None)
                finally:
                    # Nothing more goes out: the services' CLSEs would go nowhere.
                    self._broken = True
                    nursery.cancel_scope.cancel()
        finally:
            self.streams.clear()
            self.remote_ids.clear()

    async def _serve(self) -> None:
        device = self.device
        first = await self._receive_message(device.handshake_timeout)
        if first is None:
            return
        if first.command != A_CNXN:
            raise AdbTransportError(f"expected CNXN first, got {first.name}")
        version, maxdata = first.arg0, first.arg1
        if version < A_VERSION:
            raise AdbTransportError(f"CNXN version 0x{version:08x} is older than 0x{A_VERSION:08x}")
        if maxdata < MIN_PAYLOAD:
            raise AdbTransportError(f"CNXN maxdata {maxdata} is under {MIN_PAYLOAD}")
        if not first.data.startswith(b"host:"):
            raise AdbTransportError(f"CNXN banner {first.data[:40]!r} is not a host's")
        self.max_data = min(maxdata, MAX_PAYLOAD)
        await self.send(A_CNXN, A_VERSION, MAX_PAYLOAD, device.banner)
        device.counters.online += 1
        try:
            while True:
                message = await self._receive_message(None)
                if message is None:
                    return
                await self._dispatch(message)
        finally:
            device.counters.online -= 1

    async def _dispatch(self, m: Message) -> None:
        if m.command == A_OPEN:
            if m.arg0 == 0 or m.arg1 != 0:
                raise AdbTransportError(f"OPEN({m.arg0}, {m.arg1}): expected OPEN(id, 0)")
            if m.arg0 in self.remote_ids:
                raise AdbTransportError(f"OPEN reuses the server's stream id {m.arg0}")
            await self._open(m.arg0, m.data)
        elif m.command == A_OKAY:
            stream = self.streams.get(m.arg1)
            if stream is not None and stream.remote_id == m.arg0:
                stream.on_okay()
        elif m.command == A_WRTE:
            stream = self.streams.get(m.arg1)
            if stream is None or stream.remote_id != m.arg0 or stream.closed:
                return  # a write racing our CLSE: adbd drops it too
            if stream.consume:
                stream.on_write(m.data)
            else:
                await self.send(A_OKAY, stream.local_id, stream.remote_id)
        elif m.command == A_CLSE:
            stream = self.streams.get(m.arg1)
            if stream is not None and m.arg0 in (0, stream.remote_id):
                self._forget(stream)
                stream.on_close()
        else:
            raise AdbTransportError(f"{m.name} after the connection is up")

    def _forget(self, stream: _Stream) -> None:
        self.streams.pop(stream.local_id, None)
        self.remote_ids.discard(stream.remote_id)

    def _new_id(self) -> int:
        while True:
            local_id = self._next_id
            self._next_id = (self._next_id % _U32) + 1
            if local_id not in self.streams:
                return local_id

    async def _open(self, remote_id: int, raw: bytes) -> None:
        device = self.device
        try:
            service = raw.rstrip(b"\0").decode("utf-8")
        except UnicodeDecodeError:
            service = ""
        if len(self.streams) >= device.max_streams:
            service = ""  # refuse: too many streams on this connection
        plan = device.plan(service)
        if plan is None:
            device.counters.refused += 1
            logger.debug("adbd.refused", service=service[:80])
            await self.send(A_CLSE, 0, remote_id)
            return
        kind, handler, relay_pid = plan
        stream = _Stream(self, self._new_id(), remote_id, consume=relay_pid is not None)
        self.streams[stream.local_id] = stream
        self.remote_ids.add(remote_id)
        if relay_pid is not None:
            # Claimed before the OKAY goes out: a second OPEN right behind this one is
            # dropped, as the VM keeps only its first debugger.
            device.claim_relay(relay_pid, stream)
        device.counters.services[kind] += 1
        await self.send(A_OKAY, stream.local_id, remote_id)
        assert self._nursery is not None
        self._nursery.start_soon(self._run_service, stream, handler)

    async def _run_service(self, stream: _Stream, handler: _Handler) -> None:
        try:
            with stream.scope:
                await handler(stream)
        except (_StreamClosed, _ConnectionLost):
            pass
        finally:
            await stream.close()
            self._forget(stream)


#: A service: runs on an accepted stream; the stream is closed when it returns.
_Handler = Callable[[_Stream], Awaitable[None]]
