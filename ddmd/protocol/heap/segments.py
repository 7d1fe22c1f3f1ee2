"""HPSG/NHSG heap segments: run-length decoding into plain records, and the figures of a dump.

Layer: ``protocol`` (sans-IO, standard library only; no sockets, clock or logging). The
assembly of one dump's segments (HPST ... HPEN) into a ``HeapImage`` is ``heap.images``.

Wire format (protocol.md 3.4 and 4): a 17-byte header, then ``(state, n)`` byte pairs::

    u4 heap id | u1 unit size | u4 start address | u4 offset | u4 piece length N | pairs...

Each pair covers ``n + 1`` allocation units. The state byte holds the solidity (bits 0-2),
the kind (bits 3-5), an unused bit U (0x40, must be 0) and the partial bit P (0x80: the run
continues in the next pair). Runs longer than 256 units are split into P pieces; this
module joins them back into one logical :class:`Run`.

Decoding is built for big heaps: a 64 MiB heap is about two million pairs. Validation and
the figures of :class:`HeapSummary` work on whole ``bytes`` objects (slices, ``translate``,
``count``, ``collections.Counter`` over 16-bit words) and never build an object per pair;
:meth:`Segment.runs` builds the :class:`Run` records only when a caller asks, once.

Decisions taken here (the **[ddmd]** parts of protocol.md 4.3 plus our own):

* The offset field counts units: unit *i* starts at ``start + (offset + i) * unit_size``.
  Addresses are plain Python ints and are never truncated to 32 bits.
* A P pair followed by a pair of a different state (ignoring P) is not rejected (rule 4.3
  does not say so) but cannot be joined either: the logical run ends at that pair.
* A free region is a maximal stretch of contiguous free units. Adjacent free runs merge,
  whether or not they were split with P, and across consecutive segments of one image when
  the next segment starts exactly where the previous one ended. Used runs never merge:
  each is its own object.
"""

from __future__ import annotations

import re
import struct
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import IntEnum
from itertools import compress

from ddmd.protocol.errors import LocalProtocolError, RemoteProtocolError

__all__ = [
    "HEADER_SIZE",
    "KIND_MASK",
    "KIND_SHIFT",
    "MAX_PAIR_UNITS",
    "PARTIAL",
    "SOLIDITY_MASK",
    "UNUSED",
    "HeapSummary",
    "Kind",
    "Run",
    "Segment",
    "SegmentKind",
    "Solidity",
    "decode_runs",
    "parse_segment_data",
]


# --------------------------------------------------------------------------- wire values


class Solidity(IntEnum):
    """Bits 0-2 of the state byte. Shipped VMs only send FREE and HARD; 7 is undefined."""

    FREE = 0
    HARD = 1
    SOFT = 2
    WEAK = 3
    PHANTOM = 4
    FINALIZABLE = 5
    SWEEP = 6


class Kind(IntEnum):
    """Bits 3-5 of the state byte (every 3-bit value is defined)."""

    OBJECT = 0
    CLASS_OBJECT = 1
    ARRAY_1 = 2
    ARRAY_2 = 3
    ARRAY_4 = 4
    ARRAY_8 = 5
    UNKNOWN = 6
    NON_OBJECT = 7


class SegmentKind(IntEnum):
    """The chunk type that carried a segment, as its u4 value."""

    HPSG = 0x48505347
    HPSO = 0x4850534F
    NHSG = 0x4E485347


SOLIDITY_MASK = 0x07
KIND_MASK = 0x38
KIND_SHIFT = 3
UNUSED = 0x40
PARTIAL = 0x80
MAX_PAIR_UNITS = 256

_HEADER = struct.Struct(">IBIII")
HEADER_SIZE = _HEADER.size  # 17
_U4_MAX = 0xFFFFFFFF

# Lookup tables (immutable): state byte -> 1 if the property holds, else 0.
_U_TABLE = bytes(1 if s & UNUSED else 0 for s in range(256))
_FREE_TABLE = bytes(1 if s & SOLIDITY_MASK == 0 else 0 for s in range(256))
_P_STATE = re.compile(rb"[\x80-\xff]")
_MULTI_FREE = re.compile(rb"\x01{2,}")
# Kind / solidity member (or plain int) for each 6-bit base state.
_KIND_OF: tuple[Kind, ...] = tuple(Kind(b >> KIND_SHIFT) for b in range(64))
_SOLIDITY_OF: tuple[Solidity | int, ...] = tuple(
    Solidity(b & SOLIDITY_MASK) if b & SOLIDITY_MASK <= Solidity.SWEEP else b & SOLIDITY_MASK
    for b in range(64)
)
# In a native-order 16-bit view of the pairs, where do the state byte and the count sit?
_STATE_SHIFT, _COUNT_SHIFT = (0, 8) if sys.byteorder == "little" else (8, 0)


def _solidity(value: int) -> Solidity | int:
    return Solidity(value) if 0 <= value <= Solidity.SWEEP else value


class _RuleError(LocalProtocolError):
    """A 4.3 parse-rule violation. decode_runs() turns it into RemoteProtocolError."""


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class Run:
    """One logical run: P pieces joined. ``address`` of its first byte, size in units."""

    address: int
    units: int
    kind: Kind
    solidity: Solidity | int

    @property
    def free(self) -> bool:
        return self.solidity == Solidity.FREE


@dataclass(frozen=True, slots=True)
class _Stats:
    """Per-segment figures the summary combines (computed once, on demand)."""

    units_by_state: tuple[int, ...]  # index: state & 0x3F (kind << 3 | solidity)
    runs_by_state: tuple[int, ...]  # logical runs, same index
    free_head: int  # units of the free region touching the first unit (0: none)
    free_tail: int  # units of the free region touching the last unit (0: none)
    inner_free_count: int  # free regions touching neither end
    inner_free_largest: int  # units of the largest of those
    all_free: bool


@dataclass(frozen=True, slots=True)
class Segment:
    """One validated HPSG / HPSO / NHSG chunk: the header values and the raw pairs.

    Build it with :func:`parse_segment_data` or :func:`decode_runs` (wire data: rule
    violations raise :class:`RemoteProtocolError`). Constructing it directly validates the
    same way but raises :class:`LocalProtocolError`.
    """

    heap_id: int
    unit_size: int
    start: int
    offset: int
    units: int
    usage: bytes
    _stats: _Stats | None = field(default=None, init=False, repr=False, compare=False)
    _runs: tuple[Run, ...] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, value, high in (
            ("heap id", self.heap_id, _U4_MAX),
            ("unit size", self.unit_size, 0xFF),
            ("start address", self.start, _U4_MAX),
            ("offset", self.offset, _U4_MAX),
            ("piece length", self.units, _U4_MAX),
        ):
            if not isinstance(value, int) or not 0 <= value <= high:
                raise LocalProtocolError(f"heap segment {name} {value!r} is not in 0..{high}")
        if not isinstance(self.usage, bytes):
            raise LocalProtocolError(
                f"heap segment usage must be bytes, not {type(self.usage).__name__}"
            )
        _check_rules(self.unit_size, self.units, self.usage)

    @property
    def address(self) -> int:
        """Address of the first unit: ``start + offset * unit_size``."""
        return self.start + self.offset * self.unit_size

    @property
    def end(self) -> int:
        """Address just past the last unit."""
        return self.start + (self.offset + self.units) * self.unit_size

    @property
    def pair_count(self) -> int:
        return len(self.usage) // 2

    def runs(self) -> tuple[Run, ...]:
        """The logical runs, P pieces joined, built on the first call and kept."""
        if self._runs is None:
            object.__setattr__(self, "_runs", _build_runs(self))
        assert self._runs is not None
        return self._runs

    def summary(self) -> HeapSummary:
        """Figures for this segment alone (object_count is None: HPSG semantics)."""
        return _summarise(self.heap_id, self.unit_size, (self,), objects=False)

    def stats(self) -> _Stats:
        if self._stats is None:
            object.__setattr__(self, "_stats", _compute_stats(self.usage))
        assert self._stats is not None
        return self._stats


# --------------------------------------------------------------------------- decoding


def parse_segment_data(data: bytes) -> Segment:
    """Parse the whole data of an HPSG/HPSO/NHSG chunk (17-byte header + pairs)."""
    if len(data) < HEADER_SIZE:
        raise RemoteProtocolError(
            f"heap segment rule 4.3.1: data is {len(data)} bytes, "
            f"shorter than the {HEADER_SIZE}-byte header"
        )
    heap_id, unit_size, start, offset, units = _HEADER.unpack_from(data)
    return decode_runs(heap_id, unit_size, start, offset, units, bytes(data[HEADER_SIZE:]))


def decode_runs(
    heap_id: int, unit_size: int, start: int, offset: int, units: int, usage: bytes
) -> Segment:
    """Validate a segment given as its header fields plus the raw pairs (rule 4.3).

    Raises :class:`RemoteProtocolError` naming the rule and the offending value;
    :class:`LocalProtocolError` when a header field is outside its wire range (caller bug).
    """
    try:
        return Segment(heap_id, unit_size, start, offset, units, bytes(usage))
    except _RuleError as exc:
        raise RemoteProtocolError(str(exc)) from None


def _check_rules(unit_size: int, declared: int, usage: bytes) -> None:
    """Apply protocol.md 4.3 in its order, without a Python-level loop on success."""
    if unit_size == 0:
        raise _RuleError("heap segment rule 4.3.1: unit size 0 is invalid")
    states = usage[0::2]
    counts = usage[1::2]
    whole = len(counts)  # complete pairs; an odd trailing byte sits in `states` only
    if len(states) > whole:
        states = states[:whole]
    # Rule 2 walks pairs in order; find the first failing pair of each kind, report the
    # earliest (U is checked before the overrun on the same pair), odd length last.
    first_u = states.translate(_U_TABLE).find(1)
    total = whole + sum(counts)
    first_over = _first_overrun(counts, declared) if total > declared else -1
    if first_u >= 0 and (first_over < 0 or first_u <= first_over):
        raise _RuleError(
            f"heap segment rule 4.3.2: pair {first_u} state 0x{states[first_u]:02x} "
            f"has the unused bit 0x{UNUSED:02x} set"
        )
    if first_over >= 0:
        before = sum(counts[:first_over]) + first_over
        raise _RuleError(
            f"heap segment rule 4.3.2: pair {first_over} "
            f"(state 0x{states[first_over]:02x}, {counts[first_over] + 1} units) "
            f"overruns the declared {declared} units ({declared - before} left): "
            "more units than declared"
        )
    if len(usage) % 2:
        raise _RuleError(
            f"heap segment rule 4.3.2: odd usage data ({len(usage)} bytes): "
            "the last pair is incomplete"
        )
    if total != declared:
        raise _RuleError(
            f"heap segment rule 4.3.3: pairs describe {total} units, "
            f"fewer than the declared {declared}"
        )
    if whole and states[-1] & PARTIAL:
        raise _RuleError(
            f"heap segment rule 4.3.4: last pair {whole - 1} state 0x{states[-1]:02x} "
            "has the partial bit set (a split run must end in the same chunk)"
        )


def _first_overrun(counts: bytes, declared: int) -> int:
    """Index of the first pair that takes the running unit total above ``declared``."""
    left = declared
    for index, n in enumerate(counts):
        if n + 1 > left:
            return index
        left -= n + 1
    return -1  # pragma: no cover - only called when the total exceeds `declared`


def _compute_stats(usage: bytes) -> _Stats:
    states = usage[0::2]
    counts = usage[1::2]
    units = [0] * 64
    runs = [0] * 64
    # One C-level pass: how often each (state, n) pair occurs.
    for word, times in Counter(memoryview(usage).cast("H")).items():
        state = (word >> _STATE_SHIFT) & 0xFF
        base = state & 0x3F
        units[base] += times * (((word >> _COUNT_SHIFT) & 0xFF) + 1)
        if not state & PARTIAL:
            runs[base] += times
    # A P pair ends its logical run only when the next pair has another state.
    for match in _P_STATE.finditer(states):
        index = match.start()
        if (states[index] ^ states[index + 1]) & 0x3F:
            runs[states[index] & 0x3F] += 1

    pairs = len(states)
    mask = states.translate(_FREE_TABLE)
    first_used = mask.find(0)
    if first_used < 0:  # every pair free (or no pairs at all)
        total = pairs + sum(counts)
        return _Stats(tuple(units), tuple(runs), total, total, 0, 0, pairs > 0)
    last_used = mask.rfind(0)
    head = first_used + sum(counts[:first_used])
    tail = (pairs - last_used - 1) + sum(counts[last_used + 1 :])
    inner = bytearray(mask[first_used:last_used])
    inner_counts = counts[first_used:last_used]
    count = 0
    largest = 0
    for match in list(_MULTI_FREE.finditer(inner)):
        lo, hi = match.span()
        size = (hi - lo) + sum(inner_counts[lo:hi])
        count += 1
        largest = max(largest, size)
        inner[lo:hi] = bytes(hi - lo)
    singles = inner.count(1)
    if singles:
        count += singles
        largest = max(largest, max(compress(inner_counts, inner)) + 1)
    return _Stats(tuple(units), tuple(runs), head, tail, count, largest, False)


def _build_runs(segment: Segment) -> tuple[Run, ...]:
    unit = segment.unit_size
    out: list[Run] = []
    address = segment.address
    run_start = address
    run_units = 0
    run_state = -1
    usage = segment.usage
    for state, n in zip(usage[0::2], usage[1::2], strict=True):
        base = state & 0x3F
        if run_units and base != run_state:  # P piece followed by another state
            out.append(Run(run_start, run_units, _KIND_OF[run_state], _SOLIDITY_OF[run_state]))
            run_start += run_units * unit
            run_units = 0
        run_state = base
        run_units += n + 1
        if not state & PARTIAL:
            out.append(Run(run_start, run_units, _KIND_OF[base], _SOLIDITY_OF[base]))
            run_start += run_units * unit
            run_units = 0
    return tuple(out)


# --------------------------------------------------------------------------- summary


@dataclass(frozen=True, slots=True)
class HeapSummary:
    """The figures a UI shows for one heap image. All sizes are in bytes.

    * ``bytes_used``: units of every run whose solidity is not FREE, times ``unit_size``.
    * ``bytes_free``: units of every FREE run, times ``unit_size``. Only free space between
      allocations is encoded by shipped VMs, so this is not "heap size minus used".
    * ``bytes_by_kind``: ``(Kind, bytes)`` for used runs only, ascending kind, zero entries
      left out; the values add up to ``bytes_used``.
    * ``bytes_by_solidity``: ``(Solidity, bytes)`` for every run including FREE (an
      undefined solidity 7 appears as plain int 7); the values add up to used + free.
    * ``object_count``: HPSO data only (object boundaries are known there), else ``None``:
      the number of used logical runs whose kind is not NON_OBJECT (7).
    * ``largest_free_run`` / ``free_run_count``: over free *regions*, i.e. maximal stretches
      of contiguous free units: adjacent free runs merge, P-split or not, also across
      consecutive segments when one starts where the previous ended.
    * ``fragmentation``: ``1 - largest_free_run / bytes_free``; 0.0 when nothing is free.
    * ``span``: ``(lowest address, highest address + 1)`` covered by any non-empty segment,
      or ``None`` when there is none. Gaps between segments are not counted anywhere.
    """

    heap_id: int
    unit_size: int | None
    segment_count: int
    bytes_used: int
    bytes_free: int
    bytes_by_kind: tuple[tuple[Kind, int], ...]
    bytes_by_solidity: tuple[tuple[Solidity | int, int], ...]
    object_count: int | None
    largest_free_run: int
    free_run_count: int
    fragmentation: float
    span: tuple[int, int] | None


def _summarise(
    heap_id: int, unit_size: int | None, segments: Iterable[Segment], *, objects: bool
) -> HeapSummary:
    units_by_state = [0] * 64
    runs_by_state = [0] * 64
    free_count = 0
    largest = 0
    open_units = 0  # free region still open at the end of the previous segment
    prev_end: int | None = None
    low: int | None = None
    high: int | None = None
    seg_count = 0
    for seg in segments:
        seg_count += 1
        if unit_size is None:
            unit_size = seg.unit_size
        elif seg.unit_size != unit_size:
            raise LocalProtocolError(
                f"heap {heap_id}: segment unit size {seg.unit_size} != image unit size {unit_size}"
            )
        if seg.units == 0:
            continue
        stats = seg.stats()
        for base in range(64):
            units_by_state[base] += stats.units_by_state[base]
            runs_by_state[base] += stats.runs_by_state[base]
        address = seg.address
        low = address if low is None else min(low, address)
        high = seg.end if high is None else max(high, seg.end)
        if prev_end != address and open_units:
            free_count += 1
            largest = max(largest, open_units)
            open_units = 0
        if stats.all_free:
            open_units += seg.units
        else:
            open_units += stats.free_head
            if open_units:
                free_count += 1
                largest = max(largest, open_units)
            free_count += stats.inner_free_count
            largest = max(largest, stats.inner_free_largest)
            open_units = stats.free_tail
        prev_end = seg.end
    if open_units:
        free_count += 1
        largest = max(largest, open_units)

    unit = unit_size or 0
    by_kind = [0] * 8
    by_solidity = [0] * 8
    used = free = 0
    object_count = 0
    for base in range(64):
        size = units_by_state[base] * unit
        solidity = base & SOLIDITY_MASK
        kind = base >> KIND_SHIFT
        by_solidity[solidity] += size
        if solidity == Solidity.FREE:
            free += size
        else:
            used += size
            by_kind[kind] += size
            if kind != Kind.NON_OBJECT:
                object_count += runs_by_state[base]
    largest_bytes = largest * unit
    return HeapSummary(
        heap_id=heap_id,
        unit_size=unit_size,
        segment_count=seg_count,
        bytes_used=used,
        bytes_free=free,
        bytes_by_kind=tuple((Kind(k), b) for k, b in enumerate(by_kind) if b),
        bytes_by_solidity=tuple((_solidity(s), b) for s, b in enumerate(by_solidity) if b),
        object_count=object_count if objects else None,
        largest_free_run=largest_bytes,
        free_run_count=free_count,
        fragmentation=1.0 - largest_bytes / free if free else 0.0,
        span=None if low is None or high is None else (low, high),
    )
