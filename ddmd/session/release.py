"""Consumers joining and leaving one VM session, and the release of the VM after the last
debugger leaves (DBGD, or a reconnect where the VM does not acknowledge it).

Layer: standard library, ``ddmd.protocol`` and ``ddmd.session`` (sans-IO). ``Release`` is the
part of ``VmSession`` that carries these rules out; it sees the session through
``SessionHost``, moves the lifecycle, and asks the router (whose ``debugger_joined``/
``debugger_left`` keep the consumers' table). The per-packet rules of several debuggers are in
``bridge.py`` and ``router.py``.

How the VM is released when the last debugger leaves:
- A VM that speaks DDM (ART) is sent DBGD; acknowledged, the VM is free again; else its
  connection is recycled (the VM drops every debugger's state when its connection closes).
- A VM without DDM (HotSpot) keeps its connection: HotSpot numbers its ids again from the
  start on a new connection, so one command can name another object afterwards, and it prints
  its "Listening" line again, which users read as a restart. ddmd releases what the debugger
  held as it does when one of several leaves (``Bridge.release``: each event request cleared,
  each suspension it held resumed, each object it pinned re-enabled; HoldEvents is ddmd's own
  and never reaches the VM), under an ``Own`` of this part, and waits for every reply. All
  answered without an error: the VM is ready again on the same connection. An error reply, or
  silence past ``settings.dbgd_ack``: the connection is recycled as above, and the log says why.

The log of a release: ``debugger.detached`` when the debugger leaves, then one info line,
``vm.released`` (``how``: the VM acknowledged DBGD, ddmd released it on its connection, or it
was reconnected and identified again; ``after``: why the debugger left) once the VM is free
again; a release that falls back to a reconnect says why first (``vm.release_unconfirmed``).
The steps in between are at debug level.

Decisions:
- A consumer that joins while the VM connection is not usable (reopened for a release, or not
  open yet) waits for it, up to ``settings.reconnect``; then it is closed.
- A command of a consumer already attached that arrives while the connection is not usable is
  held (``Intake``) and taken in order once it is usable again (``connection_usable``); if
  the VM goes away instead, it is answered VM_DEAD (issue 31).
- Not acknowledged (silence within ``settings.dbgd_ack``, or a refusal): the connection is
  recycled (``recycle``: the session drops everything of the old connection) and reopened.

Costs: a kept connection keeps what the JDWP agent keeps per connection beyond the requests,
suspensions and pins: the ids it handed out (so they stay valid), a default stratum a debugger
set (VM.SetDefaultStratum), and classes it redefined (as a closed connection would too).
"""

from __future__ import annotations

from collections.abc import Callable

from ddmd.protocol import ddm
from ddmd.protocol.expect import Answer, Expect
from ddmd.protocol.jdwp import ErrorCode, ReplyPacket
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
        self._keeping: _Kept | None = None  # a release on the kept connection, under way

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
            holders = router.consumers.holders()
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
        """The connection is usable again (reopened, or the release done): the consumers that
        waited and whose handshake the router completed are attached, and the commands held
        meanwhile are taken, in order."""
        router = self._router
        connected = router.connected_consumers()
        for consumer in list(self._waits):
            if consumer in connected:
                self.attached(consumer)
        for consumer, commands, leaving in router.intake.replay_held():
            debugging = consumer in router.attached()
            for command in commands:
                self._host.emit(command)
            if leaving is not None:
                self.leave(consumer, leaving)
            elif not debugging and consumer in router.attached():
                self.attached(consumer)  # a front socket's first debugger command

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
        if not debugged or router.attached():
            return  # a DDM-only client never made the VM look debugged: nothing to release
        if self._lifecycle.state != "ready" or host.model.ddm is not False:
            router.bridge.reset()  # DBGD, or a new connection, drops it all
            if self._lifecycle.state != "ready":
                return
        # The last debugger left: make the VM drop its state (breakpoints, suspensions).
        self._lifecycle.goto("last debugger left")
        router.ready = False
        self._after = reason
        if host.model.ddm is True:
            host.log("ddm.dbgd_sent", "debug", after=reason)
            host.ask(ddm.Dbgd(), self, "release", timeout=host.settings.dbgd_ack)
        elif host.model.ddm is False:
            self._keep(consumer)
        else:
            self.done(False)

    def _keep(self, consumer: int) -> None:
        """Release what the last debugger held on the connection, and wait for every reply
        (until ``settings.dbgd_ack`` past the session's time, which the router holds)."""
        host, router = self._host, self._router
        router.kept = True
        keeping = self._keeping = _Kept(self._kept, self._unconfirmed, host.settings.dbgd_ack)
        own = Own(keeping, "release on the kept connection", "release", Expect.REPLY)
        deadline = router.now + host.settings.dbgd_ack
        commands, keeping.unanswered = router.bridge.release(consumer, own, deadline)
        for command in commands:
            host.emit(command)
        if not keeping.unanswered:
            self._kept()

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
        """The VM connection is closed for good: every held command is refused, every
        consumer is closed."""
        host = self._host
        if self._keeping is not None:
            self._keeping.over = True
            self._keeping = None
        for command in self._router.intake.refuse_held(ErrorCode.VM_DEAD):
            host.emit(command)
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

    def _kept(self) -> None:
        """Every command of the release on the kept connection was carried out."""
        if self._keeping is not None:
            self._keeping.over = True
            self._keeping = None
        if self._lifecycle.state != "releasing":
            return
        host = self._host
        self._lifecycle.goto("released")
        self.released("ddmd released what the debugger held; the connection is kept")
        for command in self._router.connected_again(kept=True):
            host.emit(command)
        self.connection_usable()
        host.emit(Changed())

    def _unconfirmed(self, why: str) -> None:
        """The release on the kept connection cannot be confirmed: reconnect, and say why."""
        if self._keeping is not None:
            self._keeping.over = True
            self._keeping = None
        self._host.log("vm.release_unconfirmed", "warning", why=why, then="reconnecting")
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


class _Kept:
    """The owner of the commands of one release on the kept connection (``Release._keep``):
    told each reply, or the silence past the deadline; reports once (``done`` or ``failed``)."""

    def __init__(
        self, done: Callable[[], None], failed: Callable[[str], None], timeout: float
    ) -> None:
        self._done = done
        self._failed = failed
        self._timeout = timeout
        self.unanswered: dict[int, str] = {}  # VM-side id -> what the command is
        self.over = False

    def answered(self, own: Own, packet: ReplyPacket) -> None:
        what = self.unanswered.pop(packet.id, None)
        if self.over or what is None:
            return
        if packet.error_code:
            self._failed(f"the VM refused {what}: JDWP error {packet.error_code}")
        elif not self.unanswered:
            self._done()

    def expired(self, own: Own) -> None:
        if self.over or not self.unanswered:
            return
        waited = ", ".join(self.unanswered.values())
        self._failed(f"no answer within {self._timeout:g} s ([timeouts] dbgd_ack) to {waited}")
