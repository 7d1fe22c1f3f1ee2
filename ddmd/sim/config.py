"""What a simulated VM is: `SimConfig` (its identity, flavour and behaviour knobs), the flavours,
and `SimStatistics` (the snapshot `SimVm.statistics()` returns).

Layer: standard library only; used by every other module of `ddmd.sim`. The flavours and knobs
are described in the package docstring (`ddmd.sim`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "ART_FEATURES",
    "FLAVORS",
    "HPROF_BYTES_MAX",
    "HPROF_BYTES_MIN",
    "PRE_INITIALIZED",
    "U4_MASK",
    "Flavor",
    "SimConfig",
    "SimStatistics",
    "check_type_name",
    "refusal",
]

Flavor = Literal["art", "legacy", "modern"]
FLAVORS: Final[tuple[Flavor, ...]] = ("art", "legacy", "modern")

ART_FEATURES: Final = (
    "hprof-heap-dump-streaming",
    "hprof-heap-dump",
    "method-sample-profiling",
    "method-trace-profiling-streaming",
    "method-trace-profiling",
    "view-hierarchy",
    "opengl-tracing",
)
PRE_INITIALIZED: Final = "<pre-initialized>"

U4_MASK: Final = 0xFFFFFFFF

#: Bounds of ``hprof_bytes`` (a streamed heap dump of that size): the packet's length field
#: (u4, 11 + 8 header bytes included) caps it; below the minimum it is not worth streaming.
HPROF_BYTES_MIN: Final = 4096
HPROF_BYTES_MAX: Final = U4_MASK - 11 - 8


def check_type_name(name: object) -> str:
    """``name`` if it can be a DDM request type (four printable ASCII characters), else
    ValueError with a message fit for the user."""
    if not (isinstance(name, str) and len(name) == 4 and all("!" <= c <= "~" for c in name)):
        raise ValueError(
            f"{name!r} is not a request type: give four ASCII characters, such as HPGC or THST"
        )
    return name


# The FAIL message of a refused request (``fail_types``): short, in the framework's manner
# (its own failures say e.g. "Stack trace unavailable").
_REFUSALS: Final = {
    "HELO": "Hello refused",
    "FEAT": "Feature list unavailable",
    "THEN": "Thread notifications unavailable",
    "THST": "Thread status unavailable",
    "STKL": "Stack trace unavailable",
    "HPIF": "Heap info unavailable",
    "HPSG": "Heap segment dumps unavailable",
    "NHSG": "Native heap segment dumps unavailable",
    "HPGC": "Garbage collection unavailable",
    "HPDU": "Heap dump unavailable",
    "HPDS": "Heap dump unavailable",
    "REAE": "Allocation tracking unavailable",
    "REAQ": "Allocation tracking unavailable",
    "REAL": "Allocation list unavailable",
    "MPRS": "Method tracing unavailable",
    "MPRE": "Method tracing unavailable",
    "MPSS": "Method tracing unavailable",
    "MPSE": "Method tracing unavailable",
    "SPSS": "Method sampling unavailable",
    "SPSE": "Method sampling unavailable",
    "MPRQ": "Profiling status unavailable",
}


def refusal(type_name: str) -> str:
    """The FAIL message for a request of ``type_name`` refused through ``fail_types``."""
    return _REFUSALS.get(type_name, "Request refused")


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One simulated VM. ``port=0`` picks a free port (the real one is reported by ``run``).

    ``seed=None`` derives the seed from the pid, so runs are reproducible either way.
    ``gc_interval``/``churn_interval`` of 0 switch the periodic GC / thread churn off
    (``HPGC`` and the test hooks still work). ``flavor`` and ``fail_types``: see
    `ddmd.sim`; ``fail_types`` holds request type names such as ``"HPGC"``.
    ``hprof_bytes`` (0: off) makes the streamed heap dump a generated one of exactly that
    many bytes, sent in pieces and never held whole (`ddmd.sim.ddms`).
    """

    host: str = "127.0.0.1"
    port: int = 0
    pid: int = 4242
    app_name: str = "com.example.sim"
    package_name: str = "com.example.sim"
    user_id: int = 0
    vm_ident: str = "Dalvik v2.1.0"
    abi: str = "64-bit (x86_64)"
    jvm_flags: str = "CheckJNI=false"
    native_debuggable: bool = False
    features: tuple[str, ...] = ART_FEATURES
    draft: bool = False
    wait_for_debugger: bool = False
    apnm_delay: float = 0.0
    threads: int = 8
    churn_interval: float = 4.0
    gc_interval: float = 3.0
    heap_mb: int = 4
    flavor: Flavor = "art"
    seed: int | None = None
    handshake_timeout: float = 5.0
    send_timeout: float = 10.0
    ack_dbgd: bool = False
    fail_types: tuple[str, ...] = ()
    hprof_bytes: int = 0

    def __post_init__(self) -> None:
        if self.host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"sim host {self.host!r}: the sim binds loopback addresses only")
        if not 0 <= self.port <= 0xFFFF:
            raise ValueError(f"sim port {self.port} is outside 0..65535")
        if not 0 < self.pid <= U4_MASK:
            raise ValueError(f"sim pid {self.pid} is outside 1..{U4_MASK}")
        if self.flavor not in FLAVORS:
            raise ValueError(
                f"sim flavor {self.flavor!r} is not one of {', '.join(map(repr, FLAVORS))}"
            )
        if isinstance(self.fail_types, str) or not isinstance(self.fail_types, tuple | list):
            raise ValueError(
                f"sim fail_types {self.fail_types!r} must be a tuple of request type names"
            )
        for name in self.fail_types:
            check_type_name(name)
        object.__setattr__(self, "fail_types", tuple(self.fail_types))
        if not 1 <= self.threads <= 10000:
            raise ValueError(f"sim threads {self.threads} is outside 1..10000")
        if not 1 <= self.heap_mb <= 2047:
            raise ValueError(f"sim heap_mb {self.heap_mb} is outside 1..2047")
        for name in ("apnm_delay", "churn_interval", "gc_interval"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"sim {name} {value!r} must be a finite number >= 0")
        for name in ("handshake_timeout", "send_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"sim {name} must be > 0")
        if self.hprof_bytes and not HPROF_BYTES_MIN <= self.hprof_bytes <= HPROF_BYTES_MAX:
            raise ValueError(
                f"sim hprof_bytes {self.hprof_bytes} is outside {HPROF_BYTES_MIN}.."
                f"{HPROF_BYTES_MAX} (0: the small recorded dump)"
            )

    @property
    def is_dalvik(self) -> bool:
        """VM ident version 1.x is Dalvik (status values 0-9), 2.x is ART (0-4)."""
        return self.vm_ident.startswith("Dalvik v1.")


@dataclass(frozen=True, slots=True)
class SimStatistics:
    """An immutable snapshot of one simulated VM (trio's ``statistics()`` convention)."""

    port: int | None
    pid: int
    app_name: str
    listening: bool
    connected: bool
    exited: bool
    connections_accepted: int
    packets_received: int
    ddm_requests: int
    jdwp_requests: int
    thst_requests: int
    replies_sent: int
    replies_received: int  # reply packets sent TO the VM: a correct server sends none
    duplicate_outstanding_ids: int  # command ids reused within ``ID_WINDOW`` commands (`sim.link`)
    pushes_sent: int
    gcs: int
    live_threads: int
    thread_notify: bool
    exit_status: int | None = None  # the status of EXIT or VirtualMachine.Exit, once exited
