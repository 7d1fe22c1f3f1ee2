"""One walk of every process's open sockets, for many lookups.

Layer: standard library and `host.localproc` only; blocking (run in a worker thread).

`localproc.process_of_inode` walks the fd tables for one socket each time. That is right for an
accepted debugger, once in a while; it is quadratic for the scan when hundreds of VMs open
their ports at once, each lookup walking the fd table of the simulator or JVM that holds the
other hundreds of sockets. `FdIndex` is one walk: which process holds each socket inode, and
under which fd number. An answer from an older walk is checked with one ``readlink`` of that
very fd before it is believed (the fd may have been closed and reused). Its counterpart for the
socket tables is `localproc.SocketTable`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from ddmd.host.localproc import list_pids

__all__ = ["FdIndex"]


@dataclass(slots=True)
class FdIndex:
    """One walk of every readable process's fd table: socket inode -> (pid, fd name)."""

    proc_root: str = "/proc"
    _holders: dict[int, tuple[int, str]] = field(default_factory=dict)

    @classmethod
    def read(cls, proc_root: str = "/proc") -> FdIndex:
        holders: dict[int, tuple[int, str]] = {}
        pids = list_pids(proc_root)
        own = os.getpid()
        # This process last: another process holding the same socket (inherited) is the one
        # looked for; ddmd's own table is also the longest (a socket per VM).
        pids.sort(key=lambda pid: pid == own)
        for pid in pids:
            for fd, inode in _sockets_of(proc_root, pid):
                holders.setdefault(inode, (pid, fd))
        return cls(proc_root, holders)

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
