"""Who may connect to ddmd, and whose VMs it adopts: the peer-uid rule.

Layer: imports config, logs and `host.localproc` (the kernel's socket tables; standard
library only), plus trio for the listener wrapper. Used by `drive.ports` (per-VM ports and the
current-VM port), `control.server` (the control API), `discovery.scan` (whose JVMs are adopted)
and `daemon` (wiring).

JDWP lets whoever connects run code in the VM, and every local user can reach 127.0.0.1. So
every connection ddmd accepts is checked before a byte of it is read or answered:

- **TCP**: the kernel records which uid created each socket (``/proc/net/tcp`` and ``tcp6``, the
  ``uid`` column). The connecting socket is the row whose local address is our accepted
  socket's remote address and whose remote address is ours (`localproc.peer_owner`).
- **Unix sockets**: ``SO_PEERCRED`` gives the connecting process's uid.

Allowed: ddmd's own uid, root (0; root can read ddmd's memory anyway), and ``[security]
allowed_uids``. Where the owner cannot be known (no socket table: not Linux; or a peer on
another machine, possible only with ``[security] allow_non_loopback``), ``[security]
unknown_peer`` decides ("allow" by default; the daemon warns once at start when the tables
cannot be read at all). A local peer whose row is missing or has no owner (it closed its end
already: the kernel then shows uid 0, which must never pass for root) is refused: a live local
peer always has its row, so only a peer that is gone or hiding lands there.

A refused connection is closed at once. It is logged as ``security.peer_refused`` (uid, user,
port, port_kind, reason, count) at most once per (uid, port) every `REFUSED_LOG_INTERVAL`
seconds (``count``: the refusals since the previous line) and counted per kind of port for
``ddmd_peers_refused_total``. The user's name (the user database may ask a network directory)
is looked up in a worker thread, and only for the lines written: a refusal that only adds to a
count costs nothing more.

Admission (`GuardedListener.serve`). The owner of one connection is asked of the kernel over
netlink (`sockdiag.OwnerAsker`: one socket by its four ends, over a netlink socket kept open),
and the kernel answers within the request's own syscall: the whole check takes about 10 µs,
less than handing the question to a worker thread would cost. So each connection is judged in
the accept loop as it is accepted (`PeerGuard.check_now`), without blocking (an answer not
there at once counts as none): an allowed peer is handed on, any other closed, before the next
accept. Nothing waits in ddmd; what waits is in the kernel's queue of the listening socket, in
the order it came, so a flood from one user, idle or refused, is worked through at that rate
and cannot push anyone's connection out: it costs the next client the flood's checks, never its
place. Unix sockets are judged in line too (``SO_PEERCRED``).

Only where netlink cannot answer (not Linux; a sandbox without ``NETLINK_SOCK_DIAG``) are the
socket tables read: blocking file I/O whose cost grows with the number of sockets on the
machine (milliseconds), in a worker thread (`LOOKUP_THREADS` at once), apart from the accept
loop, under `LOOKUP_TIMEOUT`; a lookup that overruns it refuses the peer (an attacker must not
get in by making the lookup slow). At most `MAX_PENDING` connections per listener wait for
such a lookup; then the listener stops accepting until one is settled, so the next
connections wait in the kernel's queue, in order. No connection is ever closed unchecked: a
listener that closed the newest past a bound let a flood crowd out adb, jdb or the API.

Why a wrapped listener: the check must run between accept() and the first read. For the JDWP
ports that is ddmd's own accept loop; the control API is served by hypercorn, which has no
accept hook, and an ASGI middleware runs only after the request was read, with nothing left but
answering it (hypercorn sends a 500 for an app that returns without a response). So the control
API runs hypercorn's connection handler on ddmd's own listeners (`control.server`), and all
three kinds of port go through `GuardedListener`, whose accept() returns only admitted
connections.
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import socket
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Final, Literal

import structlog
import trio

from ddmd.config import SecurityConfig
from ddmd.host import localproc, sockdiag
from ddmd.host.localproc import PeerOwner
from ddmd.logs import Event

__all__ = [
    "LOOKUP_TIMEOUT",
    "MAX_PENDING",
    "PORT_KINDS",
    "GuardedListener",
    "PeerGuard",
    "PeerPolicy",
    "PortKind",
    "RefusalLine",
    "Verdict",
    "check_now",
    "check_peer",
    "find_owner",
    "is_local_peer",
    "look_up",
    "user_name",
    "warn_if_unchecked",
]

log = structlog.get_logger("ddmd.peers")

# "front": the adb front's own port; "front_forward": the ports of its JDWP forwards.
PortKind = Literal["vm_port", "current_port", "control", "front", "front_forward"]
PORT_KINDS: Final[tuple[PortKind, ...]] = (
    "vm_port",
    "current_port",
    "control",
    "front",
    "front_forward",
)

#: Seconds for one owner lookup in a worker thread (the socket tables) before the peer is
#: refused; also the most a refusal line waits for the user's name.
LOOKUP_TIMEOUT: Final = 2.0
#: Lookups in worker threads at once (a read of the socket tables where netlink cannot answer;
#: the user's name for a refusal line).
LOOKUP_THREADS: Final = 4
#: Accepted connections per listener waiting for (or in) a lookup in a worker thread. When that
#: many wait, the listener accepts no more until one is settled: the next connections wait in
#: the kernel's queue of the listening socket, in the order they came, and none is closed
#: unchecked. Only a check the kernel cannot answer in line (no netlink) waits at all.
MAX_PENDING: Final = 256
#: Seconds between two ``security.peer_refused`` lines for the same uid and port (the later
#: one carries the count of refusals since the previous line).
REFUSED_LOG_INTERVAL: Final = 10.0

#: The socket tables' answer for one connection: (ours, peer, proc_root) -> owner.
TableLookup = Callable[[tuple[str, int], tuple[str, int], str], PeerOwner]
#: The kernel's answer without blocking: (peer, ours) -> owner, None when it gives none.
QuickLookup = Callable[[tuple[str, int], tuple[str, int]], PeerOwner | None]


def _ask_once(peer: tuple[str, int], ours: tuple[str, int]) -> PeerOwner | None:
    return sockdiag.connection_owner(peer, ours, wait=False)


def _read_tables(ours: tuple[str, int], peer: tuple[str, int], proc_root: str) -> PeerOwner:
    return localproc.peer_owner(ours, peer, proc_root=proc_root)


def find_owner(
    ours: tuple[str, int],
    peer: tuple[str, int],
    proc_root: str = "/proc",
    tables: TableLookup = _read_tables,
) -> PeerOwner:
    """The owner of the far end of one of our TCP connections: asked of the kernel for that one
    socket (sock_diag), or read from the socket tables where netlink cannot answer (or a test
    gave another ``proc_root``). Blocking: run it in a worker thread."""
    if proc_root == "/proc":
        owner = sockdiag.connection_owner(peer, ours)
        if owner is not None:
            return owner
    return tables(ours, peer, proc_root)


def user_name(uid: int | None) -> str | None:
    """The user's name, None when the user database does not know the uid."""
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return None


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a peer may stay, its uid when known, and why (for the log)."""

    allowed: bool
    uid: int | None
    reason: str
    user: str | None = None
    # The peer closed its end before it could be checked (a browser's spare connection): it
    # is refused all the same, but it is gone, so it is not news (debug level, not a warning).
    gone: bool = False


@dataclass(frozen=True, slots=True)
class _Facts:
    """What the accepted socket itself tells (read in the trio thread: plain syscalls)."""

    family: int
    ours: tuple[str, int] | None = None
    peer: tuple[str, int] | None = None
    peer_uid: int | None = None  # SO_PEERCRED of a unix socket
    where: str | int = "?"  # the port (or socket path) for the log


@dataclass(frozen=True, slots=True)
class PeerPolicy:
    """The rule: which uids may connect, and what to do when the owner cannot be known."""

    allowed: frozenset[int]
    unknown: Literal["allow", "refuse"] = "allow"

    @classmethod
    def from_config(cls, security: SecurityConfig) -> PeerPolicy:
        own = {os.getuid(), os.geteuid(), 0}
        return cls(frozenset(own | set(security.allowed_uids)), security.unknown_peer)

    def uid_allowed(self, uid: int) -> bool:
        return uid in self.allowed

    def judge_owner(self, owner: PeerOwner, *, local_peer: bool) -> Verdict:
        """The verdict on a TCP peer from its row in the socket tables."""
        if owner.status == "found" and owner.uid is not None:
            if self.uid_allowed(owner.uid):
                return Verdict(True, owner.uid, "allowed uid")
            return Verdict(False, owner.uid, "its user is not allowed ([security] allowed_uids)")
        if owner.status == "unreadable" or not local_peer:
            why = (
                "no socket table to find its owner in"
                if owner.status == "unreadable"
                else "it is on another machine"
            )
            allowed = self.unknown == "allow"
            return Verdict(allowed, None, f"owner unknown ({why}): [security] unknown_peer")
        if owner.status == "closed":
            return Verdict(
                False, None, "it closed its end before its owner could be checked", gone=True
            )
        return Verdict(False, None, "its socket is not in the socket tables (gone)")

    def judge_now(self, facts: _Facts, ask: QuickLookup = _ask_once) -> Verdict | None:
        """The verdict had in line, without blocking: a unix socket's (``SO_PEERCRED``), and a
        TCP peer's whenever the kernel answers the sock_diag request for its one socket, which
        it does within the syscall (microseconds; a worker thread would cost more than the
        lookup): allowed, refused, closed or absent alike. None only where netlink gives no
        answer: `judge` then reads the socket tables in a worker thread. ``ask``: the kernel's
        answer (`PeerGuard` passes its `sockdiag.OwnerAsker`)."""
        if facts.family == socket.AF_UNIX:
            return self._judge_unix(facts.peer_uid)
        if facts.ours is None or facts.peer is None:
            return self._judge_unknown()
        owner = ask(facts.peer, facts.ours)
        if owner is None:
            return None
        return self.judge_owner(owner, local_peer=is_local_peer(facts.peer[0], facts.ours[0]))

    def judge(self, facts: _Facts, proc_root: str, tables: TableLookup = _read_tables) -> Verdict:
        """Blocking (sock_diag, else the socket tables): run in a worker thread."""
        if facts.family == socket.AF_UNIX:
            return self._judge_unix(facts.peer_uid)
        if facts.ours is None or facts.peer is None:
            return self._judge_unknown()
        owner = find_owner(facts.ours, facts.peer, proc_root, tables)
        return self.judge_owner(owner, local_peer=is_local_peer(facts.peer[0], facts.ours[0]))

    def _judge_unix(self, peer_uid: int | None) -> Verdict:
        if peer_uid is None:
            return Verdict(
                self.unknown == "allow",
                None,
                "owner unknown (no SO_PEERCRED here): [security] unknown_peer",
            )
        if self.uid_allowed(peer_uid):
            return Verdict(True, peer_uid, "allowed uid")
        return Verdict(False, peer_uid, "its user is not allowed ([security] allowed_uids)")

    def _judge_unknown(self) -> Verdict:
        return Verdict(self.unknown == "allow", None, "owner unknown: [security] unknown_peer")


def is_local_peer(peer: str, ours: str) -> bool:
    """A peer on this machine: loopback, or the very address it connected to."""
    if peer == ours:
        return True
    try:
        address = ipaddress.ip_address(peer.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback:
        return True
    try:
        mine = ipaddress.ip_address(ours.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(mine, ipaddress.IPv6Address) and mine.ipv4_mapped is not None:
        mine = mine.ipv4_mapped
    return address == mine


def _facts(sock: trio.socket.SocketType) -> _Facts:
    """Raises OSError when the peer is gone already (getpeername)."""
    family = sock.family
    if family == socket.AF_UNIX:
        uid: int | None = None
        option = getattr(socket, "SO_PEERCRED", None)
        if option is not None:
            creds = sock.getsockopt(socket.SOL_SOCKET, option, _UCRED.size)
            uid = int(_UCRED.unpack(creds)[1])
        path = sock.getsockname()
        return _Facts(family, peer_uid=uid, where=f"unix:{path}" if path else "unix")
    if family in (socket.AF_INET, socket.AF_INET6):
        ours = sock.getsockname()
        peer = sock.getpeername()
        return _Facts(family, (ours[0], ours[1]), (peer[0], peer[1]), where=int(ours[1]))
    return _Facts(family)


#: struct ucred (pid_t pid; uid_t uid; gid_t gid), in the machine's byte order.
_UCRED: Final = struct.Struct("=iII")


class PeerGuard:
    """The rule applied to accepted connections, with the refusal counts and the once-only
    log. One per daemon; every listener shares it."""

    def __init__(
        self,
        policy: PeerPolicy,
        *,
        proc_root: str = "/proc",
        lookup_timeout: float = LOOKUP_TIMEOUT,
        tables: TableLookup = _read_tables,
        max_pending: int = MAX_PENDING,
    ) -> None:
        self.policy = policy
        self.max_pending = max(1, max_pending)
        self._proc_root = proc_root
        self._timeout = lookup_timeout
        self._tables = tables
        self._limiter = trio.CapacityLimiter(LOOKUP_THREADS)
        # One netlink socket kept open for the in-line checks (they all run in the event loop).
        self._ask = sockdiag.OwnerAsker()
        self._refused: dict[str, int] = dict.fromkeys(PORT_KINDS, 0)
        # (uid, port) -> (when its last line was logged, refusals since then not logged)
        self._logged: dict[tuple[int | None, str | int], tuple[float, int]] = {}

    def refused_counts(self) -> Mapping[str, int]:
        """Refused connections so far, per kind of port (for /metrics)."""
        return dict(self._refused)

    def check_now(self, stream: trio.SocketStream) -> tuple[Verdict | None, _Facts]:
        """The verdict on the peer of `stream` where it can be had without blocking (nearly
        always: `PeerPolicy.judge_now`), with what the socket told; None when it needs
        `look_up`. Never raises: a check that fails refuses."""
        return check_now(self.policy, stream, proc_root=self._proc_root, ask=self._ask)

    async def look_up(self, facts: _Facts) -> Verdict:
        """The verdict `check_now` could not give: the owner looked up in a worker thread under
        the lookup timeout. Never raises but Cancelled."""
        return await look_up(
            self.policy,
            facts,
            proc_root=self._proc_root,
            limiter=self._limiter,
            lookup_timeout=self._timeout,
            tables=self._tables,
        )

    async def admit(self, stream: trio.SocketStream, kind: PortKind) -> bool:
        """True when the peer of `stream` may stay; a refusal is counted and logged (at most one
        line per uid and port every `REFUSED_LOG_INTERVAL`). Never raises but Cancelled: a
        check that fails refuses."""
        verdict, facts = self.check_now(stream)
        if verdict is None:
            verdict = await self.look_up(facts)
        if verdict.allowed:
            return True
        line = self.refuse(verdict, facts.where, kind)
        if line is not None:
            await self.report(line)
        return False

    def refuse(self, verdict: Verdict, where: str | int, kind: PortKind) -> RefusalLine | None:
        """Count one refused connection; the ``security.peer_refused`` line to write (with
        `report`) when one is due, None when this refusal only adds to the next line's count.
        The first refusal of a uid at a port is written at once, the following ones in one line
        (``count``) at most every `REFUSED_LOG_INTERVAL` seconds, so a flood of refused
        connections costs a line, not a thousand, and the user's name is looked up only for
        the lines written."""
        self._refused[kind] = self._refused.get(kind, 0) + 1
        if verdict.gone:
            log.debug(Event.SECURITY_PEER_GONE, port=where, port_kind=kind, reason=verdict.reason)
            return None
        key = (verdict.uid, where)
        now = trio.current_time()
        last = self._logged.get(key)
        if last is not None and now - last[0] < REFUSED_LOG_INTERVAL:
            self._logged[key] = (last[0], last[1] + 1)
            return None
        count = 1 if last is None else last[1] + 1
        self._logged[key] = (now, 0)
        if len(self._logged) > 4096:  # many ports and uids over a long run: forget the oldest
            del self._logged[next(iter(self._logged))]
        return RefusalLine(verdict, where, kind, count)

    async def report(self, line: RefusalLine) -> None:
        """Write a line that `refuse` found due, naming the user (the user database may ask a
        network directory: looked up in a worker thread, and left out when that overruns the
        lookup timeout or the listener stops meanwhile: the line is written all the same)."""
        user = line.verdict.user
        try:
            if user is None and line.verdict.uid is not None:
                with trio.move_on_after(self._timeout):
                    user = await trio.to_thread.run_sync(
                        user_name, line.verdict.uid, abandon_on_cancel=True, limiter=self._limiter
                    )
        finally:
            log.warning(
                Event.SECURITY_PEER_REFUSED,
                uid=line.verdict.uid,
                user=user,
                port=line.where,
                port_kind=line.kind,
                reason=line.verdict.reason,
                count=line.count,
            )


@dataclass(frozen=True, slots=True)
class RefusalLine:
    """A ``security.peer_refused`` line due (`PeerGuard.refuse`), to be written by
    `PeerGuard.report`."""

    verdict: Verdict
    where: str | int
    kind: PortKind
    count: int


def check_now(
    policy: PeerPolicy,
    stream: trio.SocketStream,
    *,
    proc_root: str = "/proc",
    ask: QuickLookup = _ask_once,
) -> tuple[Verdict | None, _Facts]:
    """The verdict on the far end of `stream` had in line (`PeerPolicy.judge_now`; with a
    ``proc_root`` other than ``/proc``, a test's, only `look_up` answers), or None, and what the
    socket told (its ``where``: our port or socket path, for the log). Never raises."""
    try:
        facts = _facts(stream.socket)
    except OSError:
        closed = "it closed the connection before it could be checked"
        return Verdict(False, None, closed, gone=True), _Facts(stream.socket.family)
    if proc_root != "/proc":
        return None, facts
    try:
        return policy.judge_now(facts, ask), facts
    except Exception as exc:  # a bug must refuse, never let a peer in or stop a port
        return Verdict(False, None, f"the check failed: {type(exc).__name__}: {exc}"), facts


async def look_up(
    policy: PeerPolicy,
    facts: _Facts,
    *,
    proc_root: str = "/proc",
    limiter: trio.CapacityLimiter | None = None,
    lookup_timeout: float = LOOKUP_TIMEOUT,
    tables: TableLookup = _read_tables,
) -> Verdict:
    """The verdict from `PeerPolicy.judge` in a worker thread; a lookup that overruns
    `lookup_timeout` or fails refuses. Never raises but Cancelled."""
    verdict = Verdict(False, None, f"its owner could not be found within {lookup_timeout:g} s")
    try:
        with trio.move_on_after(lookup_timeout):
            verdict = await trio.to_thread.run_sync(
                partial(policy.judge, facts, proc_root, tables),
                abandon_on_cancel=True,
                limiter=limiter,
            )
    except Exception as exc:  # a bug must refuse, never let a peer in or stop a port
        verdict = Verdict(False, None, f"the check failed: {type(exc).__name__}: {exc}")
    return verdict


async def check_peer(
    policy: PeerPolicy,
    stream: trio.SocketStream,
    *,
    proc_root: str = "/proc",
    limiter: trio.CapacityLimiter | None = None,
    lookup_timeout: float = LOOKUP_TIMEOUT,
    tables: TableLookup = _read_tables,
) -> tuple[Verdict, str | int]:
    """The verdict on the far end of `stream` (a connection we accepted, or one we opened),
    and our port (or socket path) for the log: in line where it can be had (`check_now`), else
    looked up in a worker thread (`look_up`)."""
    verdict, facts = check_now(policy, stream, proc_root=proc_root)
    if verdict is None:
        verdict = await look_up(
            policy,
            facts,
            proc_root=proc_root,
            limiter=limiter,
            lookup_timeout=lookup_timeout,
            tables=tables,
        )
    return verdict, facts.where


class GuardedListener(trio.abc.Listener[trio.SocketStream]):
    """A `trio.SocketListener` whose connections are handed on only when the guard admits
    them; the others are closed before anything is read from them or written to them.

    `serve` judges each connection as it accepts it, in line (`PeerGuard.check_now`: one
    sock_diag request, microseconds): an allowed one is handed on, a refused one closed, before
    the next accept, so nothing queues behind a flood but the kernel's own queue, in arrival
    order. Only a connection the kernel cannot answer for in line (no netlink) is looked up in
    a worker thread, concurrently and apart from the accept loop; when `PeerGuard.max_pending`
    of those wait, the loop accepts no more until one is settled (the next connections wait in
    the kernel's queue; none is closed unchecked), and each lookup is bounded by the lookup
    timeout. `accept` (the `trio.abc.Listener` interface) checks one connection at a time;
    ddmd's own loops use `serve`.
    """

    def __init__(self, inner: trio.SocketListener, guard: PeerGuard, kind: PortKind) -> None:
        self._inner = inner
        self._guard = guard
        self._kind: PortKind = kind
        self._pending = 0
        self._room = trio.Event()

    @property
    def socket(self) -> trio.socket.SocketType:
        return self._inner.socket

    @property
    def pending(self) -> int:
        """Accepted connections waiting for (or in) a lookup in a worker thread."""
        return self._pending

    async def accept(self) -> trio.SocketStream:
        while True:
            stream = await self._inner.accept()
            try:
                admitted = await self._guard.admit(stream, self._kind)
            except BaseException:
                _close_now(stream)
                raise
            if admitted:
                return stream
            _close_now(stream)

    async def serve(self, deliver: Callable[[trio.SocketStream], None]) -> None:
        """Accept until cancelled, handing each admitted connection to ``deliver`` (which must
        not block). An accept that fails (out of file descriptors) is logged and retried a
        moment later."""
        async with trio.open_nursery() as tasks:
            while True:
                while self._pending >= self._guard.max_pending:
                    self._room = trio.Event()
                    await self._room.wait()
                try:
                    stream = await self._inner.accept()
                except OSError as exc:
                    log.warning(Event.LISTENER_ACCEPT_FAILED, error=str(exc))
                    await trio.sleep(0.1)
                    continue
                verdict, facts = self._guard.check_now(stream)
                if verdict is None:
                    self._pending += 1
                    tasks.start_soon(self._look_up, stream, facts, deliver, tasks)
                else:
                    self._settle(stream, verdict, facts.where, deliver, tasks)

    async def _look_up(
        self,
        stream: trio.SocketStream,
        facts: _Facts,
        deliver: Callable[[trio.SocketStream], None],
        tasks: trio.Nursery,
    ) -> None:
        try:
            verdict = await self._guard.look_up(facts)
        except BaseException:
            _close_now(stream)
            raise
        finally:
            self._pending -= 1
            self._room.set()
        self._settle(stream, verdict, facts.where, deliver, tasks)

    def _settle(
        self,
        stream: trio.SocketStream,
        verdict: Verdict,
        where: str | int,
        deliver: Callable[[trio.SocketStream], None],
        tasks: trio.Nursery,
    ) -> None:
        if verdict.allowed:
            deliver(stream)
            return
        _close_now(stream)
        line = self._guard.refuse(verdict, where, self._kind)
        if line is not None:
            tasks.start_soon(self._guard.report, line)

    async def aclose(self) -> None:
        await self._inner.aclose()


def _close_now(stream: trio.SocketStream) -> None:
    # Synchronous on purpose: nothing to flush (nothing was written), and no checkpoint where
    # a cancellation could leave the socket open.
    stream.socket.close()


def warn_if_unchecked(policy: PeerPolicy, *, proc_root: str = "/proc") -> bool:
    """Log ``security.uids_unchecked`` when no socket table can be read (once, at start);
    True when the tables can be read."""
    if localproc.socket_tables_readable(proc_root):
        return True
    effect = (
        "every local user can connect to ddmd's TCP ports"
        if policy.unknown == "allow"
        else "every TCP connection is refused and the port scan adopts no VM"
    )
    log.warning(
        Event.SECURITY_UIDS_UNCHECKED,
        reason=f"{proc_root}/net/tcp cannot be read, so the owner of a TCP peer is unknown",
        effect=effect,
        key="[security] unknown_peer",
        value=policy.unknown,
    )
    return False
