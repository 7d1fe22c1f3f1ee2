"""A raw blocking JDWP client for the benches: one command at a time, TCP_NODELAY, events
skipped; run in the bench process itself, so it is the same on every path it is sent down.
"""

from __future__ import annotations

import contextlib
import socket
import struct

from . import HOST

HANDSHAKE = b"JDWP-Handshake"
HEADER = struct.Struct(">IIBBB")  # length, id, flags, command set, command
REPLY = struct.Struct(">IIBH")  # length, id, flags, error code


class Closed(Exception):
    pass


class RawJdwp:
    """A blocking JDWP client: one command at a time, events skipped."""

    def __init__(self, port: int, timeout: float = 20.0) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.next_id = 1
        self.sock.sendall(HANDSHAKE)
        if self._read(len(HANDSHAKE)) != HANDSHAKE:
            raise Closed("bad handshake reply")
        self.sizes: tuple[int, ...] = (8, 8, 8, 8, 8)  # field, method, object, type, frame

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            data = self.sock.recv(65536)
            if not data:
                raise Closed(f"closed after {len(self.buf)} of {n} bytes")
            self.buf += data
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def command(self, cs: int, cmd: int, data: bytes = b"") -> tuple[int, bytes]:
        """(error code, reply data)."""
        packet_id = self.next_id
        self.next_id += 1
        self.sock.sendall(HEADER.pack(11 + len(data), packet_id, 0, cs, cmd) + data)
        while True:
            length, rid, flags, error = REPLY.unpack(self._read(11))
            body = self._read(length - 11)
            if flags & 0x80 and rid == packet_id:
                return error, body

    def ok(self, cs: int, cmd: int, data: bytes = b"") -> bytes:
        error, body = self.command(cs, cmd, data)
        if error:
            raise RuntimeError(f"JDWP {cs}/{cmd}: error {error}")
        return body

    def id_sizes(self) -> None:
        self.sizes = struct.unpack(">5i", self.ok(1, 7))

    def ids(self, body: bytes, size: int) -> list[bytes]:
        (n,) = struct.unpack_from(">i", body)
        return [body[4 + i * size : 4 + (i + 1) * size] for i in range(n)]

    def find_main(self) -> bytes:
        """The thread id of the thread named ``main``."""
        for tid in self.ids(self.ok(1, 4), self.sizes[2]):
            if jstring(self.ok(11, 1, tid))[0] == "main":
                return tid
        raise RuntimeError("no thread named main")


def jbytes(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">I", len(raw)) + raw


def jstring(body: bytes, at: int = 0) -> tuple[str, int]:
    """The JDWP string at ``at`` and the offset after it."""
    (n,) = struct.unpack_from(">i", body, at)
    return body[at + 4 : at + 4 + n].decode("utf-8", "replace"), at + 4 + n


def recv_exact(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        got = sock.recv(n - len(data))
        if not got:
            raise EOFError(f"closed after {len(data)} of {n} bytes")
        data += got
    return bytes(data)
