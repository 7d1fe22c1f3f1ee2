"""VmRegistry: the VMs ddmd knows, target resolution, current-VM selection, change notices,
and the adb device list (written by the adb discoverer, read by ``/api/v1/devices``).

Layer: imports protocol/ only (for plain value types); sync methods only, no I/O. The daemon
creates one registry and passes it down explicitly; actors register a ``VmHandle`` and the
control API reads snapshots from it.

Snapshots are frozen dataclasses built by the actor that owns the VM (``VmHandle.snapshot()``);
``to_json()`` gives the stable JSON shape served by ``/api/v1/vms`` and ``ddmd clients --json``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from ddmd.errors import TargetError
from ddmd.logs import Event
from ddmd.protocol.ddm import StackTrace
from ddmd.protocol.heap import HeapImage

_log = structlog.get_logger("ddmd.registry")


@dataclass(frozen=True, slots=True)
class ThreadSnapshot:
    """One VM thread as ddmd last saw it (THCR/THNM/THDE pushes and THST polls)."""

    thread_id: int
    name: str
    status: int | None = None  # raw THST status value
    state: str | None = None  # DDMS label for status, e.g. "running", "wait"
    tid: int | None = None
    utime: int | None = None
    stime: int | None = None
    daemon: bool | None = None
    suspended: bool | None = None  # draft layout only

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.thread_id,
            "name": self.name,
            "status": self.status,
            "state": self.state,
            "tid": self.tid,
            "utime": self.utime,
            "stime": self.stime,
            "daemon": self.daemon,
            "suspended": self.suspended,
        }


@dataclass(frozen=True, slots=True)
class HeapInfoSnapshot:
    """One heap from the latest HPIF push."""

    heap_id: int
    timestamp_ms: int
    reason: int
    max_size: int
    size: int
    bytes_allocated: int
    objects_allocated: int

    def to_json(self) -> dict[str, Any]:
        return {
            "heap_id": self.heap_id,
            "timestamp_ms": self.timestamp_ms,
            "reason": self.reason,
            "max_size": self.max_size,
            "size": self.size,
            "bytes_allocated": self.bytes_allocated,
            "objects_allocated": self.objects_allocated,
        }


@dataclass(frozen=True, slots=True)
class VmSnapshot:
    """Everything the control API shows about one VM. Built by its actor; immutable."""

    id: str
    source: str  # "tcp" or "adb"
    address: str  # "127.0.0.1:8000" or "SERIAL jdwp:PID"
    state: str  # "connecting", "identifying", "ready", "reconnecting"
    ddm: bool | None  # None until HELO is answered or refused
    pid: int | None = None
    app: str | None = None
    package: str | None = None
    user_id: int | None = None
    vm_ident: str | None = None
    abi: str | None = None
    jvm_flags: str | None = None
    native_debuggable: bool | None = None
    description: str | None = None  # VirtualMachine.Version description (non-DDM VMs)
    features: tuple[str, ...] = ()
    unsupported: tuple[str, ...] = ()  # DDM requests that timed out or failed on this VM
    waiting_for_debugger: bool = False
    threads: tuple[ThreadSnapshot, ...] | None = None  # None: unknown / not supported
    heaps: tuple[HeapInfoSnapshot, ...] = ()
    device: str | None = None
    debugger_port: int | None = None
    debugger: str | None = None
    current: bool = False
    connected_at: float | None = None  # wall-clock seconds since the epoch

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "source": self.source,
            "address": self.address,
            "state": self.state,
            "device": self.device,
            "pid": self.pid,
            "app": self.app,
            "package": self.package,
            "user_id": self.user_id,
            "vm_ident": self.vm_ident,
            "abi": self.abi,
            "jvm_flags": self.jvm_flags,
            "native_debuggable": self.native_debuggable,
            "description": self.description,
            "ddm": self.ddm,
            "features": list(self.features),
            "unsupported": list(self.unsupported),
            "waiting_for_debugger": self.waiting_for_debugger,
            "threads": None if self.threads is None else len(self.threads),
            "heaps": [h.to_json() for h in self.heaps],
            "debugger_port": self.debugger_port,
            "debugger": self.debugger,
            "current": self.current,
            "connected_at": self.connected_at,
        }


@dataclass(frozen=True, slots=True)
class DeviceSnapshot:
    """One Android device or emulator as the adb server lists it."""

    serial: str
    state: str  # adb's state: "device" (usable), "offline", "unauthorized", ...
    model: str | None = None
    product: str | None = None

    def to_json(self, *, vms: int) -> dict[str, Any]:
        return {
            "serial": self.serial,
            "state": self.state,
            "model": self.model,
            "product": self.product,
            "vms": vms,
        }


class VmHandle(Protocol):
    """What the registry and the control API may ask of a VM actor.

    Errors (from ddmd.errors): ``FeatureUnsupported`` when the VM does not speak DDM or lacks
    the handler (the request timed out before, or was refused), ``RequestTimedOut`` when this
    request got no answer in time, ``VmGone`` when the VM disconnected meanwhile.
    """

    @property
    def vm_id(self) -> str: ...

    def snapshot(self) -> VmSnapshot: ...

    async def refresh_threads(self) -> VmSnapshot:
        """Poll THST now (DDM VMs that support it) and keep polling for a lease of a few
        seconds, so a page or ``ddmd threads --watch`` that asks again sees live states."""
        ...

    async def cause_gc(self) -> None:
        """HPGC: the VM runs a garbage collection (heap info pushes follow)."""
        ...

    async def stack_trace(self, thread_id: int) -> StackTrace:
        """STKL for one thread (``ThreadGone``-style failures arrive as FeatureUnsupported
        or ddmd.errors.DdmFailed carrying the VM's FAIL message)."""
        ...

    async def heap_segments(self) -> tuple[HeapImage, ...]:
        """Enable HPSG, cause a GC, wait for the HPST..HPEN dump; one image per heap."""
        ...

    def last_heap_images(self) -> tuple[HeapImage, ...]:
        """The most recent decoded heap images (empty until a dump arrived)."""
        ...

    def selection_key(self) -> str | None:
        """``DEVICE|NAME`` (package, app, or address for a VM without a name); None while a
        DDM VM is not named yet. The current-VM selection sticks to this key."""
        ...

    def adopt_debugger(self, stream: Any, peer: str, *, via: str) -> None:
        """Take an accepted debugger connection (sync; the actor runs the session)."""
        ...


@dataclass(slots=True)
class VmRegistry:
    """Known VMs keyed by id; resolves CLI targets; tells listeners about changes.

    Listeners are plain callables ``(kind, vm_id)`` called synchronously; they must not block
    (the event stream wraps them in ``send_nowait`` on bounded channels). Kind "device" carries
    a device serial instead of a VM id (the adb device list changed).
    """

    _vms: dict[str, VmHandle] = field(default_factory=dict)
    _devices: dict[str, DeviceSnapshot] = field(default_factory=dict)
    _listeners: list[Callable[[str, str], None]] = field(default_factory=list)
    _selected_key: str | None = None  # sticky selection: DEVICE|NAME of the chosen app
    _selected_id: str | None = None  # the VM that was chosen (preferred among equal keys)
    _last_current: str | None = None

    def add(self, handle: VmHandle) -> None:
        self._vms[handle.vm_id] = handle
        self._notify("added", handle.vm_id)
        self._check_current("vm added")

    def remove(self, vm_id: str) -> None:
        if self._vms.pop(vm_id, None) is not None:
            self._notify("removed", vm_id)
            self._check_current("vm removed")

    def changed(self, vm_id: str) -> None:
        """An actor calls this when its snapshot changed in a way listeners care about."""
        if vm_id in self._vms:
            self._notify("changed", vm_id)

    def key_changed(self, vm_id: str) -> None:
        """An actor calls this when its selection key changed (named, renamed)."""
        if vm_id in self._vms:
            self._notify("changed", vm_id)
            self._check_current("vm named")

    # ------------------------------------------------------------------ adb devices

    def set_device(
        self, serial: str, state: str, model: str | None = None, product: str | None = None
    ) -> None:
        """The adb discoverer reports a device (new, or its state or model changed)."""
        self._devices[serial] = DeviceSnapshot(serial, state, model, product)
        self._notify("device", serial)

    def remove_device(self, serial: str) -> None:
        if self._devices.pop(serial, None) is not None:
            self._notify("device", serial)

    def devices(self) -> list[DeviceSnapshot]:
        """Known devices, sorted by serial."""
        return [self._devices[s] for s in sorted(self._devices)]

    # ------------------------------------------------------------------ current VM

    def select(self, vm_id: str, *, reason: str = "selected") -> VmHandle:
        """Make ``vm_id`` current; the choice sticks to its app (DEVICE|NAME) across restarts."""
        handle = self._vms.get(vm_id)
        if handle is None:
            raise TargetError(f"no VM {vm_id!r}", candidates=self._describe(self._vms.values()))
        self._selected_id = vm_id
        self._selected_key = handle.selection_key() or f"id|{vm_id}"
        self._check_current(reason)
        return handle

    def clear_selection(self) -> None:
        self._selected_key = None
        self._selected_id = None
        self._check_current("selection cleared")

    @property
    def selected_key(self) -> str | None:
        return self._selected_key

    def current(self) -> VmHandle | None:
        """The selected app's VM if it runs; otherwise the only VM if there is exactly one."""
        if self._selected_key is not None:
            if self._selected_id in self._vms:
                chosen = self._vms[self._selected_id]
                if self._key_of(chosen) == self._selected_key:
                    return chosen
            matches = [h for h in self._vms.values() if self._key_of(h) == self._selected_key]
            if matches:
                return matches[-1]  # the most recently found instance of that app
        if len(self._vms) == 1:
            return next(iter(self._vms.values()))
        return None

    def is_current(self, vm_id: str) -> bool:
        handle = self.current()
        return handle is not None and handle.vm_id == vm_id

    def _key_of(self, handle: VmHandle) -> str:
        return handle.selection_key() or f"id|{handle.vm_id}"

    def _check_current(self, reason: str) -> None:
        handle = self.current()
        now = handle.vm_id if handle is not None else None
        if now != self._last_current:
            previous, self._last_current = self._last_current, now
            _log.info(
                Event.CURRENT_CHANGED,
                vm=now,
                previous=previous,
                reason=reason,
                selected=self._selected_key,
            )
            self._notify("current", now or "")

    def get(self, vm_id: str) -> VmHandle | None:
        return self._vms.get(vm_id)

    def handles(self) -> list[VmHandle]:
        return list(self._vms.values())

    def snapshots(self) -> list[VmSnapshot]:
        return [h.snapshot() for h in self._vms.values()]

    def __len__(self) -> int:
        return len(self._vms)

    def __contains__(self, vm_id: object) -> bool:
        return vm_id in self._vms

    @contextlib.contextmanager
    def subscribe(self, listener: Callable[[str, str], None]) -> Iterator[None]:
        self._listeners.append(listener)
        try:
            yield
        finally:
            self._listeners.remove(listener)

    def _notify(self, kind: str, vm_id: str) -> None:
        for listener in list(self._listeners):
            listener(kind, vm_id)

    def resolve(self, target: str, *, device: str | None = None) -> VmHandle:
        """A VM by id, pid, or app/package name; TargetError lists candidates otherwise."""
        target = target.strip()
        if not target:
            raise TargetError("empty target", candidates=self._describe(self._vms.values()))
        if target in self._vms:
            return self._vms[target]
        handles = [h for h in self._vms.values() if device is None or h.snapshot().device == device]
        matches: list[VmHandle] = []
        if target.isdigit():
            pid = int(target)
            matches = [h for h in handles if h.snapshot().pid == pid]
        if not matches:
            matches = [h for h in handles if target in _names(h.snapshot())]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise TargetError(
                f"no VM matches {target!r}", candidates=self._describe(self._vms.values())
            )
        raise TargetError(
            f"{target!r} matches several VMs", candidates=self._describe(matches), ambiguous=True
        )

    @staticmethod
    def _describe(handles: Any) -> tuple[str, ...]:
        out = []
        for h in handles:
            s = h.snapshot()
            name = s.app or s.package or (s.description or "?").splitlines()[0]
            out.append(f"{s.id} (pid {s.pid if s.pid is not None else '?'}, {name})")
        return tuple(sorted(out))


def _names(s: VmSnapshot) -> set[str]:
    return {n for n in (s.app, s.package) if n}
