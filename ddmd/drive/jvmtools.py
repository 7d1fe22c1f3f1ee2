"""What a VM's driver does for a plain JVM (one without DDM) through the HotSpot Attach API:
stacks (``Thread.print``), heap figures (``GC.heap_info``), a garbage collection (``GC.run``)
and an HPROF heap dump (``GC.heap_dump``); and every thread's stack for any VM (``stacks``:
one STKL per thread for a DDM VM).

Layer: trio, ``ddmd.attach`` (the attach client), ``ddmd.protocol.hsattach`` (reading the
answers) and ``ddmd.drive``. ``JvmTools`` is a part the ``VmDriver`` owns; the driver routes a
``VmHandle`` call here when its VM does not speak DDM (``applies()``). Kill is not here: a
plain JVM is stopped over ddmd's own JDWP connection (VirtualMachine.Exit, the session's).

A JVM is reached through the pid the port scan found for it (``discovery.localproc``): a VM
without one (connected by address, or on another computer) gets a sentence that says so.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

import trio

from ddmd.config import Config
from ddmd.drive.captures import CaptureResult, capture_name
from ddmd.drive.found import ProcessInfo
from ddmd.errors import DdmFailed, FeatureUnsupported, RequestTimedOut, TargetError
from ddmd.hotspot.client import AttachClient, AttachUnavailable
from ddmd.protocol.ddm import StackFrame, StackTrace
from ddmd.protocol.hsattach import (
    DumpThread,
    ThreadDump,
    parse_heap_dump,
    parse_heap_info,
    parse_thread_dump,
    pick_threads,
)
from ddmd.registry import GcOutcome, VmSnapshot

__all__ = ["JvmTools"]


class _Owner(Protocol):
    """What ``JvmTools`` needs of its ``VmDriver``."""

    @property
    def capture_dir(self) -> Path: ...

    def snapshot(self) -> VmSnapshot: ...

    async def stack_trace(self, thread_id: int) -> StackTrace: ...

    async def refresh_threads(self) -> VmSnapshot: ...


class JvmTools:
    """The attach API's features for one VM (and ``stacks`` for every VM)."""

    def __init__(
        self, owner: _Owner, *, process: ProcessInfo | None, address: str, config: Config
    ) -> None:
        self._owner = owner
        self._address = address
        self._quick = config.timeouts.jdwp_request  # a thread dump, the heap figures
        self._slow = config.timeouts.capture  # a full GC, a heap dump
        self._client: AttachClient | None = None
        if process is not None:
            cmdline = getattr(process, "cmdline", None)  # discovery.localproc's LocalProcess
            self._client = AttachClient(process.pid, cmdline=cmdline or None)

    def applies(self) -> bool:
        """True for a plain JVM: these features come from the attach API, not DDM."""
        return self._owner.snapshot().ddm is False

    # ------------------------------------------------------------------ words

    def _who(self) -> str:
        snapshot = self._owner.snapshot()
        name = snapshot.display_name
        pid = self._client.pid if self._client is not None else snapshot.pid
        return name if pid is None or f"pid {pid}" in name else f"{name} (pid {pid})"

    def _unreachable(self) -> str:
        """Why a VM without a known process cannot be attached to."""
        who = self._owner.snapshot().display_name
        where = "" if self._address in who else f" ({self._address})"
        host = self._address.rpartition(":")[0].strip("[]")
        try:
            local = ipaddress.ip_address(host).is_loopback
        except ValueError:
            local = host == "localhost"
        if not local:
            return (
                f"{who}{where} is not on this computer: the HotSpot attach API (what jstack "
                "and jcmd use) reaches only JVMs on the same computer"
            )
        return (
            f"ddmd does not know which process {who}{where} is, so it cannot use the HotSpot "
            "attach API (what jstack and jcmd use) with it"
        )

    def offer(self) -> dict[str, dict[str, object]]:
        """The profiling features a plain JVM gets from the attach API, for ``profiling()``
        (blocking, but only a few small /proc reads)."""
        reason = self.refusal()
        return {
            "hprof": {"available": reason is None, "reason": reason, "mode": "attach"},
            "attach": {"available": reason is None, "reason": reason},
        }

    def refusal(self) -> str | None:
        if self._client is None:
            return self._unreachable()
        return self._client.refusal(self._who())

    # ------------------------------------------------------------------ commands

    async def _jcmd(self, line: str, patience: float) -> str:
        if self._client is None:
            raise AttachUnavailable(self._unreachable())
        who = self._who()
        reply = await self._client.execute(who, "jcmd", line, patience=patience)
        if not reply.ok:
            said = " ".join(reply.text.split()) or f"status {reply.status}"
            raise DdmFailed(f"{who} refused {line.split()[0]}: {said}")
        return reply.text

    async def thread_dump(self) -> tuple[ThreadDump, str]:
        """``Thread.print``: read, and its text as jstack prints it."""
        text = await self._jcmd("Thread.print", self._quick)
        return parse_thread_dump(text), text

    async def heap(self) -> dict[str, Any]:
        """``GC.heap_info``'s figures (``HeapFigures.to_json``)."""
        figures = parse_heap_info(await self._jcmd("GC.heap_info", self._quick))
        return {"source": "GC.heap_info", **figures.to_json()}

    async def cause_gc(self) -> GcOutcome:
        await self._jcmd("GC.run", self._slow)
        return GcOutcome(confirmed=True, by="GC.run")

    async def dump_hprof(self) -> CaptureResult:
        """``GC.heap_dump`` (live objects, after a full GC, as ``jmap -dump:live``) into the
        capture directory. A JVM in another mount namespace (a container) writes it into its
        own /tmp, from where it is moved."""
        if self._client is None:
            raise AttachUnavailable(self._unreachable())
        snapshot = self._owner.snapshot()
        directory = self._owner.capture_dir
        name = capture_name(snapshot.package or snapshot.app, "hprof")
        path = await trio.to_thread.run_sync(_free_path, directory, name)
        root = Path(f"/proc/{self._client.pid}/root")
        same_root = await trio.to_thread.run_sync(_same_file, root, Path("/"))
        written = path if same_root else PurePosixPath("/tmp") / path.name
        try:
            text = await self._jcmd(f"GC.heap_dump {_quoted(str(written))}", self._slow)
            result = parse_heap_dump(text)
            if not result.written:
                raise DdmFailed(f"{self._who()} wrote no heap dump: {result.message}")
            if not same_root:
                inside = root / str(written).lstrip("/")
                await trio.to_thread.run_sync(shutil.move, inside, path)
            size = (await trio.to_thread.run_sync(path.stat)).st_size
        except BaseException:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(_remove, path)
            raise
        return CaptureResult(path, size)

    # ------------------------------------------------------------------ stacks

    async def stacks(self) -> dict[str, Any]:
        """Every thread's stack: the JVM's thread dump, or STKL for each thread of a DDM VM
        (a thread that ended meanwhile gets its ``error``)."""
        if self.applies():
            dump, text = await self.thread_dump()
            return {
                "source": "Thread.print",
                "threads": [t.to_json() for t in dump.threads],
                "text": text,
                "deadlocked": dump.deadlocked,
            }
        snapshot = self._owner.snapshot()
        if snapshot.threads is None:
            snapshot = await self._owner.refresh_threads()
        if snapshot.threads is None:
            missing = snapshot.missing()
            raise FeatureUnsupported(
                missing.get("THST") or missing.get("THEN") or missing.get("HELO")
                or f"{snapshot.display_name} has reported no threads yet"
            )  # fmt: skip
        threads: list[dict[str, Any]] = []
        for t in sorted(snapshot.threads, key=lambda t: t.thread_id):
            entry: dict[str, Any] = {
                "id": t.thread_id, "name": t.name, "tid": t.tid, "state": t.state,
                "daemon": t.daemon,
            }  # fmt: skip
            try:
                entry["frames"] = _frames_json(await self._owner.stack_trace(t.thread_id))
            except (DdmFailed, RequestTimedOut) as exc:
                entry["frames"], entry["error"] = [], str(exc)
            threads.append(entry)
        return {"source": "STKL", "threads": threads, "text": None, "deadlocked": None}

    async def threads(self) -> dict[str, Any]:
        """A plain JVM's thread list from its thread dump, numbered as jstack numbers it (the
        ``#N`` Java thread id, also the number ``stack`` takes): every Java thread with its
        daemon flag and the state jstack prints. The JVM's own threads (GC, the VM thread),
        which jstack lists without a number, are left out, and ``left_out`` names them."""
        dump, _ = await self.thread_dump()
        java = [t for t in dump.threads if t.number is not None]
        own = [t.name for t in dump.threads if t.number is None]
        return {
            "source": "Thread.print",
            "threads": [_listed(t) for t in java],
            "left_out": {
                "count": len(own),
                "names": own,
                "why": "the JVM's own threads (garbage collector, compiler, VM thread): they "
                "run no Java code, so they have no Java thread id and no Java stack",
            },
        }

    async def stack(self, key: str) -> dict[str, Any]:
        """One thread of a plain JVM, by ``#N`` Java thread id (the ids of ``threads``), or by
        name (exact, else a part)."""
        snapshot = self._owner.snapshot()
        dump, _ = await self.thread_dump()
        thread = self._pick(snapshot, dump, key)
        return {
            "thread_id": thread.number,
            "thread_name": thread.name,
            "java_id": thread.number,
            "state": thread.state,
            "java_state": thread.java_state,
            "frames": [f.to_json() for f in thread.frames],
            "text": thread.text,
            "source": "Thread.print",
        }

    async def stack_trace(self, thread_id: int) -> StackTrace:
        """``VmHandle.stack_trace`` for a plain JVM, in STKL's shape."""
        dump, _ = await self.thread_dump()
        thread = self._pick(self._owner.snapshot(), dump, str(thread_id))
        frames = tuple(
            StackFrame(f.class_name, f.method_name, f.file_name, f.line) for f in thread.frames
        )
        return StackTrace(thread_id, frames)

    def _pick(self, snapshot: VmSnapshot, dump: ThreadDump, key: str) -> DumpThread:
        # One numbering: a number is jstack's #N, the id `threads` lists (never the JDWP
        # object id of ddmd's own connection).
        text = key.strip()
        matches = pick_threads(dump.threads, text)
        if len(matches) == 1:
            return matches[0]
        candidates = tuple(_describe(t) for t in (matches or dump.threads))
        if matches:
            raise TargetError(
                f"{text!r} matches several threads in VM {snapshot.id}",
                candidates=candidates,
                ambiguous=True,
            )
        raise TargetError(f"no thread {text!r} in VM {snapshot.id}", candidates=candidates)


def _listed(thread: DumpThread) -> dict[str, Any]:
    """A Java thread of the dump as a row of the thread list (no frames)."""
    return {
        "id": thread.number,
        "name": thread.name,
        "tid": thread.nid,
        "state": thread.state,
        "java_state": thread.java_state,
        "state_detail": thread.state_detail,
        "daemon": thread.daemon,
        "priority": thread.priority,
    }


def _describe(thread: DumpThread) -> str:
    return f"{thread.number} {thread.name}" if thread.number is not None else thread.name


def _frames_json(trace: StackTrace) -> list[dict[str, Any]]:
    """STKL frames as the API shows them (``control.shapes.frame_json``'s keys)."""
    return [
        {"class_name": f.class_name, "method_name": f.method_name, "file_name": f.file_name,
         "line": f.line}
        for f in trace.frames
    ]  # fmt: skip


def _quoted(path: str) -> str:
    """A jcmd argument: quoted when it holds a space (jcmd's own argument rule)."""
    return f'"{path}"' if " " in path else path


def _free_path(directory: Path, name: str) -> Path:
    """``directory/name``, or ``NAME-2.hprof`` ... when taken (the JVM will not overwrite)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    stem, dot, suffix = name.rpartition(".")
    n = 2
    while path.exists():
        path = directory / f"{stem}-{n}{dot}{suffix}"
        n += 1
    return path


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return True  # cannot tell: the common case (no container)


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)
