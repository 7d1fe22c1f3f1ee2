"""The VM driver's profiling part: method tracing, the allocation tracker, HPROF dumps and
kill (issue 13), and the files they bring.

Layer: trio only (plus ``drive.captures``); every decision is the session's
(``session/profiling.py``). A part of ``VmDriver``, seen through its ``core.Core``. A call that
brings a file (a trace, a heap dump) gets a ``CaptureFile`` before it is fed to the session; the
session's ``Capture`` commands fill it (``put``), and the call returns once the file is complete
on disk.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from ddmd.drive.captures import HIGH_WATER, CaptureFile, CaptureResult, capture_name
from ddmd.drive.core import Core
from ddmd.drive.found import DeviceFiles
from ddmd.drive.jvmtools import JvmTools
from ddmd.errors import DdmFailed
from ddmd.protocol.ddm import ResolvedAllocation
from ddmd.session.commands import Capture
from ddmd.session.inputs import (
    AllocTracker,
    DumpHprof,
    Kill,
    StartTrace,
    StopTrace,
    TraceState,
)
from ddmd.session.vm import VmSession

__all__ = ["Profiling"]


class Profiling:
    """The ``VmHandle`` methods of issue 13's features, and the files under way (by call)."""

    def __init__(
        self,
        core: Core,
        session: VmSession,
        jvm: JvmTools,
        *,
        capture_dir: Path,
        device_files: DeviceFiles | None,
        app_name: Callable[[], str | None],
    ) -> None:
        self._core = core
        self._session = session
        self._jvm = jvm
        self._captures: dict[int, CaptureFile] = {}  # call -> the file it brings
        self.capture_dir = capture_dir
        self.device_files = device_files  # adb VMs: where a VM that cannot stream writes
        self._app_name = app_name

    def put(self, command: Capture) -> None:
        """A piece of the file a call brings (the session's ``Capture``)."""
        capture = self._captures.get(command.call)
        if capture is not None:
            capture.put(command.data, command.last)

    async def wait_room(self) -> None:
        """Wait while a file's disk is behind (the VM reader then lets TCP slow the VM)."""
        for capture in list(self._captures.values()):
            if capture.queued > HIGH_WATER:
                await capture.wait_room()

    def profiling(self) -> dict[str, Any]:
        """What this VM offers (``available`` and the ``reason`` when not), and its states."""
        session = self._session
        features = session.profiling_offer()
        if self._jvm.applies():  # a plain JVM: heap dumps through the attach API
            features = {**features, **self._jvm.offer()}
        return {
            "features": features,
            "trace": session.trace_state,
            "allocs": None,  # not known until asked (GET .../allocs says)
        }

    def _device_path(self, suffix: str) -> str | None:
        """Where on the device a VM that cannot stream should write its file (adb VMs only:
        ddmd can fetch it from there); None elsewhere."""
        if self.device_files is None:
            return None
        return self.device_files.device_path(capture_name(self._app_name(), suffix))

    async def start_trace(self, sampling_us: int | None = None) -> dict[str, Any]:
        request = StartTrace(sampling_us=sampling_us, device_path=self._device_path("trace"))
        value = await self._core.ask(request)
        assert isinstance(value, dict)
        return value

    async def trace_state(self) -> dict[str, Any]:
        value = await self._core.ask(TraceState())
        assert isinstance(value, dict)
        return value

    async def stop_trace(self) -> CaptureResult:
        return await self._capture(StopTrace(), "trace")

    async def dump_hprof(self) -> CaptureResult:
        if self._jvm.applies():  # a plain JVM: GC.heap_dump through the attach API
            return await self._jvm.dump_hprof()
        return await self._capture(DumpHprof(self._device_path("hprof")), "hprof")

    async def alloc_tracker(self, action: str) -> dict[str, Any]:
        value = await self._core.ask(AllocTracker(action))
        assert isinstance(value, dict)
        allocations = value.get("allocations")
        if allocations is not None:
            value = {**value, "allocations": [_allocation_json(a) for a in allocations]}
        return value

    async def kill(self, status: int = 1) -> dict[str, Any]:
        value = await self._core.ask(Kill(status))
        assert isinstance(value, dict)
        return value

    async def _capture(self, request: StopTrace | DumpHprof, suffix: str) -> CaptureResult:
        """A call whose answer is a file: written to the capture directory as it arrives."""
        nursery = self._core.nursery()
        if nursery is None:
            raise DdmFailed("the VM is not connected")
        number = self._core.next_call()
        path = _free_path(self.capture_dir, capture_name(self._app_name(), suffix))
        capture = self._captures[number] = CaptureFile(path)
        nursery.start_soon(capture.run)
        try:
            value = await self._core.ask(request, number=number)
        except BaseException:
            capture.abandon("the call failed")
            with trio.CancelScope(shield=True):
                await capture.finished()
                await trio.to_thread.run_sync(_remove, path)
            raise
        finally:
            self._captures.pop(number, None)
        assert isinstance(value, dict)
        if "device_file" in value:  # the VM wrote it on the device: fetch it through adb
            capture.abandon("the file is on the device")
            await capture.finished()
            return await self._fetch(str(value["device_file"]), path)
        await capture.finished()
        if capture.error is not None:
            await trio.to_thread.run_sync(_remove, path)
            raise DdmFailed(capture.error)
        return CaptureResult(path, capture.size)

    async def _fetch(self, remote: str, path: Path) -> CaptureResult:
        files = self.device_files
        if files is None:
            raise DdmFailed(f"the file is on the device at {remote}, and this VM is not on adb")
        try:
            size = await files.fetch(remote, path)
        except Exception as exc:  # adb's failures, in its words
            await trio.to_thread.run_sync(_remove, path)
            raise DdmFailed(f"could not fetch {remote} from the device: {exc}") from exc
        return CaptureResult(path, size)


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


def _free_path(directory: Path, name: str) -> Path:
    path = directory / name
    stem, dot, suffix = name.rpartition(".")
    n = 2
    while path.exists():
        path = directory / f"{stem}-{n}{dot}{suffix}"
        n += 1
    return path


def _allocation_json(allocation: ResolvedAllocation) -> dict[str, Any]:
    return {
        "size": allocation.size,
        "class": allocation.class_name,
        "thread": allocation.thread_id,
        "frames": [
            {"class": f.class_name, "method": f.method_name, "file": f.file_name, "line": f.line}
            for f in allocation.frames
        ],
    }
