"""One client of the adb front, from its first request to the end of its connection.

Layer: trio, structlog, logs, config, `protocol.adbwire` (what each request means) and the
front's hub, forwards, relay, tools and upstream modules.

Everything is relayed to the real server byte for byte (`_relay`: the request, then a pipe both
ways) except (adb-front.md, "Implications"):

- a transport switch: relayed (the legacy forms as their ``tport:`` equivalent, whose 8-byte
  transport id is kept and stripped for the client), and the conversation goes on with the
  device it selected;
- ``jdwp:PID`` after a switch, for a VM ddmd holds (or opens within ``[front]
  open_timeout``): OKAY, the upstream socket is closed, and the client socket goes to ddmd's
  VM connection as a consumer;
- ``forward[:norebind]:tcp:N;jdwp:PID`` (any prefix, or ``host:`` after a switch): a forward of
  the front's own (`FrontForwards`), answered as the server answers;
- ``list-forward`` (the server's list plus the front's lines), ``killforward:tcp:N`` of a
  front port, ``killforward-all`` (the front's forwards too, then relayed);
- ``host:kill``: ``[front] on_kill`` ("refuse": OKAY and close, the server stays).

Where the front cannot tell (no serial for the device, ddmd does not hold the VM, a name it
does not parse) it relays: the real server answers in its own words.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import structlog
import trio

from ddmd.config.schema import FrontConfig
from ddmd.front.forwards import BindFailed, FrontForwards
from ddmd.front.hub import ConsumerTarget, VmHub
from ddmd.front.relay import (
    ClientGone,
    ClientRequests,
    RequestTimedOut,
    UpstreamReplies,
    UpstreamSilent,
    close_gently,
    close_now,
    pipe,
)
from ddmd.front.stats import FrontStatistics
from ddmd.front.upstream import Upstream, UpstreamUnavailable
from ddmd.logs import Event
from ddmd.protocol.adbrequests import (
    TRANSPORT_ID_SIZE,
    AdbBadRequest,
    Forward,
    JdwpPid,
    Kill,
    KillForward,
    KillForwardAll,
    ListForward,
    Request,
    Selector,
    Service,
    TransportSwitch,
    fail,
    merge_forward_list,
    okay_okay_port,
    parse_service,
    parse_transport_id,
    request,
)
from ddmd.protocol.adbwire import FAIL, OKAY, AdbMalformed
from ddmd.protocol.errors import LocalProtocolError
from ddmd.toolnames import peer_process

__all__ = ["Conversation", "FrontContext"]

log = structlog.get_logger("ddmd.front")

_BROKEN = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
REBIND_REFUSED = "cannot rebind existing socket"


@dataclass(frozen=True, slots=True)
class FrontContext:
    """What every conversation shares."""

    config: FrontConfig
    hub: VmHub
    upstream: Upstream
    forwards: FrontForwards
    stats: FrontStatistics
    # Tools whose host:kill the front refused already: the first refusal for each is a warning
    # (the user should know which tool tries to stop the adb server), later ones are info.
    kill_refused_for: set[str] = field(default_factory=set)


@dataclass(slots=True)
class _Device:
    """The device a switched socket points at: its transport id, its serial once asked."""

    transport_id: int
    serial: str | None = None


class Conversation:
    """The front's side of one client connection (`run` closes it, unless it was handed to
    a VM)."""

    def __init__(self, ctx: FrontContext, client: trio.SocketStream, peer: str) -> None:
        self._ctx = ctx
        self._client = client
        self._peer = peer
        self._requests = ClientRequests(client, ctx.config.request_timeout)
        self._up: trio.SocketStream | None = None
        self._replies: UpstreamReplies | None = None
        self._device: _Device | None = None
        self._handed_over = False

    async def run(self) -> None:
        stats = self._ctx.stats
        try:
            await self._converse()
        except AdbBadRequest as exc:
            stats.bad_requests += 1
            log.info(Event.FRONT_BAD_REQUEST, peer=self._peer, reason=exc.reason)
        except RequestTimedOut as exc:
            stats.timeouts += 1
            log.info(
                Event.FRONT_REQUEST_TIMED_OUT,
                peer=self._peer,
                timeout=exc.patience,
                received=exc.received,
                key="[front] request_timeout",
            )
        except ClientGone as exc:
            log.debug(Event.FRONT_BAD_REQUEST, peer=self._peer, reason=str(exc))
        except UpstreamUnavailable:
            stats.upstream_failures += 1  # logged once per outage by Upstream
        except (UpstreamSilent, AdbMalformed) as exc:
            log.info(
                Event.FRONT_UPSTREAM_UNAVAILABLE,
                server=self._ctx.upstream.address,
                peer=self._peer,
                reason=str(exc),
            )
        except _BROKEN:
            pass  # the client (or the server) went away mid-way: nothing to tell anyone
        except Exception:  # a bug must cost one client, never the front
            log.exception(Event.FRONT_CLIENT_FAILED, peer=self._peer)
        finally:
            if self._up is not None:
                await close_now(self._up)
            if not self._handed_over:
                await close_now(self._client)

    # ------------------------------------------------------------------ dispatch

    async def _converse(self) -> None:
        while True:
            got = await self._requests.next()
            if got is None:
                return
            service = parse_service(got.service)
            if isinstance(service, TransportSwitch) and _fits(service.upstream):
                if not await self._switch(got, service):
                    return
                continue  # the next request is about that device
            await self._answer(got, service)
            return

    async def _answer(self, got: Request, service: Service) -> None:
        forwards = self._ctx.forwards
        if isinstance(service, Kill):
            await self._kill(got)
        elif isinstance(service, JdwpPid) and self._device is not None:
            await self._jdwp(got, service.pid)
        elif isinstance(service, Forward):
            await self._forward(got, service)
        elif isinstance(service, KillForward) and (
            service.local_port is not None and forwards.get(service.local_port) is not None
        ):
            forwards.remove(service.local_port, "adb forward --remove")
            await self._reply(OKAY + OKAY)
        elif isinstance(service, KillForwardAll):
            forwards.remove_all("adb forward --remove-all")
            await self._relay(got)
        elif isinstance(service, ListForward) and len(forwards):
            await self._list_forward(got)
        else:
            await self._relay(got)

    # ------------------------------------------------------------------ plumbing

    async def _upstream(self) -> tuple[trio.SocketStream, UpstreamReplies]:
        """This client's connection to the real server (opened on first use)."""
        if self._up is None or self._replies is None:
            self._up = await self._ctx.upstream.connect()
            self._replies = UpstreamReplies(self._up, self._ctx.upstream.reply_timeout)
        return self._up, self._replies

    async def _relay(self, got: Request) -> None:
        """The request as the client sent it, then both ways until the server is done."""
        up, replies = await self._upstream()
        await up.send_all(got.wire + self._requests.take_buffer())
        self._ctx.stats.relayed += 1
        await pipe(
            self._client,
            up,
            to_client=replies.take_buffer(),
            grace=self._ctx.upstream.reply_timeout,
        )

    async def _reply(self, data: bytes) -> None:
        """The front's own answer, then the end of the connection (as the server closes)."""
        await self._client.send_all(data)
        await close_gently(self._client)

    async def _serial_of(self, selector: Selector | None) -> str | None:
        """The serial of the socket's device (after a switch) or of `selector`'s, as the
        server spells it (``get-serialno``); None when the server cannot tell."""
        device = self._device
        if device is not None:
            if device.serial is None:
                device.serial = await self._ask_serial(
                    f"host-transport-id:{device.transport_id}:get-serialno"
                )
            return device.serial
        assert selector is not None
        return await self._ask_serial(selector.prefix + "get-serialno")

    async def _ask_serial(self, query: str) -> str | None:
        try:
            okay, payload = await self._ctx.upstream.query(query)
        except (UpstreamUnavailable, UpstreamSilent, AdbMalformed):
            return None
        serial = payload.decode("utf-8", "replace")
        return serial if okay and serial and serial != "unknown" else None

    async def _find(self, serial: str, pid: int) -> ConsumerTarget | None:
        hub = self._ctx.hub
        target = hub.find(serial, pid)
        if target is None:
            with trio.move_on_after(self._ctx.config.open_timeout):
                target = await hub.wait_for(serial, pid)
        return target

    async def _tool(self) -> tuple[str, int | None, str | None]:
        """(tool name, pid, command line) of the process at the client's end."""
        process = await peer_process(self._client)
        if process is None:
            return "unknown", None, None
        return process.tool or "unknown", process.pid, process.describe()

    # ------------------------------------------------------------------ requests

    async def _switch(self, got: Request, switch: TransportSwitch) -> bool:
        """Relay a transport switch and remember the device; False when it failed (the
        server's FAIL was passed on and the connection is over)."""
        up, replies = await self._upstream()
        upstream_form = switch.upstream
        await up.send_all(got.wire if upstream_form is None else request(upstream_form))
        status = await replies.status()
        if status == FAIL:
            await self._reply(await replies.fail_reply())
            return False
        if upstream_form is None:  # transport-id:N: OKAY alone, and the id is known
            assert switch.transport_id is not None
            self._device = _Device(switch.transport_id)
            await self._client.send_all(OKAY)
            return True
        raw = await replies.exactly(TRANSPORT_ID_SIZE)
        self._device = _Device(parse_transport_id(raw))
        await self._client.send_all(OKAY + raw if switch.tport else OKAY)
        return True

    async def _jdwp(self, got: Request, pid: int) -> None:
        serial = await self._serial_of(None)
        target = await self._find(serial, pid) if serial is not None else None
        if target is None:
            self._ctx.stats.jdwp_relayed += 1
            log.info(
                Event.FRONT_JDWP_RELAYED,
                peer=self._peer,
                serial=serial,
                pid=pid,
                reason="ddmd does not hold that VM"
                if serial is not None
                else "the device's serial is unknown",
            )
            await self._relay(got)
            return
        await self._client.send_all(OKAY)
        if self._up is not None:
            await close_now(self._up)
            self._up = None
        # Handed over at once: the VM's driver names the program on the other end after the
        # hand-over, so the client's handshake waits for no lookup.
        target.adopt_consumer(self._client, self._peer, via="front")
        self._handed_over = True
        self._ctx.stats.jdwp_served += 1
        log.info(Event.FRONT_JDWP_SERVED, vm=target.vm_id, peer=self._peer)

    async def _forward(self, got: Request, forward: Forward) -> None:
        forwards = self._ctx.forwards
        port, pid = forward.local_port, forward.jdwp_pid
        existing = forwards.get(port) if port is not None and port != 0 else None
        if existing is not None and forward.norebind:
            await self._reply(fail(REBIND_REFUSED))
            return
        if port is None or pid is None:
            if existing is not None:  # the server will bind it now: let go of it
                forwards.remove(existing.port, f"replaced by a forward to {forward.remote}")
            await self._relay(got)
            return
        serial = await self._serial_of(forward.selector)
        target = await self._find(serial, pid) if serial is not None else None
        if serial is None or target is None:
            if existing is not None:
                forwards.remove(existing.port, f"replaced by a forward to {forward.remote}")
            self._ctx.stats.jdwp_relayed += 1
            log.info(
                Event.FRONT_JDWP_RELAYED,
                peer=self._peer,
                serial=serial,
                pid=pid,
                forward=forward.local,
                reason="ddmd does not hold that VM"
                if serial is not None
                else "no single device for that request",
            )
            await self._relay(got)
            return
        if existing is not None:
            forwards.retarget(existing.port, serial, pid)
            await self._reply(OKAY + OKAY)  # a rebound listener: no port string (adb's server)
            return
        try:
            bound = await self._bind(serial, pid, port, norebind=forward.norebind)
        except BindFailed as exc:
            await self._reply(fail(exc.message))
            return
        except _RebindRefused:
            await self._reply(fail(REBIND_REFUSED))
            return
        await self._reply(okay_okay_port(bound))

    async def _bind(self, serial: str, pid: int, port: int, *, norebind: bool) -> int:
        """The front's forward on `port`; when the real server holds that port with a forward
        of its own, it is moved to the front (as the server rebinds), unless `norebind`."""
        forwards = self._ctx.forwards
        try:
            return await forwards.add(serial, pid, port)
        except BindFailed as exc:
            if not exc.in_use or port == 0 or not await self._server_forwards(port):
                raise
            if norebind:
                raise _RebindRefused from None
        with contextlib.suppress(UpstreamUnavailable, UpstreamSilent, AdbMalformed):
            await self._ctx.upstream.query(f"host-serial:{serial}:killforward:tcp:{port}")
        return await forwards.add(serial, pid, port)

    async def _server_forwards(self, port: int) -> bool:
        """True when the real server has a forward on ``tcp:port``."""
        try:
            okay, listing = await self._ctx.upstream.query("host:list-forward")
        except (UpstreamUnavailable, UpstreamSilent, AdbMalformed):
            return False
        local = f"tcp:{port}"
        lines = listing.decode("utf-8", "replace").splitlines()
        return okay and any(line.split(" ")[1:2] == [local] for line in lines)

    async def _list_forward(self, got: Request) -> None:
        up, replies = await self._upstream()
        await up.send_all(got.wire)
        if await replies.status() == FAIL:
            await self._reply(await replies.fail_reply())
            return
        listing = await replies.record()
        try:
            merged = merge_forward_list(listing, self._ctx.forwards.lines())
        except LocalProtocolError:  # more than 64 KiB of forwards: the server's own list
            merged = merge_forward_list(listing, [])
        await self._reply(OKAY + merged)

    async def _kill(self, got: Request) -> None:
        tool, pid, cmdline = await self._tool()
        if self._ctx.config.on_kill == "refuse":
            self._ctx.stats.kills_refused += 1
            first = tool not in self._ctx.kill_refused_for
            self._ctx.kill_refused_for.add(tool)
            (log.warning if first else log.info)(
                Event.FRONT_KILL_REFUSED,
                peer=self._peer,
                pid=pid,
                cmdline=cmdline,
                tool=tool,
                key="[front] on_kill",
                effect="answered OKAY; the adb server keeps running",
            )
            await self._reply(OKAY)
            return
        self._ctx.stats.kills_relayed += 1
        log.info(Event.FRONT_KILL_RELAYED, peer=self._peer, pid=pid, cmdline=cmdline, tool=tool)
        self._ctx.forwards.remove_all("adb kill-server")
        await self._relay(got)


def _fits(service: str | None) -> bool:
    """A request that fits one 4-hex-digit length (a switch's tport form is 3 bytes longer
    than the legacy one: a switch that would not fit is relayed as it came)."""
    return service is None or len(service.encode("utf-8", "surrogateescape")) <= 0xFFFF


class _RebindRefused(Exception):
    """norebind, and the port is a forward already."""
