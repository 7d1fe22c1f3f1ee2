"""The HotSpot Attach API's bytes and the readers of its answers (``protocol/hsattach.py``),
against replies captured from this machine's OpenJDK 17 (``golden/hotspot17``, see the golden
README): the request bytes as OpenJDK's client writes them, the status line, ``Thread.print``
thread by thread (names as jstack prints them), ``GC.heap_info`` of every collector,
``GC.heap_dump``'s two answers, and the /proc facts the handshake decides on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddmd.protocol.hsattach import (
    AttachReplyError,
    attach_disabled_by,
    encode_request,
    jcmd_request,
    parse_heap_dump,
    parse_heap_info,
    parse_proc_status,
    parse_reply,
    parse_thread_dump,
    pick_threads,
)

GOLDEN = Path(__file__).parent / "golden" / "hotspot17"
MIB = 1 << 20
KIB = 1 << 10


def golden(name: str) -> bytes:
    return (GOLDEN / name).read_bytes()


def reply_text(name: str) -> str:
    reply = parse_reply(golden(name))
    assert reply.status == 0
    return reply.text


# ------------------------------------------------------------------------------------ the wire


def test_a_request_is_version_command_and_three_arguments_each_ended_by_nul() -> None:
    assert jcmd_request("Thread.print") == b"1\0jcmd\0Thread.print\0\0\0"
    assert encode_request("threaddump") == b"1\0threaddump\0\0\0\0"
    assert encode_request("load", "instrument", "false", "a=b") == (
        b"1\0load\0instrument\0false\0a=b\0"
    )
    assert jcmd_request("GC.heap_dump /tmp/é.hprof") == (
        b"1\0jcmd\0GC.heap_dump /tmp/\xc3\xa9.hprof\0\0\0"
    )


@pytest.mark.parametrize(
    ("command", "args"), [("jcmd", ("a", "b", "c", "d")), ("jcmd", ("a\0b",)), ("", ())]
)
def test_a_request_the_protocol_cannot_carry_is_refused(command, args) -> None:
    with pytest.raises(ValueError, match="attach request"):
        encode_request(command, *args)


def test_the_reply_is_a_status_line_then_the_text() -> None:
    assert parse_reply(golden("gc-run.txt")).status == 0
    assert parse_reply(golden("gc-run.txt")).text == ""
    unknown = parse_reply(golden("jcmd-unknown.txt"))
    assert (unknown.status, unknown.ok) == (-1, False)
    assert unknown.text.strip() == "java.lang.IllegalArgumentException: Unknown diagnostic command"
    operation = parse_reply(golden("unknown-operation.txt"))
    assert (operation.status, operation.text) == (-1, "Operation nosuchcmd not recognized!")


@pytest.mark.parametrize("data", [b"", b"garbage\n", b"\n"])
def test_bytes_without_a_status_line_are_no_reply(data) -> None:
    with pytest.raises(AttachReplyError):
        parse_reply(data)


# ------------------------------------------------------------------------------------ Thread.print


def jstack_names() -> list[str]:
    """Thread names as jstack printed them for the same program (before its trailer)."""
    text = golden("jstack.txt").decode()
    body = text.split("\nJNI global refs")[0]
    return re.findall(r'^"(.*)" (?:#\d+ )?(?:daemon )?(?:prio=\d+ )?os_prio=', body, re.M)


def test_thread_print_gives_every_thread_jstack_lists_in_its_order() -> None:
    dump = parse_thread_dump(reply_text("thread-print.txt"))
    assert [t.name for t in dump.threads] == jstack_names()
    assert len(dump.threads) == 24
    assert dump.header.splitlines()[1].startswith("Full thread dump OpenJDK 64-Bit Server VM")
    assert dump.trailer.startswith("JNI global refs: 4, weak refs: 0")
    assert dump.deadlocked  # Golden.java's two threads


def test_a_java_thread_has_its_id_state_frames_and_locks() -> None:
    dump = parse_thread_dump(reply_text("thread-print.txt"))
    main = dump.threads[0]
    assert (main.name, main.number, main.daemon, main.priority) == ("main", 1, False, 5)
    assert main.nid == 0x10EB
    assert (main.java_state, main.state_detail, main.state) == (
        "WAITING",
        "on object monitor",
        "wait",
    )
    assert main.condition == "in Object.wait()"
    wait, wait_java, golden_main = main.frames
    assert (wait.class_name, wait.method_name, wait.file_name, wait.line) == (
        "java.lang.Object",
        "wait",
        "",
        -2,
    )
    assert wait.module == "java.base@17.0.15"
    assert wait.locks == ("waiting on <0x00000000f0015e08> (a java.lang.Class for Golden)",)
    assert (wait_java.file_name, wait_java.line, wait_java.locks) == ("Object.java", 338, ())
    assert (golden_main.class_name, golden_main.file_name, golden_main.line) == (
        "Golden",
        "Golden.java",
        14,
    )
    assert golden_main.module is None
    assert golden_main.locks == ("locked <0x00000000f0015e08> (a java.lang.Class for Golden)",)
    assert main.text.splitlines()[0].startswith('"main" #1 prio=5 os_prio=0')
    assert main.text.splitlines()[-1].endswith(
        "- locked <0x00000000f0015e08> (a java.lang.Class for Golden)"
    )


def test_states_in_ddmd_s_words() -> None:
    dump = parse_thread_dump(reply_text("thread-print.txt"))
    states = {t.name: t.state for t in dump.threads}
    assert states["worker one"] == "sleeping"  # TIMED_WAITING (sleeping)
    assert states['odd "quoted" name'] == "wait"  # WAITING (parking)
    assert states["deadlock-a"] == "monitor"  # BLOCKED
    assert states["Reference Handler"] == "native"  # RUNNABLE in a native method
    assert states["Signal Dispatcher"] == "running"
    assert states["Common-Cleaner"] == "timed-wait"
    assert states["VM Thread"] == "vm"  # the VM's own thread: no Java state


def test_a_name_with_quotes_and_the_vm_s_own_threads() -> None:
    dump = parse_thread_dump(reply_text("thread-print.txt"))
    quoted = next(t for t in dump.threads if "quoted" in t.name)
    assert quoted.name == 'odd "quoted" name'
    assert quoted.number == 13
    lambda_frame = next(t for t in dump.threads if t.name == "worker one").frames[2]
    assert lambda_frame.class_name.startswith("Golden$$Lambda$")
    assert (lambda_frame.method_name, lambda_frame.file_name, lambda_frame.line) == (
        "run",
        "",
        -1,
    )
    vm_thread = next(t for t in dump.threads if t.name == "VM Thread")
    assert (vm_thread.number, vm_thread.priority, vm_thread.frames) == (None, None, ())
    assert vm_thread.condition == "runnable"


def test_locked_ownable_synchronizers_are_not_a_frame_s_locks() -> None:
    dump = parse_thread_dump(reply_text("thread-print-locks.txt"))
    main = dump.threads[0]
    assert main.frames[-1].locks == ("locked <0x00000000f0015e18> (a java.lang.Class for Golden)",)
    assert "Locked ownable synchronizers:" in main.text
    assert [t.name for t in dump.threads] == [
        t.name for t in parse_thread_dump(reply_text("thread-print.txt")).threads
    ]


def test_the_jdk_19_header_with_the_os_thread_id_in_brackets() -> None:
    # Typed from the JDK 19+ layout (not on this machine): "#N [NID]" and a decimal nid.
    text = (
        '"main" #1 [4242] prio=5 os_prio=0 cpu=20.1ms elapsed=1.2s tid=0x00007f nid=4242 '
        "waiting on condition  [0x00007f]\n"
        "   java.lang.Thread.State: TIMED_WAITING (sleeping)\n"
        "\tat java.lang.Thread.sleep0(java.base@21/Native Method)\n"
    )
    (main,) = parse_thread_dump(text).threads
    assert (main.name, main.number, main.nid, main.state) == ("main", 1, 4242, "sleeping")


def test_threads_are_picked_by_number_exact_name_then_part() -> None:
    threads = parse_thread_dump(reply_text("thread-print.txt")).threads
    assert [t.name for t in pick_threads(threads, "12")] == ["worker one"]
    assert [t.name for t in pick_threads(threads, "main")] == ["main"]
    assert [t.name for t in pick_threads(threads, "WORKER")] == ["worker one"]
    assert [t.name for t in pick_threads(threads, "deadlock")] == ["deadlock-a", "deadlock-b"]
    assert pick_threads(threads, "nothing like it") == ()
    assert pick_threads(threads, " ") == ()


# ------------------------------------------------------------------------------------ GC.heap_info


@pytest.mark.parametrize(
    ("name", "collector", "used", "committed", "maximum"),
    [
        ("heap-info-G1.txt", "G1", 1685 * KIB, 256 * MIB, 256 * MIB),
        ("heap-info-after-gc-G1.txt", "G1", 1081 * KIB, 10 * MIB, 256 * MIB),
        ("heap-info-Parallel.txt", "Parallel", 5242 * KIB, (76288 + 175104) * KIB, 256 * MIB),
        ("heap-info-Serial.txt", "Serial", 5596 * KIB, (78656 + 174784) * KIB, 256 * MIB),
        ("heap-info-Shenandoah.txt", "Shenandoah", 1536 * KIB, 256 * MIB, 256 * MIB),
        ("heap-info-Z.txt", "Z", 4 * MIB, 256 * MIB, 256 * MIB),
    ],
)
def test_heap_info_of_every_collector(name, collector, used, committed, maximum) -> None:
    figures = parse_heap_info(reply_text(name))  # each JVM ran with -Xmx256m
    assert (figures.collector, figures.used, figures.committed, figures.max) == (
        collector,
        used,
        committed,
        maximum,
    )
    meta = [s for s in figures.spaces if s.kind == "metaspace"]
    assert [(s.name, s.part_of) for s in meta] == [
        ("Metaspace", None),
        ("class space", "Metaspace"),
    ]
    assert meta[0].max == 1114112 * KIB  # "reserved"
    assert figures.to_json()["text"] == figures.text


def test_a_generational_heap_lists_its_generations() -> None:
    figures = parse_heap_info(reply_text("heap-info-Parallel.txt"))
    heap = [(s.name, s.used, s.committed, s.max) for s in figures.spaces if s.kind == "heap"]
    assert heap == [
        ("PSYoungGen", 5242 * KIB, 76288 * KIB, 0x100000000 - 0xFAB00000),
        ("ParOldGen", 0, 175104 * KIB, 0xFAB00000 - 0xF0000000),
    ]


def test_heap_info_without_figures_keeps_its_text() -> None:
    figures = parse_heap_info(" Something new  1 2 3\n")
    assert (figures.collector, figures.spaces, figures.used, figures.max) == (None, (), None, None)


# ------------------------------------------------------------------------------------ GC.heap_dump


def test_heap_dump_written_or_why_not() -> None:
    written = parse_heap_dump(reply_text("heap-dump-ok.txt"))
    assert (written.written, written.size) == (True, 3291142)
    refused = parse_heap_dump(reply_text("heap-dump-exists.txt"))
    assert (refused.written, refused.size) == (False, None)
    assert refused.message == "Unable to create /tmp/exp/d1.hprof: File exists"
    assert parse_heap_dump("").message == "the JVM wrote no heap dump"


# ------------------------------------------------------------------------------------ /proc


STATUS = """\
Name:\tjava
Umask:\t0022
State:\tS (sleeping)
Tgid:\t4242
NSpid:\t4242\t17
Uid:\t1000\t65534\t65534\t65534
Gid:\t1000\t65533\t65533\t65533
SigBlk:\t0000000000000000
SigIgn:\t0000000000000000
SigCgt:\t2000000181005ccf
"""


def test_proc_status_gives_the_inner_pid_the_effective_ids_and_sigquit() -> None:
    status = parse_proc_status(STATUS)
    assert (status.ns_pid, status.euid, status.egid) == (17, 65534, 65533)
    assert (status.catches_sigquit, status.ignores_sigquit) == (True, False)
    rs = parse_proc_status(STATUS.replace("2000000181005ccf", "0000000181005cc8"))
    assert rs.catches_sigquit is False  # a JVM run with -Xrs leaves SIGQUIT alone
    assert parse_proc_status("Name:\tx\n").ns_pid is None


def test_disable_attach_mechanism_where_it_is_said_and_the_last_word_wins() -> None:
    java = ["/usr/bin/java", "-Xmx1g"]
    assert attach_disabled_by([*java, "Main"], {}) is None
    flag = "-XX:+DisableAttachMechanism"
    assert attach_disabled_by([*java, flag, "Main"], {}) == "its command line"
    assert attach_disabled_by([*java, "Main", flag], {}) is None  # the program's argument
    assert attach_disabled_by([*java, "-cp", flag, "Main"], {}) is None  # -cp's value
    assert attach_disabled_by([*java, "Main"], {"JAVA_TOOL_OPTIONS": f"-Xss1m {flag}"}) == (
        "JAVA_TOOL_OPTIONS"
    )
    undone = [*java, "-XX:-DisableAttachMechanism", "Main"]
    assert attach_disabled_by(undone, {"JAVA_TOOL_OPTIONS": flag}) is None
    assert attach_disabled_by(undone, {"_JAVA_OPTIONS": flag}) == "_JAVA_OPTIONS"
    assert attach_disabled_by([*java, flag, "-jar", "app.jar"], {}) == "its command line"
