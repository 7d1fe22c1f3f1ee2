"""The adb host protocol (protocol.md Appendix A), sans-IO: what ddmd reads from an adb server.

Layer: standard library only (the `ddmd.protocol` rule); used by `discovery` (the blocking and
trio sides that talk to the server).

* Every request is answered ``OKAY``, or ``FAIL`` followed by a message: `parse_status`.
* Messages and list payloads are records: 4 hex digits of length, then that many bytes
  (`parse_length`; `RecordDecoder` cuts them out of a stream fed in any pieces).
* ``host:version`` answers one record holding the version in hex: `parse_version`.
* ``host:track-devices(-l)`` sends one record per change, a device per line: `parse_devices`.
* ``track-jdwp`` sends one record per change, a pid per line: `parse_pids`.

Anything else from the server is `AdbMalformed`. Parsers of list payloads never raise: a line
that makes no sense is skipped and described in the problems they return.

What adb *clients* send (ddmd's adb front) is in `adbrequests`.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Final

from ddmd.protocol.errors import RemoteProtocolError

__all__ = [
    "FAIL",
    "OKAY",
    "ONLINE",
    "AdbMalformed",
    "DeviceLine",
    "RecordDecoder",
    "parse_devices",
    "parse_length",
    "parse_pids",
    "parse_status",
    "parse_version",
]

OKAY: Final = b"OKAY"
FAIL: Final = b"FAIL"
#: adb's state of a usable device or emulator.
ONLINE: Final = "device"

_HEX_DIGITS: Final = frozenset(string.hexdigits.encode())
_MAX_PID_DIGITS: Final = 10
_DETAIL_KEYS: Final = frozenset({"usb", "product", "model", "device", "transport_id", "features"})


class AdbMalformed(RemoteProtocolError):
    """The server sent something that is not the adb host protocol."""


@dataclass(frozen=True, slots=True)
class DeviceLine:
    """One line of ``host:devices-l`` / ``host:track-devices(-l)``."""

    serial: str
    state: str
    model: str | None = None
    product: str | None = None


def parse_status(request: str, status: bytes) -> bool:
    """The 4-byte answer to ``request``: True for OKAY, False for FAIL (a message record
    follows); `AdbMalformed` for anything else. An empty answer (the server closed the
    connection) is the caller's to handle first."""
    if status == OKAY:
        return True
    if status == FAIL:
        return False
    raise AdbMalformed(f"{request}: expected OKAY or FAIL, got {status!r}")


def parse_length(head: bytes) -> int:
    """The 4 hex digits that start every adb record; `AdbMalformed` otherwise."""
    if len(head) != 4 or not all(b in _HEX_DIGITS for b in head):
        raise AdbMalformed(f"record length {head!r} is not 4 hex digits")
    return int(head, 16)


def parse_version(block: bytes) -> int:
    """The payload of the ``host:version`` answer: the server's version, in hex."""
    try:
        return int(block.decode("ascii"), 16)
    except (UnicodeDecodeError, ValueError):
        raise AdbMalformed(f"host:version: {block[:16]!r} is not a hex number") from None


class RecordDecoder:
    """Length-prefixed records out of a byte stream: feed bytes as they come
    (`receive_data`), take whole records (`next_record`)."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        self._buffer += data

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as a record (0: between records)."""
        return len(self._buffer)

    def next_record(self) -> bytes | None:
        """The next whole record (possibly empty), or None until more bytes arrive.
        `AdbMalformed` when a record's length is not 4 hex digits."""
        buffer = self._buffer
        if len(buffer) < 4:
            return None
        size = parse_length(bytes(buffer[:4]))
        if len(buffer) < 4 + size:
            return None
        record = bytes(buffer[4 : 4 + size])
        del buffer[: 4 + size]
        return record


def parse_devices(payload: bytes) -> tuple[tuple[DeviceLine, ...], tuple[str, ...]]:
    """A device list record: the devices, and a problem text per line that made no sense.

    Short lines are ``SERIAL<TAB>STATE``; long (-l) lines are ``SERIAL  STATE key:value ...``
    where the state may have spaces ("no permissions (...)").
    """
    devices: dict[str, DeviceLine] = {}
    problems: list[str] = []
    for raw in payload.decode("utf-8", "replace").splitlines():
        line = raw.strip()
        if not line:
            continue
        sep = "\t" if "\t" in line else " "
        serial, _, rest = line.partition(sep)
        details: dict[str, str] = {}
        state_words: list[str] = []
        for word in rest.split():
            key, colon, value = word.partition(":")
            if colon and key in _DETAIL_KEYS:
                details[key] = value
            else:
                state_words.append(word)
        state = " ".join(state_words)
        if not serial.strip() or not state:
            problems.append(f"device line {raw!r} has no serial or no state")
            continue
        devices[serial.strip()] = DeviceLine(
            serial.strip(), state, details.get("model") or None, details.get("product") or None
        )
    return tuple(devices.values()), tuple(problems)


def parse_pids(payload: bytes) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """A track-jdwp record: the pids (decimal, one per line), and the entries that are not."""
    pids: list[int] = []
    problems: list[str] = []
    for raw in payload.decode("utf-8", "replace").split("\n"):
        word = raw.strip()
        if not word:
            continue
        if word.isascii() and word.isdigit() and len(word) <= _MAX_PID_DIGITS and int(word) > 0:
            if int(word) not in pids:
                pids.append(int(word))
        else:
            problems.append(word[:40])
    return tuple(pids), tuple(problems)


# ==============================================================================================
# The other side: what adb CLIENTS send to a server (ddmd's adb front, `ddmd.front`)
#
# A request is 4 hex digits of length (upper or lower case: ddmlib writes %04X, adb %04x) and
# the service name. The server (adb 29.x ``smart_socket_enqueue``) refuses a length of 0, one
# that is not 4 hex digits, or one above MAX_PAYLOAD by closing the socket without a word:
# `RequestDecoder` raises `AdbBadRequest` there. Service names are classified by
# `parse_service` the way adb's server reads them (``host-serial:`` serials may contain ":";
# `parse_host_service` is adb's own rule); replies are built by `okay`, `fail`, `frame`,
# `okay_okay_port`, `transport_id_bytes`.
