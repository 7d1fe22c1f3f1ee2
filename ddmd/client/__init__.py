"""``ddmd.client``: write DDM clients that are not VMs.

The Dalvik Debug Monitor design lets "something other than a VM act as a DDM client": a log
extractor, a system monitor. Such a program listens on a port of the DDM server's scan range
(ddmd: 8000-8040), exactly like a Java VM started with ``-agentlib:jdwp=server=y``; the server
connects, and the program answers the server's requests and pushes chunks of its own::

    from ddmd.client import DdmClient

    client = DdmClient("com.example.echo", port=8000)

    @client.on_chunk("ECHO")
    def echo(data: bytes) -> tuple[str, bytes]:
        return ("ECHO", data[::-1])  # the reply chunk: its type and data

    @client.on_connected
    async def greet() -> None:
        await client.send_chunk("NOTE", b"hello")  # a push, unasked

    client.run()  # until Ctrl-C; inside trio: await client.serve()

What a `DdmClient` does on its connection (protocol.md has the wire formats):

- **JDWP handshake**: echoes the server's ``JDWP-Handshake`` (within ``handshake_timeout``).
- **HELO**: replies with its identity in the layout of a current ART VM: protocol version 1,
  the pid, the VM identity ``"ddmd.client <version>"``, the app name, and the five trailers
  (user id, ABI such as ``"64-bit (x86_64)"``, empty JVM flags, not native-debuggable, the
  package name, by default the app name).
- **FEAT**: lists the chunk types that have a handler (`DdmClient.chunk_types`).
- **DBGD** (a debugger left): acknowledged with a DBGD chunk; the client keeps no debugger state.
- **A request with a handler** (`DdmClient.on_chunk`): the handler's reply chunk, an empty reply
  when it returns None, or a FAIL chunk (code 1, the exception's text) when it raises or
  overruns ``handler_timeout``.
- **A request without a handler**: an empty reply, as the 2007 draft, Dalvik, ART 5-8 and ART
  with its debugger agent answer an unknown type. (ART 9+ without the agent sends nothing at
  all; an answer lets the server know at once instead of after its timeout.) A DDM packet
  whose chunks do not parse gets an empty reply too, and a warning in the log.
- **Any other JDWP command**: an error reply, NOT_IMPLEMENTED (99), as HotSpot answers commands
  it does not know. ddmd sends no such command to a peer that answered HELO, so this only
  concerns debuggers and other tools; the connection stays usable.
- **Pushes** (`DdmClient.send_chunk`): DDM command packets with ids of the client's own,
  ``0x80000000 | n``, as ART numbers its pushes. Replies from the server (no server should send
  any) are dropped.

One DDM server is served at a time. While it is connected the port is closed, as a VM's is, and
it listens again when the connection ends. A malformed packet (bad length or flags) ends only
that connection; a failing handler or callback is logged and the client keeps serving.

Logs (structlog, logger ``ddmd.client``): ``client.listening``, ``client.connected``,
``client.disconnected``, ``client.handshake_failed``, ``client.handler_failed``,
``client.callback_failed``, ``client.request_malformed``, ``client.protocol_error``,
``client.port_busy``, ``client.accept_failed``, ``client.connection_failed`` (a bug, with its
traceback), ``client.stopping`` (`DdmClient.run` got a signal); at debug level
``client.reply_dropped``, and once per type and connection ``client.request_unhandled`` and
``client.command_refused``.

Layer: ``ddmd.protocol``, trio and structlog; nothing of the daemon.
"""

from ddmd.client.core import (
    ChunkReply,
    ClientStatistics,
    DdmClient,
    NotConnectedError,
    RequestHandler,
)
from ddmd.client.identity import BUILT_IN_TYPES, VM_IDENT, Identity, chunk_type_code

__all__ = [
    "BUILT_IN_TYPES",
    "VM_IDENT",
    "ChunkReply",
    "ClientStatistics",
    "DdmClient",
    "Identity",
    "NotConnectedError",
    "RequestHandler",
    "chunk_type_code",
]
