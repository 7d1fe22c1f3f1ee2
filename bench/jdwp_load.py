"""bridge_latency.py's load: a raw JDWP client, its three workloads, and the CPU of process trees.

The client is blocking, one command at a time, TCP_NODELAY (as bench/front.py's ``Jdwp``), run in
the bench process itself, so it is the same on every path. Workloads, timed per operation:

- ``name``: ThreadReference.Name (11/1) of the target's ``main`` thread: one command, one reply;
- ``threads``: VirtualMachine.AllThreads (1/4): one command, one reply;
- ``mix``: one simulated breakpoint stop of an IDE, timed as a whole: VM.Suspend; AllThreads and
  ThreadReference.Status of each thread; Frames of the stopped thread (``main``); in the frame of
  ``Target.main``: StackFrame.ThisObject (a static method: null, so the stopped thread's own
  java.lang.Thread object stands in for ``this``), its ObjectReference.ReferenceType,
  ReferenceType.Fields and ObjectReference.GetValues of its instance fields; the locals:
  Method.VariableTable and StackFrame.GetValues (Target is compiled with -g); one
  VirtualMachine.ClassesBySignature; VM.Resume.

CPU: ``tree_ns`` sums sum_exec_runtime (ns, the first field of /proc/PID/task/TID/schedstat) over
every thread of a process and of all its descendants, found by the ppid field of /proc/*/stat
(so socat's per-connection children and fake adb's threads count).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time

from proctree import run_ns

HOST = "127.0.0.1"
HANDSHAKE = b"JDWP-Handshake"
HEADER = struct.Struct(">IIBBB")
REPLY = struct.Struct(">IIBH")
WORKLOADS = ("name", "threads", "mix")
LABELS = {"name": "name()", "threads": "allThreads()", "mix": "IDE mix"}


class Closed(Exception):
    pass


class RawJdwp:
    """A blocking JDWP client: one command at a time, events skipped (the benches' client)."""

    def __init__(self, port: int, timeout: float = 20.0) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.next_id = 1
        self.sock.sendall(HANDSHAKE)
        if self._read(len(HANDSHAKE)) != HANDSHAKE:
            raise Closed("bad handshake reply")
        self.sizes: tuple[int, ...] = (8, 8, 8, 8, 8)  # field, method, object, type, frame

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            data = self.sock.recv(65536)
            if not data:
                raise Closed(f"closed after {len(self.buf)} of {n} bytes")
            self.buf += data
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def command(self, cs: int, cmd: int, data: bytes = b"") -> tuple[int, bytes]:
        """(error code, reply data)."""
        packet_id = self.next_id
        self.next_id += 1
        self.sock.sendall(HEADER.pack(11 + len(data), packet_id, 0, cs, cmd) + data)
        while True:
            length, rid, flags, error = REPLY.unpack(self._read(11))
            body = self._read(length - 11)
            if flags & 0x80 and rid == packet_id:
                return error, body

    def ok(self, cs: int, cmd: int, data: bytes = b"") -> bytes:
        error, body = self.command(cs, cmd, data)
        if error:
            raise RuntimeError(f"JDWP {cs}/{cmd}: error {error}")
        return body

    def id_sizes(self) -> None:
        self.sizes = struct.unpack(">5i", self.ok(1, 7))

    def ids(self, body: bytes, size: int) -> list[bytes]:
        (n,) = struct.unpack_from(">i", body)
        return [body[4 + i * size : 4 + (i + 1) * size] for i in range(n)]


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
        for tid in self.ids(self.ok(1, 4), self.sizes[2]):
            if jstring(self.ok(11, 1, tid))[0] == "main":
                self.main = tid
                break
        else:
            raise RuntimeError("no thread named main")
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


def jbytes(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">I", len(raw)) + raw


def jstring(body: bytes, at: int = 0) -> tuple[str, int]:
    (n,) = struct.unpack_from(">i", body, at)
    return body[at + 4 : at + 4 + n].decode("utf-8", "replace"), at + 4 + n


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


# --------------------------------------------------------------------------------------------
# CPU of process trees


def tree_ns(roots: list[int]) -> dict[tuple[int, int], int]:
    """sum_exec_runtime (ns) by (pid, tid) over every thread of ``roots`` and descendants."""
    out: dict[tuple[int, int], int] = {}
    for root in roots:
        out.update(run_ns(root))
    return out


def snapshot(watch: dict[str, list[int]]) -> dict[str, dict[tuple[int, int], int]]:
    return {label: tree_ns(pids) for label, pids in watch.items()}


def delta_ns(
    before: dict[str, dict[tuple[int, int], int]], after: dict[str, dict[tuple[int, int], int]]
) -> dict[str, int]:
    """ns per label; a thread new at ``after`` counts from 0."""
    return {
        label: sum(v - before.get(label, {}).get(k, 0) for k, v in now.items())
        for label, now in after.items()
    }
