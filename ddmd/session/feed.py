"""ddmd's model of the VM, fed: the built-in handler of the VM's pushes (after the profiling
part's capture check) and of the chunks that replies to ddmd's requests carry.

Layer: standard library, ``ddmd.protocol`` and ``ddmd.session`` (sans-IO). A part of
``VmSession``; it sees the session through ``SessionHost`` and reads the router's attached set
(a VM waiting for a debugger asks to be the current VM only while none is attached).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ddmd.protocol import ddm
from ddmd.protocol.errors import ProtocolError
from ddmd.session.commands import Changed, Log, SelectMe
from ddmd.session.host import SessionHost
from ddmd.session.model import Note

__all__ = ["ModelFeed", "log_notes"]


def log_notes(host: SessionHost, notes: Iterable[Note]) -> None:
    """The model's notes, as log lines."""
    for note in notes:
        host.emit(Log(note.event, note.level, dict(note.fields)))


class ModelFeed:
    """Applies the VM's chunks to ``host.model``: log lines, ``Changed``, ``SelectMe``."""

    name = "ddmd"

    def __init__(self, host: SessionHost, attached: Callable[[], tuple[int, ...]]) -> None:
        self._host = host
        self._attached = attached

    def handle_raw(self, chunk_type: int, data: bytes, msg_id: int) -> bool:
        """One pushed chunk (``handlers.BuiltinHandler``): decoded and applied."""
        try:
            chunk = ddm.decode_chunk(chunk_type, data, ddm.Direction.FROM_VM)
        except ProtocolError as exc:
            self._host.log("ddm.chunk_malformed", "warning", error=str(exc), id=msg_id)
            return True
        self.apply(chunk)
        return True

    def apply(self, chunk: ddm.Chunk) -> None:
        host = self._host
        applied = host.model.apply(chunk)
        log_notes(host, applied.notes)
        if applied.waiting and host.settings.auto_select_waiting and not self._attached():
            host.emit(SelectMe("waiting for a debugger"))
        if applied.changed or applied.renamed:
            host.emit(Changed(renamed=applied.renamed))
