"""What adb *clients* send to an adb server, sans-IO: the other direction of `adbwire`, for
ddmd's adb front (``ddmd.front``, adb-front.md).

Layer: standard library and `ddmd.protocol.adbwire` only (the `ddmd.protocol` rule).

`RequestDecoder` cuts requests out of a client's stream (`AdbBadRequest` for the lengths the
server refuses), `parse_service` classifies each one (`TransportSwitch`, `Forward`, `JdwpPid`,
...), and `okay`/`fail`/`frame`/`okay_okay_port`/`transport_id_bytes` build the replies the
server would send.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Final, Literal, cast

from ddmd.protocol.adbwire import _HEX_DIGITS, _MAX_PID_DIGITS, FAIL, OKAY, AdbMalformed
from ddmd.protocol.errors import LocalProtocolError

__all__ = [
    "ANY",
    "MAX_PAYLOAD",
    "NEED_DATA",
    "TRANSPORT_ID_SIZE",
    "AdbBadRequest",
    "BadHostPrefix",
    "DeviceService",
    "Forward",
    "HostQuery",
    "JdwpPid",
    "Kill",
    "KillForward",
    "KillForwardAll",
    "ListForward",
    "NeedData",
    "Request",
    "RequestDecoder",
    "Selector",
    "Service",
    "TransportSwitch",
    "Version",
    "fail",
    "forward_line",
    "frame",
    "jdwp_pid",
    "merge_forward_list",
    "okay",
    "okay_okay_port",
    "parse_host_service",
    "parse_service",
    "parse_transport_id",
    "request",
    "tcp_port",
    "transport_id_bytes",
]

#: adb's MAX_PAYLOAD (29.x): the longest request a server accepts. 4 hex digits cannot even
#: express more (0xffff), so only 0 and non-hex lengths are refused in practice.
MAX_PAYLOAD: Final = 1024 * 1024
#: The reply to a ``tport:`` switch: OKAY, then the transport id as 8 bytes, little-endian.
TRANSPORT_ID_SIZE: Final = 8
_MAX_FRAME: Final = 0xFFFF
_DIGITS: Final = frozenset("0123456789")
_MAX_TRANSPORT_ID: Final = 2**64 - 1


class AdbBadRequest(AdbMalformed):
    """A client's request that adb's server refuses by closing the socket: a length of 0,
    not 4 hex digits, or above `MAX_PAYLOAD`. ``reason`` says which, in a few words."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"bad adb request: {reason}")
        self.reason = reason


class NeedData(Enum):
    """`RequestDecoder.next_request` has no whole request yet (the h11 sentinel)."""

    NEED_DATA = "NEED_DATA"


NEED_DATA: Final = NeedData.NEED_DATA


@dataclass(frozen=True, slots=True)
class Request:
    """One request as the client sent it: ``wire`` is its 4-byte length and payload, byte for
    byte (relay this); ``service`` the payload as text (UTF-8; bytes that are not UTF-8 stay
    distinct, as surrogate escapes, so no two payloads read the same)."""

    wire: bytes

    @property
    def payload(self) -> bytes:
        return self.wire[4:]

    @property
    def service(self) -> str:
        return self.payload.decode("utf-8", "surrogateescape")


class RequestDecoder:
    """Smart-socket requests out of a client's byte stream: feed bytes as they come
    (`receive_data`), take whole requests (`next_request`) or NEED_DATA. Bytes after a request
    stay buffered (`take_buffer` hands them over, for a relay)."""

    __slots__ = ("_buffer", "_max_length")

    def __init__(self, max_length: int = MAX_PAYLOAD) -> None:
        self._buffer = bytearray()
        self._max_length = max_length

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        self._buffer += data

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as a request."""
        return len(self._buffer)

    @property
    def needed(self) -> int:
        """At least 1: how many bytes the next request still lacks, as far as is known (a
        reader that asks for no more than this never reads past a request, so the bytes after
        it stay in the socket for whoever serves the stream)."""
        buffer = self._buffer
        if len(buffer) < 4:
            return 4 - len(buffer)
        head = bytes(buffer[:4])
        if not all(b in _HEX_DIGITS for b in head):
            return 1
        return max(1, 4 + int(head, 16) - len(buffer))

    def take_buffer(self) -> bytes:
        """Everything buffered (and forget it)."""
        data = bytes(self._buffer)
        self._buffer.clear()
        return data

    def next_request(self) -> Request | NeedData:
        """The next whole request, NEED_DATA until it has arrived; `AdbBadRequest` as soon as
        its length is known to be one the server refuses."""
        buffer = self._buffer
        if len(buffer) < 4:
            return NEED_DATA
        head = bytes(buffer[:4])
        if not all(b in _HEX_DIGITS for b in head):
            raise AdbBadRequest(f"length {head!r} is not 4 hex digits")
        size = int(head, 16)
        if size == 0:
            raise AdbBadRequest("length 0")
        if size > self._max_length:
            raise AdbBadRequest(f"length {size} is over the limit of {self._max_length}")
        if len(buffer) < 4 + size:
            return NEED_DATA
        request = Request(bytes(buffer[: 4 + size]))
        del buffer[: 4 + size]
        return request


# ---------------------------------------------------------------------------- service names

SelectorKind = Literal["any", "usb", "local", "serial", "transport_id"]
SwitchKind = Literal["any", "usb", "local", "serial", "transport_id"]


@dataclass(frozen=True, slots=True)
class Selector:
    """The device a host request is about: ``host:`` (any single device, or the socket's
    device after a switch), ``host-usb:``, ``host-local:``, ``host-serial:SERIAL:``,
    ``host-transport-id:N:``."""

    kind: SelectorKind
    serial: str | None = None
    transport_id: int | None = None

    @property
    def prefix(self) -> str:
        """The request prefix that selects this way, ending in ":"."""
        if self.kind == "serial":
            return f"host-serial:{self.serial}:"
        if self.kind == "transport_id":
            return f"host-transport-id:{self.transport_id}:"
        if self.kind == "usb":
            return "host-usb:"
        if self.kind == "local":
            return "host-local:"
        return "host:"


ANY: Final = Selector("any")


@dataclass(frozen=True, slots=True)
class HostQuery:
    """A host service the front has no business with (devices, features, track-devices,
    connect, get-serialno, an unknown name, ...): relayed."""

    selector: Selector
    body: str


@dataclass(frozen=True, slots=True)
class Version:
    """``host:version`` (with any prefix): always the real server's answer."""

    selector: Selector


@dataclass(frozen=True, slots=True)
class Kill:
    """``host:kill`` (with any prefix): the server exits."""

    selector: Selector


@dataclass(frozen=True, slots=True)
class TransportSwitch:
    """``host:transport:S``, ``host:transport-any|usb|local``, ``host:transport-id:N`` (legacy:
    the reply is OKAY alone) or ``host:tport:serial:S|any|usb|local`` (OKAY + the 8-byte
    transport id). Afterwards the socket belongs to that device."""

    kind: SwitchKind
    serial: str | None = None
    transport_id: int | None = None
    tport: bool = False

    @property
    def upstream(self) -> str | None:
        """The ``tport:`` form of this switch (the server then tells the transport id), or None
        for ``transport-id:N`` (no tport form exists; the id is known already)."""
        if self.kind == "transport_id":
            return None
        if self.kind == "serial":
            return f"host:tport:serial:{self.serial}"
        return f"host:tport:{self.kind}"


@dataclass(frozen=True, slots=True)
class Forward:
    """``PREFIX forward:[norebind:]LOCAL;REMOTE``."""

    selector: Selector
    norebind: bool
    local: str
    remote: str

    @property
    def local_port(self) -> int | None:
        """N for a LOCAL of ``tcp:N`` (0: any free port), else None."""
        return tcp_port(self.local)

    @property
    def jdwp_pid(self) -> int | None:
        """PID for a REMOTE of ``jdwp:PID``, else None."""
        return jdwp_pid(self.remote)


@dataclass(frozen=True, slots=True)
class KillForward:
    """``PREFIX killforward:LOCAL``."""

    selector: Selector
    local: str

    @property
    def local_port(self) -> int | None:
        return tcp_port(self.local)


@dataclass(frozen=True, slots=True)
class KillForwardAll:
    """``PREFIX killforward-all``: every forward of the server, whatever the prefix."""

    selector: Selector


@dataclass(frozen=True, slots=True)
class ListForward:
    """``PREFIX list-forward``: every forward of the server, whatever the prefix."""

    selector: Selector


@dataclass(frozen=True, slots=True)
class DeviceService:
    """A name without a ``host`` prefix: a service of the socket's device (``shell:``,
    ``sync:``, ``track-jdwp``, ``jdwp``, a malformed ``jdwp:x``, ...)."""

    name: str


@dataclass(frozen=True, slots=True)
class JdwpPid:
    """``jdwp:PID``: the raw JDWP connection of one VM of the socket's device."""

    pid: int


@dataclass(frozen=True, slots=True)
class BadHostPrefix:
    """``host-serial:`` or ``host-transport-id:`` that adb's server cannot read (it closes
    the socket, or waits): relayed, so the server answers what it answers."""

    text: str


Service = (
    HostQuery
    | Version
    | Kill
    | TransportSwitch
    | Forward
    | KillForward
    | KillForwardAll
    | ListForward
    | DeviceService
    | JdwpPid
    | BadHostPrefix
)


def parse_host_service(full: str) -> tuple[str, str] | None:
    """``SERIAL:COMMAND`` split as adb's server does it (29.x ``internal::parse_host_service``):
    a serial may hold colons (``127.0.0.1:5555``, ``[::1]:5555``, ``usb:1-1``, ``tcp:host:port``,
    ``vsock:cid:port``). None when it cannot be split."""
    if not full:
        return None
    taken = 0  # the serial, with its final ":", is full[:taken]; the command is full[taken:]

    def finish() -> tuple[str, str] | None:
        serial, command = full[:taken], full[taken:]
        if not serial or not command:
            return None
        return serial[:-1], command

    for prefix in ("usb:", "product:", "model:", "device:", "localfilesystem:"):
        if full.startswith(prefix):
            taken = len(prefix)
            offset = full.find(":", taken)
            if offset < 0:
                return None
            taken = offset + 1
            return finish()
    if full.startswith(("tcp:", "udp:")):
        taken = 4
        if taken == len(full):
            return None
    if full.startswith("vsock:", taken):
        taken = full.index(":", taken) + 1
    found_address = False
    if full.startswith("[", taken):
        end = full.find("]", taken)
        if end >= 0:
            taken = end + 1
            if taken == len(full) or full[taken] != ":":
                return None  # nothing, or garbage, after the IPv6 address
            taken += 1
            found_address = True
    if not found_address:
        offset = full.find(":", taken)
        if offset < 0:
            return None
        taken = offset + 1
    next_colon = full.find(":", taken)
    if next_colon < 0:
        return finish()  # no colon: this is the command
    if all(ch in _DIGITS for ch in full[taken:next_colon]):
        taken = next_colon + 1  # a port between colons
    return finish()


def _uint(text: str, maximum: int) -> int | None:
    """The decimal ``text`` when it is at most ``maximum``, else None. Its length is checked
    before ``int()``, which refuses more than 4,300 digits (a ValueError, not an answer)."""
    if not text or not all(ch in _DIGITS for ch in text):
        return None
    significant = text.lstrip("0") or "0"
    if len(significant) > len(str(maximum)):
        return None
    value = int(significant)
    return value if value <= maximum else None


def tcp_port(local: str) -> int | None:
    """N for ``tcp:N`` (0-65535), else None (other socket specs, ``tcp:HOST:PORT``)."""
    if not local.startswith("tcp:"):
        return None
    return _uint(local[4:], 65535)


def jdwp_pid(name: str) -> int | None:
    """PID for ``jdwp:PID`` (a positive decimal of at most 10 digits), else None."""
    if not name.startswith("jdwp:"):
        return None
    digits = name[5:]
    if len(digits) > _MAX_PID_DIGITS:
        return None
    pid = _uint(digits, 2**31 - 1)
    return pid if pid else None


def _selector(service: str) -> tuple[Selector, str] | BadHostPrefix | None:
    """The host prefix and what follows it; BadHostPrefix when the server cannot read the
    prefix; None for a device service."""
    if service.startswith("host-serial:"):
        split = parse_host_service(service[len("host-serial:") :])
        if split is None:
            return BadHostPrefix(service)
        return Selector("serial", serial=split[0]), split[1]
    if service.startswith("host-transport-id:"):
        number, colon, body = service[len("host-transport-id:") :].partition(":")
        transport_id = _uint(number, _MAX_TRANSPORT_ID)
        if transport_id is None or not colon:
            return BadHostPrefix(service)
        return Selector("transport_id", transport_id=transport_id), body
    for prefix, kind in (("host-usb:", "usb"), ("host-local:", "local"), ("host:", "any")):
        if service.startswith(prefix):
            return Selector(cast("SelectorKind", kind)), service[len(prefix) :]
    return None


def _switch(body: str) -> TransportSwitch | None:
    if body.startswith("tport:"):
        rest = body[len("tport:") :]
        if rest.startswith("serial:"):
            return TransportSwitch("serial", serial=rest[len("serial:") :], tport=True)
        if rest in ("any", "usb", "local"):
            return TransportSwitch(cast("SwitchKind", rest), tport=True)
        return None
    if body.startswith("transport:"):
        return TransportSwitch("serial", serial=body[len("transport:") :])
    if body.startswith("transport-id:"):
        transport_id = _uint(body[len("transport-id:") :], _MAX_TRANSPORT_ID)
        return None if transport_id is None else TransportSwitch("transport_id", None, transport_id)
    if body in ("transport-any", "transport-usb", "transport-local"):
        return TransportSwitch(cast("SwitchKind", body[len("transport-") :]))
    return None


def _forward(selector: Selector, body: str) -> Service:
    if body == "list-forward":
        return ListForward(selector)
    if body == "killforward-all":
        return KillForwardAll(selector)
    if body.startswith("killforward:"):
        local = body[len("killforward:") :]
        if local and ";" not in local:
            return KillForward(selector, local)
        return HostQuery(selector, body)
    rest = body[len("forward:") :]
    norebind = rest.startswith("norebind:")
    if norebind:
        rest = rest[len("norebind:") :]
    pieces = rest.split(";")
    if len(pieces) != 2 or not pieces[0] or not pieces[1] or pieces[1].startswith("*"):
        return HostQuery(selector, body)  # the server answers "bad forward: ..."
    return Forward(selector, norebind, pieces[0], pieces[1])


def parse_service(text: str) -> Service:
    """What a request asks for, read the way adb's server reads it. Never raises: anything
    the front does not act on is a HostQuery, DeviceService or BadHostPrefix (relayed)."""
    split = _selector(text)
    if split is None:
        pid = jdwp_pid(text)
        return JdwpPid(pid) if pid is not None else DeviceService(text)
    if isinstance(split, BadHostPrefix):
        return split
    selector, body = split
    if body == "version":
        return Version(selector)
    if body == "kill":
        return Kill(selector)
    if selector.kind == "any" and body.startswith(("transport", "tport:")):
        switch = _switch(body)
        if switch is not None:
            return switch
        return HostQuery(selector, body)
    if body in ("list-forward", "killforward-all") or body.startswith(("forward:", "killforward:")):
        return _forward(selector, body)
    return HostQuery(selector, body)


# ------------------------------------------------------------------------------- replies


def frame(payload: bytes) -> bytes:
    """A protocol string: 4 lower-case hex digits of length (as adb writes them), then the
    payload. `LocalProtocolError` above 65535 bytes."""
    if len(payload) > _MAX_FRAME:
        raise LocalProtocolError(f"{len(payload)} bytes do not fit a 4-hex-digit length")
    return b"%04x" % len(payload) + payload


def request(service: str) -> bytes:
    """A request as adb's client sends it: ``000chost:version``."""
    return frame(service.encode("utf-8", "surrogateescape"))


def okay() -> bytes:
    return OKAY


def fail(message: str) -> bytes:
    """``FAIL`` + the message as a protocol string: ``FAIL0017device 'nope' not found``."""
    return FAIL + frame(message.encode("utf-8", "replace")[:_MAX_FRAME])


def okay_okay_port(port: int) -> bytes:
    """A forward's success as adb's server answers it when it bound a TCP port (for
    ``tcp:0`` too): ``OKAYOKAY000519000``."""
    return OKAY + OKAY + frame(str(port).encode())


def transport_id_bytes(transport_id: int) -> bytes:
    """The 8 bytes after the OKAY of a ``tport:`` switch."""
    return transport_id.to_bytes(TRANSPORT_ID_SIZE, "little")


def parse_transport_id(raw: bytes) -> int:
    if len(raw) != TRANSPORT_ID_SIZE:
        raise AdbMalformed(f"a transport id is {TRANSPORT_ID_SIZE} bytes, got {len(raw)}")
    return int.from_bytes(raw, "little")


def forward_line(serial: str, local: str, remote: str) -> bytes:
    """One ``list-forward`` line: ``SERIAL LOCAL REMOTE\\n``."""
    return f"{serial} {local} {remote}\n".encode()


def merge_forward_list(listing: bytes, extra: Iterable[bytes]) -> bytes:
    """The server's ``list-forward`` payload with the front's own lines after it, framed
    again (the hex length counts them too)."""
    return frame(listing + b"".join(extra))
