"""Workstation discovery: probe a localhost port range for JDWP listeners.

Layer: imports config, logs, netaddr, `discovery.connect` (handshake, closing, back-off) and
`host.localproc`/`host.sockdiag` and `discovery.lookups`; used by `daemon`.

Every ``interval`` seconds each port of the range that has no VM yet is tried: connect and
JDWP handshake, each under a timeout. A successful probe's
connection is handed over as the VM's connection (a plain JVM accepts only one). A port whose
listener is not JDWP (wrong handshake, silence, reset) is backed off exponentially up to
``backoff_max`` and logged once, not at every scan. Refused connections are normal (nothing
listens there) and are neither logged nor backed off.

Each VM found is also looked up in ``/proc`` (the process holding the other end of the probe's
connection, its pid and ``jps``-style name) within ``PROCESS_LOOKUP_TIMEOUT``: a slow ``/proc``
costs the VM its pid and name, never the discovery. The lookups of all the probes of a round
share their readings of the socket tables and fd tables (`discovery.lookups`): hundreds of VMs
opening their ports at once cost a few readings, not one each.

Own VMs only (with a `peers.PeerPolicy`): a JVM another user started is not adopted. Before
each round the LISTEN sockets of the ports to probe are looked up in the socket tables (one
read, in a worker thread); a port whose listener belongs to a user who may not connect is not
even connected to, so that user's own debugger keeps the VM's one JDWP connection. After a
handshake the VM's end of the connection is checked again (the listener may have changed
hands in between; the tables may not be readable). Either way the port is skipped with one
``scan.foreign_vm_skipped`` line per port and uid, not one per round.
"""

from __future__ import annotations

import errno
import ipaddress
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import structlog
import trio

from ddmd.config import Config, PortRange
from ddmd.discovery import VmFound
from ddmd.discovery.connect import NotJdwp, aclose_quietly, backoff, jdwp_handshake
from ddmd.discovery.lookups import Probed, ScanLookups
from ddmd.host import sockdiag
from ddmd.host.localproc import LocalProcess, listening_owners
from ddmd.logs import Event
from ddmd.netaddr import host_port
from ddmd.peers import LOOKUP_TIMEOUT, PeerPolicy, Verdict, user_name

log = structlog.get_logger("ddmd.scan")

PROBE_CONCURRENCY = 16
#: Seconds between two looks at the LISTEN sockets of the scan range (`PortScanner.watch`).
WATCH_INTERVAL = 0.1
PROCESS_LOOKUP_TIMEOUT = 0.5  # seconds to find a VM's local process in /proc
PROCESS_LOOKUP_THREADS = 2  # /proc scans at once (each reads every process's fd table)

# find_listener's signature: (host, port, *, client, give_up_at) -> the process or None.
ProcessLookup = Callable[..., LocalProcess | None]


async def open_jdwp(host: str, port: int, config: Config) -> tuple[trio.abc.Stream, bytes]:
    """Connect and complete the JDWP handshake. Returns the stream and bytes after the echo.

    Raises OSError when nothing accepts the connection, NotJdwp when the peer is not JDWP, and
    trio.TooSlowError when connect or handshake exceed their timeouts.
    """
    with trio.fail_after(config.timeouts.connect):
        stream = await trio.open_tcp_stream(host, port)
    try:
        with trio.fail_after(config.timeouts.handshake):
            leftover = await jdwp_handshake(stream)
    except BaseException:
        await aclose_quietly(stream)
        raise
    return stream, leftover


@dataclass(slots=True)
class _Backoff:
    failures: int = 0
    next_try: float = -math.inf
    after_protocol_error: bool = False  # the listener speaks JDWP, but its VM broke protocol


class PortScanner:
    """The scan loop. ``held`` tells which ports already have a VM (owned by the supervisor)."""

    def __init__(
        self,
        config: Config,
        held: Callable[[], set[int]],
        *,
        lookup: ProcessLookup | None = None,
        policy: PeerPolicy | None = None,
        proc_root: str = "/proc",
    ) -> None:
        self._config = config
        self._held = held
        self._backoff: dict[int, _Backoff] = {}
        self._lookup = lookup
        self._lookup_limiter = trio.CapacityLimiter(PROCESS_LOOKUP_THREADS)
        self.lookups = ScanLookups(
            proc_root, owner_timeout=LOOKUP_TIMEOUT, process_timeout=PROCESS_LOOKUP_TIMEOUT
        )
        self._policy = policy
        self._proc_root = proc_root
        self._foreign_logged: set[tuple[int, int]] = set()
        self._probe_limiter = trio.CapacityLimiter(PROBE_CONCURRENCY)
        self._probing: set[int] = set()
        self._listening: set[int] = set()  # the range's listeners at the watch's last look
        self.probes = 0

    async def run(self, send: trio.MemorySendChannel[VmFound]) -> None:
        cfg = self._config.scan
        async with send, trio.open_nursery() as nursery:
            nursery.start_soon(self.watch, send)
            while True:
                await self.scan_once(send)
                await trio.sleep(cfg.interval)

    async def scan_once(self, send: trio.MemorySendChannel[VmFound]) -> None:
        cfg = self._config.scan
        held = self._held()
        now = trio.current_time()
        ports = [
            p
            for p in cfg.ports
            if p not in held and self._backoff.get(p, _Backoff()).next_try <= now
        ]
        if self._policy is not None and ports:
            ports = await self._own_listeners(cfg.host, ports, self._policy)
        async with trio.open_nursery() as nursery:
            for port in ports:
                nursery.start_soon(self._probe, cfg.host, port, send)

    async def watch(self, send: trio.MemorySendChannel[VmFound]) -> None:
        """Between scans, probe each port of the range as soon as a listener appears on it.

        Every WATCH_INTERVAL the range's listening sockets are asked of the kernel
        (`_listening_now`: netlink, or the socket tables' LISTEN rows). A port whose
        listener was not there at the last look, and that no VM holds, is probed at once. A
        JVM is then found within a fraction of a second of opening its port, not within a scan
        interval, and hundreds opening at once are spread over the time their probes take. The
        rounds stay the rule, and the only way where the tables cannot be read (not Linux, a
        host name)."""
        cfg = self._config.scan
        try:
            ipaddress.ip_address(cfg.host)
        except ValueError:
            return  # the tables hold numeric addresses only
        async with trio.open_nursery() as nursery:
            while True:
                owners: dict[int, int] | None = None
                with trio.move_on_after(LOOKUP_TIMEOUT):
                    owners = await trio.to_thread.run_sync(
                        partial(_listening_now, cfg.host, cfg.ports, self._proc_root),
                        abandon_on_cancel=True,
                        limiter=self._lookup_limiter,
                    )
                if owners is not None:
                    for port in self._new_listeners(owners):
                        nursery.start_soon(self._probe, cfg.host, port, send)
                await trio.sleep(WATCH_INTERVAL)

    def _new_listeners(self, owners: dict[int, int]) -> list[int]:
        """The ports whose listener appeared since the last look, not held, not being probed,
        not backed off, and (with a policy) owned by a user who may connect."""
        appeared = set(owners) - self._listening
        self._listening = set(owners)
        if not appeared:
            return []
        held = self._held()
        now = trio.current_time()
        ports = []
        for port in sorted(appeared):
            if port in held or port in self._probing:
                continue
            if self._backoff.get(port, _Backoff()).next_try > now:
                continue
            uid = owners[port]
            if self._policy is not None and not self._policy.uid_allowed(uid):
                self._foreign(port, uid, user_name(uid), "its listening socket")
                continue
            ports.append(port)
        return ports

    async def _probe(
        self,
        host: str,
        port: int,
        send: trio.MemorySendChannel[VmFound],
    ) -> None:
        # One probe per port at a time: the watch and a scan round may both come to a port,
        # and a second connection would hang on a JVM's one-connection agent.
        if port in self._probing:
            return
        self._probing.add(port)
        try:
            await self._probe_port(host, port, send)
        finally:
            self._probing.discard(port)

    async def _probe_port(
        self, host: str, port: int, send: trio.MemorySendChannel[VmFound]
    ) -> None:
        async with self._probe_limiter:
            if port in self._held():
                return  # found meanwhile (by the watch, or the round before)
            if self._backoff.get(port, _Backoff()).next_try > trio.current_time():
                return  # the round's other probe of it, or the watch's, found no JVM there
            self.probes += 1
            try:
                stream, leftover = await open_jdwp(host, port, self._config)
            except OSError as exc:
                # Nothing accepts connections there (refused), which is the normal case.
                if not (exc.errno == errno.ECONNREFUSED or _all_refused(exc)):
                    log.debug(Event.SCAN_PROBE_FAILED, port=port, error=str(exc))
                return
            except NotJdwp as exc:
                self._not_jdwp(port, str(exc))
                return
            except trio.TooSlowError:
                self._not_jdwp(port, "no JDWP handshake within the timeout")
                return
            except trio.BrokenResourceError as exc:
                self._not_jdwp(port, f"connection reset during the handshake: {exc}")
                return
        if not await self._keep_if_own(stream, port):
            return
        state = self._backoff.get(port)
        if state is not None and not state.after_protocol_error:
            del self._backoff[port]
            log.info(Event.SCAN_PORT_RECOVERED, port=port)

        async def reopen() -> tuple[trio.abc.Stream, bytes]:
            # The port may have changed hands since: the same rule as the first time.
            again, rest = await open_jdwp(host, port, self._config)
            if not await self._keep_if_own(again, port):
                raise ConnectionRefusedError(
                    errno.ECONNREFUSED, f"the VM on port {port} now belongs to another user"
                )
            return again, rest

        try:
            process = await self._local_process(stream, host, port)
        except BaseException:  # cancelled (the daemon stops): the probe's connection goes too
            await aclose_quietly(stream)
            raise
        found = VmFound(
            vm_id=f"tcp:{port}",
            source="tcp",
            address=host_port(host, port),
            stream=stream,
            leftover=leftover,
            opener=reopen,
            key=port,
            process=process,
        )
        try:
            await send.send(found)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            await aclose_quietly(stream)

    async def _local_process(
        self, stream: trio.abc.Stream, host: str, port: int
    ) -> LocalProcess | None:
        """The process serving the probe's connection (pid, jps-style name); None when it
        cannot be found within PROCESS_LOOKUP_TIMEOUT."""
        if self._lookup is None:
            probed = Probed.of(stream, self.lookups)
            if probed is None:
                return None
            return await self.lookups.process(probed, host, port)
        # A lookup given by the caller (tests): one call per VM, in a worker thread.
        client: tuple[str, int] | None = None
        if isinstance(stream, trio.SocketStream):
            try:
                # Numeric addresses, even when the scan host is a name.
                host, port = stream.socket.getpeername()[:2]
                local_host, local_port = stream.socket.getsockname()[:2]
                client = (local_host, local_port)
            except OSError:
                pass  # already closed by the peer: the LISTEN socket may still tell
        lookup = partial(
            self._lookup,
            host,
            port,
            client=client,
            give_up_at=time.monotonic() + PROCESS_LOOKUP_TIMEOUT,
        )
        with trio.move_on_after(PROCESS_LOOKUP_TIMEOUT):
            return await trio.to_thread.run_sync(
                lookup, abandon_on_cancel=True, limiter=self._lookup_limiter
            )
        return None

    async def _own_listeners(self, host: str, ports: list[int], policy: PeerPolicy) -> list[int]:
        """`ports` without those whose LISTEN socket belongs to a user who may not connect.
        When the tables cannot tell (not Linux, a host name, a slow /proc), the check after
        the handshake decides; with ``unknown_peer = "refuse"`` and no tables, nothing is
        probed."""
        lookup = partial(_foreign_listeners, host, ports, policy, self._proc_root)
        found: tuple[dict[int, tuple[int, str | None]], bool] | None = None
        with trio.move_on_after(LOOKUP_TIMEOUT):
            found = await trio.to_thread.run_sync(
                lookup, abandon_on_cancel=True, limiter=self._lookup_limiter
            )
        if found is None:
            return ports
        foreign, readable = found
        if not readable:
            return ports if policy.unknown == "allow" else []
        for port, (uid, user) in foreign.items():
            self._foreign(port, uid, user, "its listening socket")
        return [p for p in ports if p not in foreign]

    async def _keep_if_own(self, stream: trio.abc.Stream, port: int) -> bool:
        """`_own_vm`, closing the stream when the answer is no (or the check is cancelled)."""
        if self._policy is None:
            return True
        try:
            own = await self._own_vm(stream, port, self._policy)
        except BaseException:
            await aclose_quietly(stream)
            raise
        if not own:
            await aclose_quietly(stream)
        return own

    async def _own_vm(self, stream: trio.abc.Stream, port: int, policy: PeerPolicy) -> bool:
        """After the handshake: does the VM's end of this connection belong to an allowed
        user? A VM whose end is gone already, or whose owner cannot be known when
        ``unknown_peer`` says "refuse", is dropped quietly."""
        if not isinstance(stream, trio.SocketStream):
            return True  # not a socket (tests' memory streams): nothing to look up
        probed = Probed.of(stream, self.lookups)
        if probed is None:
            verdict = Verdict(False, None, "it closed the connection before it could be checked")
        else:
            verdict = await self.lookups.verdict(probed, policy)
        if verdict.allowed:
            return True
        if verdict.uid is not None:
            self._foreign(port, verdict.uid, verdict.user, "its end of the probe's connection")
        else:
            log.debug(Event.SCAN_PROBE_FAILED, port=port, error=f"VM not adopted: {verdict.reason}")
        return False

    def _foreign(self, port: int, uid: int, user: str | None, seen: str) -> None:
        if (port, uid) in self._foreign_logged:
            return
        self._foreign_logged.add((port, uid))
        log.warning(
            Event.SCAN_FOREIGN_VM_SKIPPED,
            port=port,
            uid=uid,
            user=user,
            seen=seen,
            reason="another user's VM; add the user to [security] allowed_uids to adopt it",
        )

    def _not_jdwp(self, port: int, why: str) -> None:
        state = self._backoff.setdefault(port, _Backoff())
        if state.failures == 0:
            log.warning(Event.SCAN_PORT_NOT_JDWP, port=port, reason=why)
        state.failures += 1
        state.next_try = trio.current_time() + self._delay(state.failures)

    def vm_ended(self, port: int, *, protocol_error: bool, reason: str) -> None:
        """The supervisor reports how a VM found on ``port`` ended. A VM that broke the
        protocol is reconnected with exponential back-off (logged once), not at every scan;
        any other ending clears the back-off."""
        if not protocol_error:
            if self._backoff.pop(port, None) is not None:
                log.info(Event.SCAN_PORT_RECOVERED, port=port)
            return
        state = self._backoff.setdefault(port, _Backoff(after_protocol_error=True))
        state.after_protocol_error = True
        if state.failures == 0:
            log.warning(Event.SCAN_BACKOFF, port=port, reason=reason)
        state.failures += 1
        state.next_try = trio.current_time() + self._delay(state.failures)

    def _delay(self, failures: int) -> float:
        return backoff(failures, self._config.scan.interval, self._config.scan.backoff_max)


def _listening_now(host: str, ports: PortRange, proc_root: str) -> dict[int, int] | None:
    """Blocking: port -> uid of the range's listeners. Netlink (`sockdiag`) where it works: it
    walks the listening sockets only, where reading /proc/net/tcp to its end walks the whole
    connection table. Otherwise (or with a ``proc_root`` of tests) the tables, read up to their
    first connection (Linux lists the listening sockets first)."""
    if proc_root == "/proc":
        found = sockdiag.listeners(host, ports)
        if found is not None:
            return found
    return listening_owners(host, ports, proc_root=proc_root, listeners_first=True)


def _foreign_listeners(
    host: str, ports: list[int], policy: PeerPolicy, proc_root: str
) -> tuple[dict[int, tuple[int, str | None]], bool]:
    """Blocking (socket tables, user database): port -> (uid, user name) of the listeners
    owned by users who may not connect, and whether the tables could be read at all."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return {}, True  # a host name: the check after the handshake decides
    owners = listening_owners(host, ports, proc_root=proc_root)
    if owners is None:
        return {}, False
    return (
        {
            port: (uid, user_name(uid))
            for port, uid in owners.items()
            if not policy.uid_allowed(uid)
        },
        True,
    )


def _all_refused(exc: OSError) -> bool:
    # trio.open_tcp_stream raises an OSError whose __cause__ groups one error per address.
    cause = exc.__cause__
    if isinstance(cause, BaseExceptionGroup):
        return all(
            isinstance(e, OSError) and e.errno == errno.ECONNREFUSED for e in cause.exceptions
        )
    return False
