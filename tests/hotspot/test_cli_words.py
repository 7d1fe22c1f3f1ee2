"""What the CLI prints for the attach API's answers and for every thread's stack, from JSON
bodies shaped as the daemon sends them (``cli/jvm.py``); the real daemon's are in
test_cli.py."""

from __future__ import annotations

from pathlib import Path

from ddmd.cli.jvm import format_gc_any, format_heap_any, format_stack_any, format_stacks
from ddmd.protocol.hsattach import parse_heap_info, parse_reply

GOLDEN = Path(__file__).parents[1] / "protocol" / "golden" / "hotspot17"
VM = {"id": "tcp:8000", "name": "Quiet", "pid": 42}


def jvm_heap(name: str) -> dict:
    text = parse_reply((GOLDEN / name).read_bytes()).text
    return {"source": "GC.heap_info", **parse_heap_info(text).to_json()}


def test_a_generational_heap_in_words() -> None:
    body = {"vm": VM, "heaps": [], "images": [], "jvm_heap": jvm_heap("heap-info-Parallel.txt")}
    assert format_heap_any(body).splitlines() == [
        "heap of VM Quiet (tcp:8000, pid 42), from GC.heap_info (Parallel collector):",
        "Java heap: 5.1 MiB used of 245.5 MiB committed, at most 256.0 MiB",
        "  PSYoungGen: 5.1 MiB used of 74.5 MiB committed, at most 85.0 MiB",
        "  ParOldGen: 0 B used of 171.0 MiB committed, at most 171.0 MiB",
        "Metaspace: 196.0 KiB used of 384.0 KiB committed, 1.1 GiB reserved",
        "    class space: 7.0 KiB used of 128.0 KiB committed, 1.0 GiB reserved",
    ]


def test_a_gc_with_the_heap_after_it() -> None:
    body = {
        "vm": VM,
        "gc": "done",
        "confirmed": True,
        "confirmed_by": "GC.run",
        "heaps": [],
        "jvm_heap": jvm_heap("heap-info-after-gc-G1.txt"),
    }
    assert format_gc_any(body) == (
        "GC done on Quiet (tcp:8000, pid 42) (GC.run): "
        "Java heap: 1.1 MiB used of 10.0 MiB committed, at most 256.0 MiB"
    )


def test_heap_info_ddmd_cannot_read_is_shown_as_the_jvm_said_it() -> None:
    body = {"vm": VM, "jvm_heap": {"spaces": [], "used": None, "text": " Odd Heap 12K\n"}}
    assert format_heap_any(body).splitlines()[1:] == [" Odd Heap 12K"]


def test_every_stack_of_a_ddm_vm_one_block_per_thread() -> None:
    frame = {"class_name": "a.B", "method_name": "run", "file_name": "B.java", "line": 7}
    body = {
        "vm": VM,
        "source": "STKL",
        "text": None,
        "threads": [
            {"id": 1, "name": "main", "tid": 42, "state": "wait", "daemon": False,
             "frames": [frame]},
            {"id": 9, "name": "Binder:1", "tid": None, "state": "native", "daemon": True,
             "frames": [], "error": "the thread is gone"},
        ],
    }  # fmt: skip
    assert format_stacks(body).splitlines() == [
        "threads of VM Quiet (tcp:8000, pid 42):",
        "",
        '"main" #1 tid=42 wait',
        "  at a.B.run(B.java:7)",
        "",
        '"Binder:1" #9 daemon native',
        "  (no stack: the thread is gone)",
    ]


def test_one_thread_of_a_plain_jvm_is_its_block_of_the_dump() -> None:
    text = '"VM Thread" os_prio=0 cpu=0.7ms elapsed=5.8s tid=0x7f nid=0xb0e runnable  '
    body = {"vm": VM, "thread_id": None, "thread_name": "VM Thread", "text": text, "frames": []}
    assert format_stack_any(body).splitlines() == [
        "thread 'VM Thread' of VM Quiet (tcp:8000, pid 42):",
        text.rstrip(),
    ]
