"""The HotSpot Attach API on Linux, sans-IO: the request's bytes, the reply's status and text,
and readers of the outputs ddmd uses (``Thread.print``, ``GC.heap_info``, ``GC.heap_dump``),
plus the few ``/proc`` facts the attach handshake decides on.

Layer: standard library only (mypy --strict). The trio side is ``ddmd.hotspot.client``.

What was checked, and where (OpenJDK's Linux client ``jdk.attach/linux/.../VirtualMachineImpl``
and the VM side ``hotspot/os/posix/attachListener_posix.cpp``, ``attachListener_linux.cpp``;
then every format below against this machine's OpenJDK 17.0.15, whose raw replies are the
golden files of ``tests/protocol/golden/hotspot17``):

- The VM listens on the unix socket ``.java_pid<NSPID>`` in its own ``/tmp`` (from another
  process: ``/proc/PID/root/tmp``), where NSPID is the pid the JVM sees itself as (the last
  number of ``NSpid:`` in ``/proc/PID/status``; the pid itself outside containers).
- No socket yet: the client creates ``.attach_pid<NSPID>`` in the VM's working directory
  (``/proc/PID/cwd``, else its ``/tmp``) and sends SIGQUIT. The VM's SIGQUIT handler sees the
  file and starts its attach listener (without the file it prints a thread dump instead). A
  process whose ``SigCgt`` does not have SIGQUIT would be killed by the signal (a JVM run with
  ``-Xrs``), so the client looks first. A VM started with ``-XX:+DisableAttachMechanism`` never
  creates the socket.
- The VM accepts a connection only from its own effective uid and gid, or root
  (``SO_PEERCRED``); other peers are closed without a word.
- Request (protocol version 1): ``"1" NUL command NUL arg0 NUL arg1 NUL arg2 NUL``, always
  three arguments, UTF-8. ``jcmd`` takes the whole command line as arg0 (``"GC.heap_dump
  /tmp/x.hprof"``).
- Reply: the status as decimal text and a newline (``0`` done, anything else failed, with the
  reason as the text), then the command's output until the VM closes the connection. A
  ``GC.heap_dump`` that cannot write its file still answers 0: its text says so.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_ARGS",
    "SIGQUIT",
    "AttachReplyError",
    "DumpFrame",
    "DumpThread",
    "HeapDumpResult",
    "HeapFigures",
    "HeapSpace",
    "ProcStatus",
    "Reply",
    "ThreadDump",
    "attach_disabled_by",
    "attach_file_name",
    "encode_request",
    "jcmd_request",
    "parse_heap_dump",
    "parse_heap_info",
    "parse_proc_status",
    "parse_reply",
    "parse_thread_dump",
    "pick_threads",
    "socket_name",
]

PROTOCOL_VERSION = "1"
MAX_ARGS = 3
SIGQUIT = 3


class AttachReplyError(ValueError):
    """Bytes that are not an attach reply (no status line)."""


# ------------------------------------------------------------------------------------ the wire


def socket_name(ns_pid: int) -> str:
    return f".java_pid{ns_pid}"


def attach_file_name(ns_pid: int) -> str:
    return f".attach_pid{ns_pid}"


def encode_request(command: str, *args: str) -> bytes:
    """One request: version, command and exactly three arguments, each ended by NUL."""
    if len(args) > MAX_ARGS:
        raise ValueError(f"an attach request takes at most {MAX_ARGS} arguments, not {len(args)}")
    parts = [PROTOCOL_VERSION, command, *args, *[""] * (MAX_ARGS - len(args))]
    for part in parts:
        if "\0" in part:
            raise ValueError(f"an attach request cannot carry a NUL character: {part!r}")
    if not command:
        raise ValueError("an attach request needs a command")
    return b"".join(part.encode("utf-8") + b"\0" for part in parts)


def jcmd_request(line: str) -> bytes:
    """A diagnostic command, as ``jcmd PID LINE`` sends it."""
    return encode_request("jcmd", line)


@dataclass(frozen=True, slots=True)
class Reply:
    """The VM's answer: its status (0 = done) and the text that followed."""

    status: int
    text: str

    @property
    def ok(self) -> bool:
        return self.status == 0


def parse_reply(data: bytes) -> Reply:
    """A whole reply, as read until the VM closed the connection."""
    head, newline, rest = data.partition(b"\n")
    status = head.strip()
    if not newline and not status:
        raise AttachReplyError("the VM closed the connection without an answer")
    if not re.fullmatch(rb"-?\d{1,10}", status):
        raise AttachReplyError(f"the answer does not start with a status line: {head[:40]!r}")
    return Reply(int(status), rest.decode("utf-8", "replace"))


# ------------------------------------------------------------------------------------ /proc


@dataclass(frozen=True, slots=True)
class ProcStatus:
    """What ``/proc/PID/status`` says about attaching: the pid the process sees itself as, its
    effective uid and gid, and whether it catches SIGQUIT (None: not said)."""

    ns_pid: int | None
    euid: int | None
    egid: int | None
    catches_sigquit: bool | None
    ignores_sigquit: bool | None


def _mask_has(text: str | None, signal: int) -> bool | None:
    if text is None:
        return None
    try:
        return bool(int(text, 16) >> (signal - 1) & 1)
    except ValueError:
        return None


def parse_proc_status(text: str) -> ProcStatus:
    """``Uid:``/``Gid:`` (real, effective, saved, fs), ``NSpid:`` (outermost first: the last is
    the innermost namespace's), ``SigCgt:``/``SigIgn:`` (hex masks, bit n-1 = signal n)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, colon, value = line.partition(":")
        if colon:
            fields[key.strip()] = value.strip()

    def second(key: str) -> int | None:
        values = fields.get(key, "").split()
        return int(values[1]) if len(values) > 1 and values[1].isdigit() else None

    nspids = fields.get("NSpid", "").split()
    ns_pid = int(nspids[-1]) if nspids and nspids[-1].isdigit() else None
    return ProcStatus(
        ns_pid=ns_pid,
        euid=second("Uid"),
        egid=second("Gid"),
        catches_sigquit=_mask_has(fields.get("SigCgt"), SIGQUIT),
        ignores_sigquit=_mask_has(fields.get("SigIgn"), SIGQUIT),
    )


_DISABLE = re.compile(r"^-XX:([+-])DisableAttachMechanism$")
_OPTION_VALUE = frozenset(
    {"-cp", "-classpath", "--class-path", "-p", "--module-path", "--upgrade-module-path",
     "--add-modules", "--limit-modules", "--add-reads", "--add-exports", "--add-opens",
     "--patch-module", "--source"}
)  # fmt: skip
_ENV_FIRST = ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS")
_ENV_LAST = ("_JAVA_OPTIONS",)


def _jvm_options(cmdline: Sequence[str]) -> list[str]:
    """The launcher's options: up to the main class, ``-jar``, ``-m`` or a source file."""
    options: list[str] = []
    args = iter(cmdline[1:])
    for arg in args:
        if arg in ("-jar", "-m", "--module") or not arg.startswith("-"):
            break
        options.append(arg)
        if arg in _OPTION_VALUE:
            next(args, None)
    return options


def attach_disabled_by(cmdline: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """Where ``-XX:+DisableAttachMechanism`` is in force, in words ("its command line",
    "JAVA_TOOL_OPTIONS"); None when it is not. The JVM reads JAVA_TOOL_OPTIONS (and the
    launcher JDK_JAVA_OPTIONS) before its command line and _JAVA_OPTIONS after it: the last
    setting wins."""
    where: str | None = None
    sources: list[tuple[str, Iterable[str]]] = [
        *((name, environ.get(name, "").split()) for name in _ENV_FIRST),
        ("its command line", _jvm_options(cmdline)),
        *((name, environ.get(name, "").split()) for name in _ENV_LAST),
    ]
    for name, options in sources:
        for option in options:
            match = _DISABLE.match(option)
            if match:
                where = name if match[1] == "+" else None
    return where


# ------------------------------------------------------------------------------------ Thread.print


@dataclass(frozen=True, slots=True)
class DumpFrame:
    """One ``at`` line: ``line`` -2 native, -1 unknown (as DDM's STKL has it); ``module`` the
    ``java.base@17.0.15`` part; ``locks`` the ``- waiting on <...>`` lines after it."""

    class_name: str
    method_name: str
    file_name: str
    line: int
    module: str | None = None
    locks: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "class_name": self.class_name,
            "method_name": self.method_name,
            "file_name": self.file_name,
            "line": self.line,
            "module": self.module,
            "locks": list(self.locks),
        }


#: java.lang.Thread.State -> the words ddmd uses for DDM VMs' thread states.
STATE_WORDS = {
    "NEW": "init",
    "RUNNABLE": "running",
    "BLOCKED": "monitor",
    "WAITING": "wait",
    "TIMED_WAITING": "timed-wait",
    "TERMINATED": "zombie",
}


@dataclass(frozen=True, slots=True)
class DumpThread:
    """One thread of a thread dump. ``number``: the ``#N`` Java thread id (Thread.getId());
    None for the VM's own threads (GC, compiler), which have no Java object. ``nid``: the
    operating system's thread id. ``java_state``: ``WAITING``; ``state_detail``: ``on object
    monitor``; ``condition``: what the header says (``in Object.wait()``)."""

    name: str
    number: int | None
    daemon: bool
    priority: int | None
    nid: int | None
    condition: str
    java_state: str | None
    state_detail: str | None
    frames: tuple[DumpFrame, ...]
    text: str

    @property
    def state(self) -> str:
        """In ddmd's words: running, native (running in a native method), sleeping, wait,
        timed-wait, monitor; the VM's own threads: vm."""
        if self.java_state is None:
            return "vm"
        if self.java_state == "RUNNABLE" and self.frames and self.frames[0].line == -2:
            return "native"
        if self.java_state == "TIMED_WAITING" and self.state_detail == "sleeping":
            return "sleeping"
        return STATE_WORDS.get(self.java_state, self.java_state.lower())

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.number,
            "name": self.name,
            "tid": self.nid,
            "state": self.state,
            "java_state": self.java_state,
            "state_detail": self.state_detail,
            "daemon": self.daemon,
            "priority": self.priority,
            "frames": [f.to_json() for f in self.frames],
        }


@dataclass(frozen=True, slots=True)
class ThreadDump:
    """A whole ``Thread.print``: its first lines, the threads in order, and what follows them
    (JNI references, a deadlock report)."""

    header: str
    threads: tuple[DumpThread, ...]
    trailer: str

    @property
    def deadlocked(self) -> bool:
        return "deadlock" in self.trailer


_HEAD = re.compile(
    r'^"(?P<name>.*)"'
    r"(?: #(?P<number>\d+))?"
    r"(?: \[\d+\])?"  # JDK 19+: the os thread id again, in brackets
    r"(?P<daemon> daemon)?"
    r"(?P<fields>(?: [a-z_]+=\S+)+)"
    r"(?: (?P<condition>.*?))?"
    r"(?: +\[0x[0-9a-f]+\])? *$"
)
_FIELD = re.compile(r" ([a-z_]+)=(\S+)")
_STATE = re.compile(r"^\s+java\.lang\.Thread\.State: (?P<state>[A-Z_]+)(?: \((?P<detail>.*)\))?$")
_AT = re.compile(r"^\s+at (?P<where>[^(]+)\((?P<source>.*)\)$")
_LOCK = re.compile(r"^\s+- (?P<what>.+)$")
_TRAILER = ("JNI global refs", "JNI global references", "Found one Java-level deadlock")


def _number(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text, 16) if text.startswith("0x") else int(text)
    except ValueError:
        return None


def _frame(where: str, source: str) -> DumpFrame:
    class_name, _, method = where.rpartition(".")
    module, slash, place = source.rpartition("/")
    if not slash:
        module, place = "", source
    file_name, line = place, -1
    if place == "Native Method":
        file_name, line = "", -2
    elif place in ("Unknown Source", ""):
        file_name = ""
    else:
        name, colon, number = place.rpartition(":")
        if colon and number.isdigit():
            file_name, line = name, int(number)
    return DumpFrame(class_name, method, file_name, line, module.strip("/") or None)


def _thread(head: re.Match[str], body: list[str]) -> DumpThread:
    fields = dict(_FIELD.findall(head["fields"]))
    java_state = detail = None
    frames: list[DumpFrame] = []
    synchronizers = False  # after "Locked ownable synchronizers:" (-l): not a frame's locks
    for line in body:
        if line.strip() == "Locked ownable synchronizers:":
            synchronizers = True
            continue
        state = _STATE.match(line)
        at = _AT.match(line)
        lock = _LOCK.match(line)
        if state:
            java_state, detail = state["state"], state["detail"]
        elif at:
            frames.append(_frame(at["where"], at["source"]))
        elif lock and frames and not synchronizers:
            last = frames[-1]
            frames[-1] = DumpFrame(
                last.class_name, last.method_name, last.file_name, last.line, last.module,
                (*last.locks, lock["what"]),
            )  # fmt: skip
    text = "\n".join([head.string, *body]).rstrip()
    return DumpThread(
        name=head["name"],
        number=_number(head["number"]),
        daemon=head["daemon"] is not None,
        priority=_number(fields.get("prio")),
        nid=_number(fields.get("nid")),
        condition=(head["condition"] or "").strip(),
        java_state=java_state,
        state_detail=detail,
        frames=tuple(frames),
        text=text,
    )


def parse_thread_dump(text: str) -> ThreadDump:
    """``Thread.print``'s text (jstack's), read thread by thread. A thread starts with a line
    ``"NAME" #N daemon prio=5 os_prio=0 ... tid=0x... nid=0x... CONDITION [0x...]`` (the VM's
    own threads have neither ``#N`` nor ``prio``), then its state line, ``at`` frames and
    ``- locked <...>`` lines; the first line that is not a thread's after the last thread
    starts the trailer."""
    lines = text.splitlines()
    header: list[str] = []
    trailer: list[str] = []
    threads: list[DumpThread] = []
    head: re.Match[str] | None = None
    body: list[str] = []
    for index, line in enumerate(lines):
        match = _HEAD.match(line) if line.startswith('"') else None
        if match is not None and "nid" in dict(_FIELD.findall(match["fields"])):
            if head is not None:
                threads.append(_thread(head, body))
            head, body = match, []
        elif head is None:
            header.append(line)
        elif line.startswith(_TRAILER) or (line and not line[0].isspace()):
            threads.append(_thread(head, body))
            head = None
            trailer = lines[index:]
            break
        else:
            body.append(line)
    if head is not None:
        threads.append(_thread(head, body))
    return ThreadDump(
        header="\n".join(header).strip("\n"),
        threads=tuple(threads),
        trailer="\n".join(trailer).strip("\n"),
    )


def pick_threads(threads: Sequence[DumpThread], key: str) -> tuple[DumpThread, ...]:
    """The threads ``key`` means: a number is a ``#N`` thread id (or a thread so named); a name
    is the exact name first, then a part of one, ignoring case. Several: the key is
    ambiguous; none: no such thread."""
    text = key.strip()
    if text.isascii() and text.isdigit():
        by_number = tuple(t for t in threads if t.number == int(text))
        if by_number:
            return by_number
    exact = tuple(t for t in threads if t.name == text)
    if exact:
        return exact
    needle = text.casefold()
    return tuple(t for t in threads if needle and needle in t.name.casefold())


# ------------------------------------------------------------------------------------ GC.heap_info


@dataclass(frozen=True, slots=True)
class HeapSpace:
    """One line of ``GC.heap_info`` with sizes, in bytes. ``kind``: "heap" (a part of the Java
    heap: a collector's generation or its whole heap) or "metaspace" (class metadata: not in
    the Java heap). ``part_of``: the space this one is a part of (class space of Metaspace).
    ``max``: the address range reserved for it (the most it can grow to); None when not
    said."""

    name: str
    kind: str
    used: int
    committed: int | None
    max: int | None
    part_of: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "used": self.used,
            "committed": self.committed,
            "max": self.max,
            "part_of": self.part_of,
        }


@dataclass(frozen=True, slots=True)
class HeapFigures:
    """``GC.heap_info`` read: the collector, its spaces, and the Java heap's totals."""

    collector: str | None
    spaces: tuple[HeapSpace, ...]
    text: str

    def _heap(self) -> list[HeapSpace]:
        return [s for s in self.spaces if s.kind == "heap" and s.part_of is None]

    @property
    def used(self) -> int | None:
        heap = self._heap()
        return sum(s.used for s in heap) if heap else None

    @property
    def committed(self) -> int | None:
        heap = self._heap()
        if not heap or any(s.committed is None for s in heap):
            return None
        return sum(s.committed or 0 for s in heap)

    @property
    def max(self) -> int | None:
        heap = self._heap()
        if not heap or any(s.max is None for s in heap):
            return None
        return sum(s.max or 0 for s in heap)

    def to_json(self) -> dict[str, Any]:
        return {
            "collector": self.collector,
            "used": self.used,
            "committed": self.committed,
            "max": self.max,
            "spaces": [s.to_json() for s in self.spaces],
            "text": self.text,
        }


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _size(name: str) -> str:
    return rf"(?P<{name}>\d+)(?P<{name}_unit>[KMGT]?)B?"


# G1, Parallel, Serial: "NAME   total 262144K, used 1685K [0x..., 0x...(, 0x...)[)]]"
_TOTAL = re.compile(
    rf"^(?P<indent> +)(?P<name>\S.*?)\s+total {_size('total')}, used {_size('used')}"
    r"\s*\[(?P<range>[^\])]*)[\])]"
)
# Metaspace: "Metaspace       used 142K, committed 320K, reserved 1114112K"
_META = re.compile(
    rf"^(?P<indent> +)(?P<name>\S.*?)\s+used {_size('used')}, committed {_size('committed')}, "
    rf"reserved {_size('max')}"
)
# ZGC: "ZHeap           used 4M, capacity 256M, max capacity 256M"
_ZHEAP = re.compile(
    rf"^ +ZHeap\s+used {_size('used')}, capacity {_size('committed')}, max capacity {_size('max')}"
)
# Shenandoah: "Shenandoah Heap" then " 256M max, 256M soft max, 256M committed, 1536K used"
_SHENANDOAH = re.compile(
    rf"^ +{_size('max')} max, (?:{_size('soft')} soft max, )?{_size('committed')} committed, "
    rf"{_size('used')} used"
)
_COLLECTORS = (
    ("garbage-first heap", "G1"),
    ("PSYoungGen", "Parallel"),
    ("def new generation", "Serial"),
    ("Shenandoah Heap", "Shenandoah"),
    ("ZHeap", "Z"),
    ("Epsilon Heap", "Epsilon"),
)


def _bytes(match: re.Match[str], name: str) -> int:
    return int(match[name]) * _UNITS[match[f"{name}_unit"]]


def _range(text: str) -> int | None:
    """``0xLOW, 0xHIGH`` or ``0xLOW, 0xCOMMITTED_END, 0xRESERVED_END``: the reserved size."""
    addresses = [a.strip() for a in text.split(",") if a.strip()]
    try:
        values = [int(a, 16) for a in addresses]
    except ValueError:
        return None
    return values[-1] - values[0] if len(values) >= 2 else None


def parse_heap_info(text: str) -> HeapFigures:
    """``GC.heap_info``'s text. Every collector prints its own lines; ddmd reads the ones with
    sizes (the regular expressions above, one per layout seen in OpenJDK 17: G1, Parallel and
    Serial alike, Metaspace, ZGC, Shenandoah), and keeps the text whole for the rest."""
    spaces: list[HeapSpace] = []
    collector = next((name for marker, name in _COLLECTORS if marker in text), None)
    top_meta: str | None = None
    for line in text.splitlines():
        if m := _TOTAL.match(line):
            used, committed = _bytes(m, "used"), _bytes(m, "total")
            spaces.append(HeapSpace(m["name"], "heap", used, committed, _range(m["range"])))
        elif m := _META.match(line):
            nested = len(m["indent"]) > 1 and top_meta is not None
            if not nested:
                top_meta = m["name"]
            spaces.append(
                HeapSpace(
                    m["name"],
                    "metaspace",
                    _bytes(m, "used"),
                    _bytes(m, "committed"),
                    _bytes(m, "max"),
                    top_meta if nested else None,
                )
            )
        elif m := (_ZHEAP.match(line) or _SHENANDOAH.match(line)):
            name = "ZHeap" if m.re is _ZHEAP else "Shenandoah Heap"
            used, committed, most = _bytes(m, "used"), _bytes(m, "committed"), _bytes(m, "max")
            spaces.append(HeapSpace(name, "heap", used, committed, most))
    return HeapFigures(collector, tuple(spaces), text)


# ------------------------------------------------------------------------------------ GC.heap_dump


@dataclass(frozen=True, slots=True)
class HeapDumpResult:
    """``GC.heap_dump``'s answer: written (with the size it reports) or why not."""

    written: bool
    size: int | None
    message: str


_DUMPED = re.compile(r"Heap dump file created \[(\d+) bytes in [\d.]+ secs\]")


def parse_heap_dump(text: str) -> HeapDumpResult:
    """``Dumping heap to FILE ...`` then ``Heap dump file created [N bytes in T secs]``, or a
    line that says why not (``Unable to create FILE: File exists``)."""
    match = _DUMPED.search(text)
    if match:
        return HeapDumpResult(True, int(match[1]), match[0])
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    reasons = [line for line in lines if not line.startswith("Dumping heap to")]
    return HeapDumpResult(False, None, " ".join(reasons) or "the JVM wrote no heap dump")
