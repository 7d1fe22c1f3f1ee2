"""What foresight learned from debuggers' own commands, to ask the same at the next stop or in
the next debugger session: the ranges of ThreadReference.Frames they ask, the fields they read
of an object of each class, and the class data the last session used.

Layer: standard library only (sans-IO). A part of ``Foresight`` (``foresight.py``), which owns
one and passes it what it saw. Nothing here is ever served to a debugger: it only decides what
ddmd asks the VM on its own, and a reply is stored only as the VM gives it.

- Frames shapes: the (start, length) of the newest few Frames commands on an event thread;
  (0, FrameCount) is kept as such (``BY_COUNT``), asked once the count is known.
- Fields per class: the field list (count and field ids, as sent) of a debugger's
  ObjectReference.GetValues on an object of a class. At the next stop whose ``this`` is of that
  class, ddmd asks the same fields of the new ``this``. Field ids are fixed while the class is
  loaded; after a structural redefinition the VM refuses a stale one, and that refusal is only
  ever served for the very same bytes, which the VM would refuse alike.
- Objects typed in this session: an object's ReferenceType reply (tag and class), kept until
  the last debugger leaves. A debugger built on JDI keeps the type of an object it has seen
  (and a string's text, an array's length), so ddmd does not ask those again at later stops;
  and when `this` is an object already typed, the fields debuggers read of it are asked at
  once, without waiting for its ReferenceType again. An object's class never changes and ids
  are not reused on one connection.
- Frame counts: the last FrameCount of each thread. A debugger that asks frames (0, FrameCount)
  at every stop gets them asked at once in that range (a step rarely changes the depth), as
  well as once the new count is known.
- What debuggers asked at the last stop: the kinds (command set and command) of the
  suspension-scoped commands they sent since the stop before. At the next stop ddmd asks ahead
  only those kinds (at a session's first stop, every kind of the plan): jdb, which asks little
  at a step, is not sent thirty thread statuses it never reads, whose bytes would delay its own
  commands on a link that carries one write at a time (adb's, before its delayed ACK).
- The next session's class data: when the last debugger leaves, class structure and method
  data are dropped (an agent may redefine a class while none is attached, and JDWP never shows
  it), but their keys are kept here; when a debugger starts the next session, ddmd asks them
  again, pipelined, so that what it serves in that session was asked in that session.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

__all__ = ["BY_COUNT", "FIRST_SHAPE", "Learned"]

BY_COUNT: Final = b"count"  # a Frames shape: (0, the FrameCount reply)
FIRST_SHAPE: Final = b"\x00\x00\x00\x00\xff\xff\xff\xff"  # (0, -1): JDI's frames()
MAX_SHAPES: Final = 3
MAX_CLASSES: Final = 64  # classes whose field lists are kept
MAX_REWARM: Final = 512  # keys asked again at the start of the next session
MAX_TYPED: Final = 4096  # objects whose type this session knows


class Learned:
    """Frames shapes, field lists per class, and the keys of the last session's class data."""

    def __init__(self) -> None:
        self.shapes: dict[bytes, None] = {FIRST_SHAPE: None}
        self.fields: dict[bytes, bytes] = {}  # class id -> field list of ObjectReference.GetValues
        self.rewarm: list[bytes] = []
        self.types: dict[bytes, bytes] = {}  # object id -> its ReferenceType reply, this session
        self.counts: dict[bytes, bytes] = {}  # thread -> its last FrameCount reply
        self.asked: set[int] = set()  # kinds ((set << 8) | command) asked since the last stop
        self.wanted: frozenset[int] | None = None  # asked at the stop before; None: no stop yet
        self.stops = 0  # stops in this session

    def reset(self) -> None:
        """A new connection: ids restart, so field ids and class keys mean nothing now."""
        self.fields.clear()
        self.rewarm.clear()
        self.types.clear()
        self.counts.clear()
        self.asked, self.wanted, self.stops = set(), None, 0

    def reply(self, follow: tuple[object, ...], data: bytes, thread: bytes, size: int) -> None:
        """What a reply foresight follows teaches: an object's type, a thread's frame count."""
        if follow[0] == "type" and len(data) >= 1 + size:  # size: a class id's
            obj = follow[1]
            assert isinstance(obj, bytes)
            self.typed(obj, data[: 1 + size])
        elif follow[0] == "count" and thread and len(data) >= 4:
            self.counts.pop(thread, None)
            self.counts[thread] = data[:4]
            while len(self.counts) > MAX_CLASSES:
                del self.counts[next(iter(self.counts))]

    def asked_kind(self, kind: int) -> None:
        """A debugger sent a suspension-scoped command of ``kind``."""
        self.asked.add(kind)

    def stopped(self) -> None:
        """A new stop: what was asked since the one before is what the next asks will be."""
        self.wanted = frozenset(self.asked) if self.stops else None
        self.asked = set()
        self.stops += 1

    def wants(self, kind: int) -> bool:
        """Whether to ask ``kind`` ahead at this stop."""
        return self.wanted is None or kind in self.wanted

    def typed(self, obj: bytes, reply: bytes) -> None:
        """``obj``'s ReferenceType reply (tag and class id) was seen in this session."""
        self.types[obj] = reply
        while len(self.types) > MAX_TYPED:
            del self.types[next(iter(self.types))]

    def type_of(self, obj: bytes) -> bytes | None:
        return self.types.get(obj)

    def shape(self, shape: bytes) -> None:
        """A debugger asked Frames of the event thread in ``shape`` (newest kept last)."""
        self.shapes.pop(shape, None)
        self.shapes[shape] = None
        while len(self.shapes) > MAX_SHAPES:
            del self.shapes[next(iter(self.shapes))]

    def ranges(self) -> list[bytes]:
        """The (start, length) shapes to ask at once (not the one that needs the count)."""
        return [s for s in self.shapes if s != BY_COUNT]

    def by_count(self) -> bool:
        return BY_COUNT in self.shapes

    def field_list(self, class_id: bytes, fields: bytes) -> None:
        """A debugger read ``fields`` of an object of ``class_id``."""
        self.fields.pop(class_id, None)
        self.fields[class_id] = fields
        while len(self.fields) > MAX_CLASSES:
            del self.fields[next(iter(self.fields))]

    def fields_of(self, class_id: bytes) -> bytes | None:
        return self.fields.get(class_id)

    def keep_for_next_session(self, keys: Iterable[bytes]) -> None:
        """The session ended: its class data's keys are kept (the newest, when there are many);
        the objects it typed are forgotten (the next debugger has seen none of them)."""
        self.rewarm = list(keys)[-MAX_REWARM:]
        self.types.clear()
        self.asked, self.wanted, self.stops = set(), None, 0

    def take_rewarm(self) -> list[bytes]:
        keys, self.rewarm = self.rewarm, []
        return keys
