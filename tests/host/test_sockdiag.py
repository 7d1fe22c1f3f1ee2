"""sockdiag: the kernel's listening sockets over netlink give the same answer as the socket
tables, and None (never an exception) where netlink cannot be used."""

from __future__ import annotations

import contextlib
import os
import socket

import pytest

from ddmd.host import sockdiag
from ddmd.host.localproc import listening_owners
from tests.actors.needs import IN_CI
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
