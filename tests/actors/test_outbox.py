"""Outbox.send_now: the relay lane's one-step write, on a real socket pair.

Written whole when the outbox is idle; the rest queued, in order, when the socket takes part of
it; nothing done when something waits before it (the caller's general path keeps the order).
"""

from __future__ import annotations

import socket

import trio

from ddmd.drive.debugger import Outbox


def pair() -> tuple[trio.SocketStream, socket.socket]:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    return trio.SocketStream(trio.socket.from_stdlib_socket(ours)), theirs


def drain(sock: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        got += sock.recv(n - len(got))
    return got


async def test_an_idle_outbox_writes_at_once() -> None:
    stream, peer = pair()
    with peer:
        box = Outbox(stream, budget=1 << 20, limit=1.0)
        assert box.send_now(b"one packet") is True
        assert (box.packets, box.written, box.queued) == (1, 10, 0)
        assert drain(peer, 10) == b"one packet"
        await stream.aclose()


async def test_a_full_socket_keeps_the_rest_in_order() -> None:
    stream, peer = pair()
    with peer:
        box = Outbox(stream, budget=1 << 30, limit=1.0)
        big = bytes(range(256)) * 8192  # 2 MiB: more than the socket buffers hold
        assert box.send_now(big) is False
        assert 0 < box.queued < len(big)  # part went out, the rest waits
        assert box.send_now(b"next") is None  # something waits before it: not written
        assert box.put(b"next")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(box.flush, 0.0)
            got = await trio.to_thread.run_sync(drain, peer, len(big) + 4)
        assert got == big + b"next"
        assert (box.queued, box.written) == (0, len(big) + 4)
        await stream.aclose()


async def test_busy_broken_or_closed_outboxes_do_nothing_at_once() -> None:
    stream, peer = pair()
    with peer:
        box = Outbox(stream, budget=1 << 20, limit=1.0)
        box.busy = True
        assert box.send_now(b"x") is None
        box.busy = False
        box.broken = "connection error"
        assert box.send_now(b"x") is None
        box.broken = None
        await stream.aclose()
        assert box.send_now(b"x") is False  # closed: queued, and flush reports the error
        assert box.queued == 1
