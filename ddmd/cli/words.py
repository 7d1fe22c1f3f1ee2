"""The words the CLI prints for what the daemon's JSON says in codes: heap kinds, why a heap-info
push came, times, thread states and CPU times, method descriptors, VM banners, debuggers.

The daemon's JSON keeps its machine values (the web page and scripts read them); what a person
reads is said here, once, so every command says it the same way. ``--json`` output goes through
`json_words`: times become ISO 8601 (UTC, microseconds, "Z": the log's ``ts``) and a heap-info
reason becomes its name; every other value is left as it came.

Layer: standard library only; pure functions over plain values. Used by `cli.format`,
`cli.trace`, `cli.profiling` and `sysmon.cli`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any, Final

__all__ = [
    "HEAP_INFO_REASONS",
    "HEAP_KIND_WORDS",
    "STATE_WORDS",
    "USER_HZ",
    "cpu_time",
    "debugger_words",
    "heap_info_reason",
    "heap_kind",
    "iso_time",
    "json_words",
    "method_words",
    "parameter_words",
    "short_vm_name",
    "thread_state",
]

#: The heap kinds of a segment summary (`bytes_by_kind` keys), as the web page's legend names
#: them (`control/heapimage.py`): which Java objects occupy those bytes.
HEAP_KIND_WORDS: Final = {
    "object": "object",
    "class_object": "class object",
    "array_1": "byte[] / boolean[]",
    "array_2": "char[] / short[]",
    "array_4": "int[] / float[] / Object[]",
    "array_8": "long[] / double[]",
    "unknown": "unknown",
    "non_object": "not a Java object",
}

#: Why a VM sent its heap information (HPIF's u1 reason: the "when" value that caused it,
#: protocol.md 3.4): the JSON name, then the words of the human output.
HEAP_INFO_REASONS: Final = {
    0: ("never", "unasked"),
    1: ("request", "on request"),
    2: ("gc", "after a GC"),
    3: ("gc", "after a GC"),
}

#: One vocabulary for thread states whatever the VM family: DDMS's words (ART and Dalvik's
#: THST labels). JDWP (plain JVMs) and the 2007 draft say some of them differently.
STATE_WORDS: Final = {
    "sleeping": "timed-wait",  # JDWP SLEEPING, draft 2: Thread.sleep, a timed wait
    "waiting": "wait",  # draft 4
}

#: Clock ticks a second in /proc/PID/task/TID/stat (THST's utime and stime): USER_HZ, which is
#: 100 on Linux and Android whatever the kernel's own tick rate.
USER_HZ: Final = 100


def heap_kind(name: str) -> str:
    return HEAP_KIND_WORDS.get(name, name.replace("_", " "))


def heap_info_reason(value: object, *, human: bool = False) -> object:
    """HPIF's reason as a name ("gc"), or in words ("after a GC"); an unknown value as it is."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in HEAP_INFO_REASONS:
        return value
    name, words = HEAP_INFO_REASONS[value]
    return words if human else name


def thread_state(state: object) -> str | None:
    if state is None or state == "":
        return None
    text = str(state)
    return STATE_WORDS.get(text, text)


def cpu_time(ticks: object) -> str | None:
    """THST's utime/stime (clock ticks) as seconds: ``52`` -> ``0.52 s``."""
    if isinstance(ticks, bool) or not isinstance(ticks, int):
        return None
    return f"{ticks / USER_HZ:.2f} s"


# ------------------------------------------------------------------------------------ times


def iso_time(epoch_seconds: float) -> str:
    """The log's timestamp format: ISO 8601, UTC, microseconds, "Z"."""
    when = dt.datetime.fromtimestamp(epoch_seconds, dt.UTC)
    return when.isoformat(timespec="microseconds").replace("+00:00", "Z")


#: JSON keys holding wall-clock seconds since the epoch (snapshots, debuggers).
_EPOCH_SECONDS: Final = frozenset({"since", "connected_at"})
#: JSON keys holding milliseconds since the epoch, and the key the ISO time goes under.
_EPOCH_MS: Final = {"timestamp_ms": "timestamp"}


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def json_words(data: Any) -> Any:
    """``data`` with its times in ISO 8601 (``timestamp_ms`` becomes ``timestamp``; 0, "not
    known", becomes null) and a heap-info ``reason`` named; everything else unchanged."""
    if isinstance(data, list):
        return [json_words(item) for item in data]
    if not isinstance(data, dict):
        return data
    heap_info = "heap_id" in data and "timestamp_ms" in data
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in _EPOCH_MS and _number(value):
            out[_EPOCH_MS[key]] = iso_time(value / 1000) if value else None
        elif key in _EPOCH_SECONDS and _number(value):
            out[key] = iso_time(value) if value else None
        elif key == "reason" and heap_info:
            out[key] = heap_info_reason(value)
        else:
            out[key] = json_words(value)
    return out


# ------------------------------------------------------------------------------ methods

_PRIMITIVES: Final = {
    "Z": "boolean",
    "B": "byte",
    "C": "char",
    "S": "short",
    "I": "int",
    "J": "long",
    "F": "float",
    "D": "double",
    "V": "void",
}


def _simple(class_name: str) -> str:
    """``android/os/Bundle`` -> ``Bundle``; an inner class keeps its outer one (``Map$Entry``
    -> ``Map.Entry``)."""
    return class_name.rsplit("/", 1)[-1].rsplit(".", 1)[-1].replace("$", ".")


def parameter_words(signature: str) -> list[str] | None:
    """The parameter types of a method descriptor, as short Java names:
    ``(Landroid/os/Bundle;I[B)V`` -> ``["Bundle", "int", "byte[]"]``; None when it is not one."""
    if not signature.startswith("(") or ")" not in signature:
        return None
    text = signature[1 : signature.index(")")]
    words: list[str] = []
    i = 0
    while i < len(text):
        dims = 0
        while i < len(text) and text[i] == "[":
            dims, i = dims + 1, i + 1
        if i >= len(text):
            return None
        code = text[i]
        if code == "L":
            end = text.find(";", i)
            if end < 0:
                return None
            base = _simple(text[i + 1 : end])
            i = end + 1
        elif code in _PRIMITIVES and code != "V":
            base = _PRIMITIVES[code]
            i += 1
        else:
            return None
        words.append(base + "[]" * dims)
    return words


def method_words(class_name: str | None, name: str | None, signature: str | None, full: str) -> str:
    """A method as a Java developer writes it: ``com.example.Main.onCreate(Bundle)``, not
    ``com.example.Main.onCreate(Landroid/os/Bundle;)V``. ``full`` (the name with its
    descriptor) is returned when the parts do not make a method."""
    if not class_name or not name or not signature:
        return full
    params = parameter_words(signature)
    if params is None:
        return full
    return f"{class_name.replace('/', '.')}.{name}({', '.join(params)})"


# ----------------------------------------------------------------------------------- VMs


def short_vm_name(vm: Mapping[str, Any]) -> str | None:
    """The VM cell of ``ddmd clients``: the daemon's ``vm_label`` (``OpenJDK 17.0.15``,
    ``ART``), the one the web page shows; worked out here for an older daemon without it."""
    if "vm_label" in vm:
        label = vm["vm_label"]
        return None if label is None else str(label)
    from ddmd.session.model import vm_label

    ident, description = vm.get("vm_ident"), vm.get("description")
    return vm_label(
        None if ident is None else str(ident), None if description is None else str(description)
    )


# ----------------------------------------------------------------------------- debuggers


def debugger_words(debugger: Mapping[str, Any]) -> str:
    """An attached debugger as its program (and pid, when the daemon knows it): ``jdb pid
    1234``; never the ephemeral port it connected from."""
    tool = str(debugger.get("tool") or "unnamed debugger")
    pid = debugger.get("pid")
    text = f"{tool} pid {pid}" if isinstance(pid, int) and not isinstance(pid, bool) else tool
    return text if debugger.get("debugging", True) else f"{text} (DDM only)"
