"""The values of a method trace and its text part: actions, threads, methods, the text
header (or streaming summary), the binary header's fields, and the one error type.

Layer: ``protocol`` (standard library only). The layout is described in
``ddmd.protocol.trace``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

from ddmd.protocol.errors import RemoteProtocolError

__all__ = [
    "ACTION_MASK",
    "MAGIC",
    "MAGIC_BYTES",
    "MAX_TEXT_BYTES",
    "STREAMING_FLAG",
    "THREAD_CPU",
    "WALL",
    "Action",
    "DataHeader",
    "StreamCode",
    "TraceFormatError",
    "TraceHeader",
    "TraceMethod",
    "TraceThread",
    "check_version",
    "clocks_for",
    "parse_method_line",
    "parse_text_header",
    "record_struct",
]

MAGIC: Final = 0x574F4C53  # b"SLOW" little-endian
MAGIC_BYTES: Final = b"SLOW"
STREAMING_FLAG: Final = 0xF0
ACTION_MASK: Final = 0x03
#: A text header (or a streaming summary) longer than this is refused.
MAX_TEXT_BYTES: Final = 64 * 1024 * 1024

THREAD_CPU: Final = "thread-cpu"
WALL: Final = "wall"


class Action(IntEnum):
    """The low two bits of a record's method value."""

    ENTER = 0
    EXIT = 1
    UNROLL = 2  # the method was left by an exception


class StreamCode(IntEnum):
    """The code after a zero thread id in the streaming layout."""

    METHOD = 1
    THREAD = 2
    SUMMARY = 3


class TraceFormatError(RemoteProtocolError):
    """The bytes are not a method trace ddmd can read. ``str()`` is a sentence for users."""


# --------------------------------------------------------------------------- header values


@dataclass(frozen=True, slots=True)
class TraceThread:
    tid: int
    name: str

    @property
    def label(self) -> str:
        return f"{self.tid} {self.name}" if self.name else str(self.tid)


@dataclass(frozen=True, slots=True)
class TraceMethod:
    """One ``*methods`` line. ``name``/``signature`` are None for a bare function name."""

    id: int
    class_name: str
    name: str | None = None
    signature: str | None = None
    source: str | None = None
    line: int | None = None
    known: bool = True  # False: records name it but the header does not list it

    @property
    def full_name(self) -> str:
        """``com.example.Inbox.load()V``: class, method and signature."""
        if self.name is None:
            return self.class_name
        return f"{self.class_name}.{self.name}{self.signature or ''}"

    @classmethod
    def unknown(cls, method_id: int) -> TraceMethod:
        return cls(method_id, f"(unknown method {method_id:#x})", known=False)


@dataclass(frozen=True, slots=True)
class TraceHeader:
    """The text header of a trace, or the summary at the end of a streaming trace."""

    version: int
    options: tuple[tuple[str, str], ...]
    threads: tuple[TraceThread, ...]
    methods: tuple[TraceMethod, ...]

    def option(self, key: str) -> str | None:
        for name, value in reversed(self.options):
            if name == key:
                return value
        return None

    def _int(self, key: str) -> int | None:
        value = self.option(key)
        try:
            return None if value is None else int(value, 10)
        except ValueError:
            return None

    @property
    def clock(self) -> str | None:
        return self.option("clock")

    @property
    def vm(self) -> str | None:
        return self.option("vm")

    @property
    def pid(self) -> int | None:
        return self._int("pid")

    @property
    def elapsed_usec(self) -> int | None:
        return self._int("elapsed-time-usec")

    @property
    def num_method_calls(self) -> int | None:
        return self._int("num-method-calls")

    @property
    def overflow(self) -> bool:
        """True when the VM's buffer filled up and later records were dropped."""
        return self.option("data-file-overflow") == "true"


@dataclass(frozen=True, slots=True)
class DataHeader:
    """The binary header. ``clocks`` names the times of each record, in order."""

    version: int  # 1, 2 or 3, without the streaming flag
    streaming: bool
    offset: int  # from the magic to the first record
    start_usec: int
    record_size: int
    clocks: tuple[str, ...]


# --------------------------------------------------------------------------- text parsing


def _number(text: str) -> int:
    """C's ``strtoul(text, NULL, 0)`` for a whole field: 0x.. hex, 0.. octal, else decimal."""
    value = text.strip()
    if value[:2].lower() == "0x":
        return int(value[2:], 16)
    if len(value) > 1 and value.startswith("0"):
        return int(value[1:], 8)
    return int(value, 10)


def parse_method_line(line: str, where: str = "method line") -> TraceMethod:
    """``id<TAB>class<TAB>method<TAB>signature[<TAB>source[<TAB>line]]``; also ``id<TAB>name``."""
    fields = line.rstrip("\n").split("\t")
    try:
        method_id = _number(fields[0])
    except ValueError:
        raise TraceFormatError(f"{where}: {fields[0]!r} is not a method id") from None
    if method_id < 0 or len(fields) < 2:
        raise TraceFormatError(f"{where}: {line.rstrip()!r} has no class name after the id")
    if len(fields) == 2:
        return TraceMethod(method_id, fields[1])
    if len(fields) == 3:
        return TraceMethod(method_id, fields[1], fields[2])
    source = fields[4] if len(fields) > 4 else None
    number: int | None = None
    if len(fields) > 5:
        try:
            number = int(fields[5], 10)
        except ValueError:
            number = None
    return TraceMethod(method_id, fields[1], fields[2], fields[3], source, number)


def parse_text_header(text: bytes, where: str = "the text header") -> TraceHeader:
    """Parse a whole text header (``*version`` ... ``*end``)."""
    lines = text.decode("utf-8", "replace").split("\n")
    if not lines or lines[0] != "*version":
        raise TraceFormatError(f"{where} does not start with a *version line")
    if len(lines) < 2:
        raise TraceFormatError(f"{where} has no version number after *version")
    try:
        version = _number(lines[1])
    except ValueError:
        raise TraceFormatError(f"{where}: version {lines[1]!r} is not a number") from None
    options: list[tuple[str, str]] = []
    threads: list[TraceThread] = []
    methods: list[TraceMethod] = []
    section = "options"
    ended = False
    for number, line in enumerate(lines[2:], start=3):
        if line.startswith("*"):
            token = line[1:]
            if token == "end":
                ended = True
                break
            if token not in ("threads", "methods"):
                raise TraceFormatError(f"{where}, line {number}: unknown section {line!r}")
            section = token
            continue
        if not line:
            continue
        if section == "options":
            key, sep, value = line.partition("=")
            if sep:
                options.append((key, value))
        elif section == "threads":
            tid, sep, name = line.partition("\t")
            try:
                if not sep:
                    raise ValueError(line)
                threads.append(TraceThread(_number(tid), name))
            except ValueError:
                raise TraceFormatError(
                    f"{where}, line {number}: {line!r} is not a thread line (id, tab, name)"
                ) from None
        else:
            methods.append(parse_method_line(line, f"{where}, line {number}"))
    if not ended:
        raise TraceFormatError(f"{where} has no *end line")
    return TraceHeader(version, tuple(options), tuple(threads), tuple(methods))


def clocks_for(version: int, record_size: int, clock: str | None) -> tuple[str, ...]:
    """The times each record holds, from the header's ``clock`` option."""
    if clock == "dual":
        if version < 3:
            raise TraceFormatError(
                f"clock=dual needs format version 3, the data is version {version}"
            )
        if record_size < 14:
            raise TraceFormatError(
                f"clock=dual needs records of at least 14 bytes, the data says {record_size}"
            )
        return (THREAD_CPU, WALL)
    if clock is None:
        # Android Studio's reader takes a trace that does not name its clock as thread-cpu.
        return (THREAD_CPU,)
    return (clock,)


def record_struct(version: int, record_size: int, clocks: int) -> struct.Struct:
    tid = "B" if version == 1 else "H"
    used = (1 if version == 1 else 2) + 4 + 4 * clocks
    if record_size < used:
        raise TraceFormatError(
            f"a record size of {record_size} bytes is too small for format version "
            f"{version} with {clocks} clock(s) ({used} bytes at least)"
        )
    pad = f"{record_size - used}x" if record_size > used else ""
    return struct.Struct(f"<{tid}I{'I' * clocks}{pad}")


def check_version(version: int, where: str) -> None:
    if version in (1, 2, 3):
        return
    if version in (4, 5):
        raise TraceFormatError(
            f"{where}: format version {version} (ART's newer trace format) is not supported; "
            "ddmd reads versions 1 to 3"
        )
    raise TraceFormatError(f"{where}: format version {version} is not supported (1 to 3 are)")
