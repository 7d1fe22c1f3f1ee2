"""bridge_latency.py's load: three workloads on the rig's raw JDWP client.

The client (``rig.jdwp.RawJdwp``) is blocking, one command at a time, TCP_NODELAY, run in the
bench process itself, so it is the same on every path. Workloads, timed per operation:

- ``name``: ThreadReference.Name (11/1) of the target's ``main`` thread: one command, one reply;
- ``threads``: VirtualMachine.AllThreads (1/4): one command, one reply;
- ``mix``: one simulated breakpoint stop of an IDE, timed as a whole: VM.Suspend; AllThreads and
  ThreadReference.Status of each thread; Frames of the stopped thread (``main``); in the frame of
  ``Target.main``: StackFrame.ThisObject (a static method: null, so the stopped thread's own
  java.lang.Thread object stands in for ``this``), its ObjectReference.ReferenceType,
  ReferenceType.Fields and ObjectReference.GetValues of its instance fields; the locals:
  Method.VariableTable and StackFrame.GetValues (Target is compiled with -g); one
  VirtualMachine.ClassesBySignature; VM.Resume.
"""

from __future__ import annotations

import contextlib
import struct
import time

from rig.jdwp import RawJdwp, jbytes, jstring

WORKLOADS = ("name", "threads", "mix")
LABELS = {"name": "name()", "threads": "allThreads()", "mix": "IDE mix"}


class Jdwp(RawJdwp):
    """The workloads' client: id sizes asked at once; Dispose when it closes."""

    def __init__(self, port: int, timeout: float = 20.0) -> None:
        super().__init__(port, timeout)
        self.id_sizes()
        self.main = b""
        self.target = b""

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.ok(1, 6)  # Dispose
        super().close()

    def prepare(self) -> None:
        """Find the ``main`` thread and the Target class."""
        self.main = self.find_main()
        body = self.ok(1, 2, jbytes("LTarget;"))
        if struct.unpack_from(">i", body)[0] < 1:
            raise RuntimeError("no class Target")
        self.target = body[5 : 5 + self.sizes[3]]

    # the workloads: each returns the number of commands it sent
    def name(self) -> int:
        self.ok(11, 1, self.main)
        return 1

    def threads(self) -> int:
        self.ok(1, 4)
        return 1

    def mix(self) -> int:
        field_size, meth, obj, ref, frame = self.sizes
        sent = 0

        def cmd(cs: int, c: int, data: bytes = b"") -> tuple[int, bytes]:
            nonlocal sent
            sent += 1
            return self.command(cs, c, data)

        cmd(1, 8)  # VM.Suspend: the breakpoint stop
        _, body = cmd(1, 4)  # AllThreads
        for tid in self.ids(body, obj):
            cmd(11, 4, tid)  # Status
        err, body = cmd(11, 6, self.main + struct.pack(">ii", 0, -1))  # Frames
        chosen = None
        if not err:
            (n,) = struct.unpack_from(">i", body)
            at = 4
            for _ in range(n):
                fid = body[at : at + frame]
                cls = body[at + frame + 1 : at + frame + 1 + ref]
                mid = body[at + frame + 1 + ref : at + frame + 1 + ref + meth]
                at += frame + 1 + ref + meth + 8
                if chosen is None or cls == self.target:
                    chosen = (fid, cls, mid)
                if cls == self.target:
                    break
        if chosen is not None:
            fid, cls, mid = chosen
            err, body = cmd(16, 3, self.main + fid)  # StackFrame.ThisObject
            this = body[1 : 1 + obj] if not err else b""
            if not this.strip(b"\0"):
                this = self.main  # static: the stopped thread's object stands in
            err, body = cmd(9, 1, this)  # ObjectReference.ReferenceType
            if not err:
                err, body = cmd(2, 4, body[1 : 1 + ref])  # ReferenceType.Fields
            if not err:
                fields = []
                (n,) = struct.unpack_from(">i", body)
                at = 4
                for _ in range(n):
                    fid_ = body[at : at + field_size]
                    at += field_size
                    _, at = jstring(body, at)
                    _, at = jstring(body, at)
                    (mods,) = struct.unpack_from(">i", body, at)
                    at += 4
                    if not mods & 0x8:
                        fields.append(fid_)
                data = this + struct.pack(">i", len(fields)) + b"".join(fields)
                cmd(9, 2, data)  # ObjectReference.GetValues
            err, body = cmd(6, 2, cls + mid)  # Method.VariableTable
            if not err:
                slots = []
                (_, n) = struct.unpack_from(">ii", body)
                at = 8
                for _ in range(n):
                    at += 8
                    _, at = jstring(body, at)
                    sig, at = jstring(body, at)
                    (_, slot) = struct.unpack_from(">ii", body, at)
                    at += 8
                    slots.append(struct.pack(">iB", slot, ord(sig[0])))
                data = self.main + fid + struct.pack(">i", len(slots)) + b"".join(slots)
                cmd(16, 1, data)  # StackFrame.GetValues
        cmd(1, 2, jbytes("Ljava/lang/String;"))  # ClassesBySignature
        cmd(1, 9)  # VM.Resume
        return sent


def run_ops(client: Jdwp, workload: str, n: int) -> tuple[list[float], int]:
    """``n`` operations of ``workload``: (each one's latency in us, commands sent)."""
    op = getattr(client, workload)
    clock = time.perf_counter_ns
    out = []
    sent = 0
    for _ in range(n):
        t0 = clock()
        sent += op()
        out.append((clock() - t0) / 1000)
    return out, sent
