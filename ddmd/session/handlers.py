"""Chunk handlers on one VM: who sees which chunk, their requests, and what they publish.

Layer: standard library and ``ddmd.protocol`` only (sans-IO). The public face of this is
``ddmd.ext`` (``ChunkHandler``, ``VmContext``); here is how one VM session runs them:

    VM push (DDM command) ─▶ split into chunks ─▶ every handler whose types match ("*": all)
    reply to a handler's own request ─▶ that handler only (never anyone else's replies)
    handler.send_chunk ─▶ router.send_own(HandlerOrigin) ─▶ SendToVm (id from the IdRewriter)
    handler.publish ─▶ Publish command (the driver keeps the value and announces it)

Handlers are synchronous. One that raises is logged (``ext.handler_failed``) and the VM, the
other handlers and every debugger carry on; after ``FAILURE_LIMIT`` failures on one VM it is
switched off for that VM with one more line (``ext.handler_disabled``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from ddmd.protocol import ddm
from ddmd.protocol.errors import ProtocolError
from ddmd.protocol.idmap import Pending
from ddmd.protocol.jdwp import CommandPacket, ReplyPacket

__all__ = ["FAILURE_LIMIT", "BuiltinHandler", "HandlerHost", "HandlerLike", "HandlerOrigin"]

#: Failures of one handler on one VM before it is switched off for that VM.
FAILURE_LIMIT = 5
_FAIL = int(ddm.ChunkType.FAIL)


class HandlerLike(Protocol):
    """What the host needs of a handler (``ddmd.ext.ChunkHandler`` has it all)."""

    name: str
    chunk_types: tuple[str, ...]

    def connected(self, vm: Any) -> None: ...

    def disconnected(self, vm: Any) -> None: ...

    def handle_chunk(
        self, vm: Any, chunk_type: str, data: bytes, is_reply: bool, msg_id: int
    ) -> None: ...


class BuiltinHandler(Protocol):
    """ddmd's own handler of pushed chunks (a capture a call waits for, its model of the VM):
    given the raw chunk type. True: the chunk is taken, the built-in handlers after it do not
    get it (the plugins still do)."""

    def handle_raw(self, chunk_type: int, data: bytes, msg_id: int) -> bool: ...


@dataclass(frozen=True, slots=True, eq=False)
class HandlerOrigin:
    """The id-map origin of one handler's requests on one VM (compared by identity)."""

    name: str


class _Sink(Protocol):
    """The session's side of the host: sending, logging and the snapshot."""

    def handler_send(self, origin: HandlerOrigin, data: bytes) -> int: ...

    def handler_log(self, event: str, level: str, **fields: object) -> None: ...

    def handler_publish(self, name: str, value: Any) -> None: ...

    def handler_snapshot(self) -> dict[str, Any]: ...


@dataclass(eq=False)
class _Context:
    """``ddmd.ext.VmContext`` for one handler on one VM."""

    id: str
    _handler: HandlerLike
    _origin: HandlerOrigin
    _sink: _Sink
    data: dict[str, Any] = field(default_factory=dict)
    failures: int = 0
    off: bool = False
    connected: bool = False
    live: bool = False  # inside a callback: sending and publishing are allowed
    requests: dict[int, int] = field(default_factory=dict)  # message id -> its chunk type

    def snapshot(self) -> dict[str, Any]:
        """The VM as ``GET /api/v1/vms/ID`` shows it."""
        return self._sink.handler_snapshot()

    def send_chunk(self, chunk_type: str, data: bytes = b"") -> int:
        """Send one DDM request to the VM; returns its message id. The answer, if the VM sends
        one, arrives as ``handle_chunk(..., is_reply=True, msg_id=that id)``."""
        if not self.live:
            raise RuntimeError(
                f"{self._handler.name}: send_chunk works inside connected() and handle_chunk() "
                "(handlers run when ddmd calls them)"
            )
        if not isinstance(data, bytes | bytearray):
            raise TypeError(f"send_chunk data must be bytes, not {type(data).__name__}")
        code = ddm.chunk_type_code(chunk_type)
        msg_id = self._sink.handler_send(self._origin, ddm.raw_chunk(code, bytes(data)))
        self.requests[msg_id] = code
        return msg_id

    def publish(self, value: Any) -> None:
        """Show ``value`` (JSON) for this VM: ``GET /api/v1/vms/ID/ext``, the web page and the
        ``ext.updated`` event."""
        if not self.live:
            raise RuntimeError(
                f"{self._handler.name}: publish works inside connected() and handle_chunk()"
            )
        try:
            value = json.loads(json.dumps(value))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{self._handler.name}: publish needs JSON data ({exc})") from None
        self._sink.handler_publish(self._handler.name, value)


def _connected(context: _Context, handler: HandlerLike) -> None:
    handler.connected(context)


def _disconnected(context: _Context, handler: HandlerLike) -> None:
    handler.disconnected(context)


class HandlerHost:
    """The chunk handlers of one VM session."""

    def __init__(
        self,
        vm_id: str,
        handlers: Sequence[HandlerLike],
        sink: _Sink,
        *,
        builtin: Sequence[BuiltinHandler] = (),
    ) -> None:
        """``builtin``: ddmd's own handlers (a capture, then its model of the VM), first in
        every dispatch, in order until one takes the chunk, given every push from the first
        byte (plugins only once the VM is identified); a bug in one of them is ddmd's and is
        not caught here."""
        self._contexts: list[_Context] = []
        self._handler: dict[_Context, HandlerLike] = {}  # each context's handler
        self._by_type: dict[int, list[_Context]] = {}
        self._everything: list[_Context] = []
        self._by_origin: dict[HandlerOrigin, _Context] = {}
        self._targets: dict[int, list[_Context]] = {}  # chunk type -> who gets it, in order
        self._builtin = list(builtin)
        for handler in handlers:
            origin = HandlerOrigin(handler.name)
            context = _Context(vm_id, handler, origin, sink)
            self._contexts.append(context)
            self._handler[context] = handler
            self._by_origin[origin] = context
            for name in handler.chunk_types:
                if name == "*":
                    self._everything.append(context)
                else:
                    self._by_type.setdefault(ddm.chunk_type_code(name), []).append(context)
        self._sink = sink

    def names(self) -> list[str]:
        """The plugins' names (not ddmd's own handlers)."""
        return [self._handler[c].name for c in self._contexts]

    def context(self, name: str) -> _Context | None:
        for c in self._contexts:
            if self._handler[c].name == name:
                return c
        return None

    # ------------------------------------------------------------------ events

    def connected(self) -> None:
        for context in self._contexts:
            if not context.off and not context.connected:
                context.connected = True
                self._call(context, "connected", partial(_connected, context))

    def disconnected(self) -> None:
        for context in self._contexts:
            if context.connected:
                context.connected = False
                if not context.off:
                    self._call(context, "disconnected", partial(_disconnected, context))

    def push(self, packet: CommandPacket) -> None:
        """A DDM command from the VM: each chunk to the handlers of its type (a packet whose
        chunks do not frame is the caller's to log; nobody gets any of it)."""
        try:
            chunks = ddm.split_chunks(packet.data)
        except ProtocolError:
            return
        self.dispatch(chunks, packet.id)

    def dispatch(self, chunks: Sequence[tuple[int, bytes]], msg_id: int) -> None:
        """Pushed chunks (type, data), in order, each to the handlers of its type."""
        for chunk_type, data in chunks:
            for own in self._builtin:
                if own.handle_raw(chunk_type, data, msg_id):
                    break
            targets = self._targets.get(chunk_type)
            if targets is None:
                # In registration order, each handler once.
                typed = self._by_type.get(chunk_type, [])
                targets = self._targets[chunk_type] = [
                    c for c in self._contexts if c in typed or c in self._everything
                ]
            for context in targets:
                if context.connected and not context.off:
                    self._deliver(context, chunk_type, data, False, msg_id)

    def owns(self, pending: Pending) -> bool:
        return isinstance(pending.origin, HandlerOrigin) and pending.origin in self._by_origin

    def reply(self, pending: Pending, packet: ReplyPacket) -> None:
        """The VM's answer to a handler's request: to that handler only.

        An empty reply arrives as the request's type with no data; a JDWP error (a VM without
        DDM) as a FAIL chunk whose code is the JDWP error and whose message says so."""
        context = self._by_origin.get(pending.origin)  # type: ignore[call-overload]
        if context is None:
            return
        request_type = context.requests.pop(pending.vm_id, 0)
        if context.off or not context.connected:
            return
        if packet.error_code:
            message = f"the VM answered with JDWP error {packet.error_code}"
            data = ddm.Fail(packet.error_code, message).encode_data()
            self._deliver(context, _FAIL, data, True, pending.vm_id)
            return
        try:
            chunks = ddm.split_chunks(packet.data)
        except ProtocolError as exc:
            self._sink.handler_log(
                "ddm.chunk_malformed",
                "warning",
                handler=self._handler[context].name,
                error=str(exc),
            )
            return
        if not chunks:
            chunks = [(request_type, b"")]
        for chunk_type, data in chunks:
            self._deliver(context, chunk_type, data, True, pending.vm_id)

    def expired(self, pending: Pending) -> None:
        """A handler's request got no answer (silence is normal on ART, protocol.md 2.2)."""
        context = self._by_origin.get(pending.origin)  # type: ignore[call-overload]
        if context is not None:
            context.requests.pop(pending.vm_id, None)

    # ------------------------------------------------------------------ internals

    def _deliver(
        self, context: _Context, chunk_type: int, data: bytes, is_reply: bool, msg_id: int
    ) -> None:
        name = ddm.type_name(chunk_type)
        self._call(
            context,
            "handle_chunk",
            lambda h: h.handle_chunk(context, name, data, is_reply, msg_id),
        )

    def _call(self, context: _Context, what: str, call: Callable[[HandlerLike], None]) -> None:
        handler = self._handler[context]
        context.live = True
        try:
            call(handler)
        except Exception as exc:  # a plugin's bug must not reach the VM or anyone else
            context.failures += 1
            self._sink.handler_log(
                "ext.handler_failed",
                "warning",
                handler=handler.name,
                call=what,
                error=f"{type(exc).__name__}: {exc}",
            )
            if context.failures >= FAILURE_LIMIT and not context.off:
                context.off = True
                self._sink.handler_log(
                    "ext.handler_disabled",
                    "warning",
                    handler=handler.name,
                    reason=f"it failed {context.failures} times on this VM",
                )
        finally:
            context.live = False
