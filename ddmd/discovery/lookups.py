"""The scan's /proc lookups, shared by all of a round's probes.

Layer: trio, `peers` (the uid rule) and the blocking readers of `host.fdindex` and
`host.localproc`; used by `discovery.scan`.

Each VM the scan finds needs two answers from ``/proc``: whose is the VM's end of the probe's
connection (the uid rule), and which process is it (pid and ``jps`` name). Asked one VM at a
time, each answer read the whole socket table and walked fd tables, so 500 VMs opening their
ports at once cost 500 x (500 + 500) rows and fds: seconds. Here:

- `Fresh` runs one reading in a worker thread for every caller waiting at the time. A caller
  names the newest reading it may not use (`Fresh.mark`: one that began before its connection
  existed cannot show it) and gets the first reading that began after;
- the socket table is read fresh for each batch of probes; the fd index (socket inode -> pid)
  is reused while it still answers (each answer is checked with one ``readlink``) and walked
  again only for a socket it does not know.

Every wait has a deadline. A /proc that does not answer in time costs a VM its pid and name;
for the uid rule it refuses the VM, as `peers.check_peer` refuses a peer it cannot check.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Generic, TypeVar

import trio

from ddmd.host.fdindex import FdIndex
from ddmd.host.localproc import (
    LocalProcess,
    SocketTable,
    java_name,
    read_cmdline,
    read_exe,
)
from ddmd.peers import PeerPolicy, Verdict, is_local_peer, user_name

__all__ = ["Fresh", "Probed", "ScanLookups"]

T = TypeVar("T")

#: Worker threads reading /proc at once for one scanner.
READ_THREADS = 2


class Fresh(Generic[T]):
    """A value read in a worker thread, shared by everyone waiting for it.

    Readings are numbered. ``await get(after=n)`` returns the value of a reading numbered above
    ``n`` (one that began after the caller's mark), starting one when none is under way, or
    waiting for the one under way and then, if that one began too early, for the next. None
    when ``timeout`` passes, or when the reading that answers raised (a bug must cost the
    answer, never the scan). A reading cancelled midway leaves the waiters to start another."""

    def __init__(
        self, read: Callable[[], T], limiter: trio.CapacityLimiter, timeout: float
    ) -> None:
        self._read = read
        self._limiter = limiter
        self._timeout = timeout
        self._started = 0
        self._finished = 0
        self._answer: T | None = None  # the newest finished reading's (None: it failed)
        self._good: T | None = None  # the newest reading that did not fail
        self._running: trio.Event | None = None
        self.readings = 0
        self.failures = 0

    def mark(self) -> int:
        """The newest reading begun so far: a later ``get(after=mark)`` will not use it."""
        return self._started

    def latest(self) -> T | None:
        """The newest good reading, however old; None before the first."""
        return self._good

    async def get(self, after: int | None = None) -> T | None:
        wanted = (self._started if after is None else after) + 1
        with trio.move_on_after(self._timeout):
            while self._finished < wanted:
                if self._running is None:
                    await self._take()
                else:
                    await self._running.wait()
            return self._answer
        return None

    async def _take(self) -> None:
        self._started += 1
        number = self._started
        done = self._running = trio.Event()
        try:
            try:
                value: T | None = await trio.to_thread.run_sync(
                    self._read, abandon_on_cancel=True, limiter=self._limiter
                )
            except Exception:
                value = None
                self.failures += 1
            else:
                self.readings += 1
                self._good = value
            self._answer, self._finished = value, number
        finally:
            self._running = None
            done.set()


@dataclass(frozen=True, slots=True)
class Probed:
    """A probe's connection after the handshake: its two ends, and which readings may show
    them (call `of` right after the handshake: the VM has accepted, both ends exist)."""

    ours: tuple[str, int]
    peer: tuple[str, int]
    mark: int  # the socket table readings begun before the connection was made
    fds_mark: int  # the fd index walks begun before the VM accepted it

    @classmethod
    def of(cls, stream: trio.abc.Stream, lookups: ScanLookups) -> Probed | None:
        """None for a stream that is not a TCP socket (nothing to look up), or one whose
        peer is gone already."""
        if not isinstance(stream, trio.SocketStream):
            return None
        try:
            ours = stream.socket.getsockname()
            peer = stream.socket.getpeername()
        except OSError:
            return None
        return cls(
            (ours[0], ours[1]), (peer[0], peer[1]), lookups.tables.mark(), lookups.fds.mark()
        )


class ScanLookups:
    """One scanner's shared readings of the socket tables and of the fd index."""

    def __init__(
        self,
        proc_root: str = "/proc",
        *,
        owner_timeout: float,
        process_timeout: float,
    ) -> None:
        self._proc_root = proc_root
        self._limiter = trio.CapacityLimiter(READ_THREADS)
        self._owner_timeout = owner_timeout
        self._process_timeout = process_timeout
        self.tables: Fresh[SocketTable] = Fresh(
            partial(SocketTable.read, proc_root), self._limiter, owner_timeout
        )
        self.fds: Fresh[FdIndex] = Fresh(
            partial(FdIndex.read, proc_root), self._limiter, process_timeout
        )

    async def verdict(self, probed: Probed, policy: PeerPolicy) -> Verdict:
        """The uid rule on the VM's end of the probe's connection (as `peers.check_peer`)."""
        table = await self.tables.get(after=probed.mark)
        if table is None:
            return Verdict(
                False, None, f"its owner could not be found within {self._owner_timeout:g} s"
            )
        owner = table.peer_owner(probed.ours, probed.peer)
        verdict = policy.judge_owner(
            owner, local_peer=is_local_peer(probed.peer[0], probed.ours[0])
        )
        if verdict.allowed or verdict.uid is None:
            return verdict
        user: str | None = None
        with trio.move_on_after(self._owner_timeout):
            user = await trio.to_thread.run_sync(
                user_name, verdict.uid, abandon_on_cancel=True, limiter=self._limiter
            )
        return Verdict(False, verdict.uid, verdict.reason, user)

    async def process(self, probed: Probed, host: str, port: int) -> LocalProcess | None:
        """The process holding the VM's end of the probe's connection (or, failing that, the
        port's LISTEN socket), with its ``jps`` name; None when /proc cannot tell in time."""
        with trio.move_on_after(self._process_timeout):
            table = await self.tables.get(after=probed.mark)
            if table is None:
                return None
            # The probe's peer address is the VM's numeric address, even for a host name.
            vm_end = table.connected(probed.peer, probed.ours)
            owner = vm_end or table.listening(probed.peer[0], port)
            if owner is None:
                return None
            found = await self._holder(owner.inode, probed.fds_mark)
            if found is None:
                return None
            pid, cmdline, exe = found
            return LocalProcess(
                pid=pid, uid=owner.uid, name=java_name(cmdline, exe=exe), cmdline=cmdline
            )
        return None

    async def _holder(self, inode: int, mark: int) -> _Described | None:
        """The process holding ``inode``, described: from the last walk of the fd tables when
        it still answers, else from a walk begun after ``mark`` (the VM had accepted by then,
        so its end is in its fd table)."""
        known = self.fds.latest()
        if known is not None:
            found = await trio.to_thread.run_sync(
                _describe, known, inode, abandon_on_cancel=True, limiter=self._limiter
            )
            if found is not None:
                return found
        index = await self.fds.get(after=mark)
        if index is None:
            return None
        return await trio.to_thread.run_sync(
            _describe, index, inode, abandon_on_cancel=True, limiter=self._limiter
        )


_Described = tuple[int, tuple[str, ...], str | None]  # pid, command line, executable


def _describe(index: FdIndex, inode: int) -> _Described | None:
    pid = index.holder(inode)
    if pid is None:
        return None
    return pid, read_cmdline(pid, proc_root=index.proc_root) or (), read_exe(index.proc_root, pid)
