"""localproc: socket tables, fd links and command lines read from a fake /proc tree.

The table lines are copied from a real Linux /proc/net/tcp and tcp6 (x86, so each 32-bit word of
an address reads little-endian): the loopback listener and both ends of a connection, a
``0.0.0.0`` and a ``::`` listener, a ``::1`` listener, an IPv4 client of the ``::`` listener
(v4-mapped), and a TIME_WAIT row (inode 0). The last tests read the real /proc.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddmd.host import localproc
from ddmd.host.localproc import (
    LocalProcess,
    SocketOwner,
    connected_socket,
    find_listener,
    java_name,
    listening_socket,
    parse_address,
    process_of_inode,
    read_cmdline,
)
from tests.actors.needs import IN_CI

HEADER = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout"
    " inode                                                     "
)
HEADER6 = (
    "  sl  local_address                         remote_address                        st"
    " tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode"
)
# A JVM listening on 127.0.0.1:18123 (0x46CB); uid 1000.
JVM_LISTEN = (
    "   0: 0100007F:46CB 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0"
    " 14910 1 000000009c7e84ba 100 0 0 10 0                     "
)
# The same JVM after accepting ddmd's probe from 127.0.0.1:44734 (0xAEBE): its end, and ddmd's.
JVM_ACCEPTED = (
    "  32: 0100007F:46CB 0100007F:AEBE 01 00000000:00000000 00:00000000 00000000  1000        0"
    " 14295 1 0000000066e75206 20 4 31 11 -1                    "
)
PROBE_END = (
    "  34: 0100007F:AEBE 0100007F:46CB 01 00000000:00000000 00:00000000 00000000     0        0"
    " 14933 1 00000000971fa28f 20 4 30 11 -1                    "
)
TIME_WAIT = (
    "  33: 0100007F:AEB6 0100007F:46CB 06 00000000:00000000 03:0000156D 00000000     0        0"
    " 0 3 000000005fd7c462                                      "
)
# 0.0.0.0:18126 (0x46CE)
ANY4_LISTEN = (
    "   0: 00000000:46CE 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0"
    " 18245 1 000000009b72b5fb 100 0 0 10 0                     "
)
# [::1]:18124 (0x46CC), [::]:18125 (0x46CD), and the v4-mapped accepted end of a connection
# from 127.0.0.1:44888 (0xAF58) to the "::" listener.
LOOP6_LISTEN = (
    "   0: 00000000000000000000000001000000:46CC 00000000000000000000000000000000:0000 0A"
    " 00000000:00000000 00:00000000 00000000     0        0 18241 1 00000000f093972f 100 0 0 10 0"
)
ANY6_LISTEN = (
    "   1: 00000000000000000000000000000000:46CD 00000000000000000000000000000000:0000 0A"
    " 00000000:00000000 00:00000000 00000000     0        0 18242 1 00000000f55fd824 100 0 0 10 0"
)
MAPPED_ACCEPTED = (
    "   2: 0000000000000000FFFF00000100007F:46CD 0000000000000000FFFF00000100007F:AF58 01"
    " 00000000:00000000 00:00000000 00000000     0        0 18246 1 00000000dd6f21f0 20 0 0 10 -1"
)
MAPPED_CLIENT = (
    "   2: 0100007F:AF58 0100007F:46CD 01 00000000:00000000 00:00000000 00000000     0        0"
    " 18243 2 00000000d56a3b6b 20 0 0 10 -1                     "
)


def with_port(line: str, port: int, *, inode: int, local: str | None = None) -> str:
    """A LISTEN row like JVM_LISTEN for another port (and local address), inode."""
    fields = line.split()
    address = local or fields[1].split(":")[0]
    fields[1] = f"{address}:{port:04X}"
    fields[9] = str(inode)
    return "   " + " ".join(fields)


@dataclass
class FakeProc:
    fds: dict[str, str] = field(default_factory=dict)  # fd name -> link text
    cmdline: bytes | None = None
    exe: str | None = None
    has_fd_dir: bool = True


def make_proc(
    root: Path,
    tcp: list[str] | None = None,
    tcp6: list[str] | None = None,
    procs: dict[int, FakeProc] | None = None,
) -> str:
    (root / "net").mkdir(parents=True)
    if tcp is not None:
        (root / "net" / "tcp").write_text("\n".join([HEADER, *tcp]) + "\n")
    if tcp6 is not None:
        (root / "net" / "tcp6").write_text("\n".join([HEADER6, *tcp6]) + "\n")
    (root / "self").mkdir()  # non-numeric entries of /proc are not processes
    (root / "sys").mkdir()
    for pid, proc in (procs or {}).items():
        pdir = root / str(pid)
        pdir.mkdir()
        if proc.has_fd_dir:
            (pdir / "fd").mkdir()
            for fd, target in proc.fds.items():
                (pdir / "fd" / fd).symlink_to(target)
        if proc.cmdline is not None:
            (pdir / "cmdline").write_bytes(proc.cmdline)
        if proc.exe is not None:
            (pdir / "exe").symlink_to(proc.exe)
    return str(root)


def argv(*words: str) -> bytes:
    return b"".join(w.encode() + b"\0" for w in words)


JAVA_ARGV = argv(
    "java",
    "-agentlib:jdwp=transport=dt_socket,server=y,suspend=n,address=127.0.0.1:18123",
    "-cp",
    "classes",
    "com.example.Counter",
)

# --------------------------------------------------------------------------------------------
# Addresses


@pytest.mark.parametrize(
    ("text", "byteorder", "expected"),
    [
        ("0100007F:46CB", "little", ("127.0.0.1", 18123)),
        ("7F000001:1F40", "big", ("127.0.0.1", 8000)),
        ("00000000:0000", "little", ("0.0.0.0", 0)),
        ("00000000000000000000000001000000:46CC", "little", ("::1", 18124)),
        ("00000000000000000000000000000001:46CC", "big", ("::1", 18124)),
        ("0000000000000000FFFF00000100007F:46CD", "little", ("127.0.0.1", 18125)),  # v4-mapped
        ("B80D0120000000000000000001000000:0050", "little", ("2001:db8::1", 80)),
    ],
)
def test_parse_address(text, byteorder, expected) -> None:
    parsed = parse_address(text, byteorder)
    assert parsed is not None
    host, port = parsed
    assert (str(host), port) == expected
    assert host == ipaddress.ip_address(expected[0])


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0100007F",
        "0100007F:",
        "0100007F:46C",
        "0100007F:46CB0",
        "0100007:46CB",
        "0100007F0:46CB",
        "G100007F:46CB",
        "+100007F:46CB",
        "0100007F:+6CB",
        "0100007F:-6CB",
        " 100007F:46CB",
        "0100_07F:46CB",
        "000000000000000000000000010000:46CC",  # 30 hex digits
        "0100007F:46CB:00",
        "\uff10100007F:46CB",  # a full-width digit
    ],
)
def test_malformed_address_is_none(text) -> None:
    assert parse_address(text, "little") is None


# --------------------------------------------------------------------------------------------
# Socket tables


def test_listener_by_exact_address(tmp_path) -> None:
    root = make_proc(tmp_path, tcp=[JVM_LISTEN, TIME_WAIT, ANY4_LISTEN], tcp6=[LOOP6_LISTEN])
    found = listening_socket("127.0.0.1", 18123, proc_root=root, byteorder="little")
    assert found == SocketOwner(inode=14910, uid=1000)
    assert listening_socket("127.0.0.1", 18199, proc_root=root, byteorder="little") is None


def test_established_rows_are_not_listeners(tmp_path) -> None:
    # After the JDWP agent accepted a connection it closes its listener: only the connection.
    root = make_proc(tmp_path, tcp=[JVM_ACCEPTED, TIME_WAIT, PROBE_END], tcp6=[])
    assert listening_socket("127.0.0.1", 18123, proc_root=root, byteorder="little") is None


def test_connected_socket_by_four_tuple(tmp_path) -> None:
    root = make_proc(tmp_path, tcp=[JVM_LISTEN, JVM_ACCEPTED, TIME_WAIT, PROBE_END], tcp6=[])
    jvm_end = connected_socket(
        ("127.0.0.1", 18123), ("127.0.0.1", 44734), proc_root=root, byteorder="little"
    )
    assert jvm_end == SocketOwner(inode=14295, uid=1000)
    probe_end = connected_socket(
        ("127.0.0.1", 44734), ("127.0.0.1", 18123), proc_root=root, byteorder="little"
    )
    assert probe_end == SocketOwner(inode=14933, uid=0)
    # Another client port, or the TIME_WAIT row's (0xAEB6 = 44726, inode 0): nothing.
    for client_port in (44735, 44726):
        assert (
            connected_socket(
                ("127.0.0.1", 18123),
                ("127.0.0.1", client_port),
                proc_root=root,
                byteorder="little",
            )
            is None
        )
    # The listener is not a connection.
    assert (
        connected_socket(("127.0.0.1", 18123), ("0.0.0.0", 0), proc_root=root, byteorder="little")
        is None
    )


def test_v4_mapped_connection_in_tcp6(tmp_path) -> None:
    root = make_proc(tmp_path, tcp=[MAPPED_CLIENT], tcp6=[ANY6_LISTEN, MAPPED_ACCEPTED])
    accepted = connected_socket(
        ("127.0.0.1", 18125), ("127.0.0.1", 44888), proc_root=root, byteorder="little"
    )
    assert accepted == SocketOwner(inode=18246, uid=0)
    # Asked for in its IPv6 spelling, the same socket.
    assert (
        connected_socket(
            ("::ffff:127.0.0.1", 18125), ("127.0.0.1", 44888), proc_root=root, byteorder="little"
        )
        == accepted
    )
    client = connected_socket(
        ("127.0.0.1", 44888), ("127.0.0.1", 18125), proc_root=root, byteorder="little"
    )
    assert client == SocketOwner(inode=18243, uid=0)


def test_v4_mapped_listener_serves_ipv4(tmp_path) -> None:
    mapped = with_port(JVM_LISTEN, 8000, inode=555, local="0000000000000000FFFF00000100007F")
    root = make_proc(tmp_path, tcp=[], tcp6=[mapped])
    assert listening_socket("127.0.0.1", 8000, proc_root=root, byteorder="little") == SocketOwner(
        555, 1000
    )


def test_wildcard_listeners(tmp_path) -> None:
    root = make_proc(tmp_path, tcp=[ANY4_LISTEN], tcp6=[LOOP6_LISTEN, ANY6_LISTEN])

    def owner(host: str, port: int) -> SocketOwner | None:
        return listening_socket(host, port, proc_root=root, byteorder="little")

    assert owner("127.0.0.1", 18126) == SocketOwner(18245, 0)  # 0.0.0.0 serves IPv4
    assert owner("::1", 18126) is None  # ... not IPv6
    assert owner("127.0.0.1", 18125) == SocketOwner(18242, 0)  # :: serves both
    assert owner("::1", 18125) == SocketOwner(18242, 0)
    assert owner("[::1]", 18124) == SocketOwner(18241, 0)  # brackets allowed
    assert owner("127.0.0.1", 18124) is None  # ::1 serves only itself


def test_exact_listener_wins_over_wildcard(tmp_path) -> None:
    wildcard = with_port(ANY4_LISTEN, 8000, inode=1)
    exact = with_port(JVM_LISTEN, 8000, inode=2)
    root = make_proc(tmp_path, tcp=[wildcard, exact], tcp6=[])
    assert listening_socket("127.0.0.1", 8000, proc_root=root, byteorder="little") == SocketOwner(
        2, 1000
    )


def test_host_names_and_missing_tables_answer_none(tmp_path) -> None:
    root = make_proc(tmp_path, tcp=[JVM_LISTEN])  # no tcp6 file (IPv6 disabled)
    assert listening_socket("127.0.0.1", 18123, proc_root=root, byteorder="little") is not None
    assert listening_socket("localhost", 18123, proc_root=root) is None
    assert listening_socket("127.0.0.1", 18123, proc_root=str(tmp_path / "nowhere")) is None
    assert connected_socket(("nohost", 1), ("127.0.0.1", 2), proc_root=root) is None


def test_garbage_lines_are_skipped(tmp_path) -> None:
    garbage = [
        "",
        "   ",
        "garbage",
        "   0: 0100007F:46CB",  # truncated
        "   1: 0100007F:46CB 00000000:0000 0A 00000000:00000000 00:00000000 00000000",
        "   2: 0100007F:46CB 00000000:0000 0A 0:0 0:0 0 -1000 0 777 1",  # negative uid
        "   3: 0100007F:46CB 00000000:0000 0A 0:0 0:0 0 1000 0 \uff17\uff17\uff17 1",  # full-width
        "   4: 0100007F:46CB 00000000:0000 ZZ 0:0 0:0 0 1000 0 778 1",  # state not hex
        "   5: 0100007F:46CB 00000000:0000 0A0 0:0 0:0 0 1000 0 779 1",  # state too long
        "   6: 0100007X:46CB 00000000:0000 0A 0:0 0:0 0 1000 0 780 1",
        "\x00\xff\x7f binary",
        JVM_LISTEN,
    ]
    root = make_proc(tmp_path, tcp=garbage, tcp6=["nonsense " * 20])
    assert listening_socket("127.0.0.1", 18123, proc_root=root, byteorder="little") == SocketOwner(
        14910, 1000
    )
    (tmp_path / "net" / "tcp").write_bytes(b"\xff\xfe\x00garbage\n" * 50)
    assert listening_socket("127.0.0.1", 18123, proc_root=root, byteorder="little") is None


@settings(max_examples=300)
@given(st.lists(st.text(max_size=200), max_size=8), st.integers(0, 65535))
def test_any_table_content_never_raises(lines, port) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = make_proc(Path(tmp), tcp=lines, tcp6=lines[::-1])
        listening_socket("127.0.0.1", port, proc_root=root)
        connected_socket(("127.0.0.1", port), ("127.0.0.1", 1), proc_root=root)
        assert find_listener("127.0.0.1", port, client=("127.0.0.1", 1), proc_root=root) is None


# --------------------------------------------------------------------------------------------
# Processes


def test_process_of_inode(tmp_path) -> None:
    root = make_proc(
        tmp_path,
        procs={
            1: FakeProc(fds={"0": "/dev/null", "3": "socket:[777]"}),
            42: FakeProc(fds={"0": "/dev/null", "1": "pipe:[14295]", "7": "socket:[14295]"}),
            43: FakeProc(fds={"5": "socket:[142950]"}),
        },
    )
    assert process_of_inode(14295, proc_root=root) == 42
    assert process_of_inode(14295, uid=os.getuid(), proc_root=root) == 42
    assert process_of_inode(14295, uid=12345, proc_root=root) == 42  # any owner, just later
    assert process_of_inode(777, proc_root=root) == 1
    assert process_of_inode(1429, proc_root=root) is None
    assert process_of_inode(0, proc_root=root) is None
    assert process_of_inode(14295, proc_root=str(tmp_path / "nowhere")) is None


def test_unreadable_and_vanished_processes_are_skipped(tmp_path, monkeypatch) -> None:
    root = make_proc(
        tmp_path,
        procs={
            10: FakeProc(fds={"3": "socket:[14295]"}),  # another user's: fd/ unreadable
            11: FakeProc(has_fd_dir=False),  # exited while we scanned
            12: FakeProc(fds={"3": "socket:[14295]"}),
        },
    )
    (tmp_path / "11" / "fd").write_text("not a directory")  # and an fd "dir" that is a file
    (tmp_path / "12" / "fd" / "9").write_text("a plain file, not a link")
    denied = str(tmp_path / "10" / "fd")
    real_scandir = os.scandir
    calls: list[str] = []

    def scandir(path):  # root can read every fd/ directory: refuse like the kernel does
        calls.append(str(path))
        if str(path) == denied:
            raise PermissionError(13, "Permission denied", path)
        return real_scandir(path)

    monkeypatch.setattr(localproc.os, "scandir", scandir)
    assert process_of_inode(14295, proc_root=root) == 12
    assert denied in calls  # the unreadable one was really tried, and skipped


def test_give_up_at_stops_the_scan(tmp_path) -> None:
    root = make_proc(tmp_path, procs={5: FakeProc(fds={"3": "socket:[14295]"})})
    assert process_of_inode(14295, proc_root=root, give_up_at=time.monotonic() + 60) == 5
    assert process_of_inode(14295, proc_root=root, give_up_at=time.monotonic() - 1) is None


def test_read_cmdline(tmp_path) -> None:
    root = make_proc(
        tmp_path,
        procs={
            1: FakeProc(cmdline=argv("java", "-cp", "a b", "Main")),
            2: FakeProc(cmdline=b"java\0bad\xff\0"),
            3: FakeProc(cmdline=b""),  # a kernel thread
            4: FakeProc(cmdline=b"no-final-nul"),
        },
    )
    assert read_cmdline(1, proc_root=root) == ("java", "-cp", "a b", "Main")
    assert read_cmdline(2, proc_root=root) == ("java", "bad\ufffd")
    assert read_cmdline(3, proc_root=root) == ()
    assert read_cmdline(4, proc_root=root) == ("no-final-nul",)
    assert read_cmdline(5, proc_root=root) is None


# --------------------------------------------------------------------------------------------
# Names


@pytest.mark.parametrize(
    ("cmdline", "expected"),
    [
        (["java", "Counter"], "Counter"),
        (["/usr/lib/jvm/java-17-openjdk-amd64/bin/java", "-cp", "x", "a.b.Main", "arg"], "Main"),
        (["java", "-Xmx1g", "-Dk=v", "-agentlib:jdwp=server=y", "-ea", "a.b.Main"], "Main"),
        (["java", "-classpath", "lib/*", "--class-path", "c", "Tool", "-cp", "ignored"], "Tool"),
        (["java", "--class-path=c", "Tool"], "Tool"),
        (["java", "-jar", "/opt/app/build/app.jar", "-cp", "x"], "app.jar"),
        (["java", "-Xss1m", "-jar", "app.jar"], "app.jar"),
        (["java", "-jar"], None),
        (["java", "-p", "mods", "-m", "m1/a.b.Main", "x"], "Main"),
        (["java", "--module-path", "mods", "--module", "m1/a.b.Main"], "Main"),
        (["java", "--module=m1/a.b.Main"], "Main"),
        (["java", "-m", "m1"], "m1"),
        (["java", "-m"], None),
        (["java", "--add-opens", "java.base/java.lang=ALL-UNNAMED", "Main"], "Main"),
        (
            [
                "java",
                "--add-modules",
                "ALL-SYSTEM",
                "--add-exports",
                "a/b=c",
                "--add-reads",
                "a=b",
                "--patch-module",
                "a=p.jar",
                "--limit-modules",
                "java.base",
                "--upgrade-module-path",
                "up",
                "--enable-native-access",
                "ALL-UNNAMED",
                "x.Y",
            ],
            "Y",
        ),
        (["java", "Tool.java", "arg"], "Tool.java"),  # source-file mode: the file's name
        (["java", "/home/me/src/Tool.java"], "Tool.java"),
        (["java", "--source", "17", "/usr/local/bin/script", "a"], "script"),
        (["java", "--source=17", "script"], "script"),
        (["java", "@options.txt", "Main"], None),  # an argument file: give up, do not guess
        (["java", "-cp", "x", "@more"], None),
        (["java", "Main", "@not-an-argfile"], "Main"),  # after the main class: its arguments
        (["java", "-cp"], None),
        (["java", "-version"], None),
        (["java"], None),
        ([], None),
        (["javaw", "Main"], "Main"),
        (["/work/.venv/bin/python", "-m", "ddmd.sim", "--port", "8000"], None),
        (["socat", "TCP-LISTEN:8000", "TCP:host:8000"], None),
        (["java-wrapper", "Main"], None),
    ],
)
def test_java_name(cmdline, expected) -> None:
    assert java_name(cmdline) == expected


def test_java_name_by_exe_link() -> None:
    # A launcher started under another argv[0]: the executable says it is java.
    renamed = ["my-service", "-Xmx64m", "com.example.Service"]
    assert java_name(renamed) is None
    assert java_name(renamed, exe="/usr/lib/jvm/java-17-openjdk-amd64/bin/java") == "Service"
    assert java_name(renamed, exe="/usr/bin/python3.11") is None


# --------------------------------------------------------------------------------------------
# Together


def jvm_proc(tmp_path: Path, *, tcp: list[str], pid: int = 4242) -> str:
    return make_proc(
        tmp_path,
        tcp=tcp,
        tcp6=[],
        procs={
            1: FakeProc(fds={"0": "/dev/null"}, cmdline=argv("/sbin/init")),
            pid: FakeProc(
                fds={"0": "/dev/null", "4": "socket:[14910]", "5": "socket:[14295]"},
                cmdline=JAVA_ARGV,
                exe="/usr/lib/jvm/java-17-openjdk-amd64/bin/java",
            ),
            4343: FakeProc(fds={"3": "socket:[14933]"}, cmdline=argv("ddmd", "run")),
        },
    )


needs_little_endian = pytest.mark.skipif(
    sys.byteorder != "little", reason="the golden tables are from a little-endian machine"
)


@needs_little_endian
def test_find_listener_before_and_after_the_probe(tmp_path) -> None:
    # Before the probe, the LISTEN socket; after it (the agent closed its listener), the
    # accepted end of the probe's connection. Both lead to the JVM.
    before = jvm_proc(tmp_path / "before", tcp=[JVM_LISTEN])
    expected = LocalProcess(
        pid=4242, uid=1000, name="Counter", cmdline=tuple(JAVA_ARGV.decode().split("\0")[:-1])
    )
    assert find_listener("127.0.0.1", 18123, proc_root=before) == expected
    after = jvm_proc(tmp_path / "after", tcp=[JVM_ACCEPTED, TIME_WAIT, PROBE_END])
    assert find_listener("127.0.0.1", 18123, proc_root=after) is None  # no listener any more
    found = find_listener("127.0.0.1", 18123, client=("127.0.0.1", 44734), proc_root=after)
    assert found == expected
    # Another client's connection is not this one (and there is no listener to fall back on).
    assert find_listener("127.0.0.1", 18123, client=("127.0.0.1", 44735), proc_root=after) is None


@needs_little_endian
def test_find_listener_without_name_or_process(tmp_path) -> None:
    # A python program (a simulated VM) holds the socket: pid, no name.
    root = make_proc(
        tmp_path / "sim",
        tcp=[JVM_LISTEN],
        procs={7: FakeProc(fds={"3": "socket:[14910]"}, cmdline=argv("python3", "-m", "ddmd"))},
    )
    found = find_listener("127.0.0.1", 18123, proc_root=root)
    assert found is not None
    assert (found.pid, found.name) == (7, None)
    # The socket exists, but no readable process holds it (another user's): None.
    root = make_proc(tmp_path / "other", tcp=[JVM_LISTEN], procs={8: FakeProc(fds={})})
    assert find_listener("127.0.0.1", 18123, proc_root=root) is None
    # The process vanished between fd scan and cmdline: still the pid, with no name.
    root = make_proc(
        tmp_path / "gone", tcp=[JVM_LISTEN], procs={9: FakeProc(fds={"3": "socket:[14910]"})}
    )
    assert find_listener("127.0.0.1", 18123, proc_root=root) == LocalProcess(9, 1000, None, ())


# --------------------------------------------------------------------------------------------
# The real /proc (Linux)

needs_proc = pytest.mark.skipif(
    not os.path.exists("/proc/net/tcp") and not IN_CI, reason="needs Linux /proc/net/tcp"
)


@needs_proc
def test_real_listener_and_accepted_connection() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        found = find_listener("127.0.0.1", port)
        assert found is not None
        assert found.pid == os.getpid()
        assert found.uid == os.getuid()
        assert found.name is None  # pytest runs in python, not java
        assert found.cmdline == tuple(sys.orig_argv)
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = server.accept()
            with accepted:
                server.close()  # like a JDWP agent after its one connection
                assert find_listener("127.0.0.1", port) is None
                client_address = client.getsockname()[:2]
                found = find_listener("127.0.0.1", port, client=client_address)
                assert found is not None
                assert found.pid == os.getpid()
