"""Debuggers joining and leaving one VM session, and the release of the VM after the last
one leaves (DBGD, or a reconnect where the VM does not acknowledge it).

Layer: standard library, ``ddmd.protocol`` and ``ddmd.session`` (sans-IO). ``AttachMixin`` is
the part of ``VmSession`` that carries these rules out; the per-packet rules of several
debuggers are in ``bridge.py`` and ``router.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ddmd.protocol import ddm
from ddmd.session.calls import Own
from ddmd.session.commands import Changed, CloseDebugger, Command, Reconnect
from ddmd.session.inputs import DebuggerJoined
from ddmd.session.model import VmModel
from ddmd.session.router import Router
from ddmd.session.settings import SessionSettings

__all__ = ["AttachMixin"]


class AttachMixin:
    """The debugger half of ``VmSession`` (its attributes live there)."""

    vm_id: str
    state: str
    model: VmModel
    router: Router
    settings: SessionSettings
    _out: list[Command]
    _waits: dict[int, float]

    if TYPE_CHECKING:  # VmSession's

        def _log(self, event: str, level: str = "info", **fields: object) -> None: ...

        def _goto(self, what: str) -> None: ...

        def _ask(self, chunk: ddm.Chunk, purpose: str, feature: str, now: float) -> Own: ...

        def _drop_own(self, why: str) -> None: ...

    # ------------------------------------------------------------------ debuggers

    def _debugger_joins(self, item: DebuggerJoined, now: float) -> None:
        count = self.router.debugger_count()
        if self.state == "closed" or count >= self.settings.max_debuggers:
            holders = self.router.holders()
            if self.state == "closed":
                reason = f"{self.vm_id} is gone"
            elif self.settings.max_debuggers == 1:
                reason = f"{self.vm_id} already has a debugger"
            else:
                reason = f"{self.vm_id} already has {count} debuggers ([debugger] max_per_vm)"
            self._log(
                "debugger.rejected",
                "warning",
                peer=item.peer,
                via=item.via,
                reason=reason,
                holder=", ".join(peer for peer, _ in holders) or None,
                holder_via=", ".join(via for _, via in holders) or None,
            )
            self._out.append(CloseDebugger(item.debugger, "rejected"))
            return
        self._out += self.router.debugger_joined(item.debugger, item.via, item.peer)
        if not self.router.ready:
            self._waits[item.debugger] = now + self.settings.reconnect

    def _attached(self, debugger: int) -> None:
        """A debugger's handshake completed: the VM no longer waits for one."""
        self._waits.pop(debugger, None)
        self.model.waiting = False
        self._out.append(Changed())

    def _debugger_leaves(self, debugger: int, reason: str, now: float) -> None:
        self._waits.pop(debugger, None)
        counts = self.router.debugger_statistics(debugger) or (0, 0, 0, 0)
        was_attached, commands = self.router.debugger_left(debugger)
        self._out += commands
        if not was_attached:
            return
        self._log(
            "debugger.detached",
            debugger=debugger,
            reason=reason,
            packets_in=counts[0],
            packets_out=counts[1],
        )
        self._out.append(Changed())
        if self.router.attached() or self.state != "ready":
            return
        # The last debugger left: make the VM drop its state (breakpoints, suspensions).
        self._goto("last debugger left")
        self.router.ready = False
        if self.model.ddm is True:
            self._log("ddm.dbgd_sent", after=reason)
            self._ask(ddm.Dbgd(), "dbgd", "DBGD", now)
        else:
            self._release_done(False)

    def _release_done(self, acknowledged: bool) -> None:
        if self.state != "releasing":
            return
        if acknowledged:
            self._goto("acknowledged")
            self._log("ddm.dbgd_acknowledged")
            self._out += self.router.connected_again()
            for debugger in list(self._waits):
                if debugger in self.router.attached():
                    self._attached(debugger)
            self._out.append(Changed())
            return
        # Closing the connection releases breakpoints and suspensions on every VM family.
        self._goto("no acknowledgement")
        self._drop_own("recycled after the debugger left")
        self._log("vm.reconnecting")
        self._out.append(Reconnect("recycled after the debugger left"))
        self._out.append(Changed())
