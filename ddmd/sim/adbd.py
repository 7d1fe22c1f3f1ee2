"""`FakeDevice`: a stand-in for a phone's adbd that the REAL adb server adopts, for tests and
benchmarks (``adb -P SERVERPORT connect 127.0.0.1:DEVPORT``; the device then shows as
``127.0.0.1:DEVPORT<TAB>device``).

    device = FakeDevice({4242: ("127.0.0.1", sim.port)})
    port = await nursery.start(device.serve)      # 127.0.0.1, a free port
    ... adb -P 5637 connect 127.0.0.1:{port} ...
    device.add_pid(4243, "127.0.0.1", jvm_port)   # track-jdwp streams get the new list
    device.remove_pid(4242)                       # ... and its open jdwp streams close
    device.log(records)                           # logcat -B records, to every logcat stream

Command line: ``python -m ddmd.sim.adbd --port 5599 --pid 4242=127.0.0.1:8000 [--pid ...]
[--logcat FILE] [--adb-port 5637 [--adb adb]]``; it prints one line naming the serial once
ready. FILE holds ``logcat -B`` output (``adb exec-out logcat -B -d > FILE``): the log ring.

The transport protocol (adb's ``protocol.txt``): every message is a 24-byte little-endian
header (command, arg0, arg1, data length, data check = the sum of the payload bytes, magic =
command ^ 0xffffffff) and the payload. The server opens with ``CNXN``; the device answers
``CNXN`` version 0x01000000, maxdata 256 KiB and its banner (no ``AUTH``: an unlocked,
``ro.adb.secure=0`` device). Streams: the server sends ``OPEN(its id, 0, "service\\0")``; the
device accepts with ``OKAY(our id, its id)`` or refuses with ``CLSE(0, its id)``; then
``WRTE`` both ways, each answered ``OKAY`` before the writer sends the next one on that
stream; ``CLSE`` ends it. The banner carries no ``shell_v2`` feature, so ``adb shell`` sends
the plain ``shell:`` service.

Device services, as a real ART device answers them (docs adb-front.md section 1):

* ``jdwp``: the pid list ``pid\\n...`` unframed, then close (``adb jdwp``);
* ``track-jdwp``: the list framed by 4 hex digits of length, now and on every change;
* ``jdwp:PID``: ``OKAY`` at once, then the stream is relayed byte for byte to the TCP address
  of that pid (a HotSpot JVM's JDWP agent, a ``ddmd sim`` VM); a failed connect closes the
  stream (the client sees ``OKAY`` then EOF). An unknown pid is refused before accepting
  (the client sees ``FAIL0006closed``). A second ``jdwp:PID`` while one stream to that pid
  is open is accepted and dropped at once, as ART's adbconnection does ("Ignoring second
  debugger. Accept then drop!"): ``OKAY`` then EOF;
* ``shell:CMD`` and ``exec:CMD`` (a raw pipe on a real device): ``echo``, ``getprop [KEY]``,
  ``ps``; anything else prints ``/system/bin/sh: CMD: not found``; then close;
* ``shell:logcat ARGS`` / ``exec:logcat ARGS``: the device's log in logcat's binary format
  (``-B``; without it one line says so): the ring first (all of it, or ``-T N`` records, or
  ``-T SEC.FRACTION`` onwards), then every record logged later (`FakeDevice.log`,
  `FakeDevice.replay`), until the stream closes; ``-d`` / ``-t`` print the ring and exit
  (`LogcatOptions`). ``-b`` and filters are ignored;
* anything else is refused (``CLSE`` at once).

The log: ``FakeDevice(logcat=BACKLOG)`` or `FakeDevice.set_log` fill the ring (whole records,
the oldest dropped past ``log_ring_bytes``); ``device.log(records)`` appends and sends to every
open logcat stream (bytes that are not records, ``b"garbage"``, go out as they are); ``await
device.replay(records, lines_per_second=20_000, loop=True)`` logs a batch per tick and waits
while a stream is over a high-water mark (the adb flow control reaches back to it). A stream
more than ``log_follower_bytes`` behind is closed (logd drops a reader that cannot keep up).

Input from the server is untrusted: a bad header (magic, unknown command, a payload over
256 KiB, a wrong data check), a message out of place, or a server that stalls in the middle
of a message, on a send, or on the ``OKAY`` of a write closes that connection (and every
relay on it), never the device. Waits that are idle by nature have no deadline: between two
messages of a connected server (a real phone's transport idles for hours), and a relay
waiting for a debugger or a VM to say something.

Layer: the simulator; imports trio, structlog and the standard library only (nothing of the
daemon).
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import struct
import sys
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Final

import structlog
import trio

__all__ = [
    "A_CLSE",
    "A_CNXN",
    "A_OKAY",
    "A_OPEN",
    "A_VERSION",
    "A_WRTE",
    "COMMANDS",
    "DEFAULT_PROPERTIES",
    "HEADER_SIZE",
    "MAX_PAYLOAD",
    "AdbTransportError",
    "DeviceStatistics",
    "FakeDevice",
    "LogcatOptions",
    "Message",
    "MessageDecoder",
    "banner",
    "checksum",
    "decode_header",
    "encode_message",
    "main",
    "parse_logcat_args",
    "shell_output",
    "split_log_records",
]

logger = structlog.get_logger()

# --------------------------------------------------------------------------------------------
# The transport protocol, sans-IO


def _command(name: bytes) -> int:
    return int.from_bytes(name, "little")


A_SYNC: Final = _command(b"SYNC")
A_CNXN: Final = _command(b"CNXN")
A_AUTH: Final = _command(b"AUTH")
A_OPEN: Final = _command(b"OPEN")
A_OKAY: Final = _command(b"OKAY")
A_CLSE: Final = _command(b"CLSE")
A_WRTE: Final = _command(b"WRTE")
A_STLS: Final = _command(b"STLS")
#: Every command adb has defined, by value (names for messages and errors).
COMMANDS: Final = {
    A_SYNC: "SYNC",
    A_CNXN: "CNXN",
    A_AUTH: "AUTH",
    A_OPEN: "OPEN",
    A_OKAY: "OKAY",
    A_CLSE: "CLSE",
    A_WRTE: "WRTE",
    A_STLS: "STLS",
}

#: The version this device speaks: the one before A_VERSION_SKIP_CHECKSUM, so both sides
#: fill in the data check.
A_VERSION: Final = 0x01000000
#: The largest payload this device sends or accepts (adb's MAX_PAYLOAD_V2).
MAX_PAYLOAD: Final = 256 * 1024
#: The smallest maxdata a server may announce (adb's MAX_PAYLOAD_V1).
MIN_PAYLOAD: Final = 4096
HEADER_SIZE: Final = 24
_HEADER: Final = struct.Struct("<6I")
_U32: Final = 0xFFFFFFFF


class AdbTransportError(Exception):
    """Bytes from the server that are not adb's transport protocol, or a message out of place."""


@dataclass(frozen=True, slots=True)
class Message:
    """One transport message: the command, its two arguments and the payload."""

    command: int
    arg0: int
    arg1: int
    data: bytes = b""

    @property
    def name(self) -> str:
        return COMMANDS.get(self.command, f"0x{self.command:08x}")


def checksum(data: bytes | bytearray | memoryview) -> int:
    """adb's "data_crc32": really the sum of the payload's bytes (mod 2**32)."""
    return sum(data) & _U32


def encode_message(command: int, arg0: int, arg1: int, data: bytes = b"") -> bytes:
    """A whole message: the 24-byte header, then ``data``."""
    return (
        _HEADER.pack(command, arg0 & _U32, arg1 & _U32, len(data), checksum(data), command ^ _U32)
        + data
    )


def decode_header(raw: bytes, *, max_data: int = MAX_PAYLOAD) -> tuple[int, int, int, int, int]:
    """``(command, arg0, arg1, data_length, data_check)`` of a 24-byte header.

    `AdbTransportError` when the magic is not the command's complement, the command is not
    one adb defines, or the payload would be longer than ``max_data``.
    """
    if len(raw) != HEADER_SIZE:
        raise AdbTransportError(f"a header is {HEADER_SIZE} bytes, not {len(raw)}")
    command, arg0, arg1, length, check, magic = _HEADER.unpack(raw)
    if magic != command ^ _U32:
        raise AdbTransportError(f"bad magic 0x{magic:08x} for command 0x{command:08x}")
    if command not in COMMANDS:
        raise AdbTransportError(f"unknown command 0x{command:08x}")
    if length > max_data:
        raise AdbTransportError(
            f"{COMMANDS[command]} payload of {length} bytes is over the {max_data} allowed"
        )
    return command, arg0, arg1, length, check


class MessageDecoder:
    """Messages out of a byte stream fed in any pieces: `receive_data`, then `next_message`
    until it returns None. A data check of 0 is accepted (a peer that skips checksums);
    any other value must be the payload's sum."""

    __slots__ = ("_buffer", "_header", "max_data")

    def __init__(self, max_data: int = MAX_PAYLOAD) -> None:
        self.max_data = max_data
        self._buffer = bytearray()
        self._header: tuple[int, int, int, int, int] | None = None

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        self._buffer += data

    @property
    def buffered(self) -> int:
        """Bytes of a message begun and not yet whole (0: between messages)."""
        return len(self._buffer)

    def next_message(self) -> Message | None:
        """The next whole message, or None until more bytes arrive; `AdbTransportError` for
        bytes that are not a message (the stream is then unusable)."""
        buffer = self._buffer
        if self._header is None:
            if len(buffer) < HEADER_SIZE:
                return None
            self._header = decode_header(bytes(buffer[:HEADER_SIZE]), max_data=self.max_data)
            del buffer[:HEADER_SIZE]
        command, arg0, arg1, length, check = self._header
        if len(buffer) < length:
            return None
        data = bytes(buffer[:length])
        del buffer[:length]
        self._header = None
        if check != 0 and check != checksum(data):
            raise AdbTransportError(
                f"{COMMANDS[command]} data check 0x{check:08x} is not the payload's sum "
                f"0x{checksum(data):08x}"
            )
        return Message(command, arg0, arg1, data)


# --------------------------------------------------------------------------------------------
# What the device says about itself

DEFAULT_PROPERTIES: Final[Mapping[str, str]] = {
    "ro.build.version.sdk": "30",
    "ro.build.version.release": "11",
    "ro.build.type": "userdebug",
    "ro.debuggable": "1",
    "ro.product.name": "ddmdsim",
    "ro.product.model": "ddmd_sim",
    "ro.product.device": "ddmdsim",
    "ro.product.manufacturer": "ddmd",
    "ro.product.cpu.abi": "x86_64",
    "ro.product.cpu.abilist": "x86_64,x86",
    "ro.serialno": "ddmdsim0001",
    "ro.kernel.qemu": "0",
    "ro.secure": "0",
    "ro.adb.secure": "0",
    "persist.sys.timezone": "UTC",
}


def banner(properties: Mapping[str, str], features: Iterable[str]) -> bytes:
    """The CNXN payload: ``device::ro.product.name=..;ro.product.model=..;
    ro.product.device=..;features=a,b`` (what the server parses into ``devices -l``)."""
    keys = ("ro.product.name", "ro.product.model", "ro.product.device")
    props = [f"{k}={properties[k]}" for k in keys if k in properties]
    props.append("features=" + ",".join(features))
    return ("device::" + ";".join(props)).encode()


@dataclass(slots=True)
class DeviceStatistics:
    """Counters of one `FakeDevice` since it was made."""

    port: int | None = None
    connections: int = 0  # TCP connections from a server
    online: int = 0  # connections open now that finished the CNXN exchange
    bad_input: int = 0  # connections closed for bytes that are not the protocol
    stalled: int = 0  # connections closed because the server stalled (a deadline ran out)
    last_problem: str | None = None
    services: Counter[str] = field(default_factory=Counter)  # accepted, by kind
    refused: int = 0  # OPENs answered CLSE(0, id)
    dropped: int = 0  # jdwp:PID accepted and dropped (a stream to the pid was open)
    connect_failed: int = 0  # jdwp:PID accepted, the pid's TCP connect failed
    bytes_to_vm: int = 0
    bytes_from_vm: int = 0
    log_records: int = 0  # records logged (set_log, log, replay) since the device was made
    log_followers: int = 0  # logcat streams following the log now
    log_overflows: int = 0  # followers closed because they fell too far behind


# --------------------------------------------------------------------------------------------
# The device's log (logcat -B)

_LOG_PREFIX: Final = struct.Struct("<HH")
_LOG_STAMP: Final = struct.Struct("<II")  # sec, nsec at offset 12 of every header version
_LOGCAT_PROGRAMS: Final = frozenset({"logcat", "/system/bin/logcat"})
#: logcat's one-letter options that take a value (besides -t and -T).
_LOGCAT_VALUED: Final = frozenset("bvefGnrmP")


def split_log_records(data: bytes) -> list[bytes]:
    """``data`` (logcat -B output) cut into records by their headers (``len`` and
    ``hdr_size``, 0 meaning 20). Bytes that do not make a whole record (garbage, a cut tail)
    are kept as one last piece, so nothing is lost."""
    out: list[bytes] = []
    pos, end = 0, len(data)
    while pos < end:
        if end - pos < _LOG_PREFIX.size:
            out.append(data[pos:])
            break
        length, hdr_size = _LOG_PREFIX.unpack_from(data, pos)
        size = (hdr_size or 20) + length
        if (hdr_size not in (0, 20) and hdr_size < 24) or pos + size > end:
            out.append(data[pos:])
            break
        out.append(data[pos : pos + size])
        pos += size
    return out


def _whole_record(piece: bytes) -> bool:
    """Whether ``piece`` is exactly one record by its header (as `split_log_records` cuts)."""
    if len(piece) < _LOG_PREFIX.size:
        return False
    length: int
    hdr_size: int
    length, hdr_size = _LOG_PREFIX.unpack_from(piece, 0)
    if hdr_size not in (0, 20) and hdr_size < 24:
        return False
    return (hdr_size or 20) + length == len(piece) and length > 0


def _stamp(record: bytes) -> tuple[int, int] | None:
    """(sec, nsec) of a record; None for bytes too short to be one."""
    if len(record) < 20:
        return None
    sec, nsec = _LOG_STAMP.unpack_from(record, 12)
    return sec, nsec


@dataclass(frozen=True, slots=True)
class LogcatOptions:
    """What the fake ``logcat`` does with its arguments: ``-B`` (binary), ``-d`` (dump the
    ring and exit), ``-t N|TIME`` (the last N records, or those since TIME, and exit), ``-T
    N|TIME`` (the same, then follow). TIME is seconds since the Epoch with a fraction
    (``1700000000.250000000``), logcat's ``sssss.mmm`` form. ``-b``, ``-v``, ``-s`` and
    filter specs are accepted and ignored: the stream carries whatever was logged."""

    binary: bool = False
    dump: bool = False
    tail: int | None = None
    since: tuple[int, int] | None = None


def parse_logcat_args(args: list[str]) -> LogcatOptions:
    """`LogcatOptions` of ``args``; ValueError (logcat's own complaint) for a bad ``-t``/``-T``
    value or a missing option argument."""
    binary = dump = False
    tail: int | None = None
    since: tuple[int, int] | None = None
    words = iter(args)
    for word in words:
        if word.startswith("--"):
            name = word[2:].partition("=")[0]
            binary = binary or name == "binary"
            dump = dump or name == "dump"
            continue
        if not word.startswith("-") or len(word) < 2:
            continue  # a filter spec
        flags = word[1:]
        for i, flag in enumerate(flags):
            if flag in "tT":
                value = flags[i + 1 :] or next(words, None)
                if value is None:
                    raise ValueError(f"logcat: option requires an argument -- '{flag}'")
                tail, since = _tail_or_since(value)
                dump = dump or flag == "t"
                break
            if flag in _LOGCAT_VALUED:
                if i == len(flags) - 1:
                    next(words, None)  # its value is the next word
                break  # the rest of this word is its value
            binary = binary or flag == "B"
            dump = dump or flag == "d"
    return LogcatOptions(binary, dump, tail, since)


def _tail_or_since(value: str) -> tuple[int | None, tuple[int, int] | None]:
    whole, dot, fraction = value.partition(".")
    if whole.isdigit() and not dot:
        return int(whole), None
    if whole.isdigit() and fraction.isdigit() and len(fraction) <= 9:
        return None, (int(whole), int(fraction.ljust(9, "0")))
    raise ValueError(f"logcat: -t/-T {value!r}: expected a count or seconds.fraction")


class _LogFollower:
    """One ``logcat`` stream following the log: what was logged since it last took."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.pending = bytearray()
        self.overflowed = False
        self._wake = trio.Event()

    def push(self, data: bytes) -> bool:
        """Queue ``data``; False (and overflowed) once more than ``limit`` bytes wait."""
        if self.overflowed:
            return False
        if len(self.pending) + len(data) > self.limit:
            self.overflowed = True
            self.pending.clear()
        else:
            self.pending += data
        self._wake.set()
        return not self.overflowed

    def take(self) -> bytes:
        data = bytes(self.pending)
        self.pending.clear()
        return data

    async def wait(self) -> None:
        if not self.pending and not self.overflowed:
            self._wake = trio.Event()
            await self._wake.wait()


class _DeviceLog:
    """The device's log ring (whole records, the oldest dropped past ``ring_bytes``, never the
    last one) and the streams that follow it."""

    def __init__(self, stats: DeviceStatistics, ring_bytes: int, follower_bytes: int) -> None:
        self._stats = stats
        self.ring_bytes = ring_bytes
        self.follower_bytes = follower_bytes
        self._ring: deque[tuple[tuple[int, int] | None, bytes]] = deque()
        self._size = 0
        self.followers: set[_LogFollower] = set()
        self._drained = trio.Event()

    def contents(self) -> bytes:
        return b"".join(record for _, record in self._ring)

    def set(self, data: bytes) -> None:
        self._ring.clear()
        self._size = 0
        self._keep(split_log_records(data))

    def append(self, records: list[bytes]) -> None:
        """Add ``records`` to the ring and queue them for every follower. Bytes that are not a
        whole record (garbage, a cut tail) go to the open streams only: logd's ring holds
        records, so a stream opened later never gets them."""
        if not records:
            return
        self._keep([r for r in records if _whole_record(r)])
        data = b"".join(records)
        for follower in list(self.followers):
            if not follower.push(data):
                self._stats.log_overflows += 1
                self.followers.discard(follower)

    def _keep(self, records: list[bytes]) -> None:
        ring = self._ring
        for record in records:
            ring.append((_stamp(record), record))
            self._size += len(record)
        self._stats.log_records += len(records)
        while self._size > self.ring_bytes and len(ring) > 1:
            self._size -= len(ring.popleft()[1])

    def select(self, tail: int | None, since: tuple[int, int] | None) -> bytes:
        """The ring, or its last ``tail`` records, or those stamped ``since`` or later
        (bytes without a stamp always pass)."""
        ring: list[tuple[tuple[int, int] | None, bytes]] = list(self._ring)
        if tail is not None:
            ring = ring[len(ring) - tail :] if tail else []
        if since is not None:
            ring = [(stamp, r) for stamp, r in ring if stamp is None or stamp >= since]
        return b"".join(record for _, record in ring)

    def follow(self) -> _LogFollower:
        follower = _LogFollower(self.follower_bytes)
        self.followers.add(follower)
        return follower

    def taken(self) -> None:
        """A follower took its queue: wake `wait_drained`."""
        self._drained.set()

    async def wait_drained(self, high_water: int) -> bool:
        """Until no follower has more than ``high_water`` bytes queued; whether it waited."""
        waited = False
        while any(len(f.pending) > high_water for f in self.followers):
            waited = True
            self._drained = trio.Event()
            await self._drained.wait()
        return waited


# --------------------------------------------------------------------------------------------
# The device


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

    def __init__(self, device: FakeDevice, tcp: trio.SocketStream) -> None:
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
                stats = self.device._stats
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
        device._stats.online += 1
        try:
            while True:
                message = await self._receive_message(None)
                if message is None:
                    return
                await self._dispatch(message)
        finally:
            device._stats.online -= 1

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
        plan = device._plan(service)
        if plan is None:
            device._stats.refused += 1
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
            device._relays.setdefault(relay_pid, set()).add(stream)
        device._stats.services[kind] += 1
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


class FakeDevice:
    """A fake adbd on a TCP port: the real adb server adopts it with ``adb connect``.

    ``pids`` maps each debuggable pid to the TCP address its ``jdwp:PID`` stream is relayed
    to. ``properties`` is the ``getprop`` table (`DEFAULT_PROPERTIES` by default; the banner
    takes ro.product.name/model/device from it); ``features`` the banner's feature list.
    The timeouts are in seconds; see the module docstring for which waits have none.
    """

    def __init__(
        self,
        pids: Mapping[int, tuple[str, int]] | None = None,
        *,
        properties: Mapping[str, str] | None = None,
        features: Iterable[str] = ("cmd",),
        process_names: Mapping[int, str] | None = None,
        handshake_timeout: float = 10.0,
        message_timeout: float = 10.0,
        send_timeout: float = 10.0,
        okay_timeout: float = 60.0,
        connect_timeout: float = 5.0,
        max_streams: int = 512,
        logcat: bytes = b"",
        log_ring_bytes: int = 4 << 20,
        log_follower_bytes: int = 16 << 20,
    ) -> None:
        self.pids: dict[int, tuple[str, int]] = {}
        self.process_names: dict[int, str] = dict(process_names or {})
        self.properties: dict[str, str] = dict(
            DEFAULT_PROPERTIES if properties is None else properties
        )
        self.features = tuple(features)
        self.banner = banner(self.properties, self.features)
        self.handshake_timeout = handshake_timeout
        self.message_timeout = message_timeout
        self.send_timeout = send_timeout
        self.okay_timeout = okay_timeout
        self.connect_timeout = connect_timeout
        self.max_streams = max_streams
        self._stats = DeviceStatistics()
        self._changed = trio.Event()
        self._relays: dict[int, set[_Stream]] = {}
        self._port: int | None = None
        self._log = _DeviceLog(self._stats, log_ring_bytes, log_follower_bytes)
        self._log.set(logcat)
        for pid, (host, port) in (pids or {}).items():
            self.add_pid(pid, host, port)

    # ----------------------------------------------------------------------------- public API

    @property
    def port(self) -> int | None:
        """The listening port once `serve` reported it."""
        return self._port

    def add_pid(self, pid: int, host: str, port: int, *, name: str | None = None) -> None:
        """Make ``pid`` debuggable: ``jdwp:PID`` is relayed to ``host:port``; track-jdwp
        streams get the new list. ``name`` is its name in ``ps`` (default ``app.PID``)."""
        if not 0 < pid <= 0x7FFFFFFF:
            raise ValueError(f"pid {pid} is outside 1..{0x7FFFFFFF}")
        if not 0 < port <= 0xFFFF:
            raise ValueError(f"port {port} is outside 1..65535")
        self.pids[pid] = (host, port)
        if name is not None:
            self.process_names[pid] = name
        self._notify()

    def remove_pid(self, pid: int, *, close_streams: bool = True) -> None:
        """The process is gone: track-jdwp streams get the new list, and its open ``jdwp:PID``
        streams close (unless ``close_streams=False``)."""
        self.pids.pop(pid, None)
        if close_streams:
            for stream in list(self._relays.get(pid, ())):
                stream.scope.cancel()
        self._notify()

    def statistics(self) -> DeviceStatistics:
        """A copy of the counters."""
        s = self._stats
        return DeviceStatistics(
            port=self._port,
            connections=s.connections,
            online=s.online,
            bad_input=s.bad_input,
            stalled=s.stalled,
            last_problem=s.last_problem,
            services=Counter(s.services),
            refused=s.refused,
            dropped=s.dropped,
            connect_failed=s.connect_failed,
            bytes_to_vm=s.bytes_to_vm,
            bytes_from_vm=s.bytes_from_vm,
            log_records=s.log_records,
            log_followers=len(self._log.followers),
            log_overflows=s.log_overflows,
        )

    # --- the log (logcat)

    @property
    def log_contents(self) -> bytes:
        """The log ring now: what ``logcat -B -d`` prints."""
        return self._log.contents()

    def set_log(self, backlog: bytes) -> None:
        """Replace the log ring with ``backlog`` (logcat -B records); open logcat streams
        get nothing of it."""
        self._log.set(backlog)

    def log(self, records: bytes) -> None:
        """Append ``records`` (logcat -B bytes, whole records or not: ``b"garbage"`` goes out
        as is) to the ring and send them to every open logcat stream. A stream that falls more
        than ``log_follower_bytes`` behind is closed, as logd drops a reader that cannot keep
        up."""
        if records:
            self._log.append(split_log_records(records))

    async def replay(
        self,
        records: bytes | Sequence[bytes],
        *,
        lines_per_second: float,
        loop: bool = False,
        tick: float = 0.01,
        high_water: int = 1 << 20,
    ) -> int:
        """`log` ``records`` (bytes cut by `split_log_records`, or a sequence of records) at
        ``lines_per_second``, one batch per ``tick`` seconds (the first at once); forever with
        ``loop``. A late timer is caught up on the next batch; but while a logcat stream has
        more than ``high_water`` bytes queued the replay waits (the adb flow control reaches
        back to it) and that time is not caught up. Returns the number of records logged
        (when not looping)."""
        if lines_per_second <= 0 or tick <= 0:
            raise ValueError("lines_per_second and tick must be positive")
        items = split_log_records(records) if isinstance(records, bytes) else list(records)
        if not items:
            return 0
        sent = index = 0
        owed = lines_per_second * tick
        last = trio.current_time()
        while True:
            count = int(owed + 1e-9)
            owed -= count
            batch: list[bytes] = []
            while count > 0:
                take = items[index : index + count]
                batch += take
                count -= len(take)
                index += len(take)
                if index == len(items):
                    if not loop:
                        break
                    index = 0
            self._log.append(batch)
            sent += len(batch)
            if not loop and index == len(items):
                return sent
            if await self._log.wait_drained(high_water):
                last = trio.current_time()
            await trio.sleep(tick)
            now = trio.current_time()
            owed += lines_per_second * (now - last)
            last = now

    def open_jdwp_streams(self, pid: int) -> int:
        """How many ``jdwp:PID`` relays to ``pid`` are open now."""
        return len(self._relays.get(pid, ()))

    async def serve(
        self,
        port: int = 0,
        *,
        host: str = "127.0.0.1",
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen on ``host:port`` (0: a free port) and serve every server that connects,
        until cancelled. Reports the bound port with ``task_status.started(port)``."""
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()[1]
        self._port = bound
        logger.info("adbd.listening", port=bound)
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._handle, listeners)
            task_status.started(bound)

    # ----------------------------------------------------------------------------- internals

    def _notify(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    def _pid_list(self) -> bytes:
        return b"".join(b"%d\n" % pid for pid in sorted(self.pids))

    async def _handle(self, tcp: trio.SocketStream) -> None:
        self._stats.connections += 1
        async with tcp:
            await _Connection(self, tcp).run()

    def _plan(self, service: str) -> tuple[str, _Handler, int | None] | None:
        """(kind, handler, the pid of a jdwp relay) for a service to accept; None to refuse."""
        if service == "jdwp":
            return "jdwp", self._serve_jdwp_list, None
        if service == "track-jdwp":
            return "track-jdwp", self._serve_track_jdwp, None
        if service.startswith("jdwp:"):
            text = service[5:]
            pid = int(text) if text.isdigit() and len(text) <= 10 else None
            if pid is None or pid not in self.pids:
                return None  # closed before accepting: the client sees FAIL0006closed
            if self._relays.get(pid):
                self._stats.dropped += 1
                return "jdwp-dropped", self._drop, None
            return "jdwp-relay", partial(self._relay, pid=pid), pid
        kind, colon, command = service.partition(":")
        if colon and kind in ("shell", "exec"):
            words = _words(command)
            if words and words[0] in _LOGCAT_PROGRAMS:
                return "logcat", partial(self._serve_logcat, args=words[1:]), None
            return kind, partial(self._serve_shell, command=command), None
        return None

    async def _serve_jdwp_list(self, stream: _Stream) -> None:
        pids = self._pid_list()
        if pids:
            await stream.write(pids)

    async def _serve_track_jdwp(self, stream: _Stream) -> None:
        sent: bytes | None = None
        while True:
            changed = self._changed
            pids = self._pid_list()
            if pids != sent:
                await stream.write(b"%04x" % len(pids) + pids)
                sent = pids
            await changed.wait()

    async def _drop(self, stream: _Stream) -> None:
        return  # accepted; the stream closes now ("Accept then drop!")

    async def _serve_shell(self, stream: _Stream, *, command: str) -> None:
        out = shell_output(command, self.properties, self.pids, self.process_names)
        if out:
            await stream.write(out)

    async def _serve_logcat(self, stream: _Stream, *, args: list[str]) -> None:
        """``logcat ARGS``: see `LogcatOptions`. Without ``-B`` it says it serves binary
        only and exits (ddmd always asks for binary)."""
        try:
            options = parse_logcat_args(args)
        except ValueError as exc:
            await stream.write(f"{exc}\n".encode())
            return
        if not options.binary:
            await stream.write(b"logcat: this fake device only serves the binary format: add -B\n")
            return
        log = self._log
        if options.dump:
            backlog = log.select(options.tail, options.since)
            if backlog:
                await stream.write(backlog)
            return
        # Snapshot and registration with no await between: nothing logged is missed.
        backlog = log.select(options.tail, options.since)
        follower = log.follow()
        try:
            if backlog:
                await stream.write(backlog)
            while True:
                data = follower.take()
                log.taken()
                if data:
                    await stream.write(data)
                elif follower.overflowed:
                    return
                else:
                    await follower.wait()
        finally:
            log.followers.discard(follower)
            log.taken()

    async def _relay(self, stream: _Stream, *, pid: int) -> None:
        """``jdwp:PID``: the stream was registered in ``_relays[pid]`` when accepted."""
        streams = self._relays.setdefault(pid, set())
        streams.add(stream)
        try:
            address = self.pids.get(pid)
            if address is None:
                return
            host, port = address
            try:
                with trio.fail_after(self.connect_timeout):
                    vm = await trio.open_tcp_stream(host, port)
            except (OSError, trio.TooSlowError) as exc:
                self._stats.connect_failed += 1
                logger.info(
                    "adbd.jdwp_connect_failed",
                    pid=pid,
                    address=f"{host}:{port}",
                    error=str(exc) or type(exc).__name__,
                )
                return
            async with vm, trio.open_nursery() as nursery:
                nursery.start_soon(self._vm_to_server, vm, stream, nursery.cancel_scope)
                await self._server_to_vm(stream, vm)
                nursery.cancel_scope.cancel()
        finally:
            streams.discard(stream)
            if not streams and self._relays.get(pid) is streams:
                del self._relays[pid]

    async def _server_to_vm(self, stream: _Stream, vm: trio.SocketStream) -> None:
        while True:
            try:
                data = await stream.receive()
            except _StreamClosed:
                return
            try:
                with trio.fail_after(self.send_timeout):
                    await vm.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, trio.TooSlowError):
                return
            self._stats.bytes_to_vm += len(data)
            await stream.ack()

    async def _vm_to_server(
        self, vm: trio.SocketStream, stream: _Stream, scope: trio.CancelScope
    ) -> None:
        try:
            while True:
                try:
                    data = await vm.receive_some(stream.conn.max_data)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    return
                if not data:
                    return
                self._stats.bytes_from_vm += len(data)
                await stream.write(data)
        except _StreamClosed:
            return
        finally:
            scope.cancel()


def _words(command: str) -> list[str]:
    """A shell command's words (plain whitespace splitting if its quotes do not close)."""
    try:
        return shlex.split(command)
    except ValueError:
        return command.split()


def shell_output(
    command: str,
    properties: Mapping[str, str],
    pids: Iterable[int] = (),
    names: Mapping[int, str] | None = None,
) -> bytes:
    """What the minimal shell prints for ``command``: ``echo``, ``getprop [KEY]``, ``ps``;
    anything else is "not found", as ``/system/bin/sh`` says it."""
    words = _words(command)
    if not words:
        return b""
    name, args = words[0], words[1:]
    if name == "echo":
        return (" ".join(args) + "\n").encode()
    if name == "getprop":
        if args:
            return (properties.get(args[0], "") + "\n").encode()
        return "".join(f"[{k}]: [{v}]\n" for k, v in sorted(properties.items())).encode()
    if name == "ps":
        names = names or {}
        lines = [
            "USER           PID  PPID     VSZ    RSS WCHAN            ADDR S NAME",
            "root             1     0   10764   2536 0                   0 S init",
            "shell          700     1   12345   3000 0                   0 S adbd",
        ]
        lines.extend(
            f"u0_a{pid % 1000:<5d}{pid:>8d}   300 1234567  90000 0                   0 S "
            f"{names.get(pid, f'app.{pid}')}"
            for pid in sorted(pids)
        )
        return ("\n".join(lines) + "\n").encode()
    return f"/system/bin/sh: {name}: not found\n".encode()


# --------------------------------------------------------------------------------------------
# Command line


def _pid_arg(text: str) -> tuple[int, str, int]:
    pid_text, sep, address = text.partition("=")
    host, colon, port_text = address.rpartition(":")
    if not sep or not pid_text.isdigit() or not port_text.isdigit():
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected PID=HOST:PORT, e.g. 4242=127.0.0.1:8000"
        )
    return int(pid_text), (host if colon and host else "127.0.0.1"), int(port_text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ddmd.sim.adbd",
        description="A fake Android device daemon (adbd) for the real adb server to adopt.",
    )
    parser.add_argument("--port", type=int, default=0, help="TCP port to listen on (0: free)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--pid",
        type=_pid_arg,
        action="append",
        default=[],
        metavar="PID=HOST:PORT",
        help="a debuggable pid and the JDWP address its jdwp:PID is relayed to",
    )
    parser.add_argument(
        "--logcat",
        type=argparse.FileType("rb"),
        default=None,
        metavar="FILE",
        help="logcat -B output to serve as the device's log",
    )
    parser.add_argument(
        "--adb-port",
        type=int,
        default=None,
        help="once listening, run `ADB -P N connect 127.0.0.1:PORT`",
    )
    parser.add_argument("--adb", default="adb", help="the adb program (with --adb-port)")
    return parser


async def _main(args: argparse.Namespace) -> int:
    backlog = b""
    if args.logcat is not None:
        with args.logcat as file:
            backlog = file.read()
    device = FakeDevice({pid: (host, port) for pid, host, port in args.pid}, logcat=backlog)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(partial(device.serve, args.port, host=args.host))
        serial = f"127.0.0.1:{port}"
        if args.adb_port is not None:
            with trio.fail_after(30):
                result = await trio.run_process(
                    [args.adb, "-P", str(args.adb_port), "connect", serial],
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                )
            said = (result.stdout + result.stderr).decode(errors="replace").strip()
            if result.returncode != 0 or "connected" not in said:
                print(f"adb connect {serial} failed: {said}", file=sys.stderr, flush=True)
                nursery.cancel_scope.cancel()
                return 1
        pids = ",".join(str(p) for p in sorted(device.pids)) or "none"
        print(f"device {serial} ready (pids {pids})", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # stdout is for the one "ready" line a script waits for; logs go to stderr.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    try:
        return trio.run(_main, args)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
