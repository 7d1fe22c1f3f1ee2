"""The system-monitor chunk, ``SMON``: one report of a machine's load, memory and CPU use.

Layer: SANS-IO, standard library and ``ddmd.protocol.errors`` only, so the server-side handler
can decode reports without loading trio. ``SMON`` is not an Android chunk type (protocol.md 3.1
lists every type Android and the 2007 draft define).

A report travels client to server: pushed (a DDM command) every interval, or as the reply to an
``SMON`` request (whose data is empty: "report now"). Layout version 1, big-endian::

    offset  size        field
    0       u1          layout version = 1
    1       u8          timestamp, ms since the Unix epoch
    9       u4 x 3      load averages over 1, 5, 15 minutes, in thousandths (1.25 -> 1250)
    21      u8 x 5      MemTotal, MemAvailable, MemFree, SwapTotal, SwapFree, in KiB
                        (all ones, 0xFFFFFFFFFFFFFFFF: the kernel does not report it)
    61      u4          CPU sample period, ms: the time the busy figures cover (0: none)
    65      u2          n, the number of CPUs (cores online at the time of the report)
    67      u2 x n      each CPU's busy share of the period, in thousandths (0-1000);
                        0xFFFF: not known (no earlier sample of that CPU, or no time passed)
    total   67 + 2n bytes

A later layout gets a new version number; a decoder refuses a version it does not know rather
than guess at its fields.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Final

from ddmd.protocol.errors import LocalProtocolError, RemoteProtocolError

__all__ = [
    "CHUNK_TYPE",
    "CHUNK_TYPE_CODE",
    "LAYOUT_VERSION",
    "SystemReport",
    "decode_report",
    "encode_report",
    "thousandths",
]

#: The chunk type, as a name and as the u4 on the wire.
CHUNK_TYPE: Final = "SMON"
CHUNK_TYPE_CODE: Final = int.from_bytes(CHUNK_TYPE.encode("ascii"), "big")
LAYOUT_VERSION: Final = 1

_HEAD = struct.Struct(">BQIIIQQQQQIH")  # everything up to the per-CPU figures: 67 bytes
_BUSY = struct.Struct(">H")
_U2_MAX: Final = 0xFFFF
_U4_MAX: Final = 0xFFFFFFFF
_U8_MAX: Final = 0xFFFFFFFFFFFFFFFF
_UNKNOWN_KIB: Final = _U8_MAX
_UNKNOWN_BUSY: Final = _U2_MAX
_MEMORY_FIELDS: Final = ("mem_total", "mem_available", "mem_free", "swap_total", "swap_free")


@dataclass(frozen=True, slots=True)
class SystemReport:
    """One report. Loads are in thousandths (``load1 = 1250`` means 1.25), memory in KiB (None:
    not reported by the kernel), CPU busy shares in thousandths (None: not known)."""

    timestamp_ms: int
    load1: int
    load5: int
    load15: int
    mem_total: int | None
    mem_available: int | None
    mem_free: int | None
    swap_total: int | None
    swap_free: int | None
    cpu_period_ms: int
    cpu_busy: tuple[int | None, ...]

    def __post_init__(self) -> None:
        _check("timestamp_ms", self.timestamp_ms, _U8_MAX)
        for name in ("load1", "load5", "load15", "cpu_period_ms"):
            _check(name, getattr(self, name), _U4_MAX)
        for name in _MEMORY_FIELDS:
            value = getattr(self, name)
            if value is not None:
                _check(name, value, _U8_MAX - 1)
        if not isinstance(self.cpu_busy, tuple):
            raise LocalProtocolError("SystemReport.cpu_busy must be a tuple")
        if len(self.cpu_busy) > _U2_MAX:
            raise LocalProtocolError(f"SystemReport has {len(self.cpu_busy)} CPUs, at most 65535")
        for index, busy in enumerate(self.cpu_busy):
            if busy is not None:
                _check(f"cpu_busy[{index}]", busy, 1000)

    @property
    def loads(self) -> tuple[float, float, float]:
        """The three load averages as numbers (1.25, not 1250)."""
        return (self.load1 / 1000, self.load5 / 1000, self.load15 / 1000)

    @property
    def cpu_busy_mean(self) -> float | None:
        """The mean busy share of the CPUs whose share is known, 0.0-1.0; None if none is."""
        known = [b for b in self.cpu_busy if b is not None]
        return sum(known) / len(known) / 1000 if known else None

    def encode(self) -> bytes:
        """The chunk data (without the 8-byte chunk header)."""
        return encode_report(self)

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> SystemReport:
        return decode_report(data)


def _check(name: str, value: object, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise LocalProtocolError(f"SystemReport.{name} = {value!r} is not an integer 0-{maximum}")


def thousandths(value: float, maximum: int = _U4_MAX) -> int:
    """``value`` in thousandths, rounded, clamped to 0..maximum (a NaN counts as 0)."""
    if math.isnan(value):
        return 0
    return max(0, min(maximum, round(value * 1000)))


def encode_report(report: SystemReport) -> bytes:
    """The chunk data of ``report`` (layout version 1)."""
    memory = [getattr(report, name) for name in _MEMORY_FIELDS]
    head = _HEAD.pack(
        LAYOUT_VERSION,
        report.timestamp_ms,
        report.load1,
        report.load5,
        report.load15,
        *(_UNKNOWN_KIB if value is None else value for value in memory),
        report.cpu_period_ms,
        len(report.cpu_busy),
    )
    busy = b"".join(
        _BUSY.pack(_UNKNOWN_BUSY if value is None else value) for value in report.cpu_busy
    )
    return head + busy


def decode_report(data: bytes | bytearray | memoryview) -> SystemReport:
    """Decode the chunk data of a report. Raises RemoteProtocolError saying what is wrong: too
    short, an unknown layout version, a length that does not match the CPU count, a busy share
    above 1000."""
    view = memoryview(data).cast("B")
    if len(view) < 1:
        raise RemoteProtocolError("SMON: empty data (a report starts with its layout version)")
    if view[0] != LAYOUT_VERSION:
        raise RemoteProtocolError(
            f"SMON: layout version {view[0]} is not known (this ddmd reads version "
            f"{LAYOUT_VERSION}); update ddmd"
        )
    if len(view) < _HEAD.size:
        raise RemoteProtocolError(
            f"SMON: {len(view)} bytes, shorter than the {_HEAD.size}-byte fixed part"
        )
    (_, timestamp, load1, load5, load15, *memory, period, count) = _HEAD.unpack_from(view)
    expected = _HEAD.size + count * _BUSY.size
    if len(view) != expected:
        raise RemoteProtocolError(
            f"SMON: {len(view)} bytes, but {count} CPUs make a {expected}-byte report"
        )
    busy: list[int | None] = []
    for index in range(count):
        (value,) = _BUSY.unpack_from(view, _HEAD.size + index * _BUSY.size)
        if value == _UNKNOWN_BUSY:
            busy.append(None)
        elif value > 1000:
            raise RemoteProtocolError(
                f"SMON: CPU {index} busy share {value} is above 1000 thousandths"
            )
        else:
            busy.append(value)
    return SystemReport(
        timestamp_ms=timestamp,
        load1=load1,
        load5=load5,
        load15=load15,
        mem_total=None if memory[0] == _UNKNOWN_KIB else memory[0],
        mem_available=None if memory[1] == _UNKNOWN_KIB else memory[1],
        mem_free=None if memory[2] == _UNKNOWN_KIB else memory[2],
        swap_total=None if memory[3] == _UNKNOWN_KIB else memory[3],
        swap_free=None if memory[4] == _UNKNOWN_KIB else memory[4],
        cpu_period_ms=period,
        cpu_busy=tuple(busy),
    )
