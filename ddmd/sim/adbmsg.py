"""adb's transport message format, sans-IO (adb's ``protocol.txt``): the command constants,
`Message`, `encode_message`, `decode_header` and `MessageDecoder` (bytes fed in any pieces,
whole messages out). No I/O; `ddmd.sim.adbd` re-exports the public names.

Every message is a 24-byte little-endian header (command, arg0, arg1, data length, data check =
the sum of the payload bytes, magic = command ^ 0xffffffff) and the payload.

Layer: the simulator; imports the standard library only.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

__all__ = [
    "A_AUTH",
    "A_CLSE",
    "A_CNXN",
    "A_OKAY",
    "A_OPEN",
    "A_STLS",
    "A_SYNC",
    "A_VERSION",
    "A_WRTE",
    "COMMANDS",
    "HEADER_SIZE",
    "MAX_PAYLOAD",
    "MIN_PAYLOAD",
    "AdbTransportError",
    "Message",
    "MessageDecoder",
    "checksum",
    "decode_header",
    "encode_message",
]


def _command(name: bytes) -> int:
    return int.from_bytes(name, "little")


A_SYNC: Final = _command(b"SYNC")
A_CNXN: Final = _command(b"CNXN")
A_AUTH: Final = _command(b"AUTH")
A_OPEN: Final = _command(b"OPEN")
A_OKAY: Final = _command(b"OKAY")
A_CLSE: Final = _command(b"CLSE")
A_WRTE: Final = _command(b"WRTE")
A_STLS: Final = _command(b"STLS")
#: Every command adb has defined, by value (names for messages and errors).
COMMANDS: Final = {
    A_SYNC: "SYNC",
    A_CNXN: "CNXN",
    A_AUTH: "AUTH",
    A_OPEN: "OPEN",
    A_OKAY: "OKAY",
    A_CLSE: "CLSE",
    A_WRTE: "WRTE",
    A_STLS: "STLS",
}

#: The version this device speaks: the one before A_VERSION_SKIP_CHECKSUM, so both sides
#: fill in the data check.
A_VERSION: Final = 0x01000000
#: The largest payload this device sends or accepts (adb's MAX_PAYLOAD_V2).
MAX_PAYLOAD: Final = 256 * 1024
#: The smallest maxdata a server may announce (adb's MAX_PAYLOAD_V1).
MIN_PAYLOAD: Final = 4096
HEADER_SIZE: Final = 24
_HEADER: Final = struct.Struct("<6I")
_U32: Final = 0xFFFFFFFF


class AdbTransportError(Exception):
    """Bytes from the server that are not adb's transport protocol, or a message out of place."""


@dataclass(frozen=True, slots=True)
class Message:
    """One transport message: the command, its two arguments and the payload."""

    command: int
    arg0: int
    arg1: int
    data: bytes = b""

    @property
    def name(self) -> str:
        return COMMANDS.get(self.command, f"0x{self.command:08x}")


def checksum(data: bytes | bytearray | memoryview) -> int:
    """adb's "data_crc32": really the sum of the payload's bytes (mod 2**32)."""
    return sum(data) & _U32


def encode_message(command: int, arg0: int, arg1: int, data: bytes = b"") -> bytes:
    """A whole message: the 24-byte header, then ``data``."""
    return (
        _HEADER.pack(command, arg0 & _U32, arg1 & _U32, len(data), checksum(data), command ^ _U32)
        + data
    )


def decode_header(raw: bytes, *, max_data: int = MAX_PAYLOAD) -> tuple[int, int, int, int, int]:
    """``(command, arg0, arg1, data_length, data_check)`` of a 24-byte header.

    `AdbTransportError` when the magic is not the command's complement, the command is not
    one adb defines, or the payload would be longer than ``max_data``.
    """
    if len(raw) != HEADER_SIZE:
        raise AdbTransportError(f"a header is {HEADER_SIZE} bytes, not {len(raw)}")
    command, arg0, arg1, length, check, magic = _HEADER.unpack(raw)
    if magic != command ^ _U32:
        raise AdbTransportError(f"bad magic 0x{magic:08x} for command 0x{command:08x}")
    if command not in COMMANDS:
        raise AdbTransportError(f"unknown command 0x{command:08x}")
    if length > max_data:
        raise AdbTransportError(
            f"{COMMANDS[command]} payload of {length} bytes is over the {max_data} allowed"
        )
    return command, arg0, arg1, length, check


class MessageDecoder:
    """Messages out of a byte stream fed in any pieces: `receive_data`, then `next_message`
    until it returns None. A data check of 0 is accepted (a peer that skips checksums);
    any other value must be the payload's sum."""

    __slots__ = ("_buffer", "_header", "max_data")

    def __init__(self, max_data: int = MAX_PAYLOAD) -> None:
        self.max_data = max_data
        self._buffer = bytearray()
        self._header: tuple[int, int, int, int, int] | None = None

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        self._buffer += data

    @property
    def buffered(self) -> int:
        """Bytes of a message begun and not yet whole (0: between messages)."""
        return len(self._buffer)

    def next_message(self) -> Message | None:
        """The next whole message, or None until more bytes arrive; `AdbTransportError` for
        bytes that are not a message (the stream is then unusable)."""
        buffer = self._buffer
        if self._header is None:
            if len(buffer) < HEADER_SIZE:
                return None
            self._header = decode_header(bytes(buffer[:HEADER_SIZE]), max_data=self.max_data)
            del buffer[:HEADER_SIZE]
        command, arg0, arg1, length, check = self._header
        if len(buffer) < length:
            return None
        data = bytes(buffer[:length])
        del buffer[:length]
        self._header = None
        if check != 0 and check != checksum(data):
            raise AdbTransportError(
                f"{COMMANDS[command]} data check 0x{check:08x} is not the payload's sum "
                f"0x{checksum(data):08x}"
            )
        return Message(command, arg0, arg1, data)
