"""A tiny HPROF encoder for hand-built test dumps (test side only: independent of
ddmd.sim.hprof, so the reader is checked against bytes written from the format itself).

Every method appends exactly the bytes the format describes; nothing is inferred.
"""

from __future__ import annotations

import struct

STANDARD = b"JAVA PROFILE 1.0.2"
ANDROID = b"JAVA PROFILE 1.0.3"

# basic types
OBJECT, BOOLEAN, CHAR, FLOAT, DOUBLE, BYTE, SHORT, INT, LONG = 2, 4, 5, 6, 7, 8, 9, 10, 11
SIZES = {BOOLEAN: 1, CHAR: 2, FLOAT: 4, DOUBLE: 8, BYTE: 1, SHORT: 2, INT: 4, LONG: 8}


class Dump:
    def __init__(self, version: bytes = STANDARD, id_size: int = 4, timestamp: int = 0) -> None:
        self.id_size = id_size
        self.out = bytearray(version + b"\0" + struct.pack(">IQ", id_size, timestamp))

    # ---- encoding helpers
    def id(self, value: int) -> bytes:
        return value.to_bytes(self.id_size, "big")

    def value_size(self, basic: int) -> int:
        return self.id_size if basic == OBJECT else SIZES.get(basic, 0)

    def record(self, tag: int, body: bytes, time: int = 0) -> Dump:
        self.out += struct.pack(">BII", tag, time, len(body)) + body
        return self

    def string(self, sid: int, text: str) -> Dump:
        return self.record(0x01, self.id(sid) + text.encode())

    def load_class(self, serial: int, cid: int, name_sid: int) -> Dump:
        body = struct.pack(">I", serial) + self.id(cid) + struct.pack(">I", 0) + self.id(name_sid)
        return self.record(0x02, body)

    def segment(self, *subs: bytes, tag: int = 0x1C) -> Dump:
        return self.record(tag, b"".join(subs))

    def end(self) -> Dump:
        return self.record(0x2C, b"")

    def bytes(self) -> bytes:
        return bytes(self.out)

    # ---- heap sub-records
    def root(self, tag: int, oid: int, *u4s: int, extra_id: int | None = None) -> bytes:
        out = bytes([tag]) + self.id(oid)
        if extra_id is not None:
            out += self.id(extra_id)
        return out + b"".join(struct.pack(">I", v) for v in u4s)

    def heap_info(self, heap_type: int, name_sid: int) -> bytes:
        return b"\xfe" + struct.pack(">I", heap_type) + self.id(name_sid)

    def class_dump(
        self,
        cid: int,
        super_id: int = 0,
        instance_size: int = 0,
        pool: tuple[tuple[int, int], ...] = (),
        statics: tuple[tuple[int, int], ...] = (),
        fields: tuple[tuple[int, int], ...] = (),
    ) -> bytes:
        """pool: (index, type); statics: (name sid, type); fields: (name sid, type).
        Values are written as zero bytes of the type's size."""
        out = bytearray(b"\x20" + self.id(cid) + struct.pack(">I", 0) + self.id(super_id))
        out += self.id(0) * 5 + struct.pack(">I", instance_size)
        out += struct.pack(">H", len(pool))
        for index, basic in pool:
            out += struct.pack(">HB", index, basic) + bytes(self.value_size(basic))
        out += struct.pack(">H", len(statics))
        for name, basic in statics:
            out += self.id(name) + bytes([basic]) + bytes(self.value_size(basic))
        out += struct.pack(">H", len(fields))
        for name, basic in fields:
            out += self.id(name) + bytes([basic])
        return bytes(out)

    def instance(self, oid: int, cid: int, nbytes: int) -> bytes:
        head = b"\x21" + self.id(oid) + struct.pack(">I", 0) + self.id(cid)
        return head + struct.pack(">I", nbytes) + b"\x5a" * nbytes

    def object_array(self, oid: int, cid: int, length: int) -> bytes:
        head = b"\x22" + self.id(oid) + struct.pack(">II", 0, length) + self.id(cid)
        return head + self.id(0x11) * length

    def primitive_array(self, oid: int, basic: int, length: int, nodata: bool = False) -> bytes:
        tag = b"\xc3" if nodata else b"\x23"
        head = tag + self.id(oid) + struct.pack(">IIB", 0, length, basic)
        return head if nodata else head + b"\xa5" * (length * SIZES[basic])
