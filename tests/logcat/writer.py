"""A test-side writer of logcat's binary format (``logcat -B``), written from the documented
``struct logger_entry`` layouts (AOSP ``liblog/include/log/log_read.h``) and NOT from ddmd's
decoder, so round trips through `ddmd.protocol.logcat.LogcatDecoder` check one against the other.

    Record(sec, nsec, pid, tid, level, tag, message_bytes, lid, uid)
    write_record(record)              # v4: 28-byte header, then <prio><tag>\\0<message>\\0
    write_record(record, version=1)   # v1: 20-byte header, __pad 0, no lid/uid
    write_records(records)            # back to back

Every header field is packed one by one, little-endian, in the order of the C struct; the
payload is the priority byte, the tag's UTF-8 bytes and NUL, the message bytes and NUL.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["HEADER_SIZES", "Record", "payload", "write_record", "write_records"]

#: hdr_size written for each version (v1 writes 0 in the field; its header is 20 bytes).
HEADER_SIZES = {1: 0, 2: 24, 3: 24, 4: 28}


@dataclass(frozen=True, slots=True)
class Record:
    """One entry as a device logs it: raw bytes for the message (it may be invalid UTF-8)."""

    sec: int
    nsec: int
    pid: int
    tid: int
    level: int
    tag: str | bytes
    message: bytes
    lid: int = 0  # log buffer: 0 main, 3 system, 4 crash, ...
    uid: int = 0

    @property
    def tag_bytes(self) -> bytes:
        return self.tag.encode() if isinstance(self.tag, str) else self.tag


def payload(level: int, tag: bytes, message: bytes, *, terminated: bool = True) -> bytes:
    """``<priority:1><tag>\\0<message>\\0`` (without the final NUL if not ``terminated``)."""
    return bytes([level]) + tag + b"\0" + message + (b"\0" if terminated else b"")


def write_record(record: Record, *, version: int = 4, terminated: bool = True) -> bytes:
    """One entry: header of ``version`` (1 to 4), then its payload."""
    body = payload(record.level, record.tag_bytes, record.message, terminated=terminated)
    r = record
    head = struct.pack("<H", len(body)) + struct.pack("<H", HEADER_SIZES[version])
    if version == 4:
        head += struct.pack("<i", r.pid) + struct.pack("<I", r.tid)
        head += struct.pack("<I", r.sec) + struct.pack("<I", r.nsec)
        head += struct.pack("<I", r.lid) + struct.pack("<I", r.uid)
    else:
        head += struct.pack("<i", r.pid) + struct.pack("<i", r.tid)
        head += struct.pack("<i", r.sec) + struct.pack("<i", r.nsec)
        if version == 2:
            head += struct.pack("<I", r.uid)  # euid
        elif version == 3:
            head += struct.pack("<I", r.lid)
    return head + body


def write_records(records: Iterable[Record], *, version: int = 4) -> bytes:
    return b"".join(write_record(r, version=version) for r in records)
