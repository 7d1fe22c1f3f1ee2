"""What DDMS users still reach for, as conversations of one VM session: method tracing, the
allocation tracker, HPROF heap dumps and kill (protocol.md 3.4, 3.5, 2.2).

Layer: standard library, ``ddmd.protocol`` and ``ddmd.session`` (sans-IO). ``Profiling``
is the part of ``VmSession`` that turns these ``Call`` requests into DDM requests and settles
them. Most of these requests are answered by silence on a current phone (ART 9+ without its
agent), so each conversation ends on evidence that always comes:

    start trace   MPSS | SPSS | MPRS, then MPRQ (always answered, and after the start request
                  is handled): a FAIL to the start, or MPRQ's state, decides
    stop trace    MPSE | SPSE: the MPSE push carrying the whole .trace file -> Capture commands
                  (streamed, never held whole); MPRE (file mode): its reply, then the driver
                  fetches the device file
    heap dump     HPDS: the HPDS push carrying the whole .hprof -> Capture commands; HPDU (file
                  mode): its reply, then the driver fetches the device file
    allocations   REAE, then REAQ (always answered); REAL for the list
    kill          EXIT; the VM closes the connection (no answer is expected); a plain JVM:
                  JDWP VirtualMachine.Exit instead

A file pushed whole (small) arrives through the model's push path (``capture_chunk``); one
larger than the relay threshold arrives in pieces from the router (``push_piece``) and is
passed on piece by piece, so a heap dump of hundreds of MB never sits in memory.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from ddmd.protocol import ddm
from ddmd.protocol.expect import Answer
from ddmd.protocol.jdwp import CommandSet, VirtualMachineCommand
from ddmd.session.calls import PROFILING_REQUESTS, SELF, Own, PendingCall
from ddmd.session.commands import Capture, Command, Log
from ddmd.session.inputs import (
    AllocTracker,
    DumpHprof,
    Kill,
    StartTrace,
    StopTrace,
    TraceState,
)
from ddmd.session.model import VmModel

if TYPE_CHECKING:
    from ddmd.session.vm import VmSession

__all__ = ["PROFILING_REQUESTS", "TRACE_STATES", "Profiling"]

#: MPRQ states.
TRACE_STATES = {0: "off", 1: "method", 2: "sampling"}

_C = TypeVar("_C", bound=ddm.Chunk)
_MPSE = int(ddm.ChunkType.MPSE)
_HPDS = int(ddm.ChunkType.HPDS)
_CHUNK_HEADER = struct.Struct(">II")
_EXIT_CODE = struct.Struct(">I")

STREAMING_TRACE = "method-trace-profiling-streaming"
FILE_TRACE = "method-trace-profiling"
SAMPLING = "method-sample-profiling"
STREAMING_HPROF = "hprof-heap-dump-streaming"
FILE_HPROF = "hprof-heap-dump"


@dataclass(slots=True)
class _Capture:
    """A file the VM is to push for call ``call`` (``chunk_type`` MPSE or HPDS)."""

    call: int
    chunk_type: int
    started: bool = False
    size: int = 0
    done: bool = False
    short: bool = False  # the push ended before the length its chunk header declared


@dataclass(slots=True)
class _LargePush:
    """A DDM push arriving in pieces: its chunk header, then where the data goes."""

    head: bytearray
    capture: _Capture | None = None
    remaining: int = 0  # data bytes of the first chunk still to come
    discarded: bool = False


class Profiling:
    """The profiling part of a ``VmSession``: tracing, allocations, heap dumps and kill."""

    def __init__(self, session: VmSession) -> None:
        self._s = session

    # ------------------------------------------------------------------ what is offered

    def profiling_offer(self) -> dict[str, dict[str, object]]:
        """Which of these features this VM offers, and why not (sentences for users)."""
        return {
            "trace": self._offer_trace(),
            "allocs": self._offer("REAQ"),
            "hprof": self._offer_hprof(),
            # A plain JVM is stopped over JDWP (VirtualMachine.Exit), DDM or not.
            "kill": {"available": True, "reason": None}
            if self._s.model.ddm is False
            else self._offer("EXIT"),
        }

    def _no_ddm(self) -> str | None:
        if self._s.model.ddm is False:
            return f"{self._s.name} does not speak DDM (a plain JVM): ddmd cannot do this for it"
        if self._s.model.ddm is None:
            return f"{self._s.name} is not identified yet"
        return None

    def _offer(self, feature: str) -> dict[str, object]:
        reason = self._no_ddm() or (
            self._s.missing(feature) if feature in self._s.model.unsupported else None
        )
        if feature == "REAQ" and reason is None and _android12(self._s.model):
            self._s.model.unsupported.setdefault(
                "REAQ", "it reports no heap information; Android 12 removed the allocation tracker"
            )
            reason = self._s.missing("REAQ")
        return {"available": reason is None, "reason": reason}

    def _offer_trace(self) -> dict[str, object]:
        reason = self._no_ddm()
        features = self._s.model.features
        modes = []
        if not features or STREAMING_TRACE in features:
            modes.append("streaming")
        if FILE_TRACE in features and "streaming" not in modes:
            modes.append("file")
        if reason is None and not modes:
            reason = self._s.missing("MPSS")
        return {
            "available": reason is None,
            "reason": reason,
            "modes": modes,
            "sampling": reason is None and (not features or SAMPLING in features),
        }

    def _offer_hprof(self) -> dict[str, object]:
        if self._s.model.ddm and _android12(self._s.model):
            # The heap dump handlers lived with the heap info ones and went with them
            # (protocol.md 3.8: the newest trees register neither HPDU nor HPDS).
            self._s.model.unsupported.setdefault(
                "HPDS", "it reports no heap information; Android 12 removed heap dumps with it"
            )
        reason = self._no_ddm() or (
            self._s.missing("HPDS") if "HPDS" in self._s.model.unsupported else None
        )
        features = self._s.model.features
        mode = None
        if not features or STREAMING_HPROF in features:
            mode = "streaming"
        elif FILE_HPROF in features:
            mode = "file"
        elif reason is None:
            reason = self._s.missing("HPDS")
        return {"available": reason is None, "reason": reason, "mode": mode}

    # ------------------------------------------------------------------ calls

    def _call_profiling(self, pending: PendingCall, now: float) -> None:
        request = pending.request
        if isinstance(request, Kill):
            if self._s.model.ddm is False:
                self._exit_jvm(pending, request.status, now)
                return
            reason = self._no_ddm()
            if reason is not None:
                self._s.calls._reject(pending, "unsupported", reason, now)
                return
            self._s._ask(ddm.ExitRequest(request.status), "prof-exit", "EXIT", now)
            self._s._log("vm.exit_requested", status=request.status)
            self._s.calls._resolve(pending, {"status": request.status}, now)
        elif isinstance(request, StartTrace):
            self._start_trace(pending, request, now)
        elif isinstance(request, StopTrace):
            self._stop_trace(pending, now)
        elif isinstance(request, TraceState):
            if self._refuse(pending, self._no_ddm(), now):
                return
            pending.owns.append(self._s._ask(ddm.ProfilingQuery(), "prof-mprq", "MPRQ", now))
        elif isinstance(request, AllocTracker):
            offer = self._offer("REAQ")
            if self._refuse(pending, offer["reason"], now):  # type: ignore[arg-type]
                return
            if request.action in ("start", "stop"):
                self._s.allocs_on = request.action == "start"
                enable = ddm.AllocTrackingEnable(request.action == "start")
                pending.owns.append(self._s._ask(enable, "prof-reae", "REAE", now))
            pending.owns.append(self._s._ask(ddm.AllocTrackingQuery(), "prof-reaq", "REAQ", now))
            if request.action == "list":
                pending.owns.append(
                    self._s._ask(ddm.AllocationsRequest(), "prof-real", "REAL", now)
                )
        elif isinstance(request, DumpHprof):
            self._dump_hprof(pending, request, now)

    def _exit_jvm(self, pending: PendingCall, status: int, now: float) -> None:
        """A plain JVM has no DDM EXIT: JDWP VirtualMachine.Exit (its int exit code) on ddmd's
        own connection. Like EXIT, nothing waits for an answer: the VM may be gone first."""
        data = _EXIT_CODE.pack(status & 0xFFFFFFFF)
        deadline = now + self._s.settings.ddm_request
        _, send = self._s.router.send_own(
            SELF, CommandSet.VIRTUAL_MACHINE, VirtualMachineCommand.EXIT, data, deadline
        )
        self._s._out.append(send)
        self._s._log("vm.exit_requested", status=status, via="JDWP VirtualMachine.Exit")
        self._s.calls._resolve(pending, {"status": status}, now)

    def _refuse(self, pending: PendingCall, reason: str | None, now: float) -> bool:
        if reason is None:
            return False
        self._s.calls._reject(pending, "unsupported", reason, now)
        return True

    def _start_trace(self, pending: PendingCall, request: StartTrace, now: float) -> None:
        offer = self._offer_trace()
        if self._refuse(pending, offer["reason"], now):  # type: ignore[arg-type]
            return
        if self._s.trace_state in ("method", "sampling"):
            self._s.calls._reject(pending, "conflict", f"{self._s.name} is already tracing", now)
            return
        modes = offer["modes"]
        assert isinstance(modes, list)
        if "streaming" in modes:
            if request.sampling_us is not None:
                if not offer["sampling"]:
                    self._s.calls._reject(pending, "unsupported", self._s.missing("SPSS"), now)
                    return
                start: ddm.Chunk = ddm.SamplingStart(request.buffer_size, 0, request.sampling_us)
            else:
                start = ddm.MethodTraceStreamStart(request.buffer_size, 0)
            self._s.trace_mode, self._s.trace_path = "streaming", None
        else:
            if request.device_path is None:
                self._s.calls._reject(
                    pending,
                    "unsupported",
                    f"{self._s.name} writes method traces only to a file on the device, which "
                    "ddmd can fetch only from an Android device (through adb)",
                    now,
                )
                return
            start = ddm.MethodTraceStart(request.buffer_size, 0, request.device_path)
            self._s.trace_mode, self._s.trace_path = "file", request.device_path
        feature = ddm.type_name(int(start.chunk_type))
        pending.owns.append(self._s._ask(start, "prof-start", feature, now))
        # Answered always, and only after the start request was handled (requests are handled
        # in order): its state says whether tracing began.
        pending.owns.append(self._s._ask(ddm.ProfilingQuery(), "prof-mprq", "MPRQ", now))

    def _stop_trace(self, pending: PendingCall, now: float) -> None:
        if self._refuse(pending, self._no_ddm(), now):
            return
        if self._s.trace_mode == "file" and self._s.trace_path is not None:
            pending.owns.append(self._s._ask(ddm.MethodTraceEnd(), "prof-mpre", "MPRE", now))
            return
        end: ddm.Chunk = (
            ddm.SamplingEnd() if self._s.trace_state == "sampling" else ddm.MethodTraceStreamEnd()
        )
        pending.owns.append(self._s._ask(end, "prof-end", ddm.type_name(int(end.chunk_type)), now))
        self._s._captures.append(_Capture(pending.call, _MPSE))
        pending.deadline = now + self._s.settings.capture

    def _dump_hprof(self, pending: PendingCall, request: DumpHprof, now: float) -> None:
        offer = self._offer_hprof()
        if self._refuse(pending, offer["reason"], now):  # type: ignore[arg-type]
            return
        if any(c.chunk_type == _HPDS for c in self._s._captures):
            self._s.calls._reject(
                pending, "conflict", f"a heap dump of {self._s.name} is under way", now
            )
            return
        if offer["mode"] == "file":
            if request.device_path is None:
                self._s.calls._reject(
                    pending,
                    "unsupported",
                    f"{self._s.name} writes heap dumps only to a file on the device, which ddmd "
                    "can fetch only from an Android device (through adb)",
                    now,
                )
                return
            dump = ddm.HeapDumpRequest(request.device_path)
            pending.owns.append(self._s._ask(dump, "prof-hpdu", "HPDU", now))
            pending.deadline = now + self._s.settings.capture
            return
        pending.owns.append(self._s._ask(ddm.HeapDumpStreamRequest(), "prof-hpds", "HPDS", now))
        self._s._captures.append(_Capture(pending.call, _HPDS))
        pending.deadline = now + self._s.settings.capture

    # ------------------------------------------------------------------ settling

    def _settle_profiling(self, pending: PendingCall, now: float) -> None:
        request = pending.request
        refused = next((o for o in pending.owns if o.refused()), None)
        capture = next((c for c in self._s._captures if c.call == pending.call), None)
        if refused is not None:
            self._drop_capture(capture)
            judgement = refused.judgement
            assert judgement is not None
            if judgement.answer is Answer.FAILED:
                message = f"{self._s.name} refused: {judgement.reason}"
                self._s.calls._reject(pending, "failed", message, now)
            else:
                self._s.calls._reject(pending, "unsupported", self._s.missing(refused.feature), now)
            return
        if isinstance(request, StartTrace):
            _, query = pending.owns
            if query.done:
                state = self._mprq_state(query)
                if state == "off":
                    self._s.trace_mode = None
                    self._s.calls._reject(
                        pending, "failed", f"{self._s.name} did not start tracing", now
                    )
                    return
                wanted = "sampling" if request.sampling_us is not None else "method"
                self._s.trace_state = state if state != "unknown" else wanted
                self._s.calls._resolve(
                    pending, {"trace": self._s.trace_state, "mode": self._s.trace_mode}, now
                )
        elif isinstance(request, StopTrace):
            self._settle_stop(pending, capture, now)
        elif isinstance(request, TraceState):
            (query,) = pending.owns
            if query.done:
                if query.expired:
                    self._s.calls._reject(pending, "unsupported", self._s.missing("MPRQ"), now)
                    return
                self._s.trace_state = self._mprq_state(query)
                self._s.calls._resolve(pending, {"trace": self._s.trace_state}, now)
        elif isinstance(request, AllocTracker):
            self._settle_allocs(pending, request, now)
        elif isinstance(request, DumpHprof):
            self._settle_dump(pending, capture, now)

    def _settle_stop(self, pending: PendingCall, capture: _Capture | None, now: float) -> None:
        if capture is None:  # file mode: MPRE's answer
            (end,) = pending.owns
            if not end.done:
                return
            result = self._first(end, ddm.MethodTraceEndResult)
            if end.expired or result is None or result.result != 0:
                self._s.calls._reject(
                    pending, "failed", f"{self._s.name} could not write its trace", now
                )
                return
            self._trace_off()
            self._s.calls._resolve(pending, {"device_file": self._s.trace_path}, now)
            return
        if capture.done:
            self._drop_capture(capture)
            if capture.short:
                self._s.calls._reject(
                    pending, "failed", f"{self._s.name} sent a cut-short trace", now
                )
                return
            self._trace_off()
            self._s.calls._resolve(pending, {"bytes": capture.size}, now)
        elif now >= pending.deadline:
            self._drop_capture(capture)
            self._trace_off()
            what = "stopped sending its trace for" if capture.started else "sent no trace within"
            message = f"{self._s.name} {what} {self._s.settings.capture:g} s"
            self._s.calls._reject(pending, "timed_out", message, now)

    def _settle_dump(self, pending: PendingCall, capture: _Capture | None, now: float) -> None:
        if capture is None:  # file mode: HPDU's answer
            (dump,) = pending.owns
            if not dump.done:
                return
            result = self._first(dump, ddm.HeapDumpResult)
            if dump.expired or result is None or result.result != 0:
                self._s.calls._reject(
                    pending, "failed", f"{self._s.name} could not write a heap dump", now
                )
                return
            request = pending.request
            assert isinstance(request, DumpHprof)
            self._s.calls._resolve(pending, {"device_file": request.device_path}, now)
            return
        if capture.done:
            self._drop_capture(capture)
            if capture.short:
                self._s.calls._reject(
                    pending, "failed", f"{self._s.name} sent a cut-short heap dump", now
                )
            else:
                self._s.calls._resolve(pending, {"bytes": capture.size}, now)
        elif now >= pending.deadline and capture.started:
            self._drop_capture(capture)
            message = (
                f"{self._s.name} stopped sending its heap dump for {self._s.settings.capture:g} s"
            )
            self._s.calls._reject(pending, "timed_out", message, now)
        elif now >= pending.deadline:
            self._drop_capture(capture)
            self._s.model.unsupported.setdefault(
                "HPDS", f"no heap dump arrived within {self._s.settings.capture:g} s"
            )
            self._s.calls._reject(pending, "timed_out", self._s.missing("HPDS"), now)

    def _settle_allocs(self, pending: PendingCall, request: AllocTracker, now: float) -> None:
        # REAE is answered by silence on ART 9+; REAQ always answers, after REAE was handled.
        if not all(o.done for o in pending.owns if o.purpose != "prof-reae"):
            return
        query = next(o for o in pending.owns if o.purpose == "prof-reaq")
        status = self._first(query, ddm.AllocTrackingStatus)
        if query.expired or status is None:
            self._s.model.unsupported.setdefault(
                "REAQ", "no answer; Android 12 removed the allocation tracker"
            )
            self._s.calls._reject(pending, "unsupported", self._s.missing("REAQ"), now)
            return
        if request.action != "list":
            self._s.calls._resolve(pending, {"enabled": status.enabled}, now)
            return
        listing = next(o for o in pending.owns if o.purpose == "prof-real")
        chunk = self._first(listing, ddm.Allocations)
        if chunk is None:
            self._s.calls._reject(pending, "failed", f"{self._s.name} sent no allocation list", now)
            return
        self._s.calls._resolve(
            pending, {"enabled": status.enabled, "allocations": chunk.resolved()}, now
        )

    @staticmethod
    def _first(own: Own, kind: type[_C]) -> _C | None:
        if own.judgement is None:
            return None
        return next((c for c in own.judgement.chunks if isinstance(c, kind)), None)

    def _mprq_state(self, query: Own) -> str:
        status = self._first(query, ddm.ProfilingStatus)
        if status is None:
            return "unknown"
        return TRACE_STATES.get(status.state, "unknown")

    def _trace_off(self) -> None:
        self._s.trace_state, self._s.trace_mode = "off", None

    def _drop_capture(self, capture: _Capture | None) -> None:
        if capture is not None and capture in self._s._captures:
            self._s._captures.remove(capture)

    # ------------------------------------------------------------------ the pushed files

    def _waiting_capture(self, chunk_type: int) -> _Capture | None:
        return next(
            (c for c in self._s._captures if c.chunk_type == chunk_type and not c.started), None
        )

    def capture_chunk(self, chunk_type: int, data: bytes) -> bool:
        """A whole pushed chunk: the file a capture waits for? Then it is passed on (True)."""
        capture = self._waiting_capture(chunk_type)
        if capture is None:
            return False
        capture.started = capture.done = True
        capture.size = len(data)
        self._s._out.append(Capture(capture.call, data, last=True))
        return True

    def push_piece(self, data: bytes, first: bool, last: bool) -> list[Command]:
        """A piece of a DDM push too large to hold (the router's relay): the chunk header is
        read from the first bytes; the data of a file some capture waits for is passed on as
        it comes, anything else is dropped (logged once per push)."""
        if first or self._s._large is None:
            self._s._large = _LargePush(bytearray())
        large = self._s._large
        out: list[Command] = []
        if large.capture is None and not large.discarded:
            large.head += data
            if len(large.head) < _CHUNK_HEADER.size:
                data = b""
            else:
                chunk_type, length = _CHUNK_HEADER.unpack_from(large.head)
                data = bytes(large.head[_CHUNK_HEADER.size :])
                large.head = bytearray()
                capture = self._waiting_capture(chunk_type)
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
            call = self._s._calls.get(capture.call)
            if call is not None:  # data flows: the file may take as long as it needs, but a
                call.deadline = self._s._now + self._s.settings.capture  # stall still times out
            finished = large.remaining == 0 or last
            if take or finished:
                out.append(Capture(capture.call, take, last=finished))
            if finished and not capture.done:
                capture.done = True
                capture.short = large.remaining > 0
                large.capture = None
                large.discarded = True  # anything after the file's chunk is not ours
        if last:
            self._s._large = None
        return out


def _android12(model: VmModel) -> bool:
    """Evidence of Android 12+: heap info is known missing (its hook went with the allocation
    tracker's, protocol.md 3.8)."""
    return "HPIF" in model.unsupported and "Android 12" in model.unsupported.get("HPSG", "")
