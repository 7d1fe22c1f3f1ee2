"""Outbox.send_now and Reader: the relay lane's one-step write and its reads, on a real socket
pair.

Written whole when the outbox is idle; the rest queued, in order, when the socket takes part of
it; nothing done when something waits before it (the caller's general path keeps the order).
"""

from __future__ import annotations

import socket

import pytest
import trio

from ddmd.drive.debugger import Outbox
from ddmd.drive.streams import Reader


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


# --------------------------------------------------------------------------------------------
# Reader: the relay loops' reads


async def test_reader_reads_what_is_waiting_and_waits_for_more() -> None:
    stream, peer = pair()
    with peer:
        reader = Reader(stream)
        peer.sendall(b"waiting")
        assert await reader.receive(1024) == b"waiting"
        async with trio.open_nursery() as nursery:

            async def later() -> None:
                await trio.sleep(0.05)
                peer.sendall(b"later")

            nursery.start_soon(later)
            assert await reader.receive(1024) == b"later"  # parked until it came
        peer.shutdown(socket.SHUT_WR)
        assert await reader.receive(1024) == b""  # the end
        await stream.aclose()


async def test_reader_closed_by_another_task_while_waiting() -> None:
    stream, peer = pair()
    with peer:
        reader = Reader(stream)
        async with trio.open_nursery() as nursery:

            async def close_soon() -> None:
                await trio.sleep(0.05)
                await stream.aclose()

            nursery.start_soon(close_soon)
            with pytest.raises(trio.ClosedResourceError):
                await reader.receive(1024)
        with pytest.raises(trio.ClosedResourceError):
            await reader.receive(1024)


async def test_reader_is_cancellable_while_bytes_keep_coming() -> None:
    stream, peer = pair()
    with peer:
        reader = Reader(stream)
        peer.sendall(b"x" * 1000)
        with trio.CancelScope() as scope:
            scope.cancel()
            await reader.receive(10)  # bytes are waiting, but the scope is cancelled
        assert scope.cancelled_caught
        await stream.aclose()
