"""Which local process owns a TCP socket, and what it is called (the way ``jps`` names JVMs).

Layer: standard library only. What it reads, all under ``proc_root`` (default ``/proc``):

- ``net/tcp`` and ``net/tcp6``: the kernel's socket tables of this network namespace. A row
  gives the local and remote address, the state (``0A`` LISTEN, ``01`` ESTABLISHED), the uid
  that created the socket and its inode. Addresses are hex: each 32-bit word of the address is
  printed as a number in the machine's byte order (so 127.0.0.1 reads ``0100007F`` on x86),
  the port as a plain big-endian number.
- ``[0-9]*/fd/*``: each process's open files; a socket shows as a link to ``socket:[INODE]``.
  Another user's processes cannot be read (without root) and are skipped, as are processes that
  exit during the scan.
- ``PID/cmdline`` and ``PID/exe``: the command line and the executable, for the name.

The socket tables also say who owns a connection's far end (`peer_owner`) and a port's
listener (`listening_owners`): the uid rule of ``ddmd.peers`` and of the scan reads them.

Every function is synchronous and blocking (file reads, one ``readlink`` per open file of every
process: a busy machine has many), so trio callers run it in a worker thread under a deadline;
``give_up_at`` (a ``time.monotonic()`` value) lets the scan stop by itself when that deadline
passed. Linux only: where ``/proc`` has no such files every lookup answers None. Nothing here
raises on missing, unreadable or malformed ``/proc`` content, and nothing logs: "not found" is
an ordinary answer.

Names follow ``jps``: the main class without its package (``a.b.Main`` -> ``Main``), the jar's
file name for ``-jar path/app.jar`` (``app.jar``), the class of ``-m module/a.b.Main``
(``Main``; the module's name when ``-m`` names no class). Where ddmd differs from ``jps``, it is
because ddmd only sees the command line, not the JVM's own record of it:

- a command line using ``@argfiles`` gets no name: the options (perhaps the main class itself)
  are in a file that may have changed since, so ddmd does not guess;
- source-file mode (``java Tool.java``, or ``--source N script``) is named by the file's name,
  ``Tool.java`` (``jps`` shows the launcher's class, ``Main``, for every such program);
- only Java launchers get a name: ``argv[0]``'s base name is ``java`` or ``javaw``, or the
  ``exe`` link's is (a launcher started under another ``argv[0]``). Any other program (a Python
  VM simulator, socat, a container proxy) gets ``name=None``, so a DDM VM's own name stands.
"""

from __future__ import annotations

import ipaddress
import os
import sys
import time
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, TextIO


@dataclass(frozen=True, slots=True)
class LocalProcess:
    """The process behind a local socket: its pid, owner uid, and a jps-style name."""

    pid: int
    uid: int
    name: str | None  # main class, or the jar's file name; None when the command line says neither
    cmdline: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SocketOwner:
    """A socket's row in ``net/tcp``/``net/tcp6``: its inode (to find the process holding it)
    and the uid that created it."""

    inode: int
    uid: int


IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
ByteOrder = Literal["little", "big"]

LISTEN = "0A"
ESTABLISHED = "01"
JAVA_LAUNCHERS = frozenset({"java", "javaw"})

# Launcher options whose value is the next word (``java --help`` and ``--help-extra`` of JDK 17;
# ``--name=value`` is one word and needs no entry). -d/--describe-module and --source too.
OPTIONS_WITH_VALUE = frozenset(
    {
        "-cp",
        "-classpath",
        "--class-path",
        "-p",
        "--module-path",
        "--upgrade-module-path",
        "--add-modules",
        "--enable-native-access",
        "--limit-modules",
        "--add-exports",
        "--add-opens",
        "--add-reads",
        "--patch-module",
        "-d",
        "--describe-module",
        "--source",
    }
)

_HEX = frozenset("0123456789abcdefABCDEF")


@dataclass(frozen=True, slots=True)
class Row:
    local: IpAddress
    local_port: int
    remote: IpAddress
    remote_port: int
    state: str
    uid: int
    inode: int


# --------------------------------------------------------------------------------------------
# Socket tables


def listening_socket(
    host: str,
    port: int,
    *,
    proc_root: str = "/proc",
    byteorder: ByteOrder = sys.byteorder,
) -> SocketOwner | None:
    """The LISTEN socket that accepts connections to ``host:port`` (a numeric address).

    A listener bound to the address itself wins; otherwise a wildcard one (``0.0.0.0`` serves
    IPv4 addresses, ``::`` serves both, as a dual-stack socket does). IPv4-mapped IPv6
    addresses count as their IPv4 address.
    """
    return SocketTable.read(proc_root, byteorder, local_ports={port}).listening(host, port)


def connected_socket(
    local: tuple[str, int],
    remote: tuple[str, int],
    *,
    proc_root: str = "/proc",
    byteorder: ByteOrder = sys.byteorder,
) -> SocketOwner | None:
    """The ESTABLISHED socket whose own end is ``local`` and whose peer is ``remote``.

    For the other end of a connection we made (or accepted), swap the two: the peer's socket
    has local = the peer's address, remote = ours.
    """
    return SocketTable.read(proc_root, byteorder, local_ports={local[1]}).connected(local, remote)


def parse_address(text: str, byteorder: ByteOrder = sys.byteorder) -> tuple[IpAddress, int] | None:
    """``0100007F:1F40`` -> (127.0.0.1, 8000) on a little-endian machine; None if malformed.

    IPv4-mapped IPv6 addresses come back as IPv4 addresses."""
    host_hex, sep, port_hex = text.partition(":")
    if not sep or len(port_hex) != 4 or len(host_hex) not in (8, 32):
        return None
    if not _HEX.issuperset(host_hex) or not _HEX.issuperset(port_hex):
        return None
    raw = b"".join(
        int(host_hex[i : i + 8], 16).to_bytes(4, byteorder) for i in range(0, len(host_hex), 8)
    )
    address: IpAddress = ipaddress.IPv4Address(raw) if len(raw) == 4 else ipaddress.IPv6Address(raw)
    return _plain(address), int(port_hex, 16)


def parse_row(line: str, byteorder: ByteOrder) -> Row | None:
    # "sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode"
    fields = line.split()
    if len(fields) < 10:
        return None  # the header, a blank or truncated line
    local = parse_address(fields[1], byteorder)
    remote = parse_address(fields[2], byteorder)
    state = fields[3].upper()
    uid, inode = _decimal(fields[7]), _decimal(fields[9])
    if local is None or remote is None or uid is None or inode is None:
        return None
    if len(state) != 2 or not _HEX.issuperset(state):
        return None
    return Row(local[0], local[1], remote[0], remote[1], state, uid, inode)


def _decimal(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() else None


def _plain(address: IpAddress) -> IpAddress:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def parse_host(host: str) -> IpAddress | None:
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return _plain(ipaddress.ip_address(text))
    except ValueError:
        return None  # a host name: callers pass the numeric address of their connection


def wildcard_serves(bound: IpAddress, target: IpAddress) -> bool:
    if not bound.is_unspecified:
        return False
    # "::" is dual-stack unless IPV6_V6ONLY was set, which the table does not show: assume it.
    return bound.version == 6 or target.version == 4


# --------------------------------------------------------------------------------------------
# Owners (the peer-uid rule of `ddmd.peers`)

TIME_WAIT = "06"

OwnerStatus = Literal["found", "unreadable", "closed", "absent"]


@dataclass(frozen=True, slots=True)
class PeerOwner:
    """Who holds the far end of a connection, as the socket tables tell it.

    ``uid`` is set when ``status`` is "found". Otherwise: "unreadable" (no socket table could
    be read: not Linux, or ``/proc`` hidden), "closed" (the far end was closed already: the
    kernel keeps such a row without an owner), "absent" (no row for that pair of addresses:
    the far end is on another machine, or gone).
    """

    uid: int | None
    status: OwnerStatus
    inode: int | None = None  # the socket's inode, when the lookup tells it (sock_diag does)


class _Tables:
    """``net/tcp`` and ``net/tcp6``, open, read a line at a time (use it as a context manager).

    Never read whole: under connection churn the tables hold thousands of TIME_WAIT rows (a few
    hundred KB), every accepted connection is checked in a worker thread, and whole-table reads
    in several threads at once left the daemon's resident size tens of MB higher (glibc keeps
    the freed buffers in each thread's arena). A line at a time, nothing large is allocated.
    """

    def __init__(self, files: list[TextIO]) -> None:
        self._files = files

    def lines(self, *, stop_after_listeners: bool = False) -> Iterator[str]:
        """Every line of each table (headers too). ``stop_after_listeners``: a table is left
        at its first row whose state is not LISTEN (see `listening_owners`)."""
        for f in self._files:
            try:
                for line in f:
                    if stop_after_listeners and _past_listeners(line):
                        break
                    yield line
            except OSError:
                continue  # the table went away mid-read: what was read stands

    def __enter__(self) -> _Tables:
        return self

    def __exit__(self, *exc: object) -> None:
        for f in self._files:
            f.close()


def _past_listeners(line: str) -> bool:
    fields = line.split(maxsplit=4)
    return len(fields) >= 4 and fields[0].endswith(":") and fields[3].upper() != LISTEN


def open_tables(proc_root: str) -> _Tables | None:
    """``net/tcp`` and ``net/tcp6``, opened; None when neither can be opened."""
    files: list[TextIO] = []
    for table in ("tcp", "tcp6"):
        path = os.path.join(proc_root, "net", table)
        try:
            files.append(open(path, encoding="ascii", errors="replace"))  # noqa: SIM115
        except OSError:
            continue
    return _Tables(files) if files else None


def socket_tables_readable(proc_root: str = "/proc") -> bool:
    """True when at least one of ``net/tcp``/``net/tcp6`` can be read (Linux)."""
    tables = open_tables(proc_root)
    if tables is None:
        return False
    with tables:
        return True


def _port_suffix(port: int) -> str:
    return f":{port:04X}"


_Ends = tuple[IpAddress, int, IpAddress, int]  # local address and port, remote address and port


@dataclass(slots=True)
class SocketTable:
    """One reading of the socket tables. ``readable`` is False when no table could be opened
    (not Linux, or ``/proc`` hidden): every answer is then "unreadable" / None."""

    readable: bool = False
    _by_ends: dict[_Ends, Row] = field(default_factory=dict)
    _listening: dict[int, list[Row]] = field(default_factory=dict)

    @classmethod
    def read(
        cls,
        proc_root: str = "/proc",
        byteorder: ByteOrder = sys.byteorder,
        *,
        local_ports: Collection[int] | None = None,
    ) -> SocketTable:
        """Both tables, whole, or with ``local_ports`` only the rows whose own end has one of
        those ports (the others are skipped before parsing: with hundreds of VMs, or under
        connection churn, the tables are long)."""
        tables = open_tables(proc_root)
        if tables is None:
            return cls()
        table = cls(readable=True)
        suffixes = None if local_ports is None else {_port_suffix(p) for p in local_ports}
        with tables:
            for line in tables.lines():
                if suffixes is not None:
                    fields = line.split(None, 2)
                    if len(fields) < 2 or fields[1][-5:].upper() not in suffixes:
                        continue
                row = parse_row(line, byteorder)
                if row is not None:
                    table.add(row)
        return table

    def add(self, row: Row) -> None:
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


def peer_owner(
    ours: tuple[str, int],
    peer: tuple[str, int],
    *,
    proc_root: str = "/proc",
    byteorder: ByteOrder = sys.byteorder,
) -> PeerOwner:
    """The owner of the socket at the far end of one of our connections.

    ``ours`` is our end's address (``getsockname()``), ``peer`` the far end's
    (``getpeername()``); both numeric. The far end's row has local = ``peer`` and remote =
    ``ours``, in any state but LISTEN: a peer that already sent its bytes and half-closed
    (FIN_WAIT) still has its owner. Rows without an owner, TIME_WAIT rows and those of sockets
    their process already closed (inode 0, where the uid column reads 0), answer "closed": such
    a row never counts as root's. Only lines whose port matches are parsed, so a machine with
    many sockets costs one read of each table and a string comparison per line.
    """
    return SocketTable.read(proc_root, byteorder, local_ports={peer[1]}).peer_owner(ours, peer)


def listening_owners(
    host: str,
    ports: Collection[int],
    *,
    proc_root: str = "/proc",
    byteorder: ByteOrder = sys.byteorder,
    listeners_first: bool = False,
) -> dict[int, int] | None:
    """For each of ``ports`` with a LISTEN socket that accepts connections to ``host`` (a
    numeric address), the uid that created that socket: the same choice as
    `listening_socket` (a listener bound to the address itself wins over a wildcard one), for
    many ports in one read of the tables. None when no table can be read or ``host`` is not
    numeric.

    ``listeners_first``: stop reading each table at its first row in another state. Linux
    prints a table's listening sockets before its connections (it walks the listening hash,
    then the established one), so this reads a few rows where a busy machine has thousands;
    on a kernel that did not, some listeners would be missed: for a fast path only, never
    for a rule."""
    target = parse_host(host)
    if target is None:
        return None
    tables = open_tables(proc_root)
    if tables is None:
        return None
    wanted = set(ports)
    wanted_hex = {f"{port:04X}" for port in wanted}
    listeners: list[tuple[IpAddress, int, int]] = []
    with tables:
        for line in tables.lines(stop_after_listeners=listeners_first):
            # Cheap tests first: most rows of a busy machine are connections on other ports.
            fields = line.split(maxsplit=4)
            if len(fields) < 4 or fields[3].upper() != LISTEN:
                continue
            if fields[1][-4:].upper() not in wanted_hex:
                continue
            row = parse_row(line, byteorder)
            if row is not None and row.state == LISTEN and row.inode != 0:
                listeners.append((row.local, row.local_port, row.uid))
    return choose_listeners(listeners, target, wanted)


def choose_listeners(
    listeners: Iterable[tuple[IpAddress, int, int]], target: IpAddress, wanted: Collection[int]
) -> dict[int, int]:
    """port -> uid of the listener that accepts connections to ``target`` on each of the
    ``wanted`` ports, from (bound address, port, uid) of listening sockets: one bound to the
    address itself wins over a wildcard one, as in `SocketTable.listening`."""
    exact: dict[int, int] = {}
    wildcard: dict[int, int] = {}
    for address, port, uid in listeners:
        if port not in wanted:
            continue
        if address == target:
            exact.setdefault(port, uid)
        elif wildcard_serves(address, target):
            wildcard.setdefault(port, uid)
    return {**wildcard, **exact}


# --------------------------------------------------------------------------------------------
# Processes


def process_of_inode(
    inode: int,
    *,
    uid: int | None = None,
    proc_root: str = "/proc",
    give_up_at: float | None = None,
) -> int | None:
    """The pid of a process holding socket ``inode`` open, None if none can be seen.

    Processes owned by ``uid`` (the socket's creator, when known) are looked at first, so the
    usual case reads few fd tables. Processes that cannot be read are skipped. With
    ``give_up_at`` (a ``time.monotonic()`` value) the scan stops once that time has passed.
    """
    if inode <= 0:
        return None
    link = f"socket:[{inode}]"
    pids = list_pids(proc_root)
    if uid is not None:
        pids.sort(key=lambda pid: _owner(proc_root, pid) != uid)  # stable: owner's first
    # This process last: a monitor holds one socket per VM, the longest fd table to read,
    # and the socket looked for is normally another process's.
    own = os.getpid()
    if own in pids:
        pids.remove(own)
        pids.append(own)
    for pid in pids:
        if give_up_at is not None and time.monotonic() > give_up_at:
            return None
        if _holds(proc_root, pid, link):
            return pid
    return None


def list_pids(proc_root: str) -> list[int]:
    try:
        names = os.listdir(proc_root)
    except OSError:
        return []
    return [int(n) for n in names if n.isascii() and n.isdigit()]


def _owner(proc_root: str, pid: int) -> int | None:
    try:
        return os.stat(os.path.join(proc_root, str(pid))).st_uid
    except OSError:
        return None


def _holds(proc_root: str, pid: int, link: str) -> bool:
    try:
        with os.scandir(os.path.join(proc_root, str(pid), "fd")) as entries:
            for entry in entries:
                try:
                    if os.readlink(entry.path) == link:
                        return True
                except OSError:
                    continue  # closed meanwhile, or not a link
    except OSError:
        return False  # another user's process, or one that exited (the scan continues)
    return False


def read_cmdline(pid: int, *, proc_root: str = "/proc") -> tuple[str, ...] | None:
    """The process's arguments (``/proc/PID/cmdline``); None when it cannot be read."""
    try:
        with open(os.path.join(proc_root, str(pid), "cmdline"), "rb") as f:
            raw = f.read(1 << 20)
    except OSError:
        return None
    words = raw.split(b"\0")
    if words and words[-1] == b"":
        words.pop()  # the terminating NUL
    return tuple(w.decode("utf-8", "replace") for w in words)


def read_exe(proc_root: str, pid: int) -> str | None:
    try:
        return os.readlink(os.path.join(proc_root, str(pid), "exe"))
    except OSError:
        return None  # another user's process, a kernel thread, or gone


# --------------------------------------------------------------------------------------------
# Names


def java_name(cmdline: Sequence[str], *, exe: str | None = None) -> str | None:
    """The ``jps``-style name of a Java launcher's command line; None for anything else.

    ``java [options] a.b.Main args`` -> ``Main``; ``-jar dir/app.jar`` -> ``app.jar``;
    ``-m mod/a.b.Main`` (or ``--module``) -> ``Main``, ``-m mod`` -> ``mod``; ``Tool.java``
    (source-file mode) -> ``Tool.java``. None when the program is not a Java launcher (by
    ``argv[0]`` or ``exe``), when an ``@argfile`` stands among the options, or when no main
    class follows them.
    """
    if not cmdline or not (_is_java(cmdline[0]) or (exe is not None and _is_java(exe))):
        return None
    words = iter(cmdline[1:])
    source_mode = False
    for word in words:
        if word.startswith("@"):
            return None  # an argument file: what it holds is not on the command line
        if word == "-jar":
            return _base_name(next(words, ""))
        if word in ("-m", "--module"):
            return _module_main(next(words, ""))
        if word.startswith("--module="):
            return _module_main(word.removeprefix("--module="))
        if word == "--source" or word.startswith("--source="):
            source_mode = True
        if word in OPTIONS_WITH_VALUE:
            if next(words, None) is None:
                return None
            continue
        if word.startswith("-"):
            continue  # a JVM or launcher option in one word (-Xmx1g, -Dk=v, -agentlib:...)
        if source_mode or word.endswith(".java"):
            return _base_name(word)
        return _simple_class(word)
    return None


def _is_java(path: str) -> bool:
    return os.path.basename(path) in JAVA_LAUNCHERS


def _base_name(path: str) -> str | None:
    return os.path.basename(path.rstrip("/")) or None


def _simple_class(name: str) -> str | None:
    return name.replace("/", ".").rsplit(".", 1)[-1] or None


def _module_main(spec: str) -> str | None:
    module, _, main_class = spec.partition("/")
    if main_class:
        return _simple_class(main_class)
    return module or None


# --------------------------------------------------------------------------------------------
# Together


def find_listener(
    host: str,
    port: int,
    *,
    client: tuple[str, int] | None = None,
    proc_root: str = "/proc",
    give_up_at: float | None = None,
) -> LocalProcess | None:
    """The local process serving ``host:port`` (numeric address), with its ``jps`` name.

    With ``client`` (the local address of a connection we opened to ``host:port``), the process
    holding the accepted end of that connection is preferred: a JDWP agent closes its listening
    socket once it accepted one connection, so after a successful probe only that end is left.
    Otherwise (or if it is not found) the LISTEN socket is used. The ``uid`` is the socket's
    (the user that created it). None when the socket or its process cannot be found or read,
    never an exception.
    """
    try:
        owner = None
        if client is not None:
            owner = connected_socket((host, port), client, proc_root=proc_root)
        if owner is None:
            owner = listening_socket(host, port, proc_root=proc_root)
        if owner is None:
            return None
        pid = process_of_inode(
            owner.inode, uid=owner.uid, proc_root=proc_root, give_up_at=give_up_at
        )
        if pid is None:
            return None
        cmdline = read_cmdline(pid, proc_root=proc_root) or ()
        name = java_name(cmdline, exe=read_exe(proc_root, pid))
        return LocalProcess(pid=pid, uid=owner.uid, name=name, cmdline=cmdline)
    except (OSError, ValueError):
        return None  # belt and braces: the helpers already answer None for what /proc holds
