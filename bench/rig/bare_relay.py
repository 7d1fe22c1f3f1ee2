"""A bare byte relay in one thread with a plain epoll loop: the floor of what a Python relay
costs, for bridge_latency.py's reference paths (no logic, no framing, no event-loop library).

Run: ``python bench/rig/bare_relay.py LISTEN_PORT TARGET_PORT``: prints "ready" once listening on
127.0.0.1; each client gets its own connection to TARGET_PORT, and bytes go both ways as they
come. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import sys

HOST = "127.0.0.1"


def main(listen_port: int, target_port: int) -> None:
    listener = socket.create_server((HOST, listen_port))
    listener.setblocking(False)
    poller = select.epoll()
    poller.register(listener.fileno(), select.EPOLLIN)
    other: dict[int, int] = {}
    sockets: dict[int, socket.socket] = {}
    print("ready", flush=True)
    while True:
        for fd, _ in poller.poll():
            if fd == listener.fileno():
                client, _ = listener.accept()
                try:
                    upstream = socket.create_connection((HOST, target_port), timeout=5)
                except OSError:
                    client.close()  # the target is not listening (yet): this client is refused
                    continue
                for sock in (client, upstream):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    sock.setblocking(False)
                    sockets[sock.fileno()] = sock
                    poller.register(sock.fileno(), select.EPOLLIN)
                other[client.fileno()], other[upstream.fileno()] = (
                    upstream.fileno(),
                    client.fileno(),
                )
                continue
            if fd not in sockets:
                continue
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data:
                with contextlib.suppress(OSError):
                    sockets[other[fd]].setblocking(True)  # a relay of small packets: rare
                    sockets[other[fd]].sendall(data)
                    sockets[other[fd]].setblocking(False)
                continue
            for end in (fd, other.pop(fd, -1)):
                sock = sockets.pop(end, None)
                if sock is not None:
                    poller.unregister(end)
                    sock.close()
                other.pop(end, None)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main(int(sys.argv[1]), int(sys.argv[2]))
