"""Which program is at the other end of a connection to ddmd (the adb front, a forward, ddmd's
own debugger ports): "Android Studio", "jadx", "jdb", "VS Code", "java (ddmlib)", "adb", ...
for logs and for the VM's list of clients.

Layer: the standard library, trio and `host.localproc` (the kernel's socket tables and
``/proc/PID/cmdline``). The name comes from the peer process's command line (`tool_name`, pure);
the process is the one holding the far end of the connection (`peer_process`, a worker thread
under a deadline, like the peer-uid check).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Final

import trio

from ddmd.host import localproc

__all__ = ["LOOKUP_TIMEOUT", "PeerProcess", "peer_process", "tool_name"]

#: Seconds one lookup may take (socket tables, then the fd tables of the user's processes).
LOOKUP_TIMEOUT: Final = 2.0
# At most two lookups at a time, per trio run (a RunVar: no state outlives the run).
_LIMITER: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("ddmd_peer_lookups")


@dataclass(frozen=True, slots=True)
class PeerProcess:
    """The local process at the far end of a connection."""

    pid: int
    uid: int
    cmdline: tuple[str, ...]
    tool: str | None  # `tool_name` of the command line

    def describe(self, limit: int = 200) -> str:
        """The command line as one line, cut at `limit` characters."""
        text = " ".join(self.cmdline)
        return text if len(text) <= limit else text[: limit - 3] + "..."


def _base(word: str) -> str:
    return os.path.basename(word.rstrip("/"))


def tool_name(cmdline: Sequence[str], *, exe: str | None = None) -> str | None:
    """The program a command line runs, as a user knows it; None when it says nothing."""
    if not cmdline:
        return None
    words = [w for w in cmdline if w]
    if not words:
        return None
    lowered = [w.lower() for w in words]
    joined = " ".join(lowered)
    program = _base(lowered[0])
    exe_base = _base(exe.lower()) if exe else ""
    if (
        "studio" in program
        or "android-studio" in joined
        or "androidstudio" in joined
        or "com.android.tools.idea" in joined
        or ("idea" in joined and "android" in joined)
    ):
        return "Android Studio"
    if "jadx" in joined:
        return "jadx"
    if program == "jdb" or exe_base == "jdb" or "com.sun.tools.example.debug.tty" in joined:
        return "jdb"
    if (
        program in ("code", "code-oss", "codium", "code-insiders")
        or "vscode" in joined
        or "visual studio code" in joined
        or "android-dev-ext" in joined
    ):
        return "VS Code"
    java = program in localproc.JAVA_LAUNCHERS or exe_base in localproc.JAVA_LAUNCHERS
    if java and "ddmlib" in joined:
        return "java (ddmlib)"
    if program == "adb" or exe_base == "adb":
        return "adb"
    if java:
        name = localproc.java_name(words, exe=exe)
        return f"java ({name})" if name else "java"
    return _base(words[0]) or None


def _find(
    ours: tuple[str, int], peer: tuple[str, int], proc_root: str, give_up_at: float
) -> PeerProcess | None:
    """(worker thread) The process holding the far end: its socket's row, then its fd."""
    owner = localproc.connected_socket(peer, ours, proc_root=proc_root)
    if owner is None:
        return None
    pid = localproc.process_of_inode(
        owner.inode, uid=owner.uid, proc_root=proc_root, give_up_at=give_up_at
    )
    if pid is None:
        return None
    cmdline = localproc.read_cmdline(pid, proc_root=proc_root) or ()
    try:
        exe: str | None = os.readlink(os.path.join(proc_root, str(pid), "exe"))
    except OSError:
        exe = None
    return PeerProcess(pid, owner.uid, cmdline, tool_name(cmdline, exe=exe))


async def peer_process(
    stream: trio.SocketStream, *, proc_root: str = "/proc", patience: float = LOOKUP_TIMEOUT
) -> PeerProcess | None:
    """The local process at the far end of `stream`; None when it cannot be found in time
    (another user's process, not Linux, gone already). Never raises but Cancelled."""
    try:
        limiter = _LIMITER.get()
    except LookupError:
        limiter = trio.CapacityLimiter(2)
        _LIMITER.set(limiter)
    try:
        ours = stream.socket.getsockname()
        peer = stream.socket.getpeername()
    except OSError:
        return None
    if not isinstance(ours, tuple) or not isinstance(peer, tuple):
        return None
    work = partial(
        _find,
        (str(ours[0]), int(ours[1])),
        (str(peer[0]), int(peer[1])),
        proc_root,
        time.monotonic() + patience,
    )
    with trio.move_on_after(patience):
        try:
            return await trio.to_thread.run_sync(work, abandon_on_cancel=True, limiter=limiter)
        except (OSError, ValueError):
            return None
    return None
