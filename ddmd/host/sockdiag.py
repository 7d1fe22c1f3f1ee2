"""The machine's listening TCP sockets, asked of the kernel over netlink (``sock_diag``).

Layer: standard library only; blocking (one request and its answer: run it in a worker thread),
except `connection_owner` with ``wait=False`` and `OwnerAsker`, which never block.

The scanner's watch looks for new listeners ten times a second. Reading ``/proc/net/tcp`` for
that costs a walk of the kernel's whole connection hash table to reach the end of the file
(about a millisecond here even with a handful of sockets), once per table and per look. A
``SOCK_DIAG_BY_FAMILY`` dump that asks for the LISTEN state only walks the listening sockets
(the kernel skips the connection table when no other state is asked for): tens of
microseconds. It is the interface ``ss -l`` uses (``linux/inet_diag.h``).

The peer-uid rule asks who owns the far end of each accepted connection (`connection_owner`):
an exact lookup of one socket by its four ends (``inet_diag_req_v2`` with the whole
``inet_diag_sockid`` and ``INET_DIAG_NOCOOKIE``), which the kernel answers from its hash table
(microseconds) where reading ``/proc/net/tcp`` and ``tcp6`` costs milliseconds that grow with
every connection on the machine. The kernel answers within the request's ``send``, so the
question can be asked in an event loop without blocking: `OwnerAsker` does, over a netlink
socket kept open (about 4 µs a question here), for the guard's check of every connection as it
is accepted.

Where netlink cannot be used (not Linux, a sandbox without ``NETLINK_SOCK_DIAG``), `listeners`,
`connection_owner` and `OwnerAsker` answer None and the caller reads the tables instead.
"""

from __future__ import annotations

import errno
import functools
import ipaddress
import socket
import struct
from collections.abc import Collection
from typing import Final

from ddmd.host.localproc import IpAddress, PeerOwner, choose_listeners, parse_host

__all__ = ["OwnerAsker", "connection_owner", "listeners"]

_NETLINK_SOCK_DIAG: Final = 4
_SOCK_DIAG_BY_FAMILY: Final = 20
_NLM_F_REQUEST_DUMP: Final = 0x0001 | 0x0300  # NLM_F_REQUEST | NLM_F_ROOT | NLM_F_MATCH
_NLM_F_REQUEST: Final = 0x0001
_TCP_TIME_WAIT: Final = 6
_ALL_STATES: Final = 0xFFFFFFFF
_NO_COOKIE: Final = 0xFFFFFFFF  # INET_DIAG_NOCOOKIE, both halves
# struct inet_diag_sockid: sport, dport (big-endian), src[4], dst[4] (network order), if, cookie
_SOCKID: Final = struct.Struct(">HH16s16s")
_SOCKID_TAIL: Final = struct.Struct("=III")
_NLMSG_ERROR: Final = 2
_NLMSG_DONE: Final = 3
_TCP_LISTEN: Final = 10
_HEADER: Final = struct.Struct("=IHHII")  # struct nlmsghdr
# struct inet_diag_req_v2 without its sockid (48 bytes of zeros: every socket)
_REQUEST: Final = struct.Struct("=BBBBI")
_SOCKID_SIZE: Final = 48
# struct inet_diag_msg: family, state, timer, retrans; sockid (sport, dport, src[16], dst[16],
# if, cookie[2]); expires, rqueue, wqueue, uid, inode
_MESSAGE_SIZE: Final = 72
_PORTS: Final = struct.Struct(">HH")
_UID_INODE: Final = struct.Struct("=II")
#: Seconds the kernel may take to answer (it answers at once; a sandbox might not).
TIMEOUT: Final = 1.0


def listeners(host: str, ports: Collection[int]) -> dict[int, int] | None:
    """For each of ``ports`` with a LISTEN socket that accepts connections to ``host`` (a
    numeric address), the uid that created it: the same answer as
    `localproc.listening_owners`. None when netlink cannot tell (not Linux, not allowed) or
    ``host`` is not numeric."""
    target = parse_host(host)
    if target is None:
        return None
    try:
        rows = _dump(socket.AF_INET) + _dump(socket.AF_INET6)
    except (OSError, ValueError, struct.error):
        return None
    return choose_listeners(
        ((address, port, uid) for address, port, uid, inode in rows if inode != 0),
        target,
        set(ports),
    )


def connection_owner(
    local: tuple[str, int], remote: tuple[str, int], *, wait: bool = True
) -> PeerOwner | None:
    """Who owns the TCP socket whose own end is ``local`` and whose far end is ``remote`` (both
    numeric): for the peer of a connection we accepted, ``local`` is its ``getpeername()`` and
    ``remote`` our ``getsockname()``. The same answer as `localproc.peer_owner` ("found" with
    the uid; "closed" for a TIME_WAIT socket or one its process closed; "absent" when there is
    no such socket), without reading the tables. None when netlink cannot tell (then read them).

    ``wait=False`` never blocks, so it may run in an event loop: the kernel answers a request
    for one socket within the ``send`` call (the answer is queued before ``send`` returns), and
    an answer that is not there at once is taken as no answer (None) rather than waited for.
    `OwnerAsker` asks the same without blocking, over a netlink socket kept open.
    """
    request = _owner_request(local, remote, 1)
    if not isinstance(request, bytes):
        return request
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as sock:
            sock.settimeout(TIMEOUT if wait else 0.0)
            sock.sendall(request)
            return _owner_answer(sock.recv(1 << 12))[1]
    except (OSError, ValueError, struct.error):
        return None


class OwnerAsker:
    """`connection_owner` with ``wait=False``, over one netlink socket kept open (opening and
    closing one for each question costs half as much again as the question). For one thread:
    the event loop's. Any trouble closes the socket (the next question opens another), so no
    late answer to an earlier question is ever taken for the answer to a later one; answers are
    matched by sequence number too."""

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._seq = 0

    def __call__(self, local: tuple[str, int], remote: tuple[str, int]) -> PeerOwner | None:
        self._seq = self._seq % 0xFFFFFFFF + 1
        request = _owner_request(local, remote, self._seq)
        if not isinstance(request, bytes):
            return request
        try:
            sock = self._sock
            if sock is None:
                sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)
                sock.setblocking(False)
                self._sock = sock
            sock.send(request)
            while True:  # BlockingIOError when no answer is there: no waiting
                seq, owner = _owner_answer(sock.recv(1 << 12))
                if seq == self._seq:
                    return owner
        except (OSError, ValueError, struct.error):
            self.close()
            return None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _owner_request(
    local: tuple[str, int], remote: tuple[str, int], seq: int
) -> bytes | PeerOwner | None:
    """The netlink message asking for one socket by its four ends; the answer itself where
    none is needed (PeerOwner: ends of two families; None: a host name, not an address)."""
    mine, theirs = _packed(local[0]), _packed(remote[0])
    if mine is None or theirs is None:
        return None
    if len(mine) != len(theirs):
        return PeerOwner(None, "absent")
    family = socket.AF_INET if len(mine) == 4 else socket.AF_INET6
    request = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, _ALL_STATES)
    request += _SOCKID.pack(local[1], remote[1], mine.ljust(16, b"\0"), theirs.ljust(16, b"\0"))
    request += _SOCKID_TAIL.pack(0, _NO_COOKIE, _NO_COOKIE)
    size = _HEADER.size + len(request)
    return _HEADER.pack(size, _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, seq, 0) + request


def _owner_answer(data: bytes) -> tuple[int | None, PeerOwner | None]:
    """The sequence number of the kernel's answer to `_owner_request`, and the owner it tells
    (None: an answer that tells nothing)."""
    if len(data) < _HEADER.size:
        return None, None
    length, kind, _flags, seq, _pid = _HEADER.unpack_from(data, 0)
    if length < _HEADER.size or length > len(data):
        return None, None
    if kind == _NLMSG_ERROR:
        (code,) = struct.unpack_from("=i", data, _HEADER.size)
        return seq, PeerOwner(None, "absent") if -code == errno.ENOENT else None
    body = data[_HEADER.size : length]
    if kind != _SOCK_DIAG_BY_FAMILY or len(body) < _MESSAGE_SIZE:
        return seq, None
    uid, inode = _UID_INODE.unpack_from(body, 64)
    if inode == 0 or body[1] == _TCP_TIME_WAIT:
        return seq, PeerOwner(None, "closed")
    return seq, PeerOwner(uid, "found", inode)


_V4_MAPPED: Final = bytes(10) + b"\xff\xff"


def _packed(host: str) -> bytes | None:
    """A numeric address as the kernel keeps it: 4 bytes for IPv4 (an IPv4-mapped IPv6 address
    too: its socket is an IPv4 one), 16 for IPv6; None for a host name. ``inet_pton`` rather
    than `ipaddress`, which costs more than the kernel's whole answer."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return socket.inet_pton(socket.AF_INET, text)
    except OSError:
        pass
    try:
        raw = socket.inet_pton(socket.AF_INET6, text.split("%", 1)[0])
    except OSError:
        return None
    return raw[12:] if raw.startswith(_V4_MAPPED) else raw


def _dump(family: int) -> list[tuple[IpAddress, int, int, int]]:
    """(local address, port, uid, inode) of each listening TCP socket of ``family``."""
    request = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << _TCP_LISTEN)
    request += bytes(_SOCKID_SIZE)
    header = _HEADER.pack(
        _HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST_DUMP, 1, 0
    )
    rows: list[tuple[IpAddress, int, int, int]] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as sock:
        sock.settimeout(TIMEOUT)
        sock.sendall(header + request)
        while True:
            data = sock.recv(1 << 16)
            if not data:
                raise ValueError("netlink closed before the end of the dump")
            at = 0
            while at + _HEADER.size <= len(data):
                length, kind, _flags, _seq, _pid = _HEADER.unpack_from(data, at)
                if length < _HEADER.size or at + length > len(data):
                    raise ValueError("a truncated netlink message")
                if kind == _NLMSG_DONE:
                    return rows
                if kind == _NLMSG_ERROR:
                    (code,) = struct.unpack_from("=i", data, at + _HEADER.size)
                    raise OSError(-code, "sock_diag refused the dump")
                body = data[at + _HEADER.size : at + length]
                if len(body) >= _MESSAGE_SIZE and body[1] == _TCP_LISTEN:
                    rows.append(_row(body))
                at += (length + 3) & ~3


def _row(body: bytes) -> tuple[IpAddress, int, int, int]:
    port, _ = _PORTS.unpack_from(body, 4)
    uid, inode = _UID_INODE.unpack_from(body, 64)
    return _address(body[0], body[8:24]), port, uid, inode


@functools.lru_cache(maxsize=64)
def _address(family: int, raw: bytes) -> IpAddress:
    # Cached: hundreds of listeners share an address or two, looked at ten times a second.
    address: IpAddress
    if family == socket.AF_INET:
        address = ipaddress.IPv4Address(raw[:4])
    else:
        address = ipaddress.IPv6Address(raw)
        if address.ipv4_mapped is not None:
            address = address.ipv4_mapped
    return address
