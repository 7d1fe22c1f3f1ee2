"""The thread-state poll of one VM: THST (a plain JVM: the JDWP thread list, ``jvmthreads.py``)
at a fixed rate, missed ticks skipped, while someone watches the VM (a ``RefreshThreads`` call
leases the polls for ``settings.thread_lease``; ``always_poll_threads`` keeps them on).

Layer: standard library, ``ddmd.protocol`` and ``ddmd.session`` (sans-IO). A part of
``VmSession`` that sees it through ``SessionHost``; it reads the lifecycle (identified) and the
router (``ready``: the connection is usable) and owns the THST requests it sends.
"""

from __future__ import annotations

from ddmd.protocol import ddm
from ddmd.protocol.expect import Answer, Judgement
from ddmd.protocol.jdwp import ReplyPacket
from ddmd.session.commands import Changed
from ddmd.session.host import Own, SessionHost, judge_reply, silence
from ddmd.session.jvmthreads import JvmThreads
from ddmd.session.lifecycle import Lifecycle
from ddmd.session.router import Router

__all__ = ["ThreadPoll"]


class ThreadPoll:
    """When to poll the VM's threads next, and the THST request under way."""

    def __init__(
        self, host: SessionHost, lifecycle: Lifecycle, router: Router, jvm_threads: JvmThreads
    ) -> None:
        self._host = host
        self._lifecycle = lifecycle
        self._router = router
        self._jvm_threads = jvm_threads
        self._thst: Own | None = None  # the THST request under way
        self._next_poll: float | None = None
        self._lease_until = float("-inf")

    def next_deadline(self) -> float | None:
        return self._next_poll

    def refresh(self, now: float) -> Own | None:
        """A ``RefreshThreads`` call: the polls go on for the lease; the request that ends the
        call (one under way is shared), or None when the VM cannot be polled now."""
        host = self._host
        self._lease_until = now + host.settings.thread_lease
        model = host.model
        if model.ddm is False and self._lifecycle.identified and self._router.ready:
            return self._jvm_threads.poll()  # a plain JVM: over JDWP
        if model.ddm and "THST" not in model.unsupported and self._router.ready:
            return self._ask_thst()
        return None

    def _ask_thst(self) -> Own:
        if self._thst is None or self._thst.done:
            self._thst = self._host.ask(ddm.ThreadStatusRequest(), self, "thread states")
        return self._thst

    def poll(self, now: float) -> None:
        """After every input: poll when it is time, while someone watches the VM."""
        host = self._host
        settings = host.settings
        interval = settings.thread_poll_interval
        watched = settings.always_poll_threads or now < self._lease_until
        speaks = host.model.ddm
        pollable = (speaks and "THST" not in host.model.unsupported) or (
            speaks is False and self._lifecycle.identified
        )
        if not (watched and pollable and self._router.ready):
            self._next_poll = None
            return
        if self._next_poll is None:
            self._next_poll = now + settings.poll_phase * interval
        if now < self._next_poll:
            return
        if speaks is False:
            self._jvm_threads.poll()
        else:
            self._ask_thst()
        behind = now - self._next_poll
        self._next_poll += interval * (1 + int(behind // interval))

    def drop(self) -> None:
        """The connection ended: the request under way is gone with it."""
        self._thst = None

    # ------------------------------------------------------------------ the owner of THST

    def answered(self, own: Own, packet: ReplyPacket) -> None:
        host = self._host
        if not packet.error_code:
            rows = ddm.thread_status_rows(packet.data)
            if rows is not None:  # the usual poll answer: read quickly, entries that repeat kept
                own.judgement = Judgement(Answer.DATA)
                if host.model.apply_thread_rows(rows):
                    host.emit(Changed())
                return
        judgement = judge_reply(host, own, packet)
        if judgement.answer is Answer.DATA:
            for chunk in judgement.chunks:
                host.apply(chunk)

    def expired(self, own: Own) -> None:
        silence(self._host, own)
        if own is self._thst:
            self._thst = None
