"""The trio side of the HotSpot Attach API: find or start a local JVM's attach listener, send
one command, read its answer. What the bytes mean is ``ddmd.protocol.hsattach``.

Layer: trio, the standard library, ``ddmd.errors`` and ``ddmd.protocol.hsattach``. Blocking
work (``/proc`` reads, the ``.attach_pid`` file, the signal, waiting for the socket to appear)
runs in a worker thread; the socket itself is trio's.

One command (``execute``):

1. Look at ``/proc/PID``: the process is still the one found (same command line), its
   effective uid is ddmd's, it catches SIGQUIT, and neither its command line nor
   JAVA_TOOL_OPTIONS / JDK_JAVA_OPTIONS / _JAVA_OPTIONS says ``-XX:+DisableAttachMechanism``.
   Anything else is an ``AttachUnavailable`` with the sentence that says why, before any
   signal is sent (a JVM started with that flag would print a thread dump on SIGQUIT; one
   that does not catch SIGQUIT would die of it).
2. No ``/proc/PID/root/tmp/.java_pid<NSPID>`` yet: create ``.attach_pid<NSPID>`` in the
   process's working directory (or its /tmp), send SIGQUIT, wait up to ``start_timeout``
   (5 s) for the socket (SIGQUIT once more half-way, as the JDK's own client does), remove
   the file. One handshake per JVM at a time.
3. Connect, send the request, read until the JVM closes the connection, within ``patience``.

ddmd attaches only to JVMs of its own effective uid. HotSpot would also let root in, but a
heap dump is written by the JVM as its own user, and a daemon running as root should not act
on another user's process because it could: the sentence names both users.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import signal
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import trio

from ddmd.errors import DdmFailed, FeatureUnsupported, RequestTimedOut
from ddmd.protocol.hsattach import (
    AttachReplyError,
    ProcStatus,
    Reply,
    attach_disabled_by,
    attach_file_name,
    encode_request,
    parse_proc_status,
    parse_reply,
    socket_name,
)

__all__ = ["AttachClient", "AttachUnavailable", "ProcessFacts", "refusal"]

START_TIMEOUT = 5.0  # seconds for the JVM to open its attach socket after SIGQUIT
MAX_REPLY = 64 << 20  # bytes: a thread dump of tens of thousands of threads still fits
_RECEIVE = 1 << 16


class AttachUnavailable(FeatureUnsupported):
    """ddmd cannot use the attach API with this JVM; the message says why, in a sentence."""


@dataclass(frozen=True, slots=True)
class ProcessFacts:
    """What ``/proc/PID`` says (None: the process is gone)."""

    status: ProcStatus | None
    cmdline: tuple[str, ...] = ()
    environ: tuple[tuple[str, str], ...] = ()


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, OverflowError):
        return f"uid {uid}"


def refusal(
    facts: ProcessFacts,
    who: str,
    *,
    euid: int,
    expected_cmdline: Sequence[str] | None = None,
) -> str | None:
    """Why ddmd will not attach to this process (a sentence), or None."""
    status = facts.status
    if status is None or (expected_cmdline and facts.cmdline and
                          tuple(facts.cmdline) != tuple(expected_cmdline)):  # fmt: skip
        return f"{who} has exited"
    if status.euid is not None and status.euid != euid:
        them, me = _user(status.euid), _user(euid)
        why = (
            "a JVM lets only its own user attach"
            if euid != 0
            else "ddmd attaches only to its own user's JVMs, even as root (a heap dump is "
            "written by the JVM's user)"
        )
        return f"{who} runs as {them} and ddmd as {me}: {why}; jstack and jcmd run as that user can"
    disabled = attach_disabled_by(facts.cmdline, dict(facts.environ))
    if disabled is not None:
        return (
            f"{who} was started with -XX:+DisableAttachMechanism ({disabled}): it accepts no "
            "attach, from ddmd, jstack or jcmd"
        )
    if status.catches_sigquit is False or status.ignores_sigquit:
        return (
            f"{who} does not handle SIGQUIT (a JVM started with -Xrs, or not a HotSpot JVM): "
            "its attach listener cannot be started without stopping it"
        )
    return None


class AttachClient:
    """The attach API of one local process (``pid``), named ``who`` in sentences."""

    def __init__(
        self,
        pid: int,
        *,
        cmdline: Sequence[str] | None = None,
        proc: Path = Path("/proc"),
        start_timeout: float = START_TIMEOUT,
        max_reply: int = MAX_REPLY,
    ) -> None:
        self.pid = pid
        self._cmdline = tuple(cmdline) if cmdline else None
        self._proc = proc / str(pid)
        self.start_timeout = start_timeout
        self.max_reply = max_reply
        self._starting = trio.Lock()

    # ------------------------------------------------------------------ what /proc says

    def facts(self) -> ProcessFacts:
        """Blocking (a few small /proc reads)."""
        try:
            status = parse_proc_status((self._proc / "status").read_text())
            raw = (self._proc / "cmdline").read_bytes()
        except OSError:
            return ProcessFacts(None)
        cmdline = tuple(a.decode("utf-8", "replace") for a in raw.split(b"\0")[:-1])
        environ: list[tuple[str, str]] = []
        with contextlib.suppress(OSError):
            for entry in (self._proc / "environ").read_bytes().split(b"\0"):
                key, eq, value = entry.decode("utf-8", "replace").partition("=")
                if eq and key.endswith("OPTIONS"):
                    environ.append((key, value))
        return ProcessFacts(status, cmdline, tuple(environ))

    def refusal(self, who: str) -> str | None:
        """Blocking, but cheap: why attaching cannot work (a sentence), or None."""
        return refusal(self.facts(), who, euid=os.geteuid(), expected_cmdline=self._cmdline)

    # ------------------------------------------------------------------ one command

    async def execute(self, who: str, command: str, *args: str, patience: float) -> Reply:
        """Send one command; its reply. Raises AttachUnavailable (with the sentence),
        RequestTimedOut (no answer within ``patience`` seconds), or DdmFailed (the JVM broke the
        protocol)."""
        facts = await trio.to_thread.run_sync(self.facts)
        why = refusal(facts, who, euid=os.geteuid(), expected_cmdline=self._cmdline)
        if why is not None:
            raise AttachUnavailable(why)
        assert facts.status is not None
        ns_pid = facts.status.ns_pid or self.pid
        path = self._proc / "root" / "tmp" / socket_name(ns_pid)
        if not await trio.to_thread.run_sync(path.exists):
            async with self._starting:
                started = await trio.to_thread.run_sync(
                    partial(self._start_listener, ns_pid, path), abandon_on_cancel=True
                )
            if not started:
                raise AttachUnavailable(
                    f"{who} did not open its attach socket within {self.start_timeout:g} s of "
                    "SIGQUIT (its attach listener may be disabled, or the JVM is hung)"
                )
        try:
            with trio.fail_after(patience):
                data = await self._exchange(path, encode_request(command, *args), who)
        except trio.TooSlowError:
            what = " ".join([command, *(a for a in args if a)])
            raise RequestTimedOut(f"{who} did not finish {what} within {patience:g} s") from None
        try:
            return parse_reply(data)
        except AttachReplyError as exc:
            if not data:
                raise AttachUnavailable(
                    f"{who} closed the attach connection without an answer (a JVM lets only "
                    "its own user, or root, attach)"
                ) from None
            raise DdmFailed(f"{who} sent an answer ddmd cannot read: {exc}") from None

    async def _exchange(self, path: Path, request: bytes, who: str) -> bytes:
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            await sock.connect(str(path))
        except OSError as exc:
            sock.close()
            if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
                raise AttachUnavailable(
                    f"{who}'s attach socket {path} accepts no connection (a socket left by "
                    "a JVM that is gone, or its listener stopped)"
                ) from None
            raise AttachUnavailable(f"cannot connect to {who}'s attach socket: {exc}") from None
        stream = trio.SocketStream(sock)
        async with stream:
            await stream.send_all(request)
            received = bytearray()
            while True:
                try:
                    data = await stream.receive_some(_RECEIVE)
                except trio.BrokenResourceError as exc:  # reset: what came is all there is
                    if received:
                        break
                    raise AttachUnavailable(
                        f"{who} closed the attach connection: {exc.__cause__ or exc}"
                    ) from None
                if not data:
                    break
                received += data
                if len(received) > self.max_reply:
                    raise DdmFailed(
                        f"{who}'s answer is larger than {self.max_reply >> 20} MB: not read"
                    )
            return bytes(received)

    def _start_listener(self, ns_pid: int, path: Path) -> bool:
        """Blocking: the .attach_pid handshake; True once the socket exists."""
        if path.exists():
            return True  # another caller started it meanwhile
        trigger = self._trigger(ns_pid)
        try:
            os.kill(self.pid, signal.SIGQUIT)
            began = time.monotonic()
            delay, again = 0.02, True
            while not path.exists():
                waited = time.monotonic() - began
                if waited > self.start_timeout:
                    return False
                if again and waited > self.start_timeout / 2:
                    again = False
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self.pid, signal.SIGQUIT)
                time.sleep(delay)
                delay = min(delay * 2, 0.2)
            return True
        except ProcessLookupError:
            return False
        finally:
            if trigger is not None:
                with contextlib.suppress(OSError):
                    trigger.unlink()

    def _trigger(self, ns_pid: int) -> Path | None:
        """Create .attach_pid in the JVM's working directory, else its /tmp; the file made
        (None: it was there already, someone else's, left alone)."""
        name = attach_file_name(ns_pid)
        last: OSError | None = None
        for directory in (self._proc / "cwd", self._proc / "root" / "tmp"):
            file = directory / name
            try:
                fd = os.open(file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:
                return None
            except OSError as exc:
                last = exc
                continue
            os.close(fd)
            return file
        raise AttachUnavailable(f"cannot create the attach trigger file {name}: {last}")
