"""How each DDM request ends (protocol.md 2.2), and what an answer says about a VM's features.

Layer: ``protocol`` (sans-IO, standard library only).

A VM answers some requests with a reply chunk every time (HELO, THST, STKL, ...). Others are
answered by *pushes or silence*: the handler returns nothing, so Dalvik and ART 5-8 write an
empty reply, ART 9+ without its debugger agent writes nothing at all, and the useful data (heap
info, the THCR burst, a heap dump, a trace file) arrives as separate pushes. ddmd must treat
silence to such a request as success, and may conclude that a VM lacks a feature only from
evidence: a FAIL chunk, a JDWP error, the feature missing from FEAT where FEAT lists it, or no
answer to a request that always answers.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

from ddmd.protocol.ddm import Chunk, ChunkType, Direction, Fail, chunks_of
from ddmd.protocol.errors import ProtocolError
from ddmd.protocol.jdwp import ErrorCode, ReplyPacket

__all__ = [
    "FEATURE_NAMES",
    "Answer",
    "Expect",
    "Judgement",
    "expectation",
    "judge",
]


class Expect(enum.Enum):
    """What ends a request."""

    REPLY = "reply"  # a reply chunk, every time; silence means the VM lacks the handler
    QUIET = "pushes or silence"  # success is silence, an empty reply, or the pushes it causes


_ALWAYS_ANSWERED: Final = frozenset(
    {
        ChunkType.HELO,
        ChunkType.FEAT,
        ChunkType.THST,
        ChunkType.STKL,
        ChunkType.REAQ,
        ChunkType.REAL,
        ChunkType.MPRQ,
        ChunkType.HPDU,
        ChunkType.MPRE,
        ChunkType.NHGT,
        ChunkType.VULW,
        ChunkType.VURT,
    }
)

#: The FEAT name a request needs, where a VM's FEAT reply lists it (protocol.md 3.2): a VM
#: whose FEAT list lacks the name does not get the request.
FEATURE_NAMES: Final = {
    ChunkType.HPDS: "hprof-heap-dump-streaming",
    ChunkType.HPDU: "hprof-heap-dump",
    ChunkType.MPSS: "method-trace-profiling-streaming",
    ChunkType.MPSE: "method-trace-profiling-streaming",
    ChunkType.SPSS: "method-sample-profiling",
    ChunkType.SPSE: "method-sample-profiling",
    ChunkType.MPRS: "method-trace-profiling",
    ChunkType.MPRE: "method-trace-profiling",
    ChunkType.VULW: "view-hierarchy",
    ChunkType.VURT: "view-hierarchy",
    ChunkType.VUOP: "view-hierarchy",
}


def expectation(chunk_type: int) -> Expect:
    """REPLY for requests every DDM VM answers with data; QUIET for all others, including
    types this module does not know (a VM without a handler for them stays silent on ART 9+)."""
    return Expect.REPLY if chunk_type in _ALWAYS_ANSWERED else Expect.QUIET


class Answer(enum.Enum):
    """What one reply to a DDM request means."""

    DATA = "data"  # chunks (possibly none: an empty reply)
    FAILED = "failed"  # a FAIL chunk: the VM's handler refused this request
    REFUSED = "refused"  # a JDWP error: no DDM, or no such handler (the agent's error 99)
    MALFORMED = "malformed"  # the reply's chunks do not parse


@dataclass(frozen=True, slots=True)
class Judgement:
    answer: Answer
    chunks: tuple[Chunk, ...] = ()
    reason: str = ""  # for FAILED / REFUSED / MALFORMED: why, in words for a log or a user
    fail_code: int | None = None


def judge(reply: ReplyPacket) -> Judgement:
    """Classify a reply to one of ddmd's own DDM requests."""
    if reply.error_code:
        try:
            name = ErrorCode(reply.error_code).name
        except ValueError:
            name = "unknown"
        return Judgement(Answer.REFUSED, reason=f"JDWP error {reply.error_code} ({name})")
    try:
        chunks = chunks_of(reply, Direction.FROM_VM)
    except ProtocolError as exc:
        return Judgement(Answer.MALFORMED, reason=str(exc))
    for chunk in chunks:
        if isinstance(chunk, Fail):
            message = chunk.message or "no message"
            return Judgement(
                Answer.FAILED, reason=f"{message} (code {chunk.code})", fail_code=chunk.code
            )
    return Judgement(Answer.DATA, chunks=tuple(chunks))
