"""What foresight asks next from a reply it got: the chains of ``plan.PLAN`` (a thread list to
each thread's status and name, frames to their classes, methods, `this` and locals, `this` to
its class and the fields debuggers read, values to their types).

Layer: standard library and ``ddmd.protocol`` only (sans-IO). ``next_asks`` is a pure function
of the reply and of what foresight tells it (``Context``); ``Foresight`` asks what it returns,
unless stored or in flight already.

A follow tag says what a reply is and what it leads to:

- ``("threads",)``: AllThreads -> Status and Name of each thread;
- ``("frames",)``: Frames -> `this` and the visible locals of frame 0, the class data of each new
  class and the method data of each method in the first frames;
- ``("count",)``: FrameCount -> Frames (0, count), when debuggers ask that shape;
- ``("this",)``: ThisObject -> its ReferenceType (``("type", obj, True)``), and at once what
  its type leads to when this session typed that object before;
- ``("locals", head, index, epoch)``: VariableTable -> GetValues of the visible locals;
- ``("values",)``: a GetValues reply -> for each object this session has not typed yet (a
  debugger keeps what it learned of an object): its ReferenceType (``("type", obj, False)``), a
  string's text, an array's length;
- ``("type", obj, False)``: an object's ReferenceType -> its type's name; ``("type", obj, True)``
  for `this`: its class data, superclasses and the fields debuggers read of an object of that
  class;
- ``("super", depth)``: Superclass -> what JDI's allFields() needs of it, and its superclass.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from ddmd.protocol.errors import ProtocolError
from ddmd.protocol.jdwp import IdSizes
from ddmd.session.learned import Learned
from ddmd.session.plan import (
    CLASS_DATA,
    MAX_SUPERS,
    MAX_VALUES,
    METHOD_DATA,
    SUPER_DATA,
    jdi_visible_slots,
    read_frames,
    read_threads,
    read_values,
)

__all__ = ["MAX_FRAMES", "Ask", "Context", "next_asks", "stop_asks"]

MAX_FRAMES: Final = 30  # frames of a Frames reply whose class data is asked

Ask = tuple[bytes, tuple[object, ...]]  # a command's key (set, command, data), its follow tag


@dataclass(frozen=True, slots=True)
class Context:
    """What the next asks depend on: the id sizes, the event thread (b"" if none), whether
    the whole VM is suspended (object-immutable replies are kept then only), the suspension's
    epoch, the stored VariableTable reply of a method (None when not stored), what was learned."""

    sizes: IdSizes
    thread: bytes
    all_suspended: bool
    epoch: int
    variables: Callable[[bytes], bytes | None]
    learned: Learned


def stop_asks(thread: bytes, all_suspended: bool, learned: Learned) -> list[Ask]:
    """What to ask at once when a composite suspends: the thread list (ALL), the event thread's
    frame count and its frames in the ranges debuggers asked before (with the last count for
    (0, FrameCount)); when debuggers stopped asking for the thread list (jdb at a step), the
    event thread's status and name (ALL only: under EVENT_THREAD only its frames are kept)."""
    asks: list[Ask] = [(b"\x01\x04", ("threads",))] if all_suspended else []
    if not thread:
        return asks
    asks.append((b"\x0b\x07" + thread, ("count",)))
    asks += [(b"\x0b\x06" + thread + shape, ("frames",)) for shape in learned.ranges()]
    count = learned.counts.get(thread)
    if count is not None and learned.by_count():
        asks.append((b"\x0b\x06" + thread + bytes(4) + count, ("frames",)))
    if all_suspended and not learned.wants(0x0104):  # no thread list: the event thread alone
        asks += [(b"\x0b\x04" + thread, ()), (b"\x0b\x01" + thread, ())]
    return asks


def next_asks(follow: tuple[object, ...], data: bytes, ctx: Context) -> list[Ask]:
    """What to ask after the reply ``data`` tagged ``follow`` (raises ProtocolError on a
    reply that does not parse)."""
    sizes, what = ctx.sizes, follow[0]
    if what == "threads":
        return [
            (bytes((11, c)) + thread, ())
            for thread in read_threads(data, sizes)
            for c in (4, 1)  # Status, Name
        ]
    if what == "frames":
        return _frames(data, ctx)
    if what == "count":
        if not (ctx.learned.by_count() and ctx.thread):
            return []
        shape = b"\x00\x00\x00\x00" + data[:4]  # frames 0 to FrameCount
        return [(b"\x0b\x06" + ctx.thread + shape, ("frames",))]
    if what == "this":
        obj = data[1 : 1 + sizes.object_id]
        if data[:1] != b"L" or not any(obj) or not ctx.all_suspended:
            return []
        then: tuple[object, ...] = ("type", obj, True)
        known = ctx.learned.type_of(obj)
        return [(b"\x09\x01" + obj, then), *(_type(then, known, ctx) if known else [])]
    if what == "locals":
        head, index, epoch = follow[1], follow[2], follow[3]
        assert isinstance(head, bytes)
        assert isinstance(index, int)
        if epoch != ctx.epoch:  # the frame is gone
            return []
        return [(b"\x10\x01" + head + jdi_visible_slots(data, index), ("values",))]
    if what == "values":
        return _values(data, ctx) if ctx.all_suspended else []
    if what == "type":
        return _type(follow, data, ctx)
    if what == "super":
        return _super(follow, data, ctx)
    return []


def _frames(data: bytes, ctx: Context) -> list[Ask]:
    frames = read_frames(data, ctx.sizes)
    if not frames or not ctx.thread:
        return []
    top = frames[0]
    head = ctx.thread + top.frame_id
    asks: list[Ask] = [(b"\x10\x03" + head, ("this",))]
    variables = bytes((6, 5)) + top.class_id + top.method_id
    table = ctx.variables(variables)
    if table is not None:
        with contextlib.suppress(ProtocolError):
            slots = jdi_visible_slots(table, top.code_index)
            asks.append((b"\x10\x01" + head + slots, ("values",)))
    else:
        asks.append((variables, ("locals", head, top.code_index, ctx.epoch)))
    seen: set[bytes] = set()
    for frame in frames[:MAX_FRAMES]:
        if frame.class_id not in seen:
            seen.add(frame.class_id)
            asks += [(bytes(k) + frame.class_id, ()) for k in CLASS_DATA]
            if frame.type_tag == 1:  # a class: its superclasses
                asks.append((b"\x03\x01" + frame.class_id, ("super", 1)))
        asks += [(bytes(k) + frame.class_id + frame.method_id, ()) for k in METHOD_DATA]
    return asks


def _values(data: bytes, ctx: Context) -> list[Ask]:
    asks: list[Ask] = []
    for tag, obj in read_values(data, ctx.sizes)[:MAX_VALUES]:
        if ctx.learned.type_of(obj) is not None:
            continue  # shown at an earlier stop of this session: the debugger knows it
        asks.append((b"\x09\x01" + obj, ("type", obj, False)))
        if tag == ord("s"):
            asks.append((b"\x0a\x01" + obj, ()))
        elif tag == ord("["):
            asks.append((b"\x0d\x01" + obj, ()))
    return asks


def _type(follow: tuple[object, ...], data: bytes, ctx: Context) -> list[Ask]:
    size = ctx.sizes.reference_type_id
    if len(data) < 1 + size:
        raise ProtocolError("ReferenceType reply cut short")
    cls = data[1 : 1 + size]
    obj, this = follow[1], follow[2]
    assert isinstance(obj, bytes)
    if not this:  # an object shown: its type's name
        return [(b"\x02\x0d" + cls, ())]
    asks: list[Ask] = [(bytes(k) + cls, ()) for k in CLASS_DATA]
    if data[0] == 1:  # a class: its superclasses
        asks.append((b"\x03\x01" + cls, ("super", 1)))
    fields = ctx.learned.fields_of(cls)
    if fields is not None and ctx.all_suspended:
        asks.append((b"\x09\x02" + obj + fields, ("values",)))
    return asks


def _super(follow: tuple[object, ...], data: bytes, ctx: Context) -> list[Ask]:
    cls = data[: ctx.sizes.reference_type_id]
    depth = follow[1]
    assert isinstance(depth, int)
    if len(cls) < ctx.sizes.reference_type_id or not any(cls) or depth >= MAX_SUPERS:
        return []
    asks: list[Ask] = [(bytes(k) + cls, ()) for k in SUPER_DATA]
    return [*asks, (b"\x03\x01" + cls, ("super", depth + 1))]
