"""Sharing one VM's DDM with several consumers (ddmlib, Android Studio and others arriving
through the adb front): who may turn a VM-wide switch off, what is answered without asking
the VM, and what ddmd turns off when a consumer leaves.

Layer: standard library and ``ddmd.protocol`` only (sans-IO: no sockets, no clock, no logging).

The VM-wide switches a DDM client sets on the one connection, and what each request means:

    thread notices    THEN on | off
    heap info         HPIF when = 3 (every GC) | 0 (never); 1 (now) and 2 (next GC) are
                      one-shot requests, not switch states
    heap segments     HPSG when = 1 (every GC) | 0 (never), and the same for NHSG
    allocations       REAE on | off
    method tracing    MPSS | SPSS | MPRS start it, MPSE | SPSE | MPRE stop it

The VM gets the union of what ddmd itself (``own_wants``) and every consumer asked for:

- turning a switch on goes to the VM (the VM answers the consumer; thread notices come with
  the burst of thread-creation notices the consumer expects, sent by the VM to everyone);
- turning it off goes to the VM only when nobody else wants it on; otherwise the consumer is
  answered here with an empty reply (what VMs that reply to these requests send) and the VM
  keeps it on;
- stopping a method trace that someone else started is answered with a FAIL chunk that says
  so, and the trace goes on;
- when a consumer leaves, each switch it had on and nobody else wants is turned off by ddmd.

HELO and FEAT are answered here from what ddmd already learnt (``hello``/``features``): the
VM would answer the same, and asking it again has no use.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from ddmd.protocol import ddm
from ddmd.protocol.errors import ProtocolError

__all__ = ["DdmShare", "Switch", "Verdict"]


class Switch(enum.Enum):
    THREADS = "thread notices"
    HEAP_INFO = "heap info"
    HEAP_SEGMENTS = "heap segments"
    NATIVE_SEGMENTS = "native heap segments"
    ALLOCATIONS = "allocation tracker"
    TRACING = "method tracing"


_T = ddm.ChunkType
_STARTS_TRACE = frozenset({int(_T.MPSS), int(_T.SPSS), int(_T.MPRS)})
_STOPS_TRACE = frozenset({int(_T.MPSE), int(_T.SPSE), int(_T.MPRE)})
#: A stopped trace's chunk type for each start (what ddmd sends when the starter leaves).
_STOP_FOR = {int(_T.MPSS): _T.MPSE, int(_T.SPSS): _T.SPSE, int(_T.MPRS): _T.MPRE}


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do with one DDM request of a consumer: ``relay`` it to the VM, or answer it here
    with ``answer`` (the reply's data: chunks), or neither (the VM would have said nothing)."""

    relay: bool
    answer: bytes | None = None
    why: str | None = None  # for the log when not relayed


RELAY = Verdict(True)


@dataclass(slots=True)
class _Wants:
    on: dict[Switch, int] = field(default_factory=dict)  # switch -> chunk type that set it


def _first_byte(data: bytes) -> int | None:
    return data[0] if data else None


class DdmShare:
    """The per-VM table of consumers' DDM switches. ``own_wants(switch)``: whether ddmd itself
    keeps that switch on; ``hello()``/``features()``: the VM's own answers, once known."""

    def __init__(
        self,
        own_wants: Callable[[Switch], bool],
        hello: Callable[[], bytes | None] = lambda: None,
        features: Callable[[], bytes | None] = lambda: None,
    ) -> None:
        self._own_wants = own_wants
        self._hello = hello
        self._features = features
        self._wants: dict[int, _Wants] = {}

    # ------------------------------------------------------------------ queries

    def wants(self, consumer: int) -> tuple[Switch, ...]:
        """The switches ``consumer`` has turned on (for tests and the log)."""
        entry = self._wants.get(consumer)
        return () if entry is None else tuple(entry.on)

    def wanted(self, switch: Switch, *, besides: int | None = None) -> bool:
        """Whether ddmd or a consumer other than ``besides`` keeps ``switch`` on."""
        if self._own_wants(switch):
            return True
        return any(switch in entry.on for number, entry in self._wants.items() if number != besides)

    # ------------------------------------------------------------------ a consumer's request

    def request(self, consumer: int, data: bytes) -> Verdict:
        """One DDM request (the packet's data: one or more chunks) of ``consumer``."""
        try:
            chunks = ddm.split_chunks(data)
        except ProtocolError:
            return RELAY  # the VM judges what it cannot read; so does ddmd
        if len(chunks) != 1:
            return RELAY
        chunk_type, body = chunks[0]
        if chunk_type == _T.HELO:
            known = self._hello()
            return RELAY if known is None else Verdict(False, known, "answered from ddmd's HELO")
        if chunk_type == _T.FEAT:
            known = self._features()
            return RELAY if known is None else Verdict(False, known, "answered from ddmd's FEAT")
        switch, on = _switch_of(chunk_type, body)
        if switch is None:
            return RELAY
        entry = self._wants.setdefault(consumer, _Wants())
        if switch is Switch.TRACING:
            return self._tracing(consumer, entry, chunk_type, on)
        if on is None:  # a one-shot request (heap info now / at the next GC)
            return RELAY
        if on:
            entry.on[switch] = chunk_type
            return RELAY
        entry.on.pop(switch, None)
        if self.wanted(switch, besides=consumer):
            return Verdict(False, b"", f"{switch.value} stay on: ddmd or another client uses them")
        return RELAY

    def _tracing(self, consumer: int, entry: _Wants, chunk_type: int, on: bool | None) -> Verdict:
        if on:
            entry.on[Switch.TRACING] = chunk_type
            return RELAY
        if Switch.TRACING in entry.on:
            del entry.on[Switch.TRACING]
            return RELAY
        if self.wanted(Switch.TRACING, besides=consumer):
            message = "method tracing was started by another client; it goes on"
            fail = ddm.encode_chunk(ddm.Fail(0, message))
            return Verdict(False, fail, message)
        return RELAY

    # ------------------------------------------------------------------ a consumer leaves

    def left(self, consumer: int) -> list[ddm.Chunk]:
        """Forget ``consumer``; the requests that turn off what it left on and nobody else
        wants (ddmd sends them as its own)."""
        entry = self._wants.pop(consumer, None)
        if entry is None:
            return []
        out: list[ddm.Chunk] = []
        for switch, chunk_type in entry.on.items():
            if self.wanted(switch):
                continue
            chunk = _off_request(switch, chunk_type)
            if chunk is not None:
                out.append(chunk)
        return out

    def reset(self) -> None:
        """The VM connection was reopened: its switches are all off again."""
        self._wants.clear()


def _switch_of(chunk_type: int, body: bytes) -> tuple[Switch | None, bool | None]:
    """(the switch a request sets, on/off; None for a one-shot) or (None, None)."""
    value = _first_byte(body)
    if chunk_type == _T.THEN:
        return (Switch.THREADS, value != 0) if value is not None else (None, None)
    if chunk_type == _T.REAE:
        return (Switch.ALLOCATIONS, value != 0) if value is not None else (None, None)
    if chunk_type == _T.HPIF:
        if value == 0:
            return Switch.HEAP_INFO, False
        if value == 3:
            return Switch.HEAP_INFO, True
        return (Switch.HEAP_INFO, None) if value is not None else (None, None)
    if chunk_type in (_T.HPSG, _T.NHSG):
        switch = Switch.HEAP_SEGMENTS if chunk_type == _T.HPSG else Switch.NATIVE_SEGMENTS
        return (switch, value != 0) if value is not None else (None, None)
    if chunk_type in _STARTS_TRACE:
        return Switch.TRACING, True
    if chunk_type in _STOPS_TRACE:
        return Switch.TRACING, False
    return None, None


def _off_request(switch: Switch, chunk_type: int) -> ddm.Chunk | None:
    if switch is Switch.THREADS:
        return ddm.ThreadNotify(False)
    if switch is Switch.ALLOCATIONS:
        return ddm.AllocTrackingEnable(False)
    if switch is Switch.HEAP_INFO:
        return ddm.HeapInfoRequest(0)
    if switch is Switch.HEAP_SEGMENTS:
        return ddm.HeapSegmentRequest(0, 0)
    if switch is Switch.NATIVE_SEGMENTS:
        return ddm.NativeHeapSegmentRequest(0, 0)
    stop = _STOP_FOR.get(chunk_type)
    if stop is _T.MPSE:
        return ddm.MethodTraceStreamEnd()
    if stop is _T.SPSE:
        return ddm.SamplingEnd()
    if stop is _T.MPRE:
        return ddm.MethodTraceEnd()
    return None
