"""`FakeDevice`: a stand-in for a phone's adbd that the REAL adb server adopts, for tests and
benchmarks (``adb -P SERVERPORT connect 127.0.0.1:DEVPORT``; the device then shows as
``127.0.0.1:DEVPORT<TAB>device``).

    device = FakeDevice({4242: ("127.0.0.1", sim.port)})
    port = await nursery.start(device.serve)      # 127.0.0.1, a free port
    ... adb -P 5637 connect 127.0.0.1:{port} ...
    device.add_pid(4243, "127.0.0.1", jvm_port)   # track-jdwp streams get the new list
    device.remove_pid(4242)                       # ... and its open jdwp streams close
    device.log(records)                           # logcat -B records, to every logcat stream

Command line: ``python -m ddmd.sim.adbd --port 5599 --pid 4242=127.0.0.1:8000 [--pid ...]
[--logcat FILE] [--adb-port 5637 [--adb adb]]``; it prints one line naming the serial once
ready. FILE holds ``logcat -B`` output (``adb exec-out logcat -B -d > FILE``): the log ring.

Device services, as a real ART device answers them (docs adb-front.md section 1):

* ``jdwp``: the pid list ``pid\\n...`` unframed, then close (``adb jdwp``);
* ``track-jdwp``: the list framed by 4 hex digits of length, now and on every change;
* ``jdwp:PID``: ``OKAY`` at once, then the stream is relayed byte for byte to the TCP address
  of that pid (a HotSpot JVM's JDWP agent, a ``ddmd sim`` VM); a failed connect closes the
  stream (the client sees ``OKAY`` then EOF). An unknown pid is refused before accepting
  (the client sees ``FAIL0006closed``). A second ``jdwp:PID`` while one stream to that pid
  is open is accepted and dropped at once, as ART's adbconnection does ("Ignoring second
  debugger. Accept then drop!"): ``OKAY`` then EOF;
* ``shell:CMD`` and ``exec:CMD`` (a raw pipe on a real device): ``echo``, ``getprop [KEY]``,
  ``ps``; anything else prints ``/system/bin/sh: CMD: not found``; then close;
* ``shell:logcat ARGS`` / ``exec:logcat ARGS``: the device's log in logcat's binary format
  (``-B``; without it one line says so): the ring first (all of it, or ``-T N`` records, or
  ``-T SEC.FRACTION`` onwards), then every record logged later (`FakeDevice.log`,
  `FakeDevice.replay`), until the stream closes; ``-d`` / ``-t`` print the ring and exit
  (`LogcatOptions`). ``-b`` and filters are ignored;
* anything else is refused (``CLSE`` at once).

The parts: adb's message format in `ddmd.sim.adbmsg`; a server's connection, its streams and
the deadlines on its untrusted input in `ddmd.sim.adbconn`; the log and the fake ``logcat`` in
`ddmd.sim.devicelog`; its counters in `ddmd.sim.devicestats`. This module re-exports their
public names.

Layer: the simulator; imports trio, structlog, the standard library and ``ddmd.sim`` only
(nothing of the daemon).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Final

import structlog
import trio

from ddmd.sim.adbconn import _Connection, _Handler, _Stream, _StreamClosed
from ddmd.sim.adbmsg import A_AUTH as A_AUTH
from ddmd.sim.adbmsg import (
    A_CLSE,
    A_CNXN,
    A_OKAY,
    A_OPEN,
    A_VERSION,
    A_WRTE,
    COMMANDS,
    HEADER_SIZE,
    MAX_PAYLOAD,
    AdbTransportError,
    Message,
    MessageDecoder,
    checksum,
    decode_header,
    encode_message,
)
from ddmd.sim.adbmsg import A_STLS as A_STLS
from ddmd.sim.adbmsg import A_SYNC as A_SYNC
from ddmd.sim.adbmsg import MIN_PAYLOAD as MIN_PAYLOAD
from ddmd.sim.devicelog import (
    _LOGCAT_PROGRAMS,
    LogcatOptions,
    _DeviceLog,
    parse_logcat_args,
    split_log_records,
)
from ddmd.sim.devicestats import DeviceStatistics

__all__ = [
    "A_CLSE",
    "A_CNXN",
    "A_OKAY",
    "A_OPEN",
    "A_VERSION",
    "A_WRTE",
    "COMMANDS",
    "DEFAULT_PROPERTIES",
    "HEADER_SIZE",
    "MAX_PAYLOAD",
    "AdbTransportError",
    "DeviceStatistics",
    "FakeDevice",
    "LogcatOptions",
    "Message",
    "MessageDecoder",
    "banner",
    "checksum",
    "decode_header",
    "encode_message",
    "main",
    "parse_logcat_args",
    "shell_output",
    "split_log_records",
]

logger = structlog.get_logger()

# --------------------------------------------------------------------------------------------
# What the device says about itself

DEFAULT_PROPERTIES: Final[Mapping[str, str]] = {
    "ro.build.version.sdk": "30",
    "ro.build.version.release": "11",
    "ro.build.type": "userdebug",
    "ro.debuggable": "1",
    "ro.product.name": "ddmdsim",
    "ro.product.model": "ddmd_sim",
    "ro.product.device": "ddmdsim",
    "ro.product.manufacturer": "ddmd",
    "ro.product.cpu.abi": "x86_64",
    "ro.product.cpu.abilist": "x86_64,x86",
    "ro.serialno": "ddmdsim0001",
    "ro.kernel.qemu": "0",
    "ro.secure": "0",
    "ro.adb.secure": "0",
    "persist.sys.timezone": "UTC",
}


def banner(properties: Mapping[str, str], features: Iterable[str]) -> bytes:
    """The CNXN payload: ``device::ro.product.name=..;ro.product.model=..;
    ro.product.device=..;features=a,b`` (what the server parses into ``devices -l``)."""
    keys = ("ro.product.name", "ro.product.model", "ro.product.device")
    props = [f"{k}={properties[k]}" for k in keys if k in properties]
    props.append("features=" + ",".join(features))
    return ("device::" + ";".join(props)).encode()


# --------------------------------------------------------------------------------------------
# The device


class FakeDevice:
    """A fake adbd on a TCP port: the real adb server adopts it with ``adb connect``.

    ``pids`` maps each debuggable pid to the TCP address its ``jdwp:PID`` stream is relayed
    to. ``properties`` is the ``getprop`` table (`DEFAULT_PROPERTIES` by default; the banner
    takes ro.product.name/model/device from it); ``features`` the banner's feature list.
    The timeouts are in seconds; see `ddmd.sim.adbconn` for which waits have none.
    """

    def __init__(
        self,
        pids: Mapping[int, tuple[str, int]] | None = None,
        *,
        properties: Mapping[str, str] | None = None,
        features: Iterable[str] = ("cmd",),
        process_names: Mapping[int, str] | None = None,
        handshake_timeout: float = 10.0,
        message_timeout: float = 10.0,
        send_timeout: float = 10.0,
        okay_timeout: float = 60.0,
        connect_timeout: float = 5.0,
        max_streams: int = 512,
        logcat: bytes = b"",
        log_ring_bytes: int = 4 << 20,
        log_follower_bytes: int = 16 << 20,
    ) -> None:
        self.pids: dict[int, tuple[str, int]] = {}
        self.process_names: dict[int, str] = dict(process_names or {})
        self.properties: dict[str, str] = dict(
            DEFAULT_PROPERTIES if properties is None else properties
        )
        self.features = tuple(features)
        self.banner = banner(self.properties, self.features)
        self.handshake_timeout = handshake_timeout
        self.message_timeout = message_timeout
        self.send_timeout = send_timeout
        self.okay_timeout = okay_timeout
        self.connect_timeout = connect_timeout
        self.max_streams = max_streams
        self._stats = DeviceStatistics()
        self._changed = trio.Event()
        self._relays: dict[int, set[_Stream]] = {}
        self._port: int | None = None
        #: Extra shell commands: first word -> the words after it -> what the shell prints.
        self.shell_commands: dict[str, Callable[[list[str]], bytes]] = {}
        self._log = _DeviceLog(self._stats, log_ring_bytes, log_follower_bytes)
        self._log.set(logcat)
        for pid, (host, port) in (pids or {}).items():
            self.add_pid(pid, host, port)

    # ----------------------------------------------------------------------------- public API

    @property
    def port(self) -> int | None:
        """The listening port once `serve` reported it."""
        return self._port

    def add_pid(self, pid: int, host: str, port: int, *, name: str | None = None) -> None:
        """Make ``pid`` debuggable: ``jdwp:PID`` is relayed to ``host:port``; track-jdwp
        streams get the new list. ``name`` is its name in ``ps`` (default ``app.PID``)."""
        if not 0 < pid <= 0x7FFFFFFF:
            raise ValueError(f"pid {pid} is outside 1..{0x7FFFFFFF}")
        if not 0 < port <= 0xFFFF:
            raise ValueError(f"port {port} is outside 1..65535")
        self.pids[pid] = (host, port)
        if name is not None:
            self.process_names[pid] = name
        self._notify()

    def remove_pid(self, pid: int, *, close_streams: bool = True) -> None:
        """The process is gone: track-jdwp streams get the new list, and its open ``jdwp:PID``
        streams close (unless ``close_streams=False``)."""
        self.pids.pop(pid, None)
        if close_streams:
            for stream in list(self._relays.get(pid, ())):
                stream.scope.cancel()
        self._notify()

    def statistics(self) -> DeviceStatistics:
        """A copy of the counters."""
        s = self._stats
        return DeviceStatistics(
            port=self._port,
            connections=s.connections,
            online=s.online,
            bad_input=s.bad_input,
            stalled=s.stalled,
            last_problem=s.last_problem,
            services=Counter(s.services),
            refused=s.refused,
            dropped=s.dropped,
            connect_failed=s.connect_failed,
            bytes_to_vm=s.bytes_to_vm,
            bytes_from_vm=s.bytes_from_vm,
            log_records=s.log_records,
            log_followers=len(self._log.followers),
            log_overflows=s.log_overflows,
        )

    # --- the log (logcat)

    @property
    def log_contents(self) -> bytes:
        """The log ring now: what ``logcat -B -d`` prints."""
        return self._log.contents()

    def set_log(self, backlog: bytes) -> None:
        """Replace the log ring with ``backlog`` (logcat -B records); open logcat streams
        get nothing of it."""
        self._log.set(backlog)

    def log(self, records: bytes) -> None:
        """Append ``records`` (logcat -B bytes, whole records or not: ``b"garbage"`` goes out
        as is) to the ring and send them to every open logcat stream. A stream that falls more
        than ``log_follower_bytes`` behind is closed, as logd drops a reader that cannot keep
        up."""
        if records:
            self._log.append(split_log_records(records))

    async def replay(
        self,
        records: bytes | Sequence[bytes],
        *,
        lines_per_second: float,
        loop: bool = False,
        tick: float = 0.01,
        high_water: int = 1 << 20,
    ) -> int:
        """`log` ``records`` (bytes cut by `split_log_records`, or a sequence of records) at
        ``lines_per_second``, one batch per ``tick`` seconds (the first at once); forever with
        ``loop``. A late timer is caught up on the next batch; but while a logcat stream has
        more than ``high_water`` bytes queued the replay waits (the adb flow control reaches
        back to it) and that time is not caught up. Returns the number of records logged
        (when not looping)."""
        return await self._log.replay(
            records, lines_per_second=lines_per_second, loop=loop, tick=tick, high_water=high_water
        )

    def open_jdwp_streams(self, pid: int) -> int:
        """How many ``jdwp:PID`` relays to ``pid`` are open now."""
        return len(self._relays.get(pid, ()))

    async def serve(
        self,
        port: int = 0,
        *,
        host: str = "127.0.0.1",
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen on ``host:port`` (0: a free port) and serve every server that connects,
        until cancelled. Reports the bound port with ``task_status.started(port)``."""
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()[1]
        self._port = bound
        logger.info("adbd.listening", port=bound)
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._handle, listeners)
            task_status.started(bound)

    # ----------------------------------------------------------------------------- internals

    def _notify(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    def _pid_list(self) -> bytes:
        return b"".join(b"%d\n" % pid for pid in sorted(self.pids))

    async def _handle(self, tcp: trio.SocketStream) -> None:
        self._stats.connections += 1
        async with tcp:
            await _Connection(self, tcp).run()

    # --- for the connections (`ddmd.sim.adbconn.DeviceHost`)

    @property
    def counters(self) -> DeviceStatistics:
        """The live counters, for the connections (`statistics` is a copy)."""
        return self._stats

    def claim_relay(self, pid: int, stream: _Stream) -> None:
        """A ``jdwp:PID`` stream relays to ``pid`` from now on (claimed before its OKAY goes
        out: a second OPEN right behind it is dropped, as the VM keeps only its first debugger)."""
        self._relays.setdefault(pid, set()).add(stream)

    def plan(self, service: str) -> tuple[str, _Handler, int | None] | None:
        """(kind, handler, the pid of a jdwp relay) for a service to accept; None to refuse."""
        if service == "jdwp":
            return "jdwp", self._serve_jdwp_list, None
        if service == "track-jdwp":
            return "track-jdwp", self._serve_track_jdwp, None
        if service.startswith("jdwp:"):
            text = service[5:]
            pid = int(text) if text.isdigit() and len(text) <= 10 else None
            if pid is None or pid not in self.pids:
                return None  # closed before accepting: the client sees FAIL0006closed
            if self._relays.get(pid):
                self._stats.dropped += 1
                return "jdwp-dropped", self._drop, None
            return "jdwp-relay", partial(self._relay, pid=pid), pid
        kind, colon, command = service.partition(":")
        if colon and kind in ("shell", "exec"):
            words = _words(command)
            if words and words[0] in _LOGCAT_PROGRAMS:
                return "logcat", partial(self._serve_logcat, args=words[1:]), None
            return kind, partial(self._serve_shell, command=command), None
        return None

    async def _serve_jdwp_list(self, stream: _Stream) -> None:
        pids = self._pid_list()
        if pids:
            await stream.write(pids)

    async def _serve_track_jdwp(self, stream: _Stream) -> None:
        sent: bytes | None = None
        while True:
            changed = self._changed
            pids = self._pid_list()
            if pids != sent:
                await stream.write(b"%04x" % len(pids) + pids)
                sent = pids
            await changed.wait()

    async def _drop(self, stream: _Stream) -> None:
        return  # accepted; the stream closes now ("Accept then drop!")

    async def _serve_shell(self, stream: _Stream, *, command: str) -> None:
        words = _words(command)
        extra = self.shell_commands.get(words[0]) if words else None
        if extra is not None:
            out = extra(words[1:])
            if out:
                await stream.write(out)
            return
        out = shell_output(command, self.properties, self.pids, self.process_names)
        if out:
            await stream.write(out)

    async def _serve_logcat(self, stream: _Stream, *, args: list[str]) -> None:
        """``logcat ARGS``: see `LogcatOptions` and `_DeviceLog.serve`."""
        await self._log.serve(args, stream.write)

    async def _relay(self, stream: _Stream, *, pid: int) -> None:
        """``jdwp:PID``: the stream was registered in ``_relays[pid]`` when accepted."""
        streams = self._relays.setdefault(pid, set())
        streams.add(stream)
        try:
            address = self.pids.get(pid)
            if address is None:
                return
            host, port = address
            try:
                with trio.fail_after(self.connect_timeout):
                    vm = await trio.open_tcp_stream(host, port)
            except (OSError, trio.TooSlowError) as exc:
                self._stats.connect_failed += 1
                logger.info(
                    "adbd.jdwp_connect_failed",
                    pid=pid,
                    address=f"{host}:{port}",
                    error=str(exc) or type(exc).__name__,
                )
                return
            async with vm, trio.open_nursery() as nursery:
                nursery.start_soon(self._vm_to_server, vm, stream, nursery.cancel_scope)
                await self._server_to_vm(stream, vm)
                nursery.cancel_scope.cancel()
        finally:
            streams.discard(stream)
            if not streams and self._relays.get(pid) is streams:
                del self._relays[pid]

    async def _server_to_vm(self, stream: _Stream, vm: trio.SocketStream) -> None:
        while True:
            try:
                data = await stream.receive()
            except _StreamClosed:
                return
            try:
                with trio.fail_after(self.send_timeout):
                    await vm.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, trio.TooSlowError):
                return
            self._stats.bytes_to_vm += len(data)
            await stream.ack()

    async def _vm_to_server(
        self, vm: trio.SocketStream, stream: _Stream, scope: trio.CancelScope
    ) -> None:
        try:
            while True:
                try:
                    data = await vm.receive_some(stream.conn.max_data)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    return
                if not data:
                    return
                self._stats.bytes_from_vm += len(data)
                await stream.write(data)
        except _StreamClosed:
            return
        finally:
            scope.cancel()


def _words(command: str) -> list[str]:
    """A shell command's words (plain whitespace splitting if its quotes do not close)."""
    try:
        return shlex.split(command)
    except ValueError:
        return command.split()


def shell_output(
    command: str,
    properties: Mapping[str, str],
    pids: Iterable[int] = (),
    names: Mapping[int, str] | None = None,
) -> bytes:
    """What the minimal shell prints for ``command``: ``echo``, ``getprop [KEY]``, ``ps``;
    anything else is "not found", as ``/system/bin/sh`` says it."""
    words = _words(command)
    if not words:
        return b""
    name, args = words[0], words[1:]
    if name == "echo":
        return (" ".join(args) + "\n").encode()
    if name == "getprop":
        if args:
            return (properties.get(args[0], "") + "\n").encode()
        return "".join(f"[{k}]: [{v}]\n" for k, v in sorted(properties.items())).encode()
    if name == "ps":
        names = names or {}
        lines = [
            "USER           PID  PPID     VSZ    RSS WCHAN            ADDR S NAME",
            "root             1     0   10764   2536 0                   0 S init",
            "shell          700     1   12345   3000 0                   0 S adbd",
        ]
        lines.extend(
            f"u0_a{pid % 1000:<5d}{pid:>8d}   300 1234567  90000 0                   0 S "
            f"{names.get(pid, f'app.{pid}')}"
            for pid in sorted(pids)
        )
        return ("\n".join(lines) + "\n").encode()
    return f"/system/bin/sh: {name}: not found\n".encode()


# --------------------------------------------------------------------------------------------
# Command line


def _pid_arg(text: str) -> tuple[int, str, int]:
    pid_text, sep, address = text.partition("=")
    host, colon, port_text = address.rpartition(":")
    if not sep or not pid_text.isdigit() or not port_text.isdigit():
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected PID=HOST:PORT, e.g. 4242=127.0.0.1:8000"
        )
    return int(pid_text), (host if colon and host else "127.0.0.1"), int(port_text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ddmd.sim.adbd",
        description="A fake Android device daemon (adbd) for the real adb server to adopt.",
    )
    parser.add_argument("--port", type=int, default=0, help="TCP port to listen on (0: free)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--pid",
        type=_pid_arg,
        action="append",
        default=[],
        metavar="PID=HOST:PORT",
        help="a debuggable pid and the JDWP address its jdwp:PID is relayed to",
    )
    parser.add_argument(
        "--logcat",
        type=argparse.FileType("rb"),
        default=None,
        metavar="FILE",
        help="logcat -B output to serve as the device's log",
    )
    parser.add_argument(
        "--adb-port",
        type=int,
        default=None,
        help="once listening, run `ADB -P N connect 127.0.0.1:PORT`",
    )
    parser.add_argument("--adb", default="adb", help="the adb program (with --adb-port)")
    return parser


async def _main(args: argparse.Namespace) -> int:
    backlog = b""
    if args.logcat is not None:
        with args.logcat as file:
            backlog = file.read()
    device = FakeDevice({pid: (host, port) for pid, host, port in args.pid}, logcat=backlog)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(partial(device.serve, args.port, host=args.host))
        serial = f"127.0.0.1:{port}"
        if args.adb_port is not None:
            with trio.fail_after(30):
                result = await trio.run_process(
                    [args.adb, "-P", str(args.adb_port), "connect", serial],
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                )
            said = (result.stdout + result.stderr).decode(errors="replace").strip()
            if result.returncode != 0 or "connected" not in said:
                print(f"adb connect {serial} failed: {said}", file=sys.stderr, flush=True)
                nursery.cancel_scope.cancel()
                return 1
        pids = ",".join(str(p) for p in sorted(device.pids)) or "none"
        print(f"device {serial} ready (pids {pids})", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # stdout is for the one "ready" line a script waits for; logs go to stderr.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    try:
        return trio.run(_main, args)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
