"""`RequestAnswerer`: what a `DdmClient` replies to each command a DDM server sends: HELO, FEAT
and DBGD itself, every other DDM request by its registered handler, and any other JDWP
command with NOT_IMPLEMENTED. The package docstring (`ddmd.client`) says what each reply is;
this module is the mechanics. It never touches a socket: `ddmd.client.link` reads the
command, asks for the reply and sends it.

Layer: ``ddmd.protocol`` (DDM chunks, JDWP packets), `ddmd.client.identity`, trio (the handler
deadline) and structlog; nothing of the daemon.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Final, TypeAlias

import trio
from structlog.typing import FilteringBoundLogger

from ddmd.client.identity import Identity, chunk_type_code, outgoing_chunk
from ddmd.protocol import ddm
from ddmd.protocol.errors import ProtocolError
from ddmd.protocol.jdwp import CommandPacket, ErrorCode, ReplyPacket

__all__ = ["ChunkReply", "RequestAnswerer", "RequestHandler"]

#: What a request handler returns: ``(chunk type, chunk data)`` for the reply chunk, or None
#: for an empty reply ("done, nothing to say").
ChunkReply: TypeAlias = tuple[str, bytes] | None
#: A request handler: gets the request's chunk data. Plain functions and coroutine functions
#: are both accepted.
RequestHandler: TypeAlias = Callable[[bytes], ChunkReply | Awaitable[ChunkReply]]

_FAIL_CODE: Final = 1  # the generic failure code of Android's framework handlers (2.5)
_FAIL_MESSAGE_MAX: Final = 300  # characters of an exception message carried in a FAIL chunk


class RequestAnswerer:
    """The handler table and the reply to each command; counts what it answered (read by
    `DdmClient.statistics`). Requests are answered one at a time, in order."""

    def __init__(self, identity: Identity, handler_timeout: float) -> None:
        self._identity = identity
        self._handler_timeout = handler_timeout
        self._handlers: dict[int, tuple[str, RequestHandler]] = {}
        self._seen: set[str] = set()  # what was logged once on this connection
        # counters
        self.ddm_requests = 0  # DDM requests answered, HELO and FEAT included
        self.unhandled = 0
        self.failed = 0
        self.malformed = 0
        self.refused = 0  # non-DDM commands

    @property
    def chunk_types(self) -> tuple[str, ...]:
        """The request types with a handler, sorted: the FEAT reply lists them."""
        return tuple(sorted(name for name, _ in self._handlers.values()))

    def has_handler(self, code: int) -> bool:
        return code in self._handlers

    def add_handler(self, code: int, chunk_type: str, handler: RequestHandler) -> None:
        self._handlers[code] = (chunk_type, handler)

    def new_connection(self) -> None:
        """A server connected: what is logged once per connection may be logged again."""
        self._seen.clear()

    async def answer(self, packet: CommandPacket, log: FilteringBoundLogger) -> ReplyPacket:
        """The reply to one command from the server; ``log`` is the client's logger."""
        if ddm.is_ddm(packet):
            self.ddm_requests += 1
            return await self._answer_ddm(packet, log)
        self.refused += 1
        command = f"{packet.command_set}/{packet.command}"
        if self._first_time(command):
            log.debug("client.command_refused", command=command)
        return ReplyPacket(packet.id, ErrorCode.NOT_IMPLEMENTED)

    async def _answer_ddm(self, packet: CommandPacket, log: FilteringBoundLogger) -> ReplyPacket:
        """The reply to one DDM request. Only the first chunk of a packet is handled (what
        Dalvik and ART 9+ do, protocol.md 2.4)."""
        try:
            chunks = ddm.decode_chunks(packet.data, ddm.Direction.TO_VM)
            if not chunks:
                raise ProtocolError("the packet carries no chunk")
        except ProtocolError as exc:
            # As Dalvik and ART 5-8 do: an empty reply, so the request still ends.
            self.malformed += 1
            log.warning("client.request_malformed", id=packet.id, error=str(exc))
            return ReplyPacket(packet.id)
        chunk = chunks[0]
        if isinstance(chunk, ddm.HeloRequest):
            return _reply(packet.id, self._identity.hello())
        if isinstance(chunk, ddm.FeatRequest):
            return _reply(packet.id, ddm.FeatReply(self.chunk_types))
        if isinstance(chunk, ddm.Dbgd):
            return _reply(packet.id, ddm.Dbgd())
        entry = self._handlers.get(chunk.chunk_type)
        if entry is None:
            # No handler: an empty reply, as the draft, Dalvik, ART 5-8 and ART with its agent
            # answer an unknown type (ART 9+ without the agent sends nothing at all).
            self.unhandled += 1
            name = ddm.type_name(chunk.chunk_type)
            if self._first_time(name):
                log.debug("client.request_unhandled", type=name)
            return ReplyPacket(packet.id)
        name, handler = entry
        return ReplyPacket(packet.id, 0, await self._call_handler(name, handler, chunk, log))

    async def _call_handler(
        self, name: str, handler: RequestHandler, chunk: ddm.Chunk, log: FilteringBoundLogger
    ) -> bytes:
        """The reply's data: the handler's chunk, nothing, or a FAIL chunk."""
        try:
            with trio.fail_after(self._handler_timeout):
                result = handler(chunk.encode_data())
                if inspect.isawaitable(result):
                    result = await result
            if result is None:
                return b""
            return _result_chunk(result)
        except trio.TooSlowError:
            why = f"the {name} handler did not finish within {self._handler_timeout:g} s"
            self.failed += 1
            log.warning("client.handler_failed", type=name, error=why)
            return ddm.encode_chunk(ddm.Fail(_FAIL_CODE, why))
        except Exception as exc:
            self.failed += 1
            log.warning("client.handler_failed", type=name, error=repr(exc), exc_info=True)
            message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return ddm.encode_chunk(ddm.Fail(_FAIL_CODE, message[:_FAIL_MESSAGE_MAX]))

    def _first_time(self, what: str) -> bool:
        """True the first time on this connection: a server polling a type the client does
        not serve (ddmd's thread-state polls) is logged once, not at every poll."""
        if what in self._seen:
            return False
        self._seen.add(what)
        return True


def _reply(packet_id: int, chunk: ddm.Chunk) -> ReplyPacket:
    return ReplyPacket(packet_id, 0, ddm.encode_chunk(chunk))


def _result_chunk(result: object) -> bytes:
    """A handler's ``(type, data)`` as chunk bytes; anything else is the handler's bug."""
    if not (isinstance(result, tuple) and len(result) == 2):
        raise TypeError(f"the handler returned {result!r}; expected (type, data) or None")
    chunk_type, data = result
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"the handler's reply data is {type(data).__name__}, not bytes")
    return ddm.encode_chunk(outgoing_chunk(chunk_type_code(chunk_type), bytes(data)))
