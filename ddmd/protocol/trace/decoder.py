"""The sans-IO reader of a method trace: bytes in, in pieces of any size; events out
(the text header, the binary header, threads and methods named inline, batches of records).

Layer: ``protocol`` (standard library only). The layout is described in
``ddmd.protocol.trace``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import Enum
from typing import Final

from ddmd.protocol.errors import LocalProtocolError
from ddmd.protocol.trace.format import (
    MAGIC,
    MAGIC_BYTES,
    MAX_TEXT_BYTES,
    STREAMING_FLAG,
    THREAD_CPU,
    WALL,
    DataHeader,
    StreamCode,
    TraceFormatError,
    TraceHeader,
    TraceMethod,
    TraceThread,
    check_version,
    clocks_for,
    parse_method_line,
    parse_text_header,
    record_struct,
)

__all__ = [
    "DataStarted",
    "HeaderRead",
    "MethodNamed",
    "Record",
    "RecordsRead",
    "ThreadNamed",
    "TraceDecoder",
    "TraceEvent",
]

_TEXT_START: Final = b"*version"
_TEXT_END: Final = b"\n*end\n"
_HEAD_V1: Final = struct.Struct("<IHHQ")  # 16 bytes: magic, version, offset, start time
_U2: Final = struct.Struct("<H")
_U4: Final = struct.Struct("<I")
_BATCH: Final = 65536  # records per RecordsRead event
_COMPACT: Final = 1 << 20  # drop consumed bytes once this many have piled up


# --------------------------------------------------------------------------- decoder events

#: One record: (thread id, method value with the action bits, time[, second time]).
Record = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class HeaderRead:
    header: TraceHeader
    summary: bool  # True: the summary at the end of a streaming trace


@dataclass(frozen=True, slots=True)
class DataStarted:
    data: DataHeader


@dataclass(frozen=True, slots=True)
class ThreadNamed:
    thread: TraceThread


@dataclass(frozen=True, slots=True)
class MethodNamed:
    method: TraceMethod


@dataclass(frozen=True, slots=True)
class RecordsRead:
    records: tuple[Record, ...]


TraceEvent = HeaderRead | DataStarted | ThreadNamed | MethodNamed | RecordsRead


# --------------------------------------------------------------------------- the decoder


class _State(Enum):
    START = "start"
    TEXT = "text"
    DATA_HEAD = "data header"
    RECORDS = "records"
    STREAM_HEAD = "streaming header"
    STREAM = "streaming records"
    DONE = "done"
    CLOSED = "closed"


class TraceDecoder:
    """Sans-IO reader of one trace: ``feed(bytes)`` in pieces, then ``close()``.

    Both return the events the new bytes completed, in file order; ``close()`` raises
    :class:`TraceFormatError` when the trace is cut short. A text header is held until its
    ``*end`` line arrives (at most :data:`MAX_TEXT_BYTES`); records are never held longer
    than it takes to complete them.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0
        self._dropped = 0  # bytes removed from the front of _buf
        self._scan = 0  # where the search for the *end line resumes
        self._state = _State.START
        self._header: TraceHeader | None = None
        self._data: DataHeader | None = None
        self._record: struct.Struct | None = None
        self._records = 0

    @property
    def data(self) -> DataHeader | None:
        return self._data

    def _at(self) -> int:
        return self._dropped + self._pos

    def feed(self, data: bytes) -> list[TraceEvent]:
        if self._state is _State.CLOSED:
            raise LocalProtocolError("feed() after close()")
        self._buf += data
        events: list[TraceEvent] = []
        while self._step(events):
            pass
        if self._pos >= _COMPACT:
            del self._buf[: self._pos]
            self._dropped += self._pos
            self._scan = max(0, self._scan - self._pos)
            self._pos = 0
        return events

    def close(self) -> list[TraceEvent]:
        """The end of the input: returns the last events or says what is missing."""
        events = self.feed(b"")
        left = len(self._buf) - self._pos
        state = self._state
        self._state = _State.CLOSED
        if state is _State.START:
            if left == 0:
                raise TraceFormatError("the file is empty")
            raise TraceFormatError(f"the file is too short to be a method trace ({left} bytes)")
        if state is _State.TEXT:
            raise TraceFormatError(
                "the text header has no *end line: the file is cut short or is not a method trace"
            )
        if state in (_State.DATA_HEAD, _State.STREAM_HEAD):
            if left == 0 and state is _State.DATA_HEAD:
                raise TraceFormatError("the file ends after the text header: no binary data")
            raise TraceFormatError(
                f"the file ends inside the binary header ({left} bytes at offset {self._at()})"
            )
        if left:
            what = "record" if state is _State.RECORDS else "record or block"
            raise TraceFormatError(
                f"the file is cut short: the last {what} has only {left} bytes "
                f"(offset {self._at()})"
            )
        said = self._header.num_method_calls if self._header is not None else None
        if state is _State.RECORDS and said is not None and self._records < said:
            # ART and Dalvik count exactly the records they write: fewer means the file was
            # cut at a record boundary.
            raise TraceFormatError(
                f"the file is cut short: its header says {said} records, the file holds "
                f"{self._records}"
            )
        return events

    # ------------------------------------------------------------------ one step per state

    def _step(self, events: list[TraceEvent]) -> bool:
        state = self._state
        if state is _State.START:
            return self._start()
        if state is _State.TEXT:
            return self._text(events)
        if state in (_State.DATA_HEAD, _State.STREAM_HEAD):
            return self._data_head(events)
        if state is _State.RECORDS:
            return self._plain_records(events)
        if state is _State.STREAM:
            return self._stream(events)
        if state is _State.DONE and len(self._buf) > self._pos:
            raise TraceFormatError(
                f"{len(self._buf) - self._pos} bytes follow the summary that ends a "
                f"streaming trace (offset {self._at()})"
            )
        return False

    def _start(self) -> bool:
        head = bytes(self._buf[self._pos : self._pos + 8])
        if head.startswith(_TEXT_START):
            self._state = _State.TEXT
            return True
        if head[:4] == MAGIC_BYTES:
            if len(head) < 6:
                return False
            (version,) = _U2.unpack_from(head, 4)
            if version & STREAMING_FLAG != STREAMING_FLAG:
                raise TraceFormatError(
                    "the file holds only the binary records, without the text header that "
                    "names the threads and methods (an old two-file trace); not supported"
                )
            self._state = _State.STREAM_HEAD
            return True
        if _TEXT_START.startswith(head) or MAGIC_BYTES.startswith(head):
            return False  # too few bytes to tell yet
        shown = head.decode("latin-1").encode("unicode_escape").decode("ascii")
        raise TraceFormatError(
            f"not a method trace: it starts with '{shown}', not with '*version' or 'SLOW'"
        )

    def _text(self, events: list[TraceEvent]) -> bool:
        end = self._buf.find(_TEXT_END, max(self._pos, self._scan))
        if end < 0:
            if len(self._buf) - self._pos > MAX_TEXT_BYTES:
                raise TraceFormatError(
                    f"the text header is longer than {MAX_TEXT_BYTES} bytes without an *end line"
                )
            self._scan = max(self._pos, len(self._buf) - len(_TEXT_END) + 1)
            return False
        stop = end + len(_TEXT_END)
        header = parse_text_header(bytes(self._buf[self._pos : stop]))
        check_version(header.version, "the text header")
        self._header = header
        self._pos = stop
        self._state = _State.DATA_HEAD
        events.append(HeaderRead(header, summary=False))
        return True

    def _data_head(self, events: list[TraceEvent]) -> bool:
        streaming = self._state is _State.STREAM_HEAD
        at = self._at()
        if len(self._buf) - self._pos < _HEAD_V1.size:
            return False
        magic, raw_version, offset, start = _HEAD_V1.unpack_from(self._buf, self._pos)
        if magic != MAGIC:
            raise TraceFormatError(
                f"the binary data at offset {at} starts with {magic:#010x}, not the trace "
                f"magic {MAGIC:#010x} ('SLOW')"
            )
        version = raw_version
        if streaming:
            version = raw_version & ~STREAMING_FLAG
            if version not in (2, 3):
                check_version(version, "the streaming header")
                raise TraceFormatError(
                    f"a streaming trace of format version {version} does not exist"
                )
        elif raw_version & STREAMING_FLAG == STREAMING_FLAG:
            raise TraceFormatError(
                f"the binary data after the text header says streaming format "
                f"({raw_version:#x}), which never follows a text header"
            )
        else:
            check_version(version, "the binary data")
        fixed = _HEAD_V1.size + (2 if version == 3 else 0)
        if offset < fixed:
            raise TraceFormatError(
                f"the binary header says the records start {offset} bytes after it begins, "
                f"inside its own {fixed} bytes"
            )
        if len(self._buf) - self._pos < offset:
            return False
        if version == 3:
            (record_size,) = _U2.unpack_from(self._buf, self._pos + _HEAD_V1.size)
        else:
            record_size = 9 if version == 1 else 10
        header = self._header
        if header is not None and header.version != version:
            raise TraceFormatError(
                f"the text header says format version {header.version}, the binary data "
                f"says {version}"
            )
        clocks: tuple[str, ...]
        if streaming:
            # The clock is named only in the summary at the end: ART writes 14-byte
            # records for its dual clock and 10-byte ones for a single clock.
            clocks = (THREAD_CPU, WALL) if version == 3 and record_size >= 14 else (THREAD_CPU,)
        else:
            clocks = clocks_for(version, record_size, header.clock if header else None)
        self._record = record_struct(version, record_size, len(clocks))
        self._data = DataHeader(version, streaming, offset, start, record_size, clocks)
        self._pos += offset
        self._state = _State.STREAM if streaming else _State.RECORDS
        events.append(DataStarted(self._data))
        return True

    def _plain_records(self, events: list[TraceEvent]) -> bool:
        record = self._record
        assert record is not None
        size = record.size
        count = min((len(self._buf) - self._pos) // size, _BATCH)
        if count == 0:
            return False
        stop = self._pos + count * size
        chunk = bytes(self._buf[self._pos : stop])
        self._pos = stop
        self._records += count
        events.append(RecordsRead(tuple(record.iter_unpack(chunk))))
        return True

    def _stream(self, events: list[TraceEvent]) -> bool:
        record = self._record
        assert record is not None
        size = record.size
        buf = self._buf
        end = len(buf)
        batch: list[Record] = []
        progressed = False
        while end - self._pos >= 2 and len(batch) < _BATCH:
            pos = self._pos
            (tid,) = _U2.unpack_from(buf, pos)
            if tid != 0:
                if end - pos < size:
                    break
                batch.append(record.unpack_from(buf, pos))
                self._pos = pos + size
                continue
            if end - pos < 3:
                break
            code = buf[pos + 2]
            if code == StreamCode.METHOD:
                if end - pos < 5:
                    break
                (length,) = _U2.unpack_from(buf, pos + 3)
                if end - pos < 5 + length:
                    break
                line = bytes(buf[pos + 5 : pos + 5 + length]).decode("utf-8", "replace")
                event: TraceEvent = MethodNamed(
                    parse_method_line(line, f"the method block at offset {self._at()}")
                )
                self._pos = pos + 5 + length
            elif code == StreamCode.THREAD:
                if end - pos < 7:
                    break
                (thread_id,) = _U2.unpack_from(buf, pos + 3)
                (length,) = _U2.unpack_from(buf, pos + 5)
                if end - pos < 7 + length:
                    break
                name = bytes(buf[pos + 7 : pos + 7 + length]).decode("utf-8", "replace")
                event = ThreadNamed(TraceThread(thread_id, name))
                self._pos = pos + 7 + length
            elif code == StreamCode.SUMMARY:
                if end - pos < 7:
                    break
                (length,) = _U4.unpack_from(buf, pos + 3)
                if length > MAX_TEXT_BYTES:
                    raise TraceFormatError(
                        f"the summary at offset {self._at()} says it is {length} bytes long; "
                        f"more than {MAX_TEXT_BYTES} is refused"
                    )
                if end - pos < 7 + length:
                    break
                header = parse_text_header(
                    bytes(buf[pos + 7 : pos + 7 + length]), "the summary of the streaming trace"
                )
                event = HeaderRead(header, summary=True)
                self._check_summary(header)
                self._pos = pos + 7 + length
                self._state = _State.DONE
            else:
                raise TraceFormatError(
                    f"unknown block code {code} after a zero thread id at offset {self._at()} "
                    "(1 method, 2 thread, 3 summary)"
                )
            if batch:
                events.append(RecordsRead(tuple(batch)))
                self._records += len(batch)
                batch = []
            events.append(event)
            progressed = True
            if self._state is _State.DONE:
                return True
        if batch:
            events.append(RecordsRead(tuple(batch)))
            self._records += len(batch)
            return True
        return progressed

    def _check_summary(self, header: TraceHeader) -> None:
        data = self._data
        assert data is not None
        if header.version != data.version:
            raise TraceFormatError(
                f"the summary says format version {header.version}, the binary header says "
                f"{data.version}"
            )
        clocks = clocks_for(data.version, data.record_size, header.clock)
        if len(clocks) != len(data.clocks):
            raise TraceFormatError(
                f"the summary says clock={header.clock}, which does not fit "
                f"{data.record_size}-byte records"
            )
