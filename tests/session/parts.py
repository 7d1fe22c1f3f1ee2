"""A fake ``SessionHost`` for testing one part of a VM session alone, with the Playbook.

    host = FakeHost()
    release = Release(host, lifecycle, router, recycle)
    assert (
        host.book(feed)  # feed: the test's function that hands an input to the part
        >> ConsumerLeft(1, "debugger closed the connection")
        << CloseDebugger(1, "left")
        << Changed()
        << Ask(ddm.Dbgd(), timeout=1.0)
        >> Answer("DBGD", ddm.Dbgd())
        << Applied(ddm.Dbgd())
        << Changed()
    )

What a part asks of the host shows as commands of its own in the transcript: ``Ask`` (a DDM
request of ddmd's own), ``Jdwp`` (a JDWP command), ``Unsupported`` (a feature marked missing)
and ``Applied`` (a chunk given to the model). ``Answer``/``Silence`` are inputs the host
carries out itself: the VM's answer to the oldest request of that feature still open, or its
silence until the deadline, handed to the request's owner as the session would. Every other
input goes to the part through the test's ``feed`` function. No event loop, no router of the
session, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ddmd.protocol import ddm
from ddmd.protocol.expect import expectation
from ddmd.protocol.jdwp import ReplyPacket
from ddmd.session.commands import Command, Log
from ddmd.session.host import Own, Owner
from ddmd.session.model import VmModel
from ddmd.session.settings import SessionSettings
from tests.session.playbook import Playbook

# ------------------------------------------------------------------------------ the host's commands


@dataclass(slots=True)
class Ask:
    """The part asked the VM ``chunk`` on ddmd's behalf (``timeout``: 0 is the default)."""

    chunk: ddm.Chunk
    timeout: float = 0.0


@dataclass(slots=True)
class Jdwp:
    """The part sent a JDWP command of ddmd's own (VM-side id ``vm_id``)."""

    command_set: int
    command: int
    data: bytes = b""
    vm_id: Any = None


@dataclass(slots=True)
class Unsupported:
    feature: str
    why: Any = None


@dataclass(slots=True)
class Applied:
    chunk: ddm.Chunk


# ------------------------------------------------------------------------------ the VM's side


@dataclass(slots=True)
class Answer:
    """The VM answers the oldest open request of ``feature``: these chunks, or a JDWP error."""

    feature: str
    chunks: tuple[ddm.Chunk, ...] = ()
    error: int = 0
    raw: bytes | None = None  # the reply's data as they are (a JDWP command's answer)

    def __init__(
        self, feature: str, *chunks: ddm.Chunk, error: int = 0, raw: bytes | None = None
    ) -> None:
        self.feature, self.chunks, self.error, self.raw = feature, chunks, error, raw


@dataclass(slots=True)
class Silence:
    """The oldest open request of ``feature`` got no answer by its deadline."""

    feature: str


@dataclass(frozen=True)
class Pushed:
    """A whole chunk the VM pushed (a part's ``handle_raw``)."""

    chunk_type: int
    data: bytes


@dataclass(frozen=True)
class Piece:
    """A piece of a push too large to hold (a part's ``push_piece``)."""

    data: bytes
    first: bool = False
    last: bool = False


@dataclass(slots=True)
class FakeHost:
    """``SessionHost`` with everything it is asked recorded as commands."""

    settings: SessionSettings = field(default_factory=SessionSettings)
    model: VmModel = field(default_factory=VmModel)
    name: str = "com.example.mail"
    out: list[Command | Any] = field(default_factory=list)
    open: list[Own] = field(default_factory=list)  # requests not answered yet, oldest first
    jdwp_origins: dict[int, Hashable] = field(default_factory=dict)
    next_id: int = 1

    # -------------------------------------------------------------- SessionHost

    def emit(self, command: Command) -> None:
        self.out.append(command)

    def log(self, event: str, level: str = "info", **fields: object) -> None:
        self.out.append(Log(event, level, dict(fields)))

    def ask(self, chunk: ddm.Chunk, owner: Owner, what: str, *, timeout: float = 0.0) -> Own:
        chunk_type = int(chunk.chunk_type)
        own = Own(owner, what, ddm.type_name(chunk_type), expectation(chunk_type))
        self.open.append(own)
        self.out.append(Ask(chunk, timeout))
        return own

    def send_jdwp(self, origin: Hashable, command_set: int, command: int, data: bytes) -> int:
        vm_id = self.next_id
        self.next_id += 1
        self.jdwp_origins[vm_id] = origin
        if isinstance(origin, Own):
            self.open.append(origin)
        self.out.append(Jdwp(command_set, command, data, vm_id))
        return vm_id

    def mark_unsupported(self, feature: str, why: str) -> None:
        if self.model.mark_unsupported(feature, why):
            self.out.append(Unsupported(feature, why))

    def apply(self, chunk: ddm.Chunk) -> None:
        self.model.apply(chunk)
        self.out.append(Applied(chunk))

    # -------------------------------------------------------------- the VM's side

    def request(self, feature: str) -> Own:
        """The oldest open request of ``feature``."""
        for own in self.open:
            if own.feature == feature:
                return own
        raise AssertionError(f"no open {feature} request among {self.open!r}")

    def answer(self, item: Answer) -> None:
        own = self.request(item.feature)
        self.open.remove(own)
        data = item.raw if item.raw is not None else ddm.encode_chunks(item.chunks)
        assert own.owner is not None
        own.owner.answered(own, ReplyPacket(0, item.error, data))

    def silence(self, item: Silence) -> None:
        own = self.request(item.feature)
        self.open.remove(own)
        assert own.owner is not None
        own.owner.expired(own)

    def take(self) -> list[Any]:
        out, self.out = self.out, []
        return out

    def book(
        self,
        feed: Callable[[Any], object],
        *,
        after: Callable[[], object] | None = None,
        **kw: Any,
    ) -> Playbook:
        """A Playbook whose inputs go to ``feed`` (Answer and Silence: to the host); ``after``
        runs after every input (as the session settles its calls after each)."""

        def handle(item: Any) -> Iterable[Any]:
            if isinstance(item, Answer):
                self.answer(item)
            elif isinstance(item, Silence):
                self.silence(item)
            else:
                feed(item)
            if after is not None:
                after()
            return self.take()

        return Playbook(handle, **kw)
