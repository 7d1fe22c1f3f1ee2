"""The files calls wait for: a method trace or a heap dump the VM pushes (MPSE, HPDS), passed on
as ``Capture`` commands as they arrive, never held whole.

Layer: standard library, ``ddmd.protocol`` and ``ddmd.session`` (sans-IO). A part of
``VmSession`` that sees it through ``SessionHost``; ``Profiling`` says which file a call waits
for (``expect``) and reads how it went (``of``) when it settles the call.

A file pushed whole (small) arrives through the handler host, where this part is the first
built-in handler (``handle_raw``: a file a call waits for is taken, anything else goes on to the
model); one larger than the relay threshold arrives in pieces from the router (``push_piece``)
and is passed on piece by piece, so a heap dump of hundreds of MB never sits in memory.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ddmd.protocol import ddm
from ddmd.session.commands import Capture, Command, Log
from ddmd.session.host import PendingCall, SessionHost

__all__ = ["AwaitedFile", "Captures"]

_CHUNK_HEADER = struct.Struct(">II")


@dataclass(slots=True)
class AwaitedFile:
    """A file the VM is to push for a call (``chunk_type`` MPSE or HPDS), and how it went."""

    pending: PendingCall
    chunk_type: int
    started: bool = False
    size: int = 0
    done: bool = False
    short: bool = False  # the push ended before the length its chunk header declared


@dataclass(slots=True)
class _LargePush:
    """A DDM push arriving in pieces: its chunk header, then where the data goes."""

    head: bytearray
    capture: AwaitedFile | None = None
    remaining: int = 0  # data bytes of the first chunk still to come
    discarded: bool = False


class Captures:
    """The files calls wait for, and the push arriving in pieces."""

    def __init__(self, host: SessionHost) -> None:
        self._host = host
        self._awaited: list[AwaitedFile] = []
        self._large: _LargePush | None = None

    def expect(self, pending: PendingCall, chunk_type: int) -> None:
        """Call ``pending`` waits for the VM to push a chunk of ``chunk_type``."""
        self._awaited.append(AwaitedFile(pending, chunk_type))

    def awaited(self, chunk_type: int) -> bool:
        """Some call waits for a file of ``chunk_type``."""
        return any(c.chunk_type == chunk_type for c in self._awaited)

    def of(self, pending: PendingCall) -> AwaitedFile | None:
        """The file call ``pending`` waits for, if any."""
        return next((c for c in self._awaited if c.pending is pending), None)

    def forget(self, capture: AwaitedFile | None) -> None:
        if capture is not None and capture in self._awaited:
            self._awaited.remove(capture)

    def drop(self) -> None:
        """The connection ended: no file comes any more."""
        self._awaited.clear()
        self._large = None

    def _waiting(self, chunk_type: int) -> AwaitedFile | None:
        return next(
            (c for c in self._awaited if c.chunk_type == chunk_type and not c.started), None
        )

    def handle_raw(self, chunk_type: int, data: bytes, msg_id: int) -> bool:
        """A whole pushed chunk (the first built-in handler, ``handlers.BuiltinHandler``): the
        file a call waits for? Then it is passed on, and taken from the model (True)."""
        capture = self._waiting(chunk_type)
        if capture is None:
            return False
        capture.started = capture.done = True
        capture.size = len(data)
        self._host.emit(Capture(capture.pending.call, data, last=True))
        return True

    def push_piece(self, data: bytes, first: bool, last: bool, now: float) -> list[Command]:
        """A piece of a DDM push too large to hold (the router's relay): the chunk header is
        read from the first bytes; the data of a file some capture waits for is passed on as
        it comes, anything else is dropped (logged once per push)."""
        if first or self._large is None:
            self._large = _LargePush(bytearray())
        large = self._large
        out: list[Command] = []
        if large.capture is None and not large.discarded:
            large.head += data
            if len(large.head) < _CHUNK_HEADER.size:
                data = b""
            else:
                chunk_type, length = _CHUNK_HEADER.unpack_from(large.head)
                data = bytes(large.head[_CHUNK_HEADER.size :])
                large.head = bytearray()
                capture = self._waiting(chunk_type)
                if capture is None:
                    large.discarded = True
                    out.append(
                        Log(
                            "ddm.push_discarded",
                            fields={"type": ddm.type_name(chunk_type), "length": length},
                        )
                    )
                else:
                    capture.started = True
                    large.capture, large.remaining = capture, length
        capture = large.capture
        if capture is not None:
            take = data[: large.remaining]
            large.remaining -= len(take)
            capture.size += len(take)
            # Data flows: the file may take as long as it needs, but a stall still times out.
            capture.pending.deadline = now + self._host.settings.capture
            finished = large.remaining == 0 or last
            if take or finished:
                out.append(Capture(capture.pending.call, take, last=finished))
            if finished and not capture.done:
                capture.done = True
                capture.short = large.remaining > 0
                large.capture = None
                large.discarded = True  # anything after the file's chunk is not ours
        if last:
            self._large = None
        return out
