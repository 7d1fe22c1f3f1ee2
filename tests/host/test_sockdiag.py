"""sockdiag: the kernel's listening sockets over netlink give the same answer as the socket
tables, and None (never an exception) where netlink cannot be used."""

from __future__ import annotations

import contextlib
import os
import socket
import struct

import pytest

from ddmd.host import sockdiag
from ddmd.host.localproc import PeerOwner, listening_owners
from tests.actors.needs import IN_CI, skip_or_fail
from tests.actors.rawpeers import free_port_range


def _netlink_works() -> bool:
    return sockdiag.listeners("127.0.0.1", [1]) is not None


needs_netlink = pytest.mark.skipif(
    not _netlink_works() and not IN_CI, reason="needs Linux netlink sock_diag"
)


def _listen(family: int, host: str, port: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind((host, port))
    sock.listen()
    return sock


@needs_netlink
def test_listeners_as_the_tables_tell() -> None:
    loop, anyv4, dual, closed = free_port_range(4)
    opened = [
        _listen(socket.AF_INET, "127.0.0.1", loop),
        _listen(socket.AF_INET, "0.0.0.0", anyv4),
    ]
    # No IPv6 in this kernel: the other two still tell.
    with contextlib.suppress(OSError):
        opened.append(_listen(socket.AF_INET6, "::", dual))
    ports = [loop, anyv4, dual, closed]
    try:
        found = sockdiag.listeners("127.0.0.1", ports)
        assert found == listening_owners("127.0.0.1", ports)
        assert found is not None
        assert found[loop] == os.geteuid()
        assert found[anyv4] == os.geteuid()  # 0.0.0.0 serves 127.0.0.1
        assert closed not in found
        # A connection is not a listener.
        with socket.create_connection(("127.0.0.1", loop)) as client:
            port = client.getsockname()[1]
            assert port not in (sockdiag.listeners("127.0.0.1", [port]) or {})
    finally:
        for sock in opened:
            sock.close()
    assert sockdiag.listeners("127.0.0.1", [loop]) == {}


def test_no_netlink_answers_none(monkeypatch) -> None:
    def refuse(*args: object, **kwargs: object) -> socket.socket:
        raise PermissionError(1, "netlink not allowed here")

    monkeypatch.setattr(sockdiag.socket, "socket", refuse)
    assert sockdiag.listeners("127.0.0.1", [8000]) is None
    assert sockdiag.listeners("localhost", [8000]) is None  # not numeric: the tables decide


def test_malformed_answers_are_none(monkeypatch) -> None:
    class Liar:
        def __init__(self, *args: object) -> None:
            pass

        def __enter__(self) -> Liar:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def settimeout(self, value: float) -> None:
            pass

        def sendall(self, data: bytes) -> None:
            pass

        def recv(self, size: int) -> bytes:
            return b"\xff\x00\x00\x00" + b"\x14\x00" + bytes(10)  # length past the data

    monkeypatch.setattr(sockdiag.socket, "socket", Liar)
    assert sockdiag.listeners("127.0.0.1", [8000]) is None


# --- one connection's owner, by its four ends


@needs_netlink
@pytest.mark.parametrize(
    ("family", "host"), [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")]
)
def test_a_connections_owner_and_inode_from_the_kernel(family: int, host: str) -> None:
    with socket.socket(family, socket.SOCK_STREAM) as server:
        server.bind((host, 0))
        server.listen()
        with socket.socket(family, socket.SOCK_STREAM) as client:
            client.connect(server.getsockname()[:2])
            accepted, _ = server.accept()
            with accepted:
                ours = accepted.getsockname()[:2]
                peer = accepted.getpeername()[:2]
                owner = sockdiag.connection_owner(peer, ours)
                assert owner is not None
                assert (owner.status, owner.uid) == ("found", os.getuid())
                assert owner.inode == os.fstat(client.fileno()).st_ino
                # our own end, asked the other way round
                mine = sockdiag.connection_owner(ours, peer)
                assert mine is not None
                assert mine.inode == os.fstat(accepted.fileno()).st_ino
            client.close()
            gone = sockdiag.connection_owner(peer, ours)
            assert gone is not None
            assert gone.status in ("closed", "absent")
            assert gone.uid is None


@needs_netlink
def test_no_such_connection_is_absent() -> None:
    (unused,) = free_port_range(1)
    owner = sockdiag.connection_owner(("127.0.0.1", unused), ("127.0.0.1", unused))
    assert owner is not None
    assert owner.status == "absent"


def test_a_host_name_is_not_looked_up() -> None:
    assert sockdiag.connection_owner(("localhost", 1), ("127.0.0.1", 2)) is None


@needs_netlink
def test_the_guards_lookup_reads_no_socket_table() -> None:
    from ddmd.peers import find_owner

    def no_tables(*_: object) -> PeerOwner:
        raise AssertionError("read /proc/net/tcp although sock_diag answers")

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname()) as client:
            accepted, _ = server.accept()
            with accepted:
                ours, peer = accepted.getsockname(), accepted.getpeername()
                owner = find_owner(ours, peer, "/proc", no_tables)
                assert (owner.status, owner.uid) == ("found", os.getuid())
                assert owner.inode == os.fstat(client.fileno()).st_ino


def test_without_netlink_the_tables_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    from ddmd.peers import find_owner

    monkeypatch.setattr(sockdiag, "connection_owner", lambda *_: None)
    read: list[tuple[str, int]] = []

    def tables(ours: tuple[str, int], peer: tuple[str, int], root: str) -> PeerOwner:
        read.append(peer)
        return PeerOwner(7, "found")

    assert find_owner(("127.0.0.1", 1), ("127.0.0.1", 2), "/proc", tables) == PeerOwner(7, "found")
    assert read == [("127.0.0.1", 2)]


@needs_netlink
def test_an_ipv4_client_of_a_dual_stack_listener_is_found() -> None:
    # A listener on "::" sees an IPv4 client as ::ffff:127.0.0.1: its socket is an IPv4 one.
    try:
        server = _listen(socket.AF_INET6, "::", 0)
    except OSError:
        skip_or_fail("no IPv6 in this kernel (a dual-stack listener cannot be opened)")
    with server, socket.create_connection(("127.0.0.1", server.getsockname()[1])) as client:
        accepted, _ = server.accept()
        with accepted:
            ours, peer = accepted.getsockname()[:2], accepted.getpeername()[:2]
            assert peer[0] == "::ffff:127.0.0.1"
            owner = sockdiag.connection_owner(peer, ours, wait=False)
            assert owner is not None
            assert (owner.status, owner.uid) == ("found", os.getuid())
            assert owner.inode == os.fstat(client.fileno()).st_ino


def test_ends_of_two_families_are_no_connection() -> None:
    owner = sockdiag.connection_owner(("127.0.0.1", 1), ("::2", 2))
    assert owner == PeerOwner(None, "absent")


# --- the same question without blocking, over a netlink socket kept open


@needs_netlink
def test_the_asker_answers_as_connection_owner_again_and_again() -> None:
    ask = sockdiag.OwnerAsker()
    try:
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen()
            clients = [socket.create_connection(server.getsockname()) for _ in range(3)]
            accepted = [server.accept()[0] for _ in clients]
            for _ in range(2):
                for client, mine in zip(clients, accepted, strict=True):
                    ours, peer = mine.getsockname(), mine.getpeername()
                    owner = ask(peer, ours)
                    assert owner == sockdiag.connection_owner(peer, ours)
                    assert owner is not None
                    assert (owner.status, owner.uid) == ("found", os.getuid())
                    assert owner.inode == os.fstat(client.fileno()).st_ino
            for sock in clients + accepted:
                sock.close()
    finally:
        ask.close()


def _answer(seq: int, uid: int, inode: int) -> bytes:
    body = bytearray(72)
    body[0], body[1] = socket.AF_INET, 1  # ESTABLISHED
    struct.pack_into("=II", body, 64, uid, inode)
    return struct.pack("=IHHII", 16 + len(body), 20, 0, seq, 0) + bytes(body)


class FakeNetlink:
    """A netlink socket whose answers are given in advance; counts how many were opened."""

    opened = 0
    answers: list[bytes | type[OSError]] = []

    def __init__(self, *args: object) -> None:
        FakeNetlink.opened += 1
        self.closed = False

    def setblocking(self, flag: bool) -> None:
        assert flag is False, "the asker must never block"

    def send(self, data: bytes) -> int:
        return len(data)

    def recv(self, size: int) -> bytes:
        answer = FakeNetlink.answers.pop(0)
        if isinstance(answer, bytes):
            return answer
        raise answer()

    def close(self) -> None:
        self.closed = True


def test_the_asker_skips_a_late_answer_and_never_waits(monkeypatch) -> None:
    monkeypatch.setattr(sockdiag.socket, "socket", FakeNetlink)
    monkeypatch.setattr(FakeNetlink, "opened", 0)
    ends = (("127.0.0.1", 40000), ("127.0.0.1", 5038))
    ask = sockdiag.OwnerAsker()
    # The first question's answer is not there at once: no answer, and the socket is dropped.
    FakeNetlink.answers = [BlockingIOError]
    assert ask(*ends) is None
    # The second question finds the first one's answer, come late, before its own.
    FakeNetlink.answers = [_answer(1, 4242, 7), _answer(2, 1000, 8)]
    assert ask(*ends) == PeerOwner(1000, "found", 8)
    assert FakeNetlink.opened == 2  # a fresh socket after the trouble
    FakeNetlink.answers = [_answer(3, 1000, 9)]
    assert ask(*ends) == PeerOwner(1000, "found", 9)
    assert FakeNetlink.opened == 2  # kept open while all is well
    ask.close()
