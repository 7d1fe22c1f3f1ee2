"""Logcat's binary format (``logcat -B``), sans-IO: back-to-back ``struct logger_entry`` records.

Layer rule: protocol/ is SANS-IO. Standard library only; no trio, structlog, sockets or clock.

What ddmd reads: the adb service ``exec:logcat -B -b main -b system -b crash`` (``exec:`` is a raw
pipe, so no pty rewrites the bytes). ``logcat -B`` writes each entry exactly as logd handed it to
liblog: the header, then ``len`` payload bytes (``WriteFully(fd, &log_msg, log_msg.len())`` with
``len() = entry.hdr_size + entry.len`` in AOSP ``logcat/logcat.cpp``).

The header (all little-endian, packed)::

    offset  v1 (hdr_size 0)   v2 (24)        v3 (24)        v4 (28, current)
    0       u16 len           u16 len        u16 len        u16 len        payload bytes
    2       u16 __pad = 0     u16 hdr_size   u16 hdr_size   u16 hdr_size
    4       i32 pid           i32 pid        i32 pid        i32 pid
    8       i32 tid           i32 tid        i32 tid        u32 tid
    12      i32 sec           i32 sec        i32 sec        u32 sec        since the Epoch
    16      i32 nsec          i32 nsec       i32 nsec       u32 nsec
    20      (payload)         u32 euid       u32 lid        u32 lid        log buffer id
    24                        (payload)      (payload)      u32 uid
    28                                                      (payload)

Accepted ``hdr_size`` values: 0 (v1: the kernel logger's padding), 20 (a v1 header that states its
size: pre-Android-10 ``logprint.c`` reads the payload at ``hdr_size`` whenever it is non-zero),
24 (read as v3: ``exec:`` needs Android 5+, where logd serves v3 to unprivileged readers and v4 to
privileged ones; v2's ``euid`` came only from the kernel logger of Android 4.x and would be shown
as the buffer id), 28 (v4) and anything from 28 to `MAX_HEADER_SIZE` (liblog since Android 11
accepts "hdr_size greater than known headers" so logd may extend the header: the v4 fields are
read and the rest skipped). Anything else is `LogcatMalformed`.

The payload of a text buffer (main, radio, system, crash, kernel) is ``<priority:1><tag>\\0
<message>\\0``. Read as AOSP ``android_log_processLogBuffer`` (``liblog/logprint.cpp``) does: the
tag ends at the first NUL, the message at the next one (bytes after it are ignored); a payload with
no NUL at all is split at the first byte that cannot be in a tag (<= space, ':' or >= 0x7f), or is
all tag. Unlike logprint, a message with no final NUL keeps its last byte (logprint overwrites it
with the NUL it adds). Multi-line messages are one entry and keep their newlines; tag and message
are UTF-8 with invalid bytes replaced, never an error. Binary buffers (events, stats, security)
carry ``<event tag:4><typed data>``: their entry gets logprint's ``[N]`` tag, priority INFO
(WARN for security), and the typed data in hex (ddmd reads text buffers only).

Limits: logd sends at most ``LOGGER_ENTRY_MAX_LEN`` (5 * 1024) bytes per entry, header included;
writers are truncated to ``LOGGER_ENTRY_MAX_PAYLOAD`` (4068) payload bytes (``log/log.h``).
`DEFAULT_MAX_PAYLOAD` is the former: room for every real entry, small enough that a decoder out of
step with the stream fails at once. A payload length of 0 (logd never sends one), a length over
the cap, ``nsec`` >= 10**9 (liblog's ``log_time`` is always normalised) and a truncated entry at
EOF are `LogcatMalformed`.

Sources checked (AOSP ``system/core``, mirror ``aosp-mirror/platform_system_core``):
``liblog/include/log/log_read.h`` at 0494b4d (v4 struct, LOGGER_ENTRY_MAX_PAYLOAD 4068,
LOGGER_ENTRY_MAX_LEN 5 * 1024) and before 441054a "Remove old logger_entry_v* formats" (the
v1-v3 structs); 8d22253 "accept log messages with hdr_size greater than known headers" and
d3ecc66 "support extended logger_entry headers"; ``liblog/logprint.cpp`` before d2c21a1
(``android_log_processLogBuffer``, ``android_log_processBinaryLogBuffer``); ``logcat/logcat.cpp``
(the ``-B`` write); ``liblog/include/android/log.h`` (priorities 0-8, ``log_id_t`` 0-7);
``liblog/README.protocol.md`` (the payloads). Nothing here is copied from them.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Final

from .errors import LocalProtocolError, RemoteProtocolError

__all__ = [
    "BINARY_BUFFERS",
    "DEFAULT_MAX_PAYLOAD",
    "EOF",
    "LOGGER_ENTRY_MAX_LEN",
    "LOGGER_ENTRY_MAX_PAYLOAD",
    "MAX_HEADER_SIZE",
    "NEED_DATA",
    "Buffer",
    "Level",
    "LogEntry",
    "LogcatDecoder",
    "LogcatMalformed",
    "Marker",
    "buffer_name",
    "level_letter",
    "parse_level",
]

#: The most payload a writer may log; longer messages are truncated (``log/log.h``).
LOGGER_ENTRY_MAX_PAYLOAD: Final = 4068
#: The most bytes logd hands a reader for one entry, header included (``log/log_read.h``).
LOGGER_ENTRY_MAX_LEN: Final = 5 * 1024
#: The decoder's default cap on a payload length.
DEFAULT_MAX_PAYLOAD: Final = LOGGER_ENTRY_MAX_LEN
#: The largest ``hdr_size`` accepted (an extended v4 header); ddmd's own sanity cap.
MAX_HEADER_SIZE: Final = 128

_V1_SIZE: Final = 20
_V3_SIZE: Final = 24
_V4_SIZE: Final = 28
_PREFIX: Final = struct.Struct("<HH")
_V1: Final = struct.Struct("<HHiiii")  # len, hdr_size, pid, tid, sec, nsec (v1-v3)
_V3: Final = struct.Struct("<HHiiiiI")  # ... lid
_V4: Final = struct.Struct("<HHiIIIII")  # ... tid, sec, nsec unsigned; lid, uid
_NSEC_PER_SEC: Final = 1_000_000_000


class LogcatMalformed(RemoteProtocolError):
    """The log stream is not logcat's binary format (or ended inside an entry)."""


class Level(enum.IntEnum):
    """Android's log priorities (``android_LogPriority``)."""

    UNKNOWN = 0
    DEFAULT = 1  # only for setting a minimum priority
    VERBOSE = 2
    DEBUG = 3
    INFO = 4
    WARN = 5
    ERROR = 6
    FATAL = 7
    SILENT = 8  # only for setting a minimum priority


class Buffer(enum.IntEnum):
    """Log buffer ids (``log_id_t``), the ``lid`` of a v3/v4 header."""

    MAIN = 0
    RADIO = 1
    EVENTS = 2
    SYSTEM = 3
    CRASH = 4
    STATS = 5
    SECURITY = 6
    KERNEL = 7


#: Buffers whose payload is an event (tag number + typed data), not priority/tag/message.
BINARY_BUFFERS: Final = frozenset({Buffer.EVENTS, Buffer.STATS, Buffer.SECURITY})

_LETTERS: Final = {2: "V", 3: "D", 4: "I", 5: "W", 6: "E", 7: "F"}
_BY_NAME: Final = {
    "v": Level.VERBOSE,
    "verbose": Level.VERBOSE,
    "d": Level.DEBUG,
    "debug": Level.DEBUG,
    "i": Level.INFO,
    "info": Level.INFO,
    "w": Level.WARN,
    "warn": Level.WARN,
    "warning": Level.WARN,
    "e": Level.ERROR,
    "error": Level.ERROR,
    "f": Level.FATAL,
    "fatal": Level.FATAL,
    "a": Level.FATAL,
    "assert": Level.FATAL,
    "s": Level.SILENT,
    "silent": Level.SILENT,
}
_ACCEPTED: Final = (
    "V, D, I, W, E, F (or A), S, or verbose, debug, info, warn(ing), error, fatal (or assert), "
    "silent, in any case"
)


def level_letter(level: int) -> str:
    """``V D I W E F`` for priorities 2 to 7, ``?`` for anything else."""
    return _LETTERS.get(level, "?")


def parse_level(text: str) -> Level:
    """A level from its letter or name, any case (``"w"``, ``"Warn"``, ``"ERROR"``);
    `ValueError` naming the accepted values otherwise."""
    found = _BY_NAME.get(text.strip().lower())
    if found is None:
        raise ValueError(f"unknown log level {text!r}: expected {_ACCEPTED}")
    return found


def buffer_name(lid: int | None) -> str | None:
    """``"main"``, ``"system"``, ``"crash"``, ... for a known buffer id, the number as text for
    an unknown one, None when the header carried no id (v1)."""
    if lid is None:
        return None
    try:
        return Buffer(lid).name.lower()
    except ValueError:
        return str(lid)


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One log entry. ``level`` is the raw priority byte (see `Level`); ``buffer`` the log id
    (None from a v1 header); ``uid`` the writer's uid (v4 headers only)."""

    sec: int
    nsec: int
    pid: int
    tid: int
    level: int
    tag: str
    message: str
    buffer: int | None = None
    uid: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.nsec < _NSEC_PER_SEC:
            raise LocalProtocolError(f"log entry nsec {self.nsec} is outside 0..999999999")

    @property
    def buffer_name(self) -> str | None:
        """The buffer's name (`buffer_name`)."""
        return buffer_name(self.buffer)


class Marker:
    """The type of `NEED_DATA` and `EOF`: results of `LogcatDecoder.next_entry` that are not
    entries. Compare with ``is``."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


#: More bytes are needed before the next entry is whole.
NEED_DATA: Final = Marker("NEED_DATA")
#: The stream ended cleanly, between two entries.
EOF: Final = Marker("EOF")


def _split_text(payload: bytes) -> tuple[int, bytes, bytes]:
    """(priority, tag, message) of a text payload (at least one byte), as logprint reads it."""
    end = len(payload)
    tag_end = payload.find(b"\0", 1)
    if tag_end < 0:
        for i in range(1, end):
            b = payload[i]
            if b <= 0x20 or b == 0x3A or b >= 0x7F:
                return payload[0], payload[1:i], payload[i + 1 :]
        return payload[0], payload[1:], b""
    msg_end = payload.find(b"\0", tag_end + 1)
    if msg_end < 0:
        msg_end = end
    return payload[0], payload[1:tag_end], payload[tag_end + 1 : msg_end]


def _entry(
    payload: bytes,
    sec: int,
    nsec: int,
    pid: int,
    tid: int,
    lid: int | None,
    uid: int | None,
) -> LogEntry:
    if lid in BINARY_BUFFERS:
        level: int = Level.WARN if lid == Buffer.SECURITY else Level.INFO
        if len(payload) < 4:
            return LogEntry(sec, nsec, pid, tid, level, "", payload.hex(), lid, uid)
        event = int.from_bytes(payload[:4], "little")
        return LogEntry(sec, nsec, pid, tid, level, f"[{event}]", payload[4:].hex(), lid, uid)
    priority, tag, message = _split_text(payload)
    return LogEntry(
        sec,
        nsec,
        pid,
        tid,
        priority,
        tag.decode("utf-8", "replace"),
        message.decode("utf-8", "replace"),
        lid,
        uid,
    )


class LogcatDecoder:
    """Incremental decoder of ``logcat -B`` output: bytes in any split, `LogEntry` objects out.

    ``receive_data(b"")`` signals EOF. ``next_entry()`` returns one entry, `NEED_DATA` or (after
    EOF, with nothing left) `EOF`. Memory is bounded by the entry being assembled (at most
    `MAX_HEADER_SIZE` + ``max_payload`` bytes) plus what the caller feeds between two calls; time is
    linear in the bytes fed. After a `LogcatMalformed` the decoder stays broken and raises the
    same error again.
    """

    __slots__ = ("_buf", "_eof", "_error", "_max_payload", "_pos")

    def __init__(self, *, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        if not 1 <= max_payload <= 0xFFFF:
            raise LocalProtocolError(f"max_payload {max_payload} is outside 1..65535")
        self._max_payload = max_payload
        self._buf = bytearray()
        self._pos = 0
        self._eof = False
        self._error: LogcatMalformed | None = None

    @property
    def max_payload(self) -> int:
        return self._max_payload

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as an entry (0: between entries)."""
        return len(self._buf) - self._pos

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Feed bytes from the stream; empty bytes mean it ended."""
        if self._eof:
            if data:
                raise LocalProtocolError("log data received after EOF")
            return
        if not data:
            self._eof = True
            return
        if self._pos and self._pos * 2 >= len(self._buf):
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def next_entry(self) -> LogEntry | Marker:
        """The next whole entry, `NEED_DATA` or `EOF`; `LogcatMalformed` for bytes that are not
        the format (or an entry cut short by EOF)."""
        if self._error is not None:
            raise self._error
        try:
            return self._next_entry()
        except LogcatMalformed as exc:
            self._error = exc
            raise

    def _next_entry(self) -> LogEntry | Marker:
        buf = self._buf
        pos = self._pos
        avail = len(buf) - pos
        if avail < _PREFIX.size:
            return self._need_data(avail)
        length, hdr_size = _PREFIX.unpack_from(buf, pos)
        size = _V1_SIZE if hdr_size == 0 else hdr_size
        if size not in (_V1_SIZE, _V3_SIZE) and not _V4_SIZE <= size <= MAX_HEADER_SIZE:
            raise LogcatMalformed(
                f"logcat entry header size {hdr_size} is not 0, 20, 24 or 28..{MAX_HEADER_SIZE}"
                f" (offset {pos} of the buffered bytes)"
            )
        if length == 0 or length > self._max_payload:
            raise LogcatMalformed(
                f"logcat entry payload length {length} is outside 1..{self._max_payload}"
            )
        if avail < size + length:
            return self._need_data(avail)
        lid: int | None
        uid: int | None
        if size >= _V4_SIZE:
            _, _, pid, tid, sec, nsec, lid, uid = _V4.unpack_from(buf, pos)
        elif size == _V3_SIZE:
            _, _, pid, tid, sec, nsec, lid = _V3.unpack_from(buf, pos)
            uid = None
        else:
            _, _, pid, tid, sec, nsec = _V1.unpack_from(buf, pos)
            lid = uid = None
        if not 0 <= nsec < _NSEC_PER_SEC:
            raise LogcatMalformed(f"logcat entry nsec {nsec} is outside 0..999999999")
        start = pos + size
        payload = bytes(buf[start : start + length])
        self._pos = start + length
        return _entry(payload, sec, nsec, pid, tid, lid, uid)

    def _need_data(self, avail: int) -> Marker:
        if not self._eof:
            return NEED_DATA
        if avail:
            raise LogcatMalformed(f"the log stream ended inside an entry ({avail} bytes buffered)")
        return EOF
