"""The thread list of a plain JVM (one that does not speak DDM), read over ddmd's own JDWP
connection: what jstack's first lines give, polled like THST.

Layer: standard library, ``ddmd.protocol`` and ``ddmd.session`` (sans-IO). A part of
``VmSession`` that sees it through ``SessionHost`` (its requests go out with ``send_jdwp`` under
its own origin, ``JVM_THREADS``, and the session hands their replies back here); only ever used
when the VM answered HELO with a JDWP error (``model.ddm is False``): a VM that speaks DDM
never gets a non-DDM packet from ddmd (ART would load its debugger agent).

One poll:

    IDSizes (once per connection) ─▶ AllThreads ─▶ per thread: Status; Name and ThreadGroup
    the first time it is seen; ThreadGroupReference.Name the first time a group is seen

A thread keeps its JDWP object id for as long as it lives, so its id in ddmd is stable. The
agent counts every id it hands to this connection; the ids of threads that died are handed
back (``VirtualMachine.DisposeObjects`` with the counts ddmd received), so a JVM watched for
weeks holds no growing table for ddmd. Every request has ddmd's own id from the one
IdRewriter: attached debuggers never see a reply or an event of it.
"""

from __future__ import annotations

import struct
from collections import Counter
from dataclasses import dataclass, field

from ddmd.protocol.errors import ProtocolError
from ddmd.protocol.expect import Answer, Expect, Judgement
from ddmd.protocol.idmap import Pending
from ddmd.protocol.jdwp import IdSizes, ReplyPacket
from ddmd.session.commands import Changed
from ddmd.session.host import Own, SessionHost
from ddmd.session.model import ThreadSnapshot

__all__ = ["JDWP_STATES", "JVM_THREADS", "JvmThreads"]

_VM, _THREAD, _GROUP = 1, 11, 12
_ID_SIZES, _ALL_THREADS, _DISPOSE = 7, 4, 14
_NAME, _STATUS, _THREAD_GROUP = 1, 4, 5
_GROUP_NAME = 1
_INT = struct.Struct(">i")

#: JDWP ThreadStatus -> the words DDMS uses for DDM VMs (SLEEPING is a timed wait).
JDWP_STATES = {0: "zombie", 1: "running", 2: "timed-wait", 3: "monitor", 4: "wait"}
_SUSPENDED = 1  # SuspendStatus bit


class _JvmThreadsOrigin:
    """The id-map origin of the thread poll's requests."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ddmd (thread list)"


JVM_THREADS = _JvmThreadsOrigin()


@dataclass(slots=True)
class _Poll:
    own: Own
    threads: list[int] = field(default_factory=list)
    status: dict[int, tuple[int, int]] = field(default_factory=dict)
    waiting: set[int] = field(default_factory=set)  # VM-side ids still unanswered


class JvmThreads:
    """The poll's state for one connection."""

    def __init__(self, host: SessionHost) -> None:
        self._host = host
        self.reset()

    def reset(self) -> None:
        """A new connection: ids start again."""
        self._sizes: IdSizes | None = None
        self._names: dict[int, str] = {}
        self._group_of: dict[int, int] = {}
        self._group_names: dict[int, str] = {}
        self._refs: Counter[int] = Counter()  # ids received on this connection, and how often
        self._asked: dict[int, tuple[str, int]] = {}  # VM-side id -> (what, object id)
        self._poll: _Poll | None = None
        self.polls = 0

    # ------------------------------------------------------------------ a poll

    def poll(self) -> Own:
        """Start a poll unless one is under way; the Own that ends with it."""
        if self._poll is not None and not self._poll.own.done:
            return self._poll.own
        own = Own(None, "jvm threads", "THREADS", Expect.REPLY)  # ended by the poll's replies
        self._poll = _Poll(own)
        self.polls += 1
        if self._sizes is None:
            self._ask("sizes", 0, _VM, _ID_SIZES, b"")
        else:
            self._ask("all", 0, _VM, _ALL_THREADS, b"")
        return own

    def _ask(self, what: str, obj: int, cmd_set: int, cmd: int, data: bytes) -> None:
        vm_id = self._host.send_jdwp(JVM_THREADS, cmd_set, cmd, data)
        self._asked[vm_id] = (what, obj)
        if self._poll is not None:
            self._poll.waiting.add(vm_id)

    def _object(self, obj: int) -> bytes:
        assert self._sizes is not None
        return obj.to_bytes(self._sizes.object_id, "big")

    # ------------------------------------------------------------------ replies

    def owns(self, pending: Pending) -> bool:
        return pending.origin is JVM_THREADS

    def reply(self, pending: Pending, packet: ReplyPacket) -> None:
        asked = self._asked.pop(pending.vm_id, None)
        poll = self._poll
        if asked is None:
            return
        what, obj = asked
        if poll is not None:
            poll.waiting.discard(pending.vm_id)
        try:
            self._take(what, obj, packet)
        except (ProtocolError, ValueError, struct.error) as exc:
            self._host.log("vm.protocol_error", "warning", error=f"thread list: {exc}")
        if poll is not None and not poll.waiting and not poll.own.done:
            self._finish(poll)

    def expired(self, pending: Pending) -> None:
        asked = self._asked.pop(pending.vm_id, None)
        poll = self._poll
        if asked is None or poll is None:
            return
        poll.waiting.discard(pending.vm_id)
        if asked[0] in ("sizes", "all"):
            poll.own.expired = True  # the VM did not answer: no list this time
            return
        if not poll.waiting and not poll.own.done:
            self._finish(poll)

    def _take(self, what: str, obj: int, packet: ReplyPacket) -> None:
        poll = self._poll
        if packet.error_code:
            if what in ("sizes", "all") and poll is not None:
                poll.own.judgement = Judgement(
                    Answer.FAILED, reason=f"JDWP error {packet.error_code}"
                )
            elif what == "status" and poll is not None:
                poll.status.pop(obj, None)  # it ended since AllThreads
            return
        data = packet.data
        if what == "sizes":
            self._sizes = IdSizes.decode(data)
            self._ask("all", 0, _VM, _ALL_THREADS, b"")
        elif what == "all" and poll is not None:
            self._all_threads(poll, data)
        elif what == "status" and poll is not None:
            status, suspend = struct.unpack(">ii", data[:8])
            poll.status[obj] = (status, suspend)
        elif what == "name":
            self._names[obj] = _jstring(data)
        elif what == "group":
            group = int.from_bytes(data[: self._object_size()], "big")
            self._refs[group] += 1
            self._group_of[obj] = group
            if group and group not in self._group_names:
                self._group_names[group] = ""
                self._ask("group-name", group, _GROUP, _GROUP_NAME, self._object(group))
        elif what == "group-name":
            self._group_names[obj] = _jstring(data)

    def _object_size(self) -> int:
        return 8 if self._sizes is None else self._sizes.object_id

    def _all_threads(self, poll: _Poll, data: bytes) -> None:
        size = self._object_size()
        (count,) = _INT.unpack_from(data)
        if count < 0 or 4 + count * size > len(data):
            raise ValueError(f"AllThreads reply of {len(data)} bytes cannot hold {count} ids")
        threads = [
            int.from_bytes(data[4 + i * size : 4 + (i + 1) * size], "big") for i in range(count)
        ]
        poll.threads = threads
        for thread in threads:
            self._refs[thread] += 1
            self._ask("status", thread, _THREAD, _STATUS, self._object(thread))
            poll.status[thread] = (1, 0)  # until its Status arrives
            if thread not in self._names:
                self._names[thread] = ""
                self._ask("name", thread, _THREAD, _NAME, self._object(thread))
                self._ask("group", thread, _THREAD, _THREAD_GROUP, self._object(thread))
        self._dispose_dead(set(threads))

    def _dispose_dead(self, alive: set[int]) -> None:
        """Hand back the ids of threads that died (with the count this connection received)."""
        dead = [t for t in self._names if t not in alive]
        if not dead:
            return
        body = bytearray(_INT.pack(len(dead)))
        for thread in dead:
            body += self._object(thread) + _INT.pack(self._refs.pop(thread, 1))
            self._names.pop(thread, None)
            self._group_of.pop(thread, None)
        self._ask("dispose", 0, _VM, _DISPOSE, bytes(body))

    def _finish(self, poll: _Poll) -> None:
        if poll.own.judgement is None:
            poll.own.judgement = Judgement(Answer.DATA)
        if poll.own.judgement.answer is not Answer.DATA:
            return
        table: dict[int, ThreadSnapshot] = {}
        for thread in poll.threads:
            status = poll.status.get(thread)
            if status is None:
                continue
            state, suspend = status
            table[thread] = ThreadSnapshot(
                thread,
                self._names.get(thread) or f"thread {thread}",
                status=state,
                state=JDWP_STATES.get(state, str(state)),
                suspended=bool(suspend & _SUSPENDED),
            )
        model = self._host.model
        if table != model.threads or not model.threads_known:
            model.threads = table
            model.threads_known = True
            self._host.emit(Changed())

    def group_name(self, thread: int) -> str | None:
        group = self._group_of.get(thread)
        return None if group is None else self._group_names.get(group) or None

    def live_ids(self) -> int:
        """Object ids this connection holds for ddmd (for tests: it must not grow)."""
        return len(self._refs)


def _jstring(data: bytes) -> str:
    if len(data) < 4:
        raise ValueError(f"a JDWP string of {len(data)} bytes")
    n = int.from_bytes(data[:4], "big")
    if 4 + n > len(data):
        raise ValueError(f"a JDWP string of {n} bytes in {len(data) - 4}")
    return data[4 : 4 + n].decode("utf-8", errors="replace")
