"""A plain trio byte relay: the reference a Python relay with an event loop is compared with
(bridge_latency.py's "trio relay" paths). No logic, no framing: one upstream connection per
accepted client, bytes both ways with ``receive_some(65536)``/``send_all``.

Run: ``python bench/rig/trio_relay.py LISTEN_PORT TARGET_PORT [SERIAL PID]``: prints "ready"
once listening on 127.0.0.1. With SERIAL and PID, TARGET_PORT is an adb server's and every
upstream connection is a ``jdwp:PID`` stream opened through it. Needs only trio.
"""

from __future__ import annotations

import contextlib
import sys
from functools import partial

import trio

HOST = "127.0.0.1"


def relay_main(listen_port: int, target_port: int, adb: tuple[str, int] | None = None) -> None:
    """A plain trio byte relay: one upstream connection per accepted client, bytes both ways.
    With ``adb`` (serial, pid), ``target_port`` is an adb server's and each upstream connection
    is a ``jdwp:PID`` stream opened through it (selector, then service, each answered OKAY)."""

    async def adb_request(stream: trio.SocketStream, service: str) -> None:
        await stream.send_all(b"%04x" % len(service) + service.encode())
        status = b""
        while len(status) < 4:
            data = await stream.receive_some(4 - len(status))
            if not data:
                raise OSError(f"the adb server closed the connection after {service!r}")
            status += data
        if status != b"OKAY":
            raise OSError(f"the adb server refused {service!r}: {status!r}")

    async def open_upstream() -> trio.SocketStream:
        with trio.fail_after(5):
            upstream = await trio.open_tcp_stream(HOST, target_port)
            if adb is not None:
                try:
                    await adb_request(upstream, f"host:transport:{adb[0]}")
                    await adb_request(upstream, f"jdwp:{adb[1]}")
                except BaseException:
                    await upstream.aclose()
                    raise
            return upstream

    async def pump(src: trio.SocketStream, dst: trio.SocketStream, done: trio.CancelScope) -> None:
        try:
            while data := await src.receive_some(65536):
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            done.cancel()

    async def handle(client: trio.SocketStream) -> None:
        async with client:
            try:
                upstream = await open_upstream()
            except (OSError, trio.TooSlowError) as exc:
                print(f"relay: no upstream: {exc!r}", file=sys.stderr, flush=True)
                return
            async with upstream, trio.open_nursery() as nursery:
                nursery.start_soon(pump, client, upstream, nursery.cancel_scope)
                nursery.start_soon(pump, upstream, client, nursery.cancel_scope)

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(trio.serve_tcp, handle, listen_port, host=HOST))
            print("ready", flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        trio.run(serve)


if __name__ == "__main__":
    listen, target, *adb = sys.argv[1:]
    relay_main(int(listen), int(target), (adb[0], int(adb[1])) if adb else None)
