"""ddmd's server API: chunk handlers that live inside the daemon (the seed's "server API").

A plugin is a Python package with an entry point in the group ``ddmd.handlers``::

    [project.entry-points."ddmd.handlers"]
    hello = "ddmd_hello:make_handler"    # a callable returning a ChunkHandler

ddmd loads every such entry point at start (``[extensions] disabled`` skips some by name),
and for each VM that speaks DDM calls the handler:

- ``connected(vm)`` once the VM is identified (after ddmd's own set-up requests): the place to
  send set-up requests of your own;
- ``handle_chunk(vm, chunk_type, data, is_reply, msg_id)`` for every chunk of one of your
  ``chunk_types`` the VM pushes (``"*"``: every type), and for the answer to each of your own
  requests (``is_reply=True``, ``msg_id`` = the id ``send_chunk`` returned). You never see
  replies to anyone else's requests (ddmd's own, a debugger's, another handler's). An empty
  reply arrives as your request's type with empty data; a VM without DDM answers with a FAIL
  chunk. Many requests get no answer at all on a current phone (protocol.md 2.2): silence is
  normal, so never wait for one;
- ``disconnected(vm)`` when the VM connection ends.

``vm`` is a ``VmContext`` (below): the VM's id and snapshot, ``data`` (a dict of your own
per-VM state, the seed's ClientData), ``send_chunk`` and ``publish``.

Handlers are synchronous and must not block: ddmd calls them from the VM's connection, in
order. One that raises is logged (``ext.handler_failed``, with its name) and nothing else is
affected; after 5 failures on one VM it is switched off for that VM (``ext.handler_disabled``).
A plugin that fails to import or to build its handler is listed by ``ddmd extensions`` with
the error and never stops the daemon.
"""

from __future__ import annotations

from typing import Any, Protocol

from ddmd.ext.loading import LoadedHandlers, LoadFailure, load_handlers

__all__ = [
    "ENTRY_POINT_GROUP",
    "ChunkHandler",
    "LoadFailure",
    "LoadedHandlers",
    "VmContext",
    "load_handlers",
]

ENTRY_POINT_GROUP = "ddmd.handlers"


class VmContext(Protocol):
    """One VM as a handler sees it (one context per handler and VM)."""

    #: The VM's id, as in ``/api/v1/vms`` (e.g. ``tcp:8000``, ``adb:SERIAL:PID``).
    id: str
    #: The handler's own per-VM state; kept across reconnects of the same VM.
    data: dict[str, Any]

    def snapshot(self) -> dict[str, Any]:
        """The VM as ``GET /api/v1/vms/ID`` shows it (``vm`` object)."""
        ...

    def send_chunk(self, chunk_type: str, data: bytes = b"") -> int:
        """Send one DDM request (a four-character type and its data) through ddmd's id map;
        returns its message id. Only inside ``connected`` and ``handle_chunk``."""
        ...

    def publish(self, value: Any) -> None:
        """Show a JSON value for this VM: ``GET /api/v1/vms/ID/ext`` (``{handler: value}``),
        a card on the web page's VM panel, and the ``ext.updated`` event."""
        ...


class ChunkHandler:
    """Base class of a chunk handler: set ``name`` and ``chunk_types``, override what you
    need. The methods here do nothing."""

    #: Unique among the loaded handlers; shown in logs, ``ddmd extensions`` and the API.
    name: str = ""
    #: Four-character chunk types this handler is given when the VM pushes them; ``"*"``: all.
    chunk_types: tuple[str, ...] = ()

    def connected(self, vm: VmContext) -> None:
        """The VM is identified and speaks DDM; send set-up requests here."""

    def disconnected(self, vm: VmContext) -> None:
        """The VM connection ended (it may come back: ``connected`` is called again)."""

    def handle_chunk(
        self, vm: VmContext, chunk_type: str, data: bytes, is_reply: bool, msg_id: int
    ) -> None:
        """One chunk: pushed by the VM (``is_reply=False``) or the answer to your request."""
