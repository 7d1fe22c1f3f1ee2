"""The consumers of one VM connection, other than ddmd itself: the debuggers that came in
through ddmd's ports and the sockets handed over by the adb front (ddmlib, Android Studio,
jadx, jdb through an `adb forward`). One record each, one table.

Layer: standard library and ``ddmd.protocol`` only (sans-IO).

Each consumer has a kind (``ConsumerKind``, one value object: its rules live in it, not in
branches elsewhere); one set of rules for all (``router.py``, ``bridge.py``, ``ddmshare.py``):

- ``DEBUGGER``: a debugger on ddmd's per-VM port or the current-VM port. It counts as a
  debugger from its handshake on (that is why it came).
- ``FRONT``: a socket from the adb front. It may speak DDM only (ddmlib monitoring a VM),
  which must never make the VM look debugged: ART loads its debugger agent on the first
  non-DDM packet. It counts as a debugger (events, suspensions, ``[debugger] max_per_vm``, the
  release when the last one leaves) from its first non-DDM command on.

A new kind of consumer is one more ``ConsumerKind`` here plus its listener in ``drive/``.

Every consumer that has spoken DDM also gets the VM's own DDM packets (thread notices, heap
info, names...), as if it held the VM alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddmd.protocol.jdwp import PacketDecoder

__all__ = [
    "DEBUGGER",
    "FRONT",
    "Consumer",
    "ConsumerKind",
    "ConsumerTable",
    "DebuggerOrigin",
]


@dataclass(frozen=True, slots=True)
class ConsumerKind:
    """What kind of consumer a socket is, and every rule that follows from the kind."""

    name: str  # "debugger", "front"
    debugs_from_handshake: bool  # False: it debugs only from its first non-DDM command

    def counts(self, debugging: bool) -> bool:
        """Whether a consumer of this kind counts as a debugger (events, suspensions,
        ``[debugger] max_per_vm``, the release): from its arrival, or once it debugs."""
        return self.debugs_from_handshake or debugging


#: A debugger on ddmd's per-VM port or the current-VM port: it came to debug.
DEBUGGER = ConsumerKind("debugger", debugs_from_handshake=True)
#: A socket handed over by the adb front: DDM only (ddmlib watching) until it debugs.
FRONT = ConsumerKind("front", debugs_from_handshake=False)


@dataclass(frozen=True, slots=True, eq=False)
class DebuggerOrigin:
    """The id-map origin of a consumer's commands: one per consumer, compared by identity (the
    id map hashes it for every relayed command; identity hashing is done in C)."""

    debugger: int


@dataclass(slots=True)
class Consumer:
    id: int
    via: str
    peer: str
    decoder: PacketDecoder
    origin: DebuggerOrigin
    kind: ConsumerKind = DEBUGGER
    tool: str | None = None
    attached: bool = False  # its JDWP handshake is done
    debugging: bool = False  # it counts as a debugger (see the module docstring)
    speaks_ddm: bool = False  # it sent a DDM request: the VM's DDM packets go to it too
    # While a packet is relayed to it in pieces nothing else may be written to it: what the
    # router has for it meanwhile (a locally answered command, an event) waits here.
    streaming: bool = False
    deferred: list[bytes] = field(default_factory=list)
    packets_in: int = 0
    packets_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0


class ConsumerTable:
    """Every consumer of one VM connection, and the handshakes held until it is ready."""

    def __init__(self, max_packet: int) -> None:
        self.max_packet = max_packet
        self.by_id: dict[int, Consumer] = {}
        self.waiting: list[int] = []  # handshakes held until the VM connection is ready
        self.debugging_count = 0

    def join(
        self, number: int, via: str, peer: str, kind: ConsumerKind, tool: str | None
    ) -> Consumer:
        consumer = Consumer(
            number,
            via,
            peer,
            PacketDecoder(max_length=self.max_packet, expect_handshake=True),
            DebuggerOrigin(number),
            kind,
            tool,
        )
        self.by_id[number] = consumer
        return consumer

    def remove(self, number: int) -> Consumer | None:
        if number in self.waiting:
            self.waiting.remove(number)
        consumer = self.by_id.pop(number, None)
        if consumer is not None and consumer.debugging:
            self.debugging_count -= 1
        return consumer

    def start_debugging(self, consumer: Consumer) -> None:
        if not consumer.debugging:
            consumer.debugging = True
            self.debugging_count += 1

    # ------------------------------------------------------------------ queries

    def debugging(self) -> tuple[int, ...]:
        return tuple(c.id for c in self.by_id.values() if c.debugging)

    def ddm_speakers(self) -> tuple[Consumer, ...]:
        return tuple(c for c in self.by_id.values() if c.speaks_ddm and c.attached)

    def counted(self) -> int:
        """Consumers that count against ``[debugger] max_per_vm``: every debugger from its
        arrival, a front socket once it debugs."""
        return sum(1 for c in self.by_id.values() if c.kind.counts(c.debugging))

    def holders(self) -> list[tuple[str, str]]:
        """(peer, via) of every counted consumer, attached or still in its handshake."""
        return [(c.peer, c.via) for c in self.by_id.values() if c.kind.counts(c.debugging)]

    def peers(self) -> list[str]:
        """``PEER via PORT-KIND`` of every attached consumer (tool name first, when known)."""
        return [
            f"{c.tool + ' ' if c.tool else ''}{c.peer} via {c.via}"
            for c in self.by_id.values()
            if c.attached
        ]

    def statistics(self, number: int) -> tuple[int, int, int, int] | None:
        c = self.by_id.get(number)
        if c is None:
            return None
        return c.packets_in, c.packets_out, c.bytes_in, c.bytes_out
