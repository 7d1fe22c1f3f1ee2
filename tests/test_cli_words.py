"""Issue 20, friction 8: the CLI says in words what the daemon's JSON says in codes -- heap kinds
as the web page names them, heap-info reasons, ISO 8601 times in --json, features, one thread
state vocabulary, CPU seconds, methods as Java source writes them (descriptors with -v), the
trace report's per-thread tables behind --per-thread, allocating threads by name."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from ddmd.cli.format import format_event, format_heap, format_threads, print_json
from ddmd.cli.main import main
from ddmd.cli.profiling import format_allocations, thread_names
from ddmd.cli.words import (
    HEAP_KIND_WORDS,
    cpu_time,
    heap_info_reason,
    iso_time,
    json_words,
    method_words,
    parameter_words,
    thread_state,
)
from ddmd.control.events import utc_now_iso
from ddmd.control.heapimage import _KIND_LABEL
from ddmd.control.shapes import _enum_name
from ddmd.protocol.heap import Kind
from ddmd.sim.trace import build_trace, default_recording

# The log's "ts" and every time --json prints: ISO 8601, UTC, microseconds, "Z".
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
VM = {"id": "tcp:8000", "name": "com.example.mail", "pid": 3101, "missing": {}}


# ------------------------------------------------------------------------------ heap kinds


def test_heap_kinds_have_the_web_pages_names():
    # Every key the API sends in bytes_by_kind, named as the web page's legend names it.
    assert {_enum_name(kind): label for kind, label in _KIND_LABEL.items()} == HEAP_KIND_WORDS
    assert {_enum_name(kind) for kind in Kind} == set(HEAP_KIND_WORDS)


def _segments_body() -> dict[str, object]:
    summary = {
        "bytes_used": 3_600_000,
        "bytes_free": 520_000,
        "largest_free_run": 15_600,
        "free_run_count": 1450,
        "fragmentation": 0.97,
        "object_count": None,
        "bytes_by_kind": {"object": 32, "array_1": 2168, "array_4": 4096},
    }
    segment = {"address": 0x12C00000, "end": 0x12D38B78, "unit_size": 8, "units": 160111}
    image = {"heap_id": 1, "summary": summary, "segments": [{**segment, "runs": [[0, 1, 0, 0]]}]}
    return {"vm": VM, "heaps": [], "images": [image]}


def test_heap_output_names_kinds_and_keeps_units_runs_and_fragmentation_for_verbose():
    text = format_heap(_segments_body())
    assert "used by kind: object 32 B, byte[] / boolean[] 2.1 KiB, int[] / float[] / Object[]" in (
        text
    )
    assert "array_1" not in text
    assert "units of" not in text
    assert "runs between objects, the largest 15.2 KiB" in text
    assert "many small runs are usual between collections" in text  # 97 % explained, not shown
    assert "97" not in text
    verbose = format_heap(_segments_body(), verbose=True)
    assert "segment 0x12c00000-0x12d38b78: 160111 units of 8 B, 1 runs" in verbose
    assert "fragmentation 97.0 % (the share of free bytes outside the largest run)" in verbose


# ------------------------------------------------------------------------------ GC reasons


def test_heap_info_reasons_are_named():
    assert [heap_info_reason(n) for n in (1, 2, 3)] == ["request", "gc", "gc"]
    assert heap_info_reason(3, human=True) == "after a GC"
    assert heap_info_reason(1, human=True) == "on request"
    assert heap_info_reason(77) == 77  # unknown values are carried as they came
    heap = {"heap_id": 1, "timestamp_ms": 1_700_000_000_000, "reason": 3, "size": 4096}
    assert json_words({"heaps": [heap]})["heaps"][0]["reason"] == "gc"
    # Other "reason" keys are sentences and stay as they are.
    assert json_words({"reason": 3, "x": {"reason": "slow consumer"}}) == {
        "reason": 3,
        "x": {"reason": "slow consumer"},
    }
    text = format_heap({"vm": VM, "heaps": [heap], "images": []})
    assert ", after a GC" in text
    assert "reason" not in text


# ------------------------------------------------------------------------------ ISO times


def test_json_times_are_iso_8601_like_the_logs_ts(capsys):
    assert ISO.match(utc_now_iso())
    assert iso_time(1_700_000_000.5) == "2023-11-14T22:13:20.500000Z"
    vm = {
        "id": "tcp:8000",
        "connected_at": 1_700_000_000.25,
        "heaps": [{"heap_id": 1, "timestamp_ms": 1_700_000_001_000, "reason": 1}],
        "debuggers": [{"tool": "jdb", "since": 1_700_000_002.0}],
    }
    print_json([vm])
    (shown,) = json.loads(capsys.readouterr().out)
    assert shown["connected_at"] == "2023-11-14T22:13:20.250000Z"
    heap = shown["heaps"][0]
    assert "timestamp_ms" not in heap
    assert heap["timestamp"] == "2023-11-14T22:13:21.000000Z"
    assert heap["reason"] == "request"
    assert ISO.match(shown["debuggers"][0]["since"])
    assert json_words({"connected_at": None}) == {"connected_at": None}


# ------------------------------------------------------------------------------ features


def test_features_are_named_in_words_on_the_event_lines():
    event = {
        "event": "vm.changed",
        "ts": "2026-11-26T12:00:00.000000Z",
        "vm": "tcp:8002",
        "changed": ["unsupported", "missing"],
        "snapshot": {"unsupported": ["HPIF", "HPSG"], "missing": {"HPIF": "...", "HPSG": "..."}},
    }
    line = format_event(event)
    assert line.endswith("tcp:8002: not available: heap information, heap segments")
    assert "HPIF" not in line


# ------------------------------------------------------------------------------ threads


def _threads(*rows: tuple[str | None, int | None]) -> dict[str, object]:
    threads = [
        {"id": i, "tid": 100 + i, "name": f"t{i}", "state": state, "status": None, "utime": cpu}
        for i, (state, cpu) in enumerate(rows, start=1)
    ]
    return {"vm": VM, "threads": threads, "supported": True}


def test_thread_states_have_one_vocabulary_across_vm_families():
    # JDWP (a plain JVM) and the 2007 draft say "sleeping"/"waiting"; DDMS says these words.
    assert thread_state("sleeping") == thread_state("timed-wait") == "timed-wait"
    assert thread_state("waiting") == thread_state("wait") == "wait"
    text = format_threads(_threads(("sleeping", None), ("waiting", None), ("monitor", None)))
    rows = [line.split() for line in text.splitlines()[2:]]
    assert [row[2] for row in rows] == ["timed-wait", "wait", "monitor"]
    listed = _threads(("sleeping", None), ("timed-wait", None), (None, None))["threads"]
    event = {"event": "threads.updated", "vm": "tcp:8000", "threads": listed}
    assert format_event(event).endswith("3 threads (timed-wait 2, 1 other)")


def test_cpu_times_show_their_unit():
    assert cpu_time(52) == "0.52 s"
    assert cpu_time(12345) == "123.45 s"
    assert cpu_time(None) is None
    text = format_threads(_threads(("running", 52)))
    assert "USER CPU" in text
    assert "0.52 s" in text
    assert "0.52 s (52 ticks)" in format_threads(_threads(("running", 52)), verbose=True)


# ------------------------------------------------------------------------------ methods


@pytest.mark.parametrize(
    ("class_name", "name", "signature", "shown"),
    [
        (
            "com.example.MainActivity",
            "onCreate",
            "(Landroid/os/Bundle;)V",
            "com.example.MainActivity.onCreate(Bundle)",
        ),
        ("com.example.Store", "fetch", "(I)[B", "com.example.Store.fetch(int)"),
        ("a.B", "f", "(J[[Ljava/util/Map$Entry;Z)V", "a.B.f(long, Map.Entry[][], boolean)"),
        ("com/example/Inbox", "<init>", "()V", "com.example.Inbox.<init>()"),
    ],
)
def test_methods_read_as_java_source(class_name, name, signature, shown):
    assert method_words(class_name, name, signature, "full") == shown


def test_what_is_not_a_descriptor_is_left_alone():
    assert parameter_words("(Lbroken") is None
    assert method_words("a.B", "f", "garbage", "a.B.f garbage") == "a.B.f garbage"
    assert method_words(None, None, None, "nativeFunction") == "nativeFunction"


@pytest.fixture
def trace_file(tmp_path):
    path = tmp_path / "app.trace"
    path.write_bytes(build_trace(default_recording()))
    return path


def test_trace_report_prints_java_names_with_descriptors_under_verbose(trace_file):
    plain = CliRunner().invoke(main, ["trace-report", str(trace_file), "--top", "20"])
    assert plain.exit_code == 0, plain.output
    assert "com.example.mail.MainActivity.onCreate(Bundle)" in plain.stdout
    assert "(Landroid/os/Bundle;)V" not in plain.stdout
    verbose = CliRunner().invoke(main, ["trace-report", str(trace_file), "--top", "20", "-v"])
    assert "com.example.mail.MainActivity.onCreate(Landroid/os/Bundle;)V" in verbose.stdout


def test_trace_reports_per_thread_tables_are_behind_per_thread(trace_file):
    plain = CliRunner().invoke(main, ["trace-report", str(trace_file)])
    headings = [line for line in plain.stdout.splitlines() if line.startswith("Thread ")]
    assert headings == []
    assert "(--per-thread shows the tables of each of the 2 threads)" in plain.stdout
    every = CliRunner().invoke(main, ["trace-report", str(trace_file), "--per-thread"])
    headings = [line.split(":")[0] for line in every.stdout.splitlines() if line.startswith("Thr")]
    assert headings == ["Thread 4263 SyncWorker", "Thread 4242 main"]


# ------------------------------------------------------------------------------ allocations

THREADS = [
    {"id": 1, "tid": 3101, "name": "main"},
    {"id": 14, "tid": 70_001, "name": "SyncWorker"},  # a tid beyond 16 bits
    {"id": 15, "tid": 3120, "name": ""},
]


def test_allocation_threads_are_named_from_the_thread_list():
    # ART sends the low 16 bits of the Linux tid; Dalvik the VM's own thread id.
    art = thread_names({"vm_ident": "Dalvik v2.1.0"}, THREADS)
    assert art == {3101: "main", 70_001 & 0xFFFF: "SyncWorker"}
    assert thread_names({"vm_ident": "Dalvik v1.6.0"}, THREADS) == {1: "main", 14: "SyncWorker"}
    body = {
        "enabled": True,
        "allocations": [
            {"size": 32, "class": "java.lang.String", "thread": 3101, "frames": []},
            {"size": 64, "class": "byte[]", "thread": 70_001 & 0xFFFF, "frames": []},
            {"size": 16, "class": "int[]", "thread": 999, "frames": []},
        ],
    }
    lines = format_allocations(body, "mail", 0, threads=art).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("BYTES"))
    assert [line.split()[2] for line in lines[start + 1 : start + 4]] == [
        "main",
        "SyncWorker",
        "999",
    ]
    verbose = format_allocations(body, "mail", 0, threads=art, verbose=True)
    assert "main (3101)" in verbose
