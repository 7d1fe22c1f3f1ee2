"""What can happen to a VM session: one frozen dataclass per kind (dispatch on the class).

Layer: standard library only. The driver builds these from what its sockets, the API and the
clock say, and hands them to the session; nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddmd.session.consumers import DEBUGGER, ConsumerKind


@dataclass(frozen=True, slots=True)
class VmConnected:
    """A JDWP connection to the VM is open and past its handshake. ``leftover``: bytes that
    arrived after the handshake echo (a VM may push at once). ``wall``: the wall-clock time
    of the connection (seconds since the epoch) for the snapshot; without it, ``now``."""

    now: float
    leftover: bytes = b""
    wall: float | None = None


@dataclass(slots=True)  # made per packet: not frozen, which would cost 3x (see commands.py)
class VmBytes:
    """Bytes read from the VM connection (``b""``: the VM closed it)."""

    data: bytes


@dataclass(frozen=True, slots=True)
class VmClosed:
    """The VM connection ended (EOF, a read error, or a send that may have written part of a
    packet); ``reason`` is for the log."""

    reason: str


@dataclass(frozen=True, slots=True)
class ConsumerJoined:
    """A consumer's connection was accepted (nothing read yet): ``consumer`` is the driver's id
    for it, ``via`` the kind of port ("vm-port", "current", "front"), ``peer`` its address,
    ``kind`` what it is (``consumers.ConsumerKind``: a debugger, or a socket of the adb front)."""

    consumer: int
    via: str
    peer: str
    kind: ConsumerKind = DEBUGGER
    tool: str | None = None  # the program on the other end, when known ("Android Studio")


@dataclass(frozen=True, slots=True)
class ConsumerNamed:
    """The program on the other end of a consumer's connection was found (its command line)."""

    consumer: int
    tool: str


@dataclass(slots=True)  # made per packet: not frozen (see VmBytes)
class ConsumerBytes:
    consumer: int
    data: bytes  # b"": the consumer closed its side


@dataclass(frozen=True, slots=True)
class ConsumerLeft:
    """The consumer's connection is gone (closed, broken, or dropped by the driver)."""

    consumer: int
    reason: str


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed: ``now`` is the driver's clock (the session never reads one). Sent at the
    times the session asked for with ``WakeMeAt``, and may be sent at any other time."""

    now: float


@dataclass(frozen=True, slots=True)
class RefreshThreads:
    """Poll thread states now and keep polling for a lease (a page or ``--watch`` is open)."""


@dataclass(frozen=True, slots=True)
class CauseGc:
    pass


@dataclass(frozen=True, slots=True)
class GetStack:
    thread_id: int


@dataclass(frozen=True, slots=True)
class DumpHeap:
    """Heap segments on, a GC, and the dump it pushes."""


@dataclass(frozen=True, slots=True)
class StartTrace:
    """Method tracing on: streaming (MPSS, or SPSS with ``sampling_us``), or into
    ``device_path`` on the device (MPRS) for a VM that only writes trace files there (the
    driver gives a path only where it can fetch the file: through adb)."""

    sampling_us: int | None = None
    buffer_size: int = 8 << 20
    device_path: str | None = None


@dataclass(frozen=True, slots=True)
class StopTrace:
    """Method tracing off: the trace comes as ``Capture`` commands (streaming), or is left in
    the device file (answered with its path)."""


@dataclass(frozen=True, slots=True)
class TraceState:
    """Is the VM tracing (MPRQ)?"""


@dataclass(frozen=True, slots=True)
class AllocTracker:
    """The allocation tracker: ``action`` is "start", "stop", "status" or "list"."""

    action: str


@dataclass(frozen=True, slots=True)
class DumpHprof:
    """An HPROF heap dump: streamed (HPDS, as ``Capture`` commands), or written to
    ``device_path`` (HPDU) where the VM cannot stream and the driver can fetch the file."""

    device_path: str | None = None


@dataclass(frozen=True, slots=True)
class Kill:
    """EXIT with ``status``: the VM process ends."""

    status: int = 1


Request = (
    RefreshThreads
    | CauseGc
    | GetStack
    | DumpHeap
    | StartTrace
    | StopTrace
    | TraceState
    | AllocTracker
    | DumpHprof
    | Kill
)


@dataclass(frozen=True, slots=True)
class Call:
    """A request from the API; answered by ``Resolve`` or ``Reject`` with the same ``call``."""

    call: int
    request: Request


Input = (
    VmConnected
    | VmBytes
    | VmClosed
    | ConsumerJoined
    | ConsumerBytes
    | ConsumerNamed
    | ConsumerLeft
    | Tick
    | Call
)
