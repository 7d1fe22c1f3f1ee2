"""What the parts of a VM session see of it: ``SessionHost``, and the requests ddmd sends on its
own behalf (``Own``), each carrying the part that asked (its ``Owner``).

Layer: standard library, ``ddmd.protocol`` and ``ddmd.session`` (sans-IO).

The parts of ``VmSession`` (``calls.py``, ``conversation.py``, ``poll.py``, ``profiling.py``,
``capture.py``, ``release.py``, ``jvmthreads.py``, ``feed.py``) each own their state and see the
session through ``SessionHost``, never through ``VmSession`` (``bridge.py``'s ``BridgeHost`` is
the model); what else a part works with is handed to it by name when the session composes it:
the ``Lifecycle``, the router's public API, a sibling part's public methods. A part that asks
the VM something gets back an ``Own``; when the VM answers, or the request's deadline passes,
the session hands the ``Own`` to its owner (``answered``/``expired``): a reply goes to whoever
asked, by object.

Decisions:
- The ``Own`` itself is the id-map origin of its request: the router gives it back with the
  reply (or the expiry), so no table of pending requests keyed by id is kept beside the id map.
- ``judge_reply`` and ``silence`` hold the rules every owner shares (protocol.md 2.2): a
  malformed answer is logged; a refusal, or silence to a request that is always answered, marks
  the feature unsupported.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Protocol

from ddmd.protocol import ddm
from ddmd.protocol.expect import Answer, Expect, Judgement, judge
from ddmd.protocol.jdwp import ReplyPacket
from ddmd.session.commands import Command
from ddmd.session.model import VmModel
from ddmd.session.settings import SessionSettings
from ddmd.session.words import missing_sentence, silence_reason

__all__ = [
    "SELF",
    "Own",
    "Owner",
    "PendingCall",
    "SessionHost",
    "judge_reply",
    "missing",
    "silence",
]


class _Self:
    """The id-map origin of ddmd's own commands that nobody waits on (JDWP Exit)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ddmd"


SELF = _Self()


class Owner(Protocol):
    """The part that asked: told of the VM's answer to its request, or of its silence."""

    def answered(self, own: Own, packet: ReplyPacket) -> None: ...

    def expired(self, own: Own) -> None: ...


@dataclass(slots=True, eq=False)
class Own:
    """One request of ddmd's own on the wire (compared by identity: it is its id-map origin).

    ``owner`` is told the outcome; None for a marker that other requests end (the JDWP thread
    list of a plain JVM). ``what`` is a label for logs and reprs, never compared."""

    owner: Owner | None
    what: str
    feature: str
    expect: Expect
    judgement: Judgement | None = None
    expired: bool = False
    seen: int = 0  # a model counter when it was sent (heap info for the probe)

    @property
    def done(self) -> bool:
        return self.judgement is not None or self.expired

    def refused(self) -> bool:
        return self.judgement is not None and self.judgement.answer in (
            Answer.FAILED,
            Answer.REFUSED,
        )

    def succeeded(self) -> bool:
        return self.judgement is not None and self.judgement.answer is Answer.DATA


@dataclass(slots=True)
class PendingCall:
    """One API call being worked on (``Call``): its number, request, deadline and requests."""

    call: int
    request: object
    deadline: float
    seen: int = 0
    owns: list[Own] = field(default_factory=list)


class SessionHost(Protocol):
    """What a part of a VM session may do with the session: nine members."""

    @property
    def settings(self) -> SessionSettings: ...

    @property
    def model(self) -> VmModel:
        """ddmd's model of the VM (its public fields and methods)."""
        ...

    @property
    def name(self) -> str:
        """The VM's display name, for sentences."""
        ...

    def emit(self, command: Command) -> None:
        """Add a command to those the current input returns."""
        ...

    def log(self, event: str, level: str = "info", **fields: object) -> None: ...

    def ask(self, chunk: ddm.Chunk, owner: Owner, what: str, *, timeout: float = 0.0) -> Own:
        """Send a DDM request of ddmd's own (its id from the one IdRewriter); ``owner`` gets its
        answer or its silence after ``timeout`` (0: ``settings.ddm_request``)."""
        ...

    def send_jdwp(self, origin: Hashable, command_set: int, command: int, data: bytes) -> int:
        """Send a JDWP command of ddmd's own; its VM-side id. ``origin``: an ``Own`` (its owner
        gets the answer), or an origin the session dispatches otherwise (``SELF``: nobody)."""
        ...

    def mark_unsupported(self, feature: str, why: str) -> None:
        """The VM lacks ``feature`` (logged and announced once)."""
        ...

    def apply(self, chunk: ddm.Chunk) -> None:
        """A chunk the VM sent (pushed, or carried in a reply), applied to ddmd's model."""
        ...


def missing(host: SessionHost, feature: str) -> str:
    """The sentence for a user: what the VM lacks and why (``words.missing_sentence``)."""
    model = host.model
    return missing_sentence(host.name, feature, model.unsupported.get(feature, ""), ddm=model.ddm)


def judge_reply(
    host: SessionHost, own: Own, packet: ReplyPacket, *, marks: bool = True
) -> Judgement:
    """The rules every owner applies to an answer: judged by what ends the request
    (``protocol.expect``), a malformed one logged; ``marks``: a refusal marks the feature
    unsupported (a request that pushes or stays silent: any refusal; one always answered: a
    JDWP error)."""
    own.judgement = judgement = judge(packet)
    if judgement.answer is Answer.MALFORMED:
        host.log("ddm.chunk_malformed", "warning", feature=own.feature, error=judgement.reason)
    if not marks:
        return judgement
    if own.expect is Expect.QUIET and own.refused():
        verb = "it refused" if judgement.answer is Answer.FAILED else "it answered"
        host.mark_unsupported(own.feature, f"{verb}: {judgement.reason}")
    elif own.expect is Expect.REPLY and judgement.answer is Answer.REFUSED:
        host.mark_unsupported(own.feature, f"it answered: {judgement.reason}")
    return judgement


def silence(host: SessionHost, own: Own) -> None:
    """No answer by the deadline: evidence that the VM lacks a request always answered."""
    own.expired = True
    if own.expect is Expect.REPLY:
        timeout = host.settings.ddm_request
        host.log("ddm.request_timed_out", feature=own.feature, timeout=timeout)
        host.mark_unsupported(own.feature, silence_reason(own.feature, timeout))
