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
from pathlib import Path
from typing import Any, Protocol

import structlog

from ddmd.errors import FeatureUnsupported, TargetError
from ddmd.logs import Event
from ddmd.protocol.ddm import StackTrace
from ddmd.protocol.heap import HeapImage
from ddmd.session.model import (
    GcOutcome,
    HeapInfoSnapshot,
    ThreadSnapshot,
    VmSnapshot,
)
from ddmd.session.words import SILENCE_HINTS, missing_sentence

# The snapshot types live with the session that builds them; they are served from here.
__all__ = [
    "DeviceSnapshot",
    "GcOutcome",
    "HeapInfoSnapshot",
    "ThreadSnapshot",
    "VmHandle",
    "VmRegistry",
    "VmSnapshot",
]

_log = structlog.get_logger("ddmd.registry")


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


class CapturedFile(Protocol):
    """A file a VM sent (a method trace, a heap dump), complete on disk."""

    @property
    def path(self) -> Path: ...

    @property
    def size(self) -> int: ...

    def to_json(self) -> dict[str, Any]: ...


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

    async def cause_gc(self) -> GcOutcome:
        """HPGC: the VM runs a garbage collection; done when its heap info push (or, on older
        VMs, the reply) arrives, or unconfirmed after a bounded wait."""
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

    # Method tracing, the allocation tracker, HPROF dumps, kill (drive/profiling.py; the API's
    # control/profiling.py). Errors as above, plus WrongState (already tracing, a dump under way).

    def profiling(self) -> dict[str, Any]:
        """{features: {trace, allocs, hprof, kill: {available, reason, ...}}, trace}."""
        ...

    async def start_trace(self, sampling_us: int | None = None) -> dict[str, Any]: ...

    async def stop_trace(self) -> CapturedFile: ...

    async def trace_state(self) -> dict[str, Any]: ...

    async def alloc_tracker(self, action: str) -> dict[str, Any]: ...

    async def dump_hprof(self) -> CapturedFile: ...

    async def kill(self, status: int = 1) -> dict[str, Any]: ...

    @property
    def ext_values(self) -> dict[str, Any]:
        """What each chunk handler last published for this VM (``{handler name: value}``)."""
        ...


@dataclass(slots=True)
class VmRegistry:
    """Known VMs keyed by id; resolves CLI targets; tells listeners about changes.

    Listeners are plain callables ``(kind, vm_id)`` called synchronously; they must not block
    (the event stream wraps them in ``send_nowait`` on bounded channels). Kind "device" carries
    a device serial instead of a VM id (the adb device list changed).

    The current VM (`current`): the VM of the app chosen with `select` while it runs, else the
    only VM when exactly one is known, else none. `current_port` is the port that serves it
    (set by the daemon once that port listens; None in tests without one), and the adb
    server's address and whether ddmd reaches it (`set_adb_server`, told by the adb
    discoverer) let the API say why the device list is empty.
    """

    _vms: dict[str, VmHandle] = field(default_factory=dict)
    _devices: dict[str, DeviceSnapshot] = field(default_factory=dict)
    _listeners: list[Callable[[str, str], None]] = field(default_factory=list)
    _selected_key: str | None = None  # sticky selection: DEVICE|NAME of the chosen app
    _selected_id: str | None = None  # the VM that was chosen (preferred among equal keys)
    _last_current: str | None = None
    #: The current-VM port as bound (the daemon sets it once it listens).
    current_port: int | None = None
    _adb_server: str | None = None  # host:port of the adb server ddmd uses
    _adb_connected: bool | None = None  # None: not tried yet (or adb is off)
    _stopping: bool = False  # the daemon stops: its VMs leave one by one, quietly

    def stopping(self) -> None:
        """The daemon is stopping: as its VMs are removed one by one, the current VM changes
        at every step; those changes are still notified but no longer logged (the log says
        ``daemon.stopping`` and each VM's ``vm.gone``, not a ``current.changed`` per step)."""
        self._stopping = True

    def add(self, handle: VmHandle) -> None:
        self._vms[handle.vm_id] = handle
        self._notify("added", handle.vm_id)
        self._check_current("vm added")

    def remove(self, vm_id: str) -> None:
        if self._vms.pop(vm_id, None) is not None:
            if vm_id == self._selected_id:
                # The chosen VM is gone; the choice stays with its key. A later VM with the
                # same id (a new app on the same port) is not "the chosen VM" until the key
                # leads to it (see _check_current).
                self._selected_id = None
            self._notify("removed", vm_id)
            self._check_current("vm removed")

    def changed(self, vm_id: str) -> None:
        """An actor calls this when its snapshot changed in a way listeners care about."""
        if vm_id in self._vms:
            self._notify("changed", vm_id)

    def ext_updated(self, vm_id: str) -> None:
        """A chunk handler published a new value for this VM (``VmHandle.ext_values``)."""
        if vm_id in self._vms:
            self._notify("ext", vm_id)

    def key_changed(self, vm_id: str) -> None:
        """An actor calls this when its selection key changed (named, renamed).

        The selection follows the VM, not the name it had when it was chosen: a VM selected
        before it was named (``id|VMID``, e.g. it reported WAIT before HELO) or renamed later
        (APNM: "<pre-initialized>" -> the app) stays current, and its new key is what sticks
        across app restarts from now on.
        """
        handle = self._vms.get(vm_id)
        if handle is None:
            return
        if vm_id == self._selected_id:
            self._selected_key = self._key_of(handle)
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

    def set_adb_server(self, address: str, *, connected: bool) -> None:
        """The adb discoverer reached the server at ``address`` (``host:port``), or lost it."""
        self._adb_server = address
        self._adb_connected = connected

    def adb_server(self) -> dict[str, Any] | None:
        """``{server, connected}`` once the adb discoverer tried the server, else None."""
        if self._adb_connected is None:
            return None
        return {"server": self._adb_server, "connected": self._adb_connected}

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
        if (
            handle is not None
            and self._selected_key is not None
            and self._selected_id not in self._vms
            and self._key_of(handle) == self._selected_key
        ):
            # The chosen app runs again (a new pid): from now on this VM is the chosen one,
            # so that its own renames carry the selection along (key_changed).
            self._selected_id = handle.vm_id
        now = handle.vm_id if handle is not None else None
        if now != self._last_current:
            previous, self._last_current = self._last_current, now
            (_log.debug if self._stopping else _log.info)(
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
        """A VM the way people type it; TargetError lists the candidates otherwise.

        The rules, in order; the first one that matches anything decides (one match: that VM;
        several: ambiguous, the matches are the candidates):

        1. the exact VM id ("tcp:8000", "emulator-5554/1234"; ``device`` is not needed);
        2. the pid, or the port of a VM found on a scanned port ("8001" for "tcp:8001");
        3. the exact app or package name;
        4. the end of an app or package name at a dot or colon ("mail" or ".mail" for
           "com.example.mail", "example.mail" too), ignoring case;
        5. a part of an app or package name ("exam" for "com.example.mail"), ignoring case.

        ``device`` narrows rules 2-5 to the VMs of one adb device; a device nobody knows is
        said as such ("no device X (devices: ...)"), not as a VM that does not match.
        """
        target = target.strip()
        if not target:
            raise TargetError("empty target", candidates=self._describe(self._vms.values()))
        if target in self._vms:
            return self._vms[target]
        snapshots = [(h, h.snapshot()) for h in self._vms.values()]
        if device is not None:
            self._check_device(device, [s for _, s in snapshots])
            snapshots = [(h, s) for h, s in snapshots if s.device == device]
            if not snapshots:
                raise TargetError(
                    f"no VM matches {target!r} on device {device} "
                    "(ddmd knows no debuggable VM on it)"
                )
        for rule in _TARGET_RULES:
            matches = [h for h, s in snapshots if rule(target, s)]
            if len(matches) == 1:
                return matches[0]
            if matches:
                raise TargetError(
                    f"{target!r} matches several VMs",
                    candidates=self._describe(matches),
                    ambiguous=True,
                )
        if device is not None:
            raise TargetError(
                f"no VM matches {target!r} on device {device}",
                candidates=self._describe(h for h, _ in snapshots),
            )
        raise TargetError(
            f"no VM matches {target!r}", candidates=self._describe(self._vms.values())
        )

    def _check_device(self, device: str, snapshots: list[VmSnapshot]) -> None:
        """TargetError "no device X (devices: ...)" unless adb lists ``device`` or a VM is on it."""
        known = set(self._devices) | {s.device for s in snapshots if s.device}
        if device in known:
            return
        listed = f"devices: {', '.join(sorted(known))}" if known else "no adb device is known"
        raise TargetError(f"no device {device} ({listed})")

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


# Names a VM reports before it knows its own; never matched by a part of a name.
_UNNAMED = frozenset({"", "<pre-initialized>"})
_NAME_SEPARATORS = (".", ":")


def _real_names(s: VmSnapshot) -> list[str]:
    return [n.casefold() for n in _names(s) if n not in _UNNAMED]


def _by_pid_or_port(target: str, s: VmSnapshot) -> bool:
    """The pid, or the port of a VM found by the port scan (its id is "tcp:PORT")."""
    if not (target.isascii() and target.isdigit()):
        return False
    return s.pid == int(target) or s.id == f"tcp:{int(target)}"


def _by_name(target: str, s: VmSnapshot) -> bool:
    return target in _names(s)


def _by_suffix(target: str, s: VmSnapshot) -> bool:
    needle = target.casefold().lstrip("".join(_NAME_SEPARATORS))
    if not needle:
        return False
    return any(name.endswith(sep + needle) for name in _real_names(s) for sep in _NAME_SEPARATORS)


def _by_part(target: str, s: VmSnapshot) -> bool:
    needle = target.casefold()
    return any(needle in name for name in _real_names(s))


_TARGET_RULES: tuple[Callable[[str, VmSnapshot], bool], ...] = (
    _by_pid_or_port,
    _by_name,
    _by_suffix,
    _by_part,
)


# ---------------------------------------------------------------------------------- threads

#: DDM thread ids are u4 on the wire.
MAX_THREAD_ID = 0xFFFF_FFFF


def describe_threads(threads: tuple[ThreadSnapshot, ...] | None) -> tuple[str, ...]:
    """Candidates for a thread argument: "ID NAME", by id."""
    if not threads:
        return ()
    return tuple(f"{t.thread_id} {t.name}".rstrip() for t in sorted(threads, key=_thread_id))


def _thread_id(t: ThreadSnapshot) -> int:
    return t.thread_id


#: Thread handlers whose absence means stack traces are gone too (Android 12+ removed all three).
_THREAD_HANDLERS = ("STKL", "THST", "THEN")


def no_stack_traces(snapshot: VmSnapshot) -> str | None:
    """Why ``snapshot``'s VM gives no stack traces, in a user's words; None when it may.

    A plain JVM has no DDM; a VM that refused or ignored STKL says so in its own sentence; a VM
    that gave no thread list because its thread handlers are gone (THST or THEN missing) has
    no STKL either: one sentence, instead of "give a thread id" and then a failed id.
    """
    name = snapshot.display_name
    if snapshot.ddm is False:
        return missing_sentence(name, "STKL", "", ddm=False)
    if "STKL" in snapshot.unsupported:
        return snapshot.missing()["STKL"]
    if snapshot.threads is None and any(f in snapshot.unsupported for f in _THREAD_HANDLERS):
        return missing_sentence(name, "STKL", SILENCE_HINTS["STKL"], ddm=snapshot.ddm)
    return None


def resolve_thread(snapshot: VmSnapshot, thread: str) -> int:
    """The thread id meant by ``thread``: an id, or a thread name of the VM's thread list.

    An id is checked against the thread list when the VM reports one ("no thread 7 in VM X",
    the known threads as candidates); without a list it is taken as it is (the VM answers).
    A name: the exact name first, then a part of a name ignoring case; several matches are
    ambiguous. A name needs the thread list (FeatureUnsupported without one). Raises
    ValueError for an id outside 0..MAX_THREAD_ID. A VM known to give no stack traces (a plain
    JVM; a VM without thread handlers, as Android 12+) says so at once, for an id as for a name.
    """
    no_stacks = no_stack_traces(snapshot)
    if no_stacks is not None:
        raise FeatureUnsupported(no_stacks)
    text = thread.strip()
    threads = snapshot.threads
    if not text:
        raise TargetError("empty thread name", candidates=describe_threads(threads))
    if text.isascii() and text.isdigit():
        thread_id = int(text)
        if thread_id > MAX_THREAD_ID:
            raise ValueError(f"thread id {text!r} is not a number in 0..{MAX_THREAD_ID}")
        if threads is None or any(t.thread_id == thread_id for t in threads):
            return thread_id
        named = [t for t in threads if t.name == text]  # a thread may be called "7"
        if len(named) == 1:
            return named[0].thread_id
        raise TargetError(
            f"no thread {thread_id} in VM {snapshot.id}", candidates=describe_threads(threads)
        )
    if threads is None:
        raise FeatureUnsupported(
            f"VM {snapshot.id} does not report its threads, so the thread name {text!r} "
            "cannot be looked up; give a thread id"
        )
    needle = text.casefold()
    rules: tuple[Callable[[ThreadSnapshot], bool], ...] = (
        lambda t: t.name == text,
        lambda t: needle in t.name.casefold(),
    )
    for rule in rules:
        matches = tuple(t for t in threads if rule(t))
        if len(matches) == 1:
            return matches[0].thread_id
        if matches:
            raise TargetError(
                f"{text!r} matches several threads in VM {snapshot.id}",
                candidates=describe_threads(matches),
                ambiguous=True,
            )
    raise TargetError(
        f"no thread named {text!r} in VM {snapshot.id}", candidates=describe_threads(threads)
    )
