"""The files profiling calls wait for, alone (``session/capture.py``), against a fake host: a
trace or heap dump the VM pushes is passed on as ``Capture`` commands as it arrives, whole or
in pieces; anything else goes on to the model, or is dropped when too large to hold.

``Expect(call, type)`` is a call that waits for a push of that chunk type (``Profiling`` says
so); ``Pushed(type, data)`` a whole pushed chunk; ``Piece(data, first, last)`` a piece of a push
too large to hold; ``Tick(t)`` the time the next inputs happen at.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from ddmd.protocol import ddm
from ddmd.session.capture import Captures
from ddmd.session.commands import Capture, Log
from ddmd.session.host import PendingCall
from ddmd.session.inputs import DumpHprof, StopTrace, Tick
from tests.session.parts import FakeHost, Piece, Pushed

MPSE = int(ddm.ChunkType.MPSE)
HPDS = int(ddm.ChunkType.HPDS)
DUMP = b"JAVA PROFILE 1.0.3\x00" + bytes(100)


@dataclass(frozen=True)
class Expect:
    call: int
    chunk_type: int


class Harness:
    def __init__(self) -> None:
        self.host = FakeHost()
        self.captures = Captures(self.host)
        self.calls: dict[int, PendingCall] = {}
        self.taken: list[bool] = []
        self.now = 0.0

    def feed(self, item: Any) -> None:
        if isinstance(item, Expect):
            request = StopTrace() if item.chunk_type == MPSE else DumpHprof()
            pending = self.calls[item.call] = PendingCall(item.call, request, 60.0)
            self.captures.expect(pending, item.chunk_type)
        elif isinstance(item, Pushed):
            self.taken.append(self.captures.handle_raw(item.chunk_type, item.data, 1))
        elif isinstance(item, Piece):
            for command in self.captures.push_piece(item.data, item.first, item.last, self.now):
                self.host.emit(command)
        elif isinstance(item, Tick):
            self.now = item.now
        else:
            raise AssertionError(f"no such input {item!r}")

    def book(self, **kw: Any) -> Any:
        return self.host.book(self.feed, **kw)


def test_a_whole_push_a_call_waits_for_is_passed_on_and_taken_from_the_model() -> None:
    h = Harness()
    assert h.book() >> Expect(1, HPDS) >> Pushed(HPDS, DUMP) << Capture(1, DUMP, last=True)
    assert h.taken == [True]
    capture = h.captures.of(h.calls[1])
    assert capture is not None
    assert (capture.done, capture.short, capture.size) == (True, False, len(DUMP))


def test_a_push_of_another_type_goes_on_to_the_model() -> None:
    h = Harness()
    assert h.book() >> Expect(1, MPSE) >> Pushed(HPDS, DUMP)
    assert h.taken == [False]
    assert h.captures.awaited(MPSE)
    assert not h.captures.awaited(HPDS)


def test_a_push_in_pieces_is_passed_on_as_it_comes_and_keeps_its_call_alive() -> None:
    h = Harness()
    head = struct.pack(">II", HPDS, len(DUMP))
    assert (
        h.book()
        >> Expect(1, HPDS)
        >> Piece(head[:5], first=True)  # not even the chunk header yet
        >> Tick(30.0)
        >> Piece(head[5:] + DUMP[:10])
        << Capture(1, DUMP[:10])
        >> Piece(DUMP[10:], last=True)
        << Capture(1, DUMP[10:], last=True)
    )
    assert h.calls[1].deadline == 30.0 + 60.0  # [timeouts] capture from the last data


def test_a_push_cut_short_is_marked_so() -> None:
    h = Harness()
    head = struct.pack(">II", HPDS, len(DUMP))
    assert (
        h.book()
        >> Expect(1, HPDS)
        >> Piece(head + DUMP[:10], first=True)
        << Capture(1, DUMP[:10])
        >> Piece(b"", last=True)  # the packet ended early
        << Capture(1, b"", last=True)
    )
    capture = h.captures.of(h.calls[1])
    assert capture is not None
    assert capture.short


def test_a_large_push_nobody_waits_for_is_dropped_and_logged_once() -> None:
    h = Harness()
    head = struct.pack(">II", HPDS, len(DUMP))
    assert (
        h.book(logs=True)
        >> Piece(head + DUMP[:40], first=True)
        << Log("ddm.push_discarded", "info", {"type": "HPDS", "length": len(DUMP)})
        >> Piece(DUMP[40:], last=True)
    )


def test_the_connection_ending_forgets_every_file_awaited() -> None:
    h = Harness()
    assert h.book() >> Expect(1, HPDS)
    h.captures.drop()
    assert not h.captures.awaited(HPDS)
    assert h.book() >> Pushed(HPDS, DUMP)
    assert h.taken == [False]
