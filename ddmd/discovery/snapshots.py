"""Whole readings of the socket tables and of every process's open sockets, for many lookups.

Layer: standard library and `discovery.localproc` only; blocking (run in a worker thread).

`localproc`'s functions answer one question each, reading the tables (and, for a pid, every
process's fd table) each time. That is right for an accepted debugger, once in a while; it is
quadratic for the scan when hundreds of VMs open their ports at once: each VM's lookup read a
socket table holding a row per VM, then the fd table of the simulator or JVM that holds the
other hundreds of sockets. Here one reading serves every lookup that waits for it:

- `SocketTable`: every row of ``net/tcp`` and ``net/tcp6``, keyed by both ends' addresses and by
  listening port;
- `FdIndex`: which process holds each socket inode (and under which fd number), from one walk of
  every readable process's fd table. An answer from an older walk is checked with one
  ``readlink`` of that very fd before it is believed (the fd may have been closed and reused).

Same answers as `localproc.peer_owner`, `connected_socket` and `listening_socket`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

from ddmd.discovery.localproc import (
    ESTABLISHED,
    LISTEN,
    TIME_WAIT,
    ByteOrder,
    IpAddress,
    PeerOwner,
    Row,
    SocketOwner,
    list_pids,
    open_tables,
    parse_host,
    parse_row,
    wildcard_serves,
)

__all__ = ["FdIndex", "SocketTable"]

_Ends = tuple[IpAddress, int, IpAddress, int]  # local address and port, remote address and port


@dataclass(slots=True)
class SocketTable:
    """One reading of the socket tables. ``readable`` is False when no table could be opened
    (not Linux, or ``/proc`` hidden): every answer is then "unreadable" / None."""

    readable: bool = False
    _by_ends: dict[_Ends, Row] = field(default_factory=dict)
    _listening: dict[int, list[Row]] = field(default_factory=dict)

    @classmethod
    def read(cls, proc_root: str = "/proc", byteorder: ByteOrder = sys.byteorder) -> SocketTable:
        tables = open_tables(proc_root)
        if tables is None:
            return cls()
        table = cls(readable=True)
        with tables:
            for line in tables.lines():
                row = parse_row(line, byteorder)
                if row is not None:
                    table._add(row)
        return table

    def _add(self, row: Row) -> None:
        if row.state == LISTEN:
            if row.inode != 0:
                self._listening.setdefault(row.local_port, []).append(row)
            return
        ends = (row.local, row.local_port, row.remote, row.remote_port)
        known = self._by_ends.get(ends)
        # A live socket wins over a closed one with the same ends (a TIME_WAIT left behind).
        if known is None or _closed(known):
            self._by_ends[ends] = row

    def peer_owner(self, ours: tuple[str, int], peer: tuple[str, int]) -> PeerOwner:
        """Who holds the far end of one of our connections (`localproc.peer_owner`)."""
        if not self.readable:
            return PeerOwner(None, "unreadable")
        our_host, peer_host = parse_host(ours[0]), parse_host(peer[0])
        if our_host is None or peer_host is None:
            return PeerOwner(None, "absent")
        row = self._by_ends.get((peer_host, peer[1], our_host, ours[1]))
        if row is None:
            return PeerOwner(None, "absent")
        if _closed(row):
            return PeerOwner(None, "closed")
        return PeerOwner(row.uid, "found")

    def connected(self, local: tuple[str, int], remote: tuple[str, int]) -> SocketOwner | None:
        """The ESTABLISHED socket whose own end is ``local`` and whose peer is ``remote``."""
        local_host, remote_host = parse_host(local[0]), parse_host(remote[0])
        if local_host is None or remote_host is None:
            return None
        row = self._by_ends.get((local_host, local[1], remote_host, remote[1]))
        if row is None or row.state != ESTABLISHED or row.inode == 0:
            return None
        return SocketOwner(row.inode, row.uid)

    def listening(self, host: str, port: int) -> SocketOwner | None:
        """The LISTEN socket accepting connections to ``host:port`` (`listening_socket`)."""
        target = parse_host(host)
        if target is None:
            return None
        wildcard: SocketOwner | None = None
        for row in self._listening.get(port, ()):
            if row.local == target:
                return SocketOwner(row.inode, row.uid)
            if wildcard is None and wildcard_serves(row.local, target):
                wildcard = SocketOwner(row.inode, row.uid)
        return wildcard


def _closed(row: Row) -> bool:
    return row.inode == 0 or row.state == TIME_WAIT


@dataclass(slots=True)
class FdIndex:
    """One walk of every readable process's fd table: socket inode -> (pid, fd name)."""

    proc_root: str = "/proc"
    _holders: dict[int, tuple[int, str]] = field(default_factory=dict)

    @classmethod
    def read(cls, proc_root: str = "/proc") -> FdIndex:
        index = cls(proc_root)
        pids = list_pids(proc_root)
        own = os.getpid()
        # This process last: another process holding the same socket (inherited) is the one
        # looked for; ddmd's own table is also the longest (a socket per VM).
        pids.sort(key=lambda pid: pid == own)
        for pid in pids:
            for fd, inode in _sockets_of(proc_root, pid):
                index._holders.setdefault(inode, (pid, fd))
        return index

    def __len__(self) -> int:
        return len(self._holders)

    def holder(self, inode: int) -> int | None:
        """The pid holding socket ``inode`` now, if this walk saw it; checked with one readlink
        of the fd it was seen under (None when that fd is closed or holds something else now)."""
        seen = self._holders.get(inode)
        if seen is None:
            return None
        pid, fd = seen
        try:
            link = os.readlink(os.path.join(self.proc_root, str(pid), "fd", fd))
        except OSError:
            return None
        return pid if link == f"socket:[{inode}]" else None


def _sockets_of(proc_root: str, pid: int) -> Iterator[tuple[str, int]]:
    """(fd name, socket inode) of each socket process ``pid`` holds; nothing for a process
    that cannot be read or exited meanwhile."""
    try:
        with os.scandir(os.path.join(proc_root, str(pid), "fd")) as entries:
            for entry in entries:
                try:
                    link = os.readlink(entry.path)
                except OSError:
                    continue  # closed meanwhile
                if link.startswith("socket:[") and link.endswith("]"):
                    number = link[8:-1]
                    if number.isdigit():
                        yield entry.name, int(number)
    except OSError:
        return
