"""Debuggers joining and leaving one VM session, and the release of the VM after the last
one leaves (DBGD, or a reconnect where the VM does not acknowledge it).

Layer: standard library, ``ddmd.protocol`` and ``ddmd.session`` (sans-IO). ``Attachments`` is
the part of ``VmSession`` that carries these rules out; the per-packet rules of several
debuggers are in ``bridge.py`` and ``router.py``.

The log of a release: ``debugger.detached`` when the debugger leaves, then one info line,
``vm.released`` (``how``: the VM acknowledged DBGD, or it was reconnected and identified again;
``after``: why the debugger left) once the VM is free again. The steps in between (DBGD sent and
acknowledged, the reconnect, the HELO of the new connection) are at debug level.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ddmd.protocol import ddm
from ddmd.session.commands import Changed, CloseDebugger, Reconnect
from ddmd.session.inputs import ConsumerJoined

if TYPE_CHECKING:
    from ddmd.session.vm import VmSession

__all__ = ["Attachments"]


class Attachments:
    """The debugger part of a ``VmSession``: joining, leaving, and the release of the VM."""

    def __init__(self, session: VmSession) -> None:
        self._s = session
        # Why the last debugger left, while its release is under way (None: no release).
        self.release_after: str | None = None

    # ------------------------------------------------------------------ debuggers

    def _debugger_joins(self, item: ConsumerJoined, now: float) -> None:
        count = self._s.router.debugger_count()
        # A front socket counts as a debugger only from its first debugger command (router).
        counted = item.kind.debugs_from_handshake
        if self._s.state == "closed" or (counted and count >= self._s.settings.max_debuggers):
            holders = self._s.router.holders()
            if self._s.state == "closed":
                reason = f"{self._s.vm_id} is gone"
            elif self._s.settings.max_debuggers == 1:
                reason = f"{self._s.vm_id} already has a debugger"
            else:
                reason = f"{self._s.vm_id} already has {count} debuggers ([debugger] max_per_vm)"
            self._s._log(
                "debugger.rejected",
                "warning",
                peer=item.peer,
                via=item.via,
                reason=reason,
                holder=", ".join(peer for peer, _ in holders) or None,
                holder_via=", ".join(via for _, via in holders) or None,
            )
            self._s._out.append(CloseDebugger(item.consumer, "rejected"))
            return
        self._s._out += self._s.router.debugger_joined(
            item.consumer, item.via, item.peer, kind=item.kind, tool=item.tool
        )
        if not self._s.router.ready:
            self._s._waits[item.consumer] = now + self._s.settings.reconnect

    def _attached(self, debugger: int) -> None:
        """A consumer's handshake completed, or it began to debug: it no longer waits for the
        VM; once it debugs, the VM no longer waits for a debugger."""
        self._s._waits.pop(debugger, None)
        if debugger in self._s.router.attached():
            self._s.model.waiting = False
        self._s._out.append(Changed())

    def _debugger_leaves(self, debugger: int, reason: str, now: float) -> None:
        self._s._waits.pop(debugger, None)
        counts = self._s.router.debugger_statistics(debugger) or (0, 0, 0, 0)
        was_attached, debugged, commands = self._s.router.debugger_left(debugger)
        self._s._out += commands
        if not was_attached:
            return
        self._s._log(
            "debugger.detached",
            debugger=debugger,
            reason=reason,
            packets_in=counts[0],
            packets_out=counts[1],
        )
        self._s._out.append(Changed())
        if not debugged or self._s.router.attached() or self._s.state != "ready":
            return  # a DDM-only client never made the VM look debugged: nothing to release
        # The last debugger left: make the VM drop its state (breakpoints, suspensions).
        self._s._goto("last debugger left")
        self._s.router.ready = False
        self.release_after = reason
        if self._s.model.ddm is True:
            self._s._log("ddm.dbgd_sent", "debug", after=reason)
            self._s._ask(ddm.Dbgd(), "dbgd", "DBGD", now)
        else:
            self._release_done(False)

    def _release_done(self, acknowledged: bool) -> None:
        if self._s.state != "releasing":
            return
        if acknowledged:
            self._s._goto("acknowledged")
            self._s._log("ddm.dbgd_acknowledged", "debug")
            self.released("the VM acknowledged DBGD")
            self._s._out += self._s.router.connected_again()
            for debugger in list(self._s._waits):
                if debugger in self._s.router.connected_consumers():
                    self._attached(debugger)
            self._s._out.append(Changed())
            return
        # Closing the connection releases breakpoints and suspensions on every VM family.
        self._s._goto("no acknowledgement")
        self._s._drop_own("recycled after the debugger left")
        self._s._log("vm.reconnecting", "debug")
        self._s._out.append(Reconnect("recycled after the debugger left"))
        self._s._out.append(Changed())

    def released(self, how: str) -> None:
        """The one info line of a release (``vm.released``), when one is under way: the VM
        acknowledged DBGD, or its new connection is identified (``conversation``)."""
        after, self.release_after = self.release_after, None
        if after is not None:
            self._s._log("vm.released", how=how, after=after)
