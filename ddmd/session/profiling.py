"""What DDMS users still reach for, as conversations of one VM session: method tracing, the
allocation tracker, HPROF heap dumps and kill (protocol.md 3.4, 3.5, 2.2).

Layer: standard library, ``ddmd.protocol`` and ``ddmd.session`` (sans-IO). ``Profiling``
is the part of ``VmSession`` that turns these ``Call`` requests into DDM requests and says how
each ends (``begin``/``settle`` return the ``Resolve`` or ``Reject``; ``Calls`` keeps the table
of calls). It sees the session through ``SessionHost`` and owns what only profiling touches:
the trace's state, mode and device file, and whether ddmd turned the allocation tracker on.
Most of these requests are answered by silence on a current phone (ART 9+ without its agent),
so each conversation ends on evidence that always comes:

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

The files themselves (the MPSE and HPDS pushes) are caught by ``Captures`` (``capture.py``),
which passes them on as they arrive; this part says which file a call waits for and reads how
it went.
"""

from __future__ import annotations

import struct
from typing import TypeVar

from ddmd.protocol import ddm
from ddmd.protocol.expect import Answer
from ddmd.protocol.jdwp import CommandSet, ReplyPacket, VirtualMachineCommand
from ddmd.session.capture import AwaitedFile, Captures
from ddmd.session.commands import Reject, Resolve
from ddmd.session.host import SELF, Own, PendingCall, SessionHost, judge_reply, missing, silence
from ddmd.session.inputs import (
    AllocTracker,
    DumpHprof,
    Kill,
    StartTrace,
    StopTrace,
    TraceState,
)
from ddmd.session.model import VmModel

__all__ = ["PROFILING_REQUESTS", "TRACE_STATES", "Outcome", "Profiling"]

#: The requests ``Profiling`` works on.
PROFILING_REQUESTS = (StartTrace, StopTrace, TraceState, AllocTracker, DumpHprof, Kill)

#: How a call ends.
Outcome = Resolve | Reject

#: MPRQ states.
TRACE_STATES = {0: "off", 1: "method", 2: "sampling"}

_C = TypeVar("_C", bound=ddm.Chunk)
_MPSE = int(ddm.ChunkType.MPSE)
_HPDS = int(ddm.ChunkType.HPDS)
_EXIT_CODE = struct.Struct(">I")

STREAMING_TRACE = "method-trace-profiling-streaming"
FILE_TRACE = "method-trace-profiling"
SAMPLING = "method-sample-profiling"
STREAMING_HPROF = "hprof-heap-dump-streaming"
FILE_HPROF = "hprof-heap-dump"


class Profiling:
    """The profiling part of a ``VmSession``: tracing, allocations, heap dumps and kill."""

    def __init__(self, host: SessionHost, captures: Captures) -> None:
        self._host = host
        self._captures = captures  # the files its calls wait for (the push path fills them)
        self.trace_state = "unknown"  # "off", "method", "sampling" once known
        self.trace_mode: str | None = None  # "streaming" or "file" while tracing
        self.trace_path: str | None = None
        self.allocs_on = False  # ddmd itself turned the allocation tracker on

    @property
    def tracing(self) -> bool:
        """ddmd itself keeps method tracing on."""
        return self.trace_state in ("method", "sampling")

    def drop(self) -> None:
        """The connection ended: the trace's state is unknown."""
        self.trace_state, self.trace_mode = "unknown", None

    # ------------------------------------------------------------------ the owner of its requests

    def answered(self, own: Own, packet: ReplyPacket) -> None:
        judge_reply(self._host, own, packet)  # what it says is read when the call settles

    def expired(self, own: Own) -> None:
        silence(self._host, own)

    # ------------------------------------------------------------------ what is offered

    def profiling_offer(self) -> dict[str, dict[str, object]]:
        """Which of these features this VM offers, and why not (sentences for users)."""
        return {
            "trace": self._offer_trace(),
            "allocs": self._offer("REAQ"),
            "hprof": self._offer_hprof(),
            # A plain JVM is stopped over JDWP (VirtualMachine.Exit), DDM or not.
            "kill": {"available": True, "reason": None}
            if self._host.model.ddm is False
            else self._offer("EXIT"),
        }

    def _no_ddm(self) -> str | None:
        if self._host.model.ddm is False:
            return f"{self._host.name} does not speak DDM (a plain JVM): ddmd cannot do this for it"
        if self._host.model.ddm is None:
            return f"{self._host.name} is not identified yet"
        return None

    def _offer(self, feature: str) -> dict[str, object]:
        reason = self._no_ddm() or (
            missing(self._host, feature) if feature in self._host.model.unsupported else None
        )
        if feature == "REAQ" and reason is None and _android12(self._host.model):
            self._host.model.unsupported.setdefault(
                "REAQ", "it reports no heap information; Android 12 removed the allocation tracker"
            )
            reason = missing(self._host, "REAQ")
        return {"available": reason is None, "reason": reason}

    def _offer_trace(self) -> dict[str, object]:
        reason = self._no_ddm()
        features = self._host.model.features
        modes = []
        if not features or STREAMING_TRACE in features:
            modes.append("streaming")
        if FILE_TRACE in features and "streaming" not in modes:
            modes.append("file")
        if reason is None and not modes:
            reason = missing(self._host, "MPSS")
        return {
            "available": reason is None,
            "reason": reason,
            "modes": modes,
            "sampling": reason is None and (not features or SAMPLING in features),
        }

    def _offer_hprof(self) -> dict[str, object]:
        if self._host.model.ddm and _android12(self._host.model):
            # The heap dump handlers lived with the heap info ones and went with them
            # (protocol.md 3.8: the newest trees register neither HPDU nor HPDS).
            self._host.model.unsupported.setdefault(
                "HPDS", "it reports no heap information; Android 12 removed heap dumps with it"
            )
        reason = self._no_ddm() or (
            missing(self._host, "HPDS") if "HPDS" in self._host.model.unsupported else None
        )
        features = self._host.model.features
        mode = None
        if not features or STREAMING_HPROF in features:
            mode = "streaming"
        elif FILE_HPROF in features:
            mode = "file"
        elif reason is None:
            reason = missing(self._host, "HPDS")
        return {"available": reason is None, "reason": reason, "mode": mode}

    # ------------------------------------------------------------------ calls

    def begin(self, pending: PendingCall, now: float) -> Outcome | None:
        """A profiling call (the VM is connected): its requests sent; how it ends, when that
        is known at once."""
        host = self._host
        request = pending.request
        if isinstance(request, Kill):
            if host.model.ddm is False:
                return self._exit_jvm(pending, request.status)
            reason = self._no_ddm()
            if reason is not None:
                return Reject(pending.call, "unsupported", reason)
            host.ask(ddm.ExitRequest(request.status), self, "exit")
            host.log("vm.exit_requested", status=request.status)
            return Resolve(pending.call, {"status": request.status})
        if isinstance(request, StartTrace):
            return self._start_trace(pending, request, now)
        if isinstance(request, StopTrace):
            return self._stop_trace(pending, now)
        if isinstance(request, TraceState):
            refusal = self._refusal(pending, self._no_ddm())
            if refusal is None:
                pending.owns.append(host.ask(ddm.ProfilingQuery(), self, "trace state"))
            return refusal
        if isinstance(request, AllocTracker):
            offer = self._offer("REAQ")
            refusal = self._refusal(pending, offer["reason"])  # type: ignore[arg-type]
            if refusal is not None:
                return refusal
            if request.action in ("start", "stop"):
                self.allocs_on = request.action == "start"
                enable = ddm.AllocTrackingEnable(request.action == "start")
                pending.owns.append(host.ask(enable, self, "allocation tracker switch"))
            pending.owns.append(host.ask(ddm.AllocTrackingQuery(), self, "allocation tracker"))
            if request.action == "list":
                pending.owns.append(host.ask(ddm.AllocationsRequest(), self, "allocations"))
            return None
        if isinstance(request, DumpHprof):
            return self._dump_hprof(pending, request, now)
        return None

    def _exit_jvm(self, pending: PendingCall, status: int) -> Outcome:
        """A plain JVM has no DDM EXIT: JDWP VirtualMachine.Exit (its int exit code) on ddmd's
        own connection. Like EXIT, nothing waits for an answer: the VM may be gone first."""
        data = _EXIT_CODE.pack(status & 0xFFFFFFFF)
        self._host.send_jdwp(SELF, CommandSet.VIRTUAL_MACHINE, VirtualMachineCommand.EXIT, data)
        self._host.log("vm.exit_requested", status=status, via="JDWP VirtualMachine.Exit")
        return Resolve(pending.call, {"status": status})

    @staticmethod
    def _refusal(pending: PendingCall, reason: str | None) -> Reject | None:
        return None if reason is None else Reject(pending.call, "unsupported", reason)

    def _start_trace(self, pending: PendingCall, request: StartTrace, now: float) -> Outcome | None:
        host = self._host
        offer = self._offer_trace()
        refusal = self._refusal(pending, offer["reason"])  # type: ignore[arg-type]
        if refusal is not None:
            return refusal
        if self.tracing:
            return Reject(pending.call, "conflict", f"{host.name} is already tracing")
        modes = offer["modes"]
        assert isinstance(modes, list)
        if "streaming" in modes:
            if request.sampling_us is not None:
                if not offer["sampling"]:
                    return Reject(pending.call, "unsupported", missing(host, "SPSS"))
                start: ddm.Chunk = ddm.SamplingStart(request.buffer_size, 0, request.sampling_us)
            else:
                start = ddm.MethodTraceStreamStart(request.buffer_size, 0)
            self.trace_mode, self.trace_path = "streaming", None
        else:
            if request.device_path is None:
                return Reject(
                    pending.call,
                    "unsupported",
                    f"{host.name} writes method traces only to a file on the device, which "
                    "ddmd can fetch only from an Android device (through adb)",
                )
            start = ddm.MethodTraceStart(request.buffer_size, 0, request.device_path)
            self.trace_mode, self.trace_path = "file", request.device_path
        pending.owns.append(host.ask(start, self, "trace start"))
        # Answered always, and only after the start request was handled (requests are handled
        # in order): its state says whether tracing began.
        pending.owns.append(host.ask(ddm.ProfilingQuery(), self, "trace state"))
        return None

    def _stop_trace(self, pending: PendingCall, now: float) -> Outcome | None:
        host = self._host
        refusal = self._refusal(pending, self._no_ddm())
        if refusal is not None:
            return refusal
        if self.trace_mode == "file" and self.trace_path is not None:
            pending.owns.append(host.ask(ddm.MethodTraceEnd(), self, "trace end"))
            return None
        end: ddm.Chunk = (
            ddm.SamplingEnd() if self.trace_state == "sampling" else ddm.MethodTraceStreamEnd()
        )
        pending.owns.append(host.ask(end, self, "trace end"))
        self._captures.expect(pending, _MPSE)
        pending.deadline = now + host.settings.capture
        return None

    def _dump_hprof(self, pending: PendingCall, request: DumpHprof, now: float) -> Outcome | None:
        host = self._host
        offer = self._offer_hprof()
        refusal = self._refusal(pending, offer["reason"])  # type: ignore[arg-type]
        if refusal is not None:
            return refusal
        if self._captures.awaited(_HPDS):
            return Reject(pending.call, "conflict", f"a heap dump of {host.name} is under way")
        if offer["mode"] == "file":
            if request.device_path is None:
                return Reject(
                    pending.call,
                    "unsupported",
                    f"{host.name} writes heap dumps only to a file on the device, which ddmd "
                    "can fetch only from an Android device (through adb)",
                )
            dump = ddm.HeapDumpRequest(request.device_path)
            pending.owns.append(host.ask(dump, self, "heap dump to a file"))
            pending.deadline = now + host.settings.capture
            return None
        pending.owns.append(host.ask(ddm.HeapDumpStreamRequest(), self, "heap dump"))
        self._captures.expect(pending, _HPDS)
        pending.deadline = now + host.settings.capture
        return None

    # ------------------------------------------------------------------ settling

    def settle(self, pending: PendingCall, now: float) -> Outcome | None:
        """How a profiling call ends, once that is known (after every input)."""
        host = self._host
        call = pending.call
        request = pending.request
        refused = next((o for o in pending.owns if o.refused()), None)
        capture = self._captures.of(pending)
        if refused is not None:
            self._captures.forget(capture)
            judgement = refused.judgement
            assert judgement is not None
            if judgement.answer is Answer.FAILED:
                return Reject(call, "failed", f"{host.name} refused: {judgement.reason}")
            return Reject(call, "unsupported", missing(host, refused.feature))
        if isinstance(request, StartTrace):
            _, query = pending.owns
            if not query.done:
                return None
            state = self._mprq_state(query)
            if state == "off":
                self.trace_mode = None
                return Reject(call, "failed", f"{host.name} did not start tracing")
            wanted = "sampling" if request.sampling_us is not None else "method"
            self.trace_state = state if state != "unknown" else wanted
            return Resolve(call, {"trace": self.trace_state, "mode": self.trace_mode})
        if isinstance(request, StopTrace):
            return self._settle_stop(pending, capture, now)
        if isinstance(request, TraceState):
            (query,) = pending.owns
            if not query.done:
                return None
            if query.expired:
                return Reject(call, "unsupported", missing(host, "MPRQ"))
            self.trace_state = self._mprq_state(query)
            return Resolve(call, {"trace": self.trace_state})
        if isinstance(request, AllocTracker):
            return self._settle_allocs(pending, request)
        if isinstance(request, DumpHprof):
            return self._settle_dump(pending, capture, now)
        return None

    def _settle_stop(
        self, pending: PendingCall, capture: AwaitedFile | None, now: float
    ) -> Outcome | None:
        host = self._host
        call = pending.call
        if capture is None:  # file mode: MPRE's answer
            (end,) = pending.owns
            if not end.done:
                return None
            result = self._first(end, ddm.MethodTraceEndResult)
            if end.expired or result is None or result.result != 0:
                return Reject(call, "failed", f"{host.name} could not write its trace")
            self._trace_off()
            return Resolve(call, {"device_file": self.trace_path})
        if capture.done:
            self._captures.forget(capture)
            if capture.short:
                return Reject(call, "failed", f"{host.name} sent a cut-short trace")
            self._trace_off()
            return Resolve(call, {"bytes": capture.size})
        if now >= pending.deadline:
            self._captures.forget(capture)
            self._trace_off()
            what = "stopped sending its trace for" if capture.started else "sent no trace within"
            return Reject(call, "timed_out", f"{host.name} {what} {host.settings.capture:g} s")
        return None

    def _settle_dump(
        self, pending: PendingCall, capture: AwaitedFile | None, now: float
    ) -> Outcome | None:
        host = self._host
        call = pending.call
        if capture is None:  # file mode: HPDU's answer
            (dump,) = pending.owns
            if not dump.done:
                return None
            result = self._first(dump, ddm.HeapDumpResult)
            if dump.expired or result is None or result.result != 0:
                return Reject(call, "failed", f"{host.name} could not write a heap dump")
            request = pending.request
            assert isinstance(request, DumpHprof)
            return Resolve(call, {"device_file": request.device_path})
        if capture.done:
            self._captures.forget(capture)
            if capture.short:
                return Reject(call, "failed", f"{host.name} sent a cut-short heap dump")
            return Resolve(call, {"bytes": capture.size})
        if now >= pending.deadline and capture.started:
            self._captures.forget(capture)
            message = f"{host.name} stopped sending its heap dump for {host.settings.capture:g} s"
            return Reject(call, "timed_out", message)
        if now >= pending.deadline:
            self._captures.forget(capture)
            host.model.unsupported.setdefault(
                "HPDS", f"no heap dump arrived within {host.settings.capture:g} s"
            )
            return Reject(call, "timed_out", missing(host, "HPDS"))
        return None

    def _settle_allocs(self, pending: PendingCall, request: AllocTracker) -> Outcome | None:
        host = self._host
        call = pending.call
        # The requests in the order ``begin`` sent them: [switch], query, [list].
        switch = request.action in ("start", "stop")
        query = pending.owns[1 if switch else 0]
        # REAE is answered by silence on ART 9+; REAQ always answers, after REAE was handled.
        if not all(o.done for o in pending.owns[1 if switch else 0 :]):
            return None
        status = self._first(query, ddm.AllocTrackingStatus)
        if query.expired or status is None:
            host.model.unsupported.setdefault(
                "REAQ", "no answer; Android 12 removed the allocation tracker"
            )
            return Reject(call, "unsupported", missing(host, "REAQ"))
        if request.action != "list":
            return Resolve(call, {"enabled": status.enabled})
        chunk = self._first(pending.owns[-1], ddm.Allocations)
        if chunk is None:
            return Reject(call, "failed", f"{host.name} sent no allocation list")
        return Resolve(call, {"enabled": status.enabled, "allocations": chunk.resolved()})

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
        self.trace_state, self.trace_mode = "off", None


def _android12(model: VmModel) -> bool:
    """Evidence of Android 12+: heap info is known missing (its hook went with the allocation
    tracker's, protocol.md 3.8)."""
    return "HPIF" in model.unsupported and "Android 12" in model.unsupported.get("HPSG", "")
