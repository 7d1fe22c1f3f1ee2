"""localproc.peer_owner and listening_owners: who owns a connection's far end, and a port's
listener, read from fake and real socket tables.

The fake lines are those of test_localproc (copied from a real x86 /proc/net/tcp and tcp6),
plus rows this file needs: FIN_WAIT2 ends (one still owned, one whose process closed it: the
kernel prints uid 0 and inode 0 there), and an IPv6 connection between two ::1 sockets.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from ddmd.host.localproc import (
    PeerOwner,
    listening_owners,
    peer_owner,
    socket_tables_readable,
)
from tests.actors.needs import skip_or_fail
from tests.host.test_localproc import (
    ANY4_LISTEN,
    ANY6_LISTEN,
    JVM_ACCEPTED,
    JVM_LISTEN,
    LOOP6_LISTEN,
    MAPPED_ACCEPTED,
    MAPPED_CLIENT,
    PROBE_END,
    TIME_WAIT,
    make_proc,
)

LITTLE = "little"  # the fake lines come from an x86 machine

# A debugger on 127.0.0.1:44736 (0xAEC0) that sent its bytes and half-closed: FIN_WAIT2, owned
# by uid 65534. And one on 44738 (0xAEC2) whose process has closed it: no owner (uid 0, inode 0).
FIN_WAIT_OWNED = (
    "  40: 0100007F:AEC0 0100007F:46CB 05 00000000:00000000 00:00000000 00000000 65534        0"
    " 52277 1 0000000000000000 20 4 30 10 -1"
)
FIN_WAIT_ORPHAN = (
    "  41: 0100007F:AEC2 0100007F:46CB 05 00000000:00000000 00:00000000 00000000     0        0"
    " 0 1 0000000000000000 20 4 30 10 -1"
)
# The IPv4 client of the "::" listener (MAPPED_CLIENT) owned by uid 1234 instead of root.
MAPPED_CLIENT_1234 = MAPPED_CLIENT.replace(
    "00000000     0        0 18243", "00000000  1234        0 18243"
)
# ::1 port 45056 (0xB000) connected to [::1]:18124 (0x46CC), owned by uid 1001.
LOOP6_CLIENT = (
    "   3: 00000000000000000000000001000000:B000 00000000000000000000000001000000:46CC 01"
    " 00000000:00000000 00:00000000 00000000  1001        0 19000 1 0000000000000000 20 0 0 10 -1"
)


def tables(tmp_path: Path) -> str:
    return make_proc(
        tmp_path / "proc",
        tcp=[
            JVM_LISTEN,
            JVM_ACCEPTED,
            PROBE_END,
            TIME_WAIT,
            ANY4_LISTEN,
            FIN_WAIT_OWNED,
            FIN_WAIT_ORPHAN,
            MAPPED_CLIENT_1234,
        ],
        tcp6=[LOOP6_LISTEN, ANY6_LISTEN, MAPPED_ACCEPTED, LOOP6_CLIENT],
    )


@pytest.mark.parametrize(
    ("ours", "peer", "expected"),
    [
        # ddmd's probe end looking at the JVM's accepted end (uid 1000), and the reverse.
        (("127.0.0.1", 44734), ("127.0.0.1", 18123), PeerOwner(1000, "found")),
        (("127.0.0.1", 18123), ("127.0.0.1", 44734), PeerOwner(0, "found")),
        # Half-closed but still owned: the owner counts.
        (("127.0.0.1", 18123), ("127.0.0.1", 44736), PeerOwner(65534, "found")),
        # Closed by its process, or TIME_WAIT: uid 0 in the table, but no owner (never root).
        (("127.0.0.1", 18123), ("127.0.0.1", 44738), PeerOwner(None, "closed")),
        (("127.0.0.1", 18123), ("127.0.0.1", 44726), PeerOwner(None, "closed")),
        # An IPv4 client of a dual-stack listener: our end reads v4-mapped addresses.
        (
            ("::ffff:127.0.0.1", 18125),
            ("::ffff:127.0.0.1", 44888),
            PeerOwner(1234, "found"),
        ),
        # IPv6 proper.
        (("::1", 18124), ("::1", 45056), PeerOwner(1001, "found")),
        # Nothing for this pair; a LISTEN row never counts as a peer.
        (("127.0.0.1", 18123), ("127.0.0.1", 40000), PeerOwner(None, "absent")),
        (("0.0.0.0", 0), ("127.0.0.1", 18123), PeerOwner(None, "absent")),
        # Right ports, wrong addresses.
        (("127.0.0.2", 44734), ("127.0.0.1", 18123), PeerOwner(None, "absent")),
        # Not an address at all.
        (("localhost", 44734), ("127.0.0.1", 18123), PeerOwner(None, "absent")),
    ],
)
def test_peer_owner(tmp_path, ours, peer, expected) -> None:
    assert peer_owner(ours, peer, proc_root=tables(tmp_path), byteorder=LITTLE) == expected


def test_peer_owner_without_tables_is_unreadable(tmp_path) -> None:
    root = tmp_path / "empty"
    root.mkdir()
    assert peer_owner(("127.0.0.1", 1), ("127.0.0.1", 2), proc_root=str(root)) == PeerOwner(
        None, "unreadable"
    )
    assert not socket_tables_readable(str(root))
    assert socket_tables_readable(tables(tmp_path))


def test_one_table_is_enough(tmp_path) -> None:
    root = make_proc(tmp_path / "p", tcp6=[LOOP6_CLIENT])  # no net/tcp (IPv4 hidden)
    assert peer_owner(("::1", 18124), ("::1", 45056), proc_root=root, byteorder=LITTLE) == (
        PeerOwner(1001, "found")
    )


def test_malformed_lines_are_skipped(tmp_path) -> None:
    bad = JVM_ACCEPTED.replace(" 1000 ", " x100 ")
    root = make_proc(tmp_path / "p", tcp=["garbage", "", bad, PROBE_END])
    assert peer_owner(
        ("127.0.0.1", 44734), ("127.0.0.1", 18123), proc_root=root, byteorder=LITTLE
    ) == PeerOwner(None, "absent")
    assert peer_owner(
        ("127.0.0.1", 18123), ("127.0.0.1", 44734), proc_root=root, byteorder=LITTLE
    ) == PeerOwner(0, "found")


def test_listening_owners(tmp_path) -> None:
    exact_beats_wildcard = ANY4_LISTEN.replace(":46CE", ":46CB").replace(
        "     0        0 18245", "     5        0 18299"
    )
    root = make_proc(
        tmp_path / "p",
        tcp=[exact_beats_wildcard, JVM_LISTEN, JVM_ACCEPTED, ANY4_LISTEN],
        tcp6=[LOOP6_LISTEN, ANY6_LISTEN],
    )
    ports = [18123, 18124, 18125, 18126, 18127]
    # 18123: the 127.0.0.1 listener (uid 1000) wins over 0.0.0.0 (uid 5); 18124 listens on
    # ::1 only; 18125 on "::" (dual-stack); 18126 on 0.0.0.0; 18127 not at all.
    assert listening_owners("127.0.0.1", ports, proc_root=root, byteorder=LITTLE) == {
        18123: 1000,
        18125: 0,
        18126: 0,
    }
    assert listening_owners("::1", ports, proc_root=root, byteorder=LITTLE) == {
        18124: 0,
        18125: 0,
    }
    assert listening_owners("localhost", ports, proc_root=root) is None
    empty = tmp_path / "none"
    empty.mkdir()
    assert listening_owners("127.0.0.1", ports, proc_root=str(empty)) is None


def test_listening_owners_listeners_first(tmp_path) -> None:
    # The order Linux prints: listeners, then connections. A listener printed after a
    # connection (not what Linux does) is read only by the full read.
    root = make_proc(
        tmp_path / "p",
        tcp=[JVM_LISTEN, JVM_ACCEPTED, PROBE_END, ANY4_LISTEN],
        tcp6=[ANY6_LISTEN, MAPPED_ACCEPTED],
    )
    ports = [18123, 18125, 18126]
    full = listening_owners("127.0.0.1", ports, proc_root=root, byteorder=LITTLE)
    assert full == {18123: 1000, 18125: 0, 18126: 0}
    fast = listening_owners(
        "127.0.0.1", ports, proc_root=root, byteorder=LITTLE, listeners_first=True
    )
    # Each table is left at its first connection: tcp6's listener still counts.
    assert fast == {18123: 1000, 18125: 0}


# --------------------------------------------------------------------------------------------
# The real /proc


def _real_tables() -> None:
    if not socket_tables_readable():
        skip_or_fail("/proc/net/tcp cannot be read here (not Linux)")


def test_real_connection_owner_is_this_user() -> None:
    _real_tables()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    try:
        owner = peer_owner(accepted.getsockname()[:2], accepted.getpeername()[:2])
        assert owner == PeerOwner(os.geteuid(), "found")
        # Its own end seen from the client: the accepted socket, ours too.
        assert peer_owner(client.getsockname()[:2], client.getpeername()[:2]).uid == os.geteuid()
        assert listening_owners("127.0.0.1", [server.getsockname()[1]]) == {
            server.getsockname()[1]: os.geteuid()
        }
    finally:
        for s in (client, accepted, server):
            s.close()


def test_real_closed_peer_is_never_root() -> None:
    _real_tables()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    ours, peer = accepted.getsockname()[:2], accepted.getpeername()[:2]
    try:
        client.sendall(b"JDWP-Handshake")
        client.close()  # an orphan in FIN_WAIT2 now: the kernel prints uid 0 for it
        deadline = time.monotonic() + 10
        owner = peer_owner(ours, peer)
        while owner.status == "found" and time.monotonic() < deadline:
            time.sleep(0.01)  # the kernel turns the closed socket into an ownerless row
            owner = peer_owner(ours, peer)
        assert owner.uid is None
        assert owner.status in ("closed", "absent")
    finally:
        accepted.close()
        server.close()
