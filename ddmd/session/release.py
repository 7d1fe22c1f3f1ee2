"""Consumers joining and leaving one VM session, and the release of the VM after the last
debugger leaves (DBGD, or a reconnect where the VM does not acknowledge it).

Layer: standard library, ``ddmd.protocol`` and ``ddmd.session`` (sans-IO). ``Release`` is the
part of ``VmSession`` that carries these rules out; it sees the session through
``SessionHost``, moves the lifecycle, and asks the router (whose ``debugger_joined``/
``debugger_left`` keep the consumers' table). The per-packet rules of several debuggers are in
``bridge.py`` and ``router.py``.

The log of a release: ``debugger.detached`` when the debugger leaves, then one info line,
``vm.released`` (``how``: the VM acknowledged DBGD, or it was reconnected and identified again;
``after``: why the debugger left) once the VM is free again. The steps in between (DBGD sent and
acknowledged, the reconnect, the HELO of the new connection) are at debug level.

Decisions:
- A consumer that joins while the VM connection is not usable (reopened for a release, or not
  open yet) waits for it, up to ``settings.reconnect``; then it is closed.
- Not acknowledged (silence within ``settings.dbgd_ack``, or a VM without DDM): the connection
  is recycled (``recycle``: the session drops everything of the old connection) and reopened.
"""

from __future__ import annotations

from collections.abc import Callable

from ddmd.protocol import ddm
from ddmd.protocol.expect import Answer
from ddmd.protocol.jdwp import ReplyPacket
from ddmd.session.commands import Changed, CloseDebugger, Reconnect
from ddmd.session.host import Own, SessionHost, judge_reply, silence
from ddmd.session.inputs import ConsumerJoined
from ddmd.session.lifecycle import Lifecycle
from ddmd.session.router import Router

__all__ = ["Release"]


class Release:
    """Joining, leaving, the consumers that wait for the VM, and the release of the VM."""

    def __init__(
        self,
        host: SessionHost,
        lifecycle: Lifecycle,
        router: Router,
        recycle: Callable[[str], None],
    ) -> None:
        self._host = host
        self._lifecycle = lifecycle
        self._router = router
        self._recycle = recycle
        # Why the last debugger left, while its release is under way (None: no release).
        self._after: str | None = None
        self._waits: dict[int, float] = {}  # consumer -> deadline of its wait for the VM

    @property
    def under_way(self) -> bool:
        """A release is under way (the last debugger left; the VM is not free again yet)."""
        return self._after is not None

    def next_deadline(self) -> float | None:
        return min(self._waits.values()) if self._waits else None

    def waiting(self) -> tuple[int, ...]:
        """The consumers that wait for the VM connection."""
        return tuple(self._waits)

    # ------------------------------------------------------------------ consumers

    def join(self, item: ConsumerJoined, now: float) -> None:
        host, router = self._host, self._router
        settings = host.settings
        vm_id = self._lifecycle.vm_id
        count = router.debugger_count()
        # A front socket counts as a debugger only from its first debugger command (router).
        counted = item.kind.debugs_from_handshake
        closed = self._lifecycle.state == "closed"
        if closed or (counted and count >= settings.max_debuggers):
            holders = router.holders()
            if closed:
                reason = f"{vm_id} is gone"
            elif settings.max_debuggers == 1:
                reason = f"{vm_id} already has a debugger"
            else:
                reason = f"{vm_id} already has {count} debuggers ([debugger] max_per_vm)"
            host.log(
                "debugger.rejected",
                "warning",
                peer=item.peer,
                via=item.via,
                reason=reason,
                holder=", ".join(peer for peer, _ in holders) or None,
                holder_via=", ".join(via for _, via in holders) or None,
            )
            host.emit(CloseDebugger(item.consumer, "rejected"))
            return
        for command in router.debugger_joined(
            item.consumer, item.via, item.peer, kind=item.kind, tool=item.tool
        ):
            host.emit(command)
        if not router.ready:
            self._waits[item.consumer] = now + settings.reconnect

    def named(self, consumer: int, tool: str) -> None:
        """The program on the other end of a consumer's connection was found."""
        found = self._router.consumers.by_id.get(consumer)
        if found is not None:
            found.tool = tool
            self._host.emit(Changed())

    def attached(self, consumer: int) -> None:
        """A consumer's handshake completed, or it began to debug: it no longer waits for the
        VM; once it debugs, the VM no longer waits for a debugger."""
        self._waits.pop(consumer, None)
        if consumer in self._router.attached():
            self._host.model.waiting = False
        self._host.emit(Changed())

    def connection_usable(self) -> None:
        """The connection is usable again (reopened, or the release acknowledged): the
        consumers that waited and whose handshake the router completed are attached."""
        connected = self._router.connected_consumers()
        for consumer in list(self._waits):
            if consumer in connected:
                self.attached(consumer)

    def leave(self, consumer: int, reason: str) -> None:
        host, router = self._host, self._router
        self._waits.pop(consumer, None)
        counts = router.debugger_statistics(consumer) or (0, 0, 0, 0)
        was_attached, debugged, commands = router.debugger_left(consumer)
        for command in commands:
            host.emit(command)
        if not was_attached:
            return
        host.log(
            "debugger.detached",
            debugger=consumer,
            reason=reason,
            packets_in=counts[0],
            packets_out=counts[1],
        )
        host.emit(Changed())
        if not debugged or router.attached() or self._lifecycle.state != "ready":
            return  # a DDM-only client never made the VM look debugged: nothing to release
        # The last debugger left: make the VM drop its state (breakpoints, suspensions).
        self._lifecycle.goto("last debugger left")
        router.ready = False
        self._after = reason
        if host.model.ddm is True:
            host.log("ddm.dbgd_sent", "debug", after=reason)
            host.ask(ddm.Dbgd(), self, "release", timeout=host.settings.dbgd_ack)
        else:
            self.done(False)

    def expire(self, now: float) -> None:
        """Consumers that waited for the VM too long are closed."""
        host = self._host
        for consumer, deadline in list(self._waits.items()):
            if now >= deadline:
                del self._waits[consumer]
                self._router.debugger_left(consumer)  # closed here: no ConsumerLeft will follow
                host.log(
                    "debugger.rejected",
                    "warning",
                    debugger=consumer,
                    reason=f"{self._lifecycle.vm_id} did not come back within [timeouts] reconnect",
                )
                host.emit(CloseDebugger(consumer, "the VM did not come back"))

    def vm_gone(self) -> None:
        """The VM connection is closed for good: every consumer is closed."""
        host = self._host
        consumers = self._router.connected_consumers()
        for consumer in consumers:
            host.log("debugger.detached", debugger=consumer, reason="the VM disconnected")
        for consumer in dict.fromkeys((*consumers, *self._waits)):
            host.emit(CloseDebugger(consumer, "the VM disconnected"))
        self._waits.clear()

    # ------------------------------------------------------------------ the release

    def answered(self, own: Own, packet: ReplyPacket) -> None:
        """DBGD's answer: a DBGD chunk acknowledges the release."""
        judgement = judge_reply(self._host, own, packet)
        if judgement.answer is Answer.DATA:
            for chunk in judgement.chunks:
                self._host.apply(chunk)
        acknowledged = judgement.answer is Answer.DATA and any(
            isinstance(c, ddm.Dbgd) for c in judgement.chunks
        )
        self.done(acknowledged)

    def expired(self, own: Own) -> None:
        silence(self._host, own)
        self.done(False)

    def done(self, acknowledged: bool) -> None:
        """The VM acknowledged DBGD (it is free again), or not (its connection is recycled)."""
        if self._lifecycle.state != "releasing":
            return
        host = self._host
        if acknowledged:
            self._lifecycle.goto("acknowledged")
            host.log("ddm.dbgd_acknowledged", "debug")
            self.released("the VM acknowledged DBGD")
            for command in self._router.connected_again():
                host.emit(command)
            self.connection_usable()
            host.emit(Changed())
            return
        # Closing the connection releases breakpoints and suspensions on every VM family.
        self._lifecycle.goto("no acknowledgement")
        self._recycle("recycled after the debugger left")
        host.log("vm.reconnecting", "debug")
        host.emit(Reconnect("recycled after the debugger left"))
        host.emit(Changed())

    def released(self, how: str) -> None:
        """The one info line of a release (``vm.released``), when one is under way: the VM
        acknowledged DBGD, or its new connection is identified (``conversation``)."""
        after, self._after = self._after, None
        if after is not None:
            self._host.log("vm.released", how=how, after=after)
