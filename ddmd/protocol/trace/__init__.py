"""Android method traces (``.trace``): the text header and the binary records of format
versions 1-3 with one or two clocks, ART's streaming layout, and the per-method profile
(calls, inclusive and exclusive time, per thread and overall) that ``ddmd trace-report``
prints.

Layer: ``protocol`` (sans-IO, standard library only; no files, sockets, clock or logging).
:class:`TraceDecoder` takes the bytes in pieces of any size and returns events;
:class:`TraceProfiler` turns those events into a :class:`TraceProfile` without keeping the
records; :func:`parse_trace` does both for a whole file held in memory. Modules:
``format`` (values, the text header, ``TraceFormatError``), ``decoder`` (``TraceDecoder`` and
its events), ``profile`` (``TraceProfiler``, ``TraceProfile``).

The layout (read from Dalvik's ``vm/Profile.cpp``, ART's ``runtime/trace.cc`` and
``runtime/trace.h``, dmtracedump's ``tracedump.cc`` and Android Studio's ``VmTraceParser``):

* **Text header** (the "key" part), UTF-8 lines: ``*version``, the version number,
  ``key=value`` options (``data-file-overflow``, ``clock=dual|thread-cpu|wall``,
  ``elapsed-time-usec``, ``num-method-calls``, ``clock-call-overhead-nsec``, ``vm``, ``pid``,
  ...), ``*threads`` then ``tid<TAB>name`` lines, ``*methods`` then
  ``id<TAB>class<TAB>method<TAB>signature<TAB>source[<TAB>line]`` lines (ART writes five
  columns, Dalvik six), ``*end``. The binary part starts right after the ``*end`` line.
* **Binary header**, little-endian: u4 magic ``0x574f4c53`` (the bytes ``SLOW``), u2
  version, u2 offset of the first record, u8 start time in µs, and for version 3 a u2
  record size; zero padding up to the offset (32 in practice).
* **Records**: v1 = u1 thread id, u4 method value, u4 time (9 bytes); v2 = u2 thread id,
  u4 method value, u4 time (10 bytes); v3 = the v2 fields and, with ``clock=dual``, a second
  u4 time: thread-CPU time first, then wall time (14 bytes); the record size field is
  authoritative and extra bytes are skipped. The low two bits of the method value are the
  action (0 enter, 1 exit, 2 unroll: left by an exception); the rest is the method id as the
  ``*methods`` lines give it. Thread-CPU times count from the thread's first event, wall
  times from the start of the trace.
* **Streaming layout** (ART writing straight to a file, e.g. ``am profile start
  --streaming``): the binary header comes first, with ``0xF0`` or-ed into the version, and no
  text header. Records follow, interleaved with special blocks that start with a u2 thread id
  of 0 and a u1 code: 1 = a method (u2 length, then one method line), 2 = a thread (u2 thread
  id, u2 length, name), 3 = the summary (u4 length, then the text of a header: version,
  options, threads; it ends the file). ART releases before Android 8 wrote the summary to a
  separate ``.sec`` file, so a streaming trace may also just end after a record.

What a VM sends in the ``MPSE`` push (ddmlib's "streaming" method profiling) is the ordinary
layout (text header, then binary part), not this streaming layout.

How the profile is computed (dmtracedump's rules, so the numbers agree with it):

* Each event ends an interval of the thread: its length is exclusive time of the method on
  top of the thread's stack before the event (the caller for an enter, the returning method
  for an exit). Time outside any call is nobody's.
* Unroll records are exits.
* An exit with no call open on its thread (the method was running when tracing started) is
  one call that began at time 0 of the clock, at the top level. An exit of a method other
  than the innermost open call is an error (dmtracedump stops there too).
* A call still open when the trace ends is one call that ended at the thread's last event.
* Recursion: a call made while the same method is already open on the thread counts as a
  call (``calls``, and ``recursive_calls`` too) but its inclusive time is not added again.
* A time lower than the thread's previous one counts as an interval of 0.
* A record naming a method the header does not list is kept under ``(unknown method 0x..)``.

Each clock is computed separately; ``TraceProfile.clocks`` names them in record order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ddmd.protocol.trace.decoder import (
    DataStarted,
    HeaderRead,
    MethodNamed,
    Record,
    RecordsRead,
    ThreadNamed,
    TraceDecoder,
    TraceEvent,
)
from ddmd.protocol.trace.format import (
    ACTION_MASK,
    MAGIC,
    MAX_TEXT_BYTES,
    STREAMING_FLAG,
    THREAD_CPU,
    WALL,
    Action,
    DataHeader,
    StreamCode,
    TraceFormatError,
    TraceHeader,
    TraceMethod,
    TraceThread,
    parse_method_line,
    parse_text_header,
)
from ddmd.protocol.trace.profile import (
    CallNode,
    MethodStats,
    ThreadProfile,
    TraceProfile,
    TraceProfiler,
    top_methods,
)

__all__ = [
    "ACTION_MASK",
    "MAGIC",
    "MAX_TEXT_BYTES",
    "STREAMING_FLAG",
    "THREAD_CPU",
    "WALL",
    "Action",
    "CallNode",
    "DataHeader",
    "DataStarted",
    "HeaderRead",
    "MethodNamed",
    "MethodStats",
    "Record",
    "RecordsRead",
    "StreamCode",
    "ThreadNamed",
    "ThreadProfile",
    "TraceDecoder",
    "TraceEvent",
    "TraceFormatError",
    "TraceHeader",
    "TraceMethod",
    "TraceProfile",
    "TraceProfiler",
    "TraceThread",
    "iter_records",
    "parse_method_line",
    "parse_text_header",
    "parse_trace",
    "read_trace",
    "top_methods",
]

_ID_MASK = 0xFFFFFFFF & ~ACTION_MASK


def read_trace(pieces: Iterable[bytes]) -> TraceProfile:
    """Decode and profile a trace given as pieces (e.g. a file read in blocks)."""
    decoder = TraceDecoder()
    profiler = TraceProfiler()
    for piece in pieces:
        profiler.add_all(decoder.feed(piece))
    profiler.add_all(decoder.close())
    return profiler.result()


def parse_trace(data: bytes) -> TraceProfile:
    """Decode and profile a whole trace held in memory."""
    return read_trace((data,))


def iter_records(data: bytes) -> Iterator[tuple[int, Action, int, tuple[int, ...]]]:
    """Every record of a whole trace as (thread id, action, method id, times), for tools
    and tests that want the raw sequence."""
    decoder = TraceDecoder()
    for event in [*decoder.feed(data), *decoder.close()]:
        if isinstance(event, RecordsRead):
            for record in event.records:
                value = record[1]
                action = value & ACTION_MASK
                if action > Action.UNROLL:
                    raise TraceFormatError(f"a record has action {action}, which no VM writes")
                yield record[0], Action(action), value & _ID_MASK, record[2:]
