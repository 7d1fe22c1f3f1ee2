"""A user-space delay line: a TCP relay that holds every chunk for RTT/2 in each direction, and
counts the JDWP commands that cross it (the round trips over the link).

Run: ``python bench/rig/delay.py LISTEN_PORT TARGET_PORT RTT_MS [--adb]``: prints "ready" once
listening on 127.0.0.1; one upstream connection to TARGET_PORT per accepted client.

Timing: a chunk read at t is written at t + RTT/2, whatever else is queued (each direction is a
queue in arrival order with a writer that sleeps until each chunk's own due time: order kept,
time never coalesced). RTT 0 writes at once.

Connecting: a new connection costs one RTT, as TCP's handshake does on a real link: bytes the
client sends before accept + RTT are held as if read then (the upstream connection itself is
made at once, on loopback).

Counting: in the client -> target direction the bytes after the 14-byte JDWP handshake are cut
into packets by their header lengths; a packet without the reply flag (0x80) is a command, and
each one is logged with the wall-clock time it was read (``time.time()``), its command set and
command; each new connection is logged too (set 0, command 0: a TCP connect and the JDWP
handshake, two round trips). With ``--adb`` the link carries adb's transport (an adb server ->
a device): the 24-byte message headers are parsed, every ``jdwp:PID`` stream the server opens
is followed (logged as a connection) and its WRTE payloads are counted as above; adb messages
are counted too, per direction and kind.

Control, one line on stdin, one answer line on stdout:

- ``rtt MS``: the delay from now on -> ``ok``;
- ``take``: ``log JSON``: the commands logged since the last ``take`` ([time, set, command]
  each) and the adb messages counted meanwhile ({"up WRTE": n, ...}), then both are cleared.
"""

from __future__ import annotations

import contextlib
import json
import math
import struct
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from .children import Children

HOST = "127.0.0.1"
HANDSHAKE_LEN = 14
ADB_HEADER = struct.Struct("<6I")  # command, arg0, arg1, data length, data crc32, magic
ADB_NAMES = {
    0x4E584E43: "CNXN",
    0x4E45504F: "OPEN",
    0x59414B4F: "OKAY",
    0x45534C43: "CLSE",
    0x45545257: "WRTE",
    0x48545541: "AUTH",
    0x534C5453: "STLS",
    0x434E5953: "SYNC",
}
A_OPEN, A_WRTE = 0x4E45504F, 0x45545257


class JdwpCounter:
    """Cuts one direction's byte stream into JDWP packets; calls ``on_command(set, command)``
    for every command (a packet without the reply flag)."""

    def __init__(self, on_command: Callable[[int, int], None]) -> None:
        self.on_command = on_command
        self.skip = HANDSHAKE_LEN
        self.buf = bytearray()

    def feed(self, data: bytes) -> None:
        if self.skip:
            taken = min(self.skip, len(data))
            self.skip -= taken
            data = data[taken:]
        self.buf += data
        while len(self.buf) >= 11:
            length = int.from_bytes(self.buf[:4], "big")
            if length < 11:  # not JDWP: stop counting this stream
                self.buf.clear()
                self.skip = math.inf  # type: ignore[assignment]
                return
            if len(self.buf) < length:
                return
            if not self.buf[8] & 0x80:
                self.on_command(self.buf[9], self.buf[10])
            del self.buf[:length]


class AdbCounter:
    """Cuts adb transport messages (one direction); follows the ``jdwp:`` streams the server
    opens and counts the JDWP commands in their WRTE payloads (``up``: server -> device)."""

    def __init__(
        self, direction: str, kinds: Counter[str], on_command: Callable[[int, int], None]
    ) -> None:
        self.direction = direction
        self.kinds = kinds
        self.on_command = on_command
        self.buf = bytearray()
        self.streams: dict[int, JdwpCounter] = {}

    def feed(self, data: bytes) -> None:
        self.buf += data
        while len(self.buf) >= ADB_HEADER.size:
            command, arg0, _, length, _, _ = ADB_HEADER.unpack_from(self.buf)
            if len(self.buf) < ADB_HEADER.size + length:
                return
            payload = bytes(self.buf[ADB_HEADER.size : ADB_HEADER.size + length])
            del self.buf[: ADB_HEADER.size + length]
            self.kinds[f"{self.direction} {ADB_NAMES.get(command, hex(command))}"] += 1
            if self.direction != "up":
                continue
            if command == A_OPEN and payload.startswith(b"jdwp:"):
                self.streams[arg0] = JdwpCounter(self.on_command)
                self.on_command(0, 0)  # a new stream: OPEN/OKAY, then the JDWP handshake
            elif command == A_WRTE and arg0 in self.streams:
                self.streams[arg0].feed(payload)


@dataclass
class Line:
    delay: float  # seconds, one way (RTT/2)
    adb: bool
    log: list[tuple[float, int, int]] = field(default_factory=list)
    kinds: Counter[str] = field(default_factory=Counter)

    def command(self, cs: int, cmd: int) -> None:
        self.log.append((time.time(), cs, cmd))

    def counter(self, direction: str) -> Callable[[bytes], None] | None:
        if self.adb:
            return AdbCounter(direction, self.kinds, self.command).feed
        return JdwpCounter(self.command).feed if direction == "up" else None


async def _pump(
    line: Line,
    src: trio.SocketStream,
    dst: trio.SocketStream,
    count: Callable[[bytes], None] | None,
    done: trio.CancelScope,
    open_at: float = 0.0,
) -> None:
    """Bytes from ``src`` to ``dst``, each chunk at max(read, ``open_at``) + the delay."""
    send, receive = trio.open_memory_channel[tuple[float, bytes]](math.inf)

    async def writer() -> None:
        async for due, data in receive:
            await trio.sleep_until(due)
            await dst.send_all(data)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer)
            while data := await src.receive_some(65536):
                if count is not None:
                    count(data)
                send.send_nowait((max(trio.current_time(), open_at) + line.delay, data))
            send.close()  # the writer sends what is queued, then ends
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        done.cancel()


async def _connect(port: int) -> trio.SocketStream:
    """A connection to ``port``, a refused one retried for 2 s (a JVM listens again a few ms
    after its previous debugger left); 5 s in all."""
    with trio.fail_after(5):
        deadline = trio.current_time() + 2
        while True:
            try:
                return await trio.open_tcp_stream(HOST, port)
            except OSError:
                if trio.current_time() > deadline:
                    raise
                await trio.sleep(0.02)


def serve_main(listen_port: int, target_port: int, rtt_ms: float, adb: bool) -> None:
    line = Line(rtt_ms / 2000, adb)

    async def handle(client: trio.SocketStream) -> None:
        async with client:
            open_at = trio.current_time() + 2 * line.delay  # the connection's own round trip
            if not line.adb:
                line.command(0, 0)
            try:
                upstream = await _connect(target_port)
            except (OSError, trio.TooSlowError) as exc:
                print(f"delay: no upstream: {exc!r}", file=sys.stderr, flush=True)
                return
            async with upstream, trio.open_nursery() as nursery:
                done = nursery.cancel_scope
                up = line.counter("up")
                nursery.start_soon(_pump, line, client, upstream, up, done, open_at)
                nursery.start_soon(_pump, line, upstream, client, line.counter("down"), done)

    async def control() -> None:
        stdin = trio.lowlevel.FdStream(sys.stdin.fileno())
        buf = b""
        while data := await stdin.receive_some(4096):
            buf += data
            while b"\n" in buf:
                raw, buf = buf.split(b"\n", 1)
                words = raw.decode().split()
                if words[:1] == ["rtt"]:
                    line.delay = float(words[1]) / 2000
                    print("ok", flush=True)
                elif words[:1] == ["take"]:
                    out = {"commands": line.log, "adb": dict(line.kinds)}
                    line.log = []
                    line.kinds.clear()  # in place: the counters hold it
                    print("log " + json.dumps(out), flush=True)

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(trio.serve_tcp, handle, listen_port, host=HOST))
            nursery.start_soon(control)
            print("ready", flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        trio.run(serve)


# --------------------------------------------------------------------------------------------
# The bench's side


@dataclass
class Taken:
    """What crossed a delay line between two ``take``s."""

    commands: list[tuple[float, int, int]]
    adb: dict[str, int]

    def between(self, start: float, end: float) -> int:
        """The commands logged in [start, end)."""
        return sum(start <= t < end and cs > 0 for t, cs, _ in self.commands)

    def connections(self, start: float, end: float) -> int:
        """The connections (adb: jdwp streams) opened in [start, end)."""
        return sum(start <= t < end and cs == 0 for t, cs, _ in self.commands)


class DelayLine:
    """A delay line process (this module run as a script), driven through its stdin."""

    def __init__(
        self, children: Children, listen_port: int, target_port: int, rtt_ms: float, *, adb: bool
    ) -> None:
        argv = [sys.executable, str(Path(__file__)), str(listen_port), str(target_port)]
        argv += [f"{rtt_ms:g}", *(["--adb"] if adb else [])]
        self.port = listen_port
        self.rtt_ms = rtt_ms
        self.child = children.start(f"delay line :{listen_port}", argv)
        self.child.wait_match(r"^ready$", 20)

    def set_rtt(self, rtt_ms: float) -> None:
        self.child.send(f"rtt {rtt_ms:g}")
        self.child.wait_match(r"^ok$", 10)
        self.rtt_ms = rtt_ms

    def take(self) -> Taken:
        self.child.send("take")
        got = json.loads(self.child.wait_match(r"^log (.*)$", 10)[1].group(1))
        return Taken([tuple(c) for c in got["commands"]], got["adb"])


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--adb"]
    serve_main(int(args[0]), int(args[1]), float(args[2]), "--adb" in sys.argv[1:])
