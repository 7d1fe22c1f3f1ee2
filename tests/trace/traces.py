"""Method traces built byte by byte for the tests, with ``struct`` only (independent of
``ddmd.sim.trace``'s writer), and the one scenario they all record.

The scenario, in one clock's microseconds (the second clock of a dual trace is 3x each
value):

thread 7 "main":     10 enter A, 15 enter B, 25 exit B, 30 enter B, 32 enter C,
                     40 unroll C, 45 exit B, 60 exit A
thread 9 "worker":   5 exit D (D was running before tracing started), 8 enter A,
                     20 enter C (A and C are still running when the trace ends)

Expected, by dmtracedump's rules (see ``ddmd.protocol.trace``):

thread 7 (total 50): A 1 call, inclusive 50, exclusive 25; B 2 calls, 25, 17; C 1, 8, 8
thread 9 (total 15): D 1 call, 5 (from time 0), 0; A 1, 12 (to the last event), 12; C 1, 0, 0
"""

from __future__ import annotations

import struct

A, B, C, D = 0x10, 0x20, 0x30, 0x40
ENTER, EXIT, UNROLL = 0, 1, 2
MAIN, WORKER = 7, 9

METHODS = {
    A: ("com.example.App", "a", "()V", "App.java"),
    B: ("com.example.App", "b", "(I)I", "App.java"),
    C: ("com.example.Util", "c", "()V", "Util.java"),
    D: ("com.example.Util", "d", "(Ljava/lang/String;)V", "Util.java"),
}
NAMES = {mid: f"{c}.{m}{s}" for mid, (c, m, s, _f) in METHODS.items()}
THREADS = ((MAIN, "main"), (WORKER, "worker"))

#: (thread, method, action, time) in file order.
EVENTS = (
    (WORKER, D, EXIT, 5),
    (WORKER, A, ENTER, 8),
    (MAIN, A, ENTER, 10),
    (MAIN, B, ENTER, 15),
    (WORKER, C, ENTER, 20),
    (MAIN, B, EXIT, 25),
    (MAIN, B, ENTER, 30),
    (MAIN, C, ENTER, 32),
    (MAIN, C, UNROLL, 40),
    (MAIN, B, EXIT, 45),
    (MAIN, A, EXIT, 60),
)

#: Per thread: method -> (calls, inclusive, exclusive) in the first clock.
EXPECTED = {
    MAIN: {A: (1, 50, 25), B: (2, 25, 17), C: (1, 8, 8)},
    WORKER: {D: (1, 5, 0), A: (1, 12, 12), C: (1, 0, 0)},
}
TOTALS = {MAIN: 50, WORKER: 15}
WALL_FACTOR = 3


def text_header(
    version: int,
    clock: str | None,
    *,
    threads: tuple[tuple[int, str], ...] = THREADS,
    line_numbers: bool = False,
    streaming_summary: bool = False,
    records: int = len(EVENTS),
) -> bytes:
    lines = ["*version", str(version), "data-file-overflow=false"]
    if clock is not None:
        lines.append(f"clock={clock}")
    lines += ["elapsed-time-usec=70"]
    if not streaming_summary:
        lines.append(f"num-method-calls={records}")
    lines += ["clock-call-overhead-nsec=300", "vm=art", "pid=4242", "*threads"]
    lines += [f"{tid}\t{name}" for tid, name in threads]
    lines.append("*methods")
    if not streaming_summary:
        for mid, (cls, name, sig, source) in METHODS.items():
            tail = f"\t{source}\t{mid}" if line_numbers else f"\t{source}"
            lines.append(f"{mid:#x}\t{cls}\t{name}\t{sig}{tail}")
    lines.append("*end")
    return ("\n".join(lines) + "\n").encode()


def data_header(
    version: int, *, record_size: int | None = None, offset: int = 32, flag: int = 0
) -> bytes:
    head = struct.pack("<4sHHQ", b"SLOW", version | flag, offset, 0x0005_F000_1234_5678)
    if version == 3:
        head += struct.pack("<H", record_size if record_size is not None else 14)
    return head.ljust(offset, b"\0")


def record(
    version: int, tid: int, method: int, action: int, times: tuple[int, ...], size: int
) -> bytes:
    tid_field = struct.pack("<B", tid) if version == 1 else struct.pack("<H", tid)
    body = (
        tid_field
        + struct.pack("<I", method | action)
        + b"".join(struct.pack("<I", t) for t in times)
    )
    return body.ljust(size, b"\xee")


def times_of(time: int, clocks: int) -> tuple[int, ...]:
    return (time,) if clocks == 1 else (time, time * WALL_FACTOR)


def build(
    version: int,
    clock: str | None,
    *,
    record_size: int | None = None,
    events: tuple[tuple[int, int, int, int], ...] = EVENTS,
    line_numbers: bool = False,
) -> bytes:
    """A whole trace in the ordinary layout (text header, then the binary part)."""
    clocks = 2 if clock == "dual" else 1
    size = record_size or {1: 9, 2: 10}.get(version, 14 if clocks == 2 else 10)
    parts = [
        text_header(version, clock, line_numbers=line_numbers, records=len(events)),
        data_header(version, record_size=size if version == 3 else None),
    ]
    parts += [record(version, t, m, a, times_of(when, clocks), size) for t, m, a, when in events]
    return b"".join(parts)


def build_streaming(*, summary: bool = True, dual: bool = True) -> bytes:
    """ART's streaming layout: binary header (version | 0xF0) first, threads and methods
    introduced inline, the summary last."""
    clocks = 2 if dual else 1
    size = 14 if dual else 10
    parts = [data_header(3, record_size=size, flag=0xF0)]
    names = dict(THREADS)
    seen_threads: set[int] = set()
    seen_methods: set[int] = set()
    for tid, method, action, when in EVENTS:
        if tid not in seen_threads:
            seen_threads.add(tid)
            name = names[tid].encode()
            parts.append(struct.pack("<HBHH", 0, 2, tid, len(name)) + name)
        if method not in seen_methods:
            seen_methods.add(method)
            cls, meth, sig, source = METHODS[method]
            line = f"{method:#x}\t{cls}\t{meth}\t{sig}\t{source}\n".encode()
            parts.append(struct.pack("<HBH", 0, 1, len(line)) + line)
        parts.append(record(3, tid, method, action, times_of(when, clocks), size))
    if summary:
        text = text_header(3, "dual" if dual else "thread-cpu", streaming_summary=True)
        parts.append(struct.pack("<HBI", 0, 3, len(text)) + text)
    return b"".join(parts)
