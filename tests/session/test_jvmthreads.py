"""The plain JVM's thread list alone (``session/jvmthreads.py``), against a fake host: one poll
over JDWP (IDSizes once per connection, AllThreads, then per thread Status, and Name and
ThreadGroup the first time), rule by rule.

``Poll()`` starts a poll; ``Reply(vm_id, data)`` is the VM's answer to the JDWP command the
host sent with that id (the session hands it back by the poll's origin); ``Expire(vm_id)``
its silence. The host numbers the commands from 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ddmd.protocol.expect import Answer as Verdict
from ddmd.protocol.idmap import Pending
from ddmd.protocol.jdwp import ReplyPacket
from ddmd.session.commands import Changed, Log
from ddmd.session.jvmthreads import JVM_THREADS, JvmThreads
from ddmd.session.model import ThreadSnapshot
from tests.session.parts import FakeHost, Jdwp
from tests.session.playbook import Placeholder

SIZES = bytes.fromhex("00000008" * 5)  # every id 8 bytes
T1, T2, GROUP = 0x101, 0x102, 0x200


def jobject(obj: int) -> bytes:
    return obj.to_bytes(8, "big")


def jstring(text: str) -> bytes:
    data = text.encode()
    return len(data).to_bytes(4, "big") + data


def all_threads(*threads: int) -> bytes:
    return len(threads).to_bytes(4, "big") + b"".join(jobject(t) for t in threads)


def status(state: int, suspend: int = 0) -> bytes:
    return state.to_bytes(4, "big") + suspend.to_bytes(4, "big")


@dataclass(frozen=True)
class Poll:
    pass


@dataclass(frozen=True)
class Reply:
    vm_id: int
    data: bytes = b""
    error: int = 0


@dataclass(frozen=True)
class Expire:
    vm_id: int


class Harness:
    def __init__(self) -> None:
        self.host = FakeHost()
        self.host.model.ddm = False
        self.threads = JvmThreads(self.host)
        self.owns: list[Any] = []

    def pending(self, vm_id: int) -> Pending:
        return Pending(JVM_THREADS, 0, 0, 0, math.inf, vm_id)

    def feed(self, item: Any) -> None:
        if isinstance(item, Poll):
            self.owns.append(self.threads.poll())
        elif isinstance(item, Reply):
            packet = ReplyPacket(item.vm_id, item.error, item.data)
            self.threads.reply(self.pending(item.vm_id), packet)
        elif isinstance(item, Expire):
            self.threads.expired(self.pending(item.vm_id))
        else:
            raise AssertionError(f"no such input {item!r}")

    def book(self, **kw: Any) -> Any:
        return self.host.book(self.feed, **kw)


def first_poll(h: Harness) -> None:
    assert (
        h.book()
        >> Poll()
        << Jdwp(1, 7, b"", 1)  # IDSizes, once per connection
        >> Reply(1, SIZES)
        << Jdwp(1, 4, b"", 2)  # AllThreads
        >> Reply(2, all_threads(T1, T2))
        << Jdwp(11, 4, jobject(T1), 3)  # Status
        << Jdwp(11, 1, jobject(T1), 4)  # Name, the first time only
        << Jdwp(11, 5, jobject(T1), 5)  # ThreadGroup, the first time only
        << Jdwp(11, 4, jobject(T2), 6)
        << Jdwp(11, 1, jobject(T2), 7)
        << Jdwp(11, 5, jobject(T2), 8)
        >> Reply(3, status(1))
        >> Reply(4, jstring("main"))
        >> Reply(5, jobject(GROUP))
        << Jdwp(12, 1, jobject(GROUP), 9)  # the group's name, once
        >> Reply(6, status(4, 1))
        >> Reply(7, jstring("Reference Handler"))
        >> Reply(8, jobject(GROUP))
        >> Reply(9, jstring("system"))
        << Changed()  # the poll ended: the model's thread table
    )


def test_one_poll_fills_the_models_thread_table() -> None:
    h = Harness()
    first_poll(h)
    assert h.host.model.threads == {
        T1: ThreadSnapshot(T1, "main", status=1, state="running", suspended=False),
        T2: ThreadSnapshot(T2, "Reference Handler", status=4, state="wait", suspended=True),
    }
    assert h.threads.group_name(T1) == "system"
    (own,) = h.owns
    assert own.succeeded()


def test_the_next_poll_asks_states_only_and_hands_back_the_ids_of_threads_that_died() -> None:
    h = Harness()
    first_poll(h)
    dispose = (1).to_bytes(4, "big") + jobject(T2) + (1).to_bytes(4, "big")
    assert (
        h.book()
        >> Poll()
        << Jdwp(1, 4, b"", 10)
        >> Reply(10, all_threads(T1))
        << Jdwp(11, 4, jobject(T1), 11)
        << Jdwp(1, 14, dispose, 12)  # DisposeObjects: T2, received once on this connection
        >> Reply(11, status(2))
        >> Reply(12)
        << Changed()
    )
    assert list(h.host.model.threads) == [T1]
    assert h.threads.live_ids() == 2  # main and its group: no growing table


def test_a_poll_under_way_is_shared() -> None:
    h = Harness()
    assert h.book() >> Poll() << Jdwp(1, 7, b"", 1) >> Poll()
    first, second = h.owns
    assert first is second


def test_no_answer_to_the_thread_list_ends_the_poll_with_no_list() -> None:
    h = Harness()
    assert h.book() >> Poll() << Jdwp(1, 7, b"", 1) >> Expire(1)
    (own,) = h.owns
    assert own.expired
    assert not h.host.model.threads_known


def test_a_jdwp_error_to_the_thread_list_fails_the_poll() -> None:
    h = Harness()
    assert (
        h.book()
        >> Poll()
        << Jdwp(1, 7, b"", 1)
        >> Reply(1, SIZES)
        << Jdwp(1, 4, b"", 2)
        >> Reply(2, error=112)  # VM_DEAD
    )
    (own,) = h.owns
    assert own.judgement.answer is Verdict.FAILED
    assert not h.host.model.threads_known


def test_a_malformed_answer_is_logged_and_the_poll_goes_on() -> None:
    h = Harness()
    error = Placeholder("error")
    assert (
        h.book(logs=True)
        >> Poll()
        << Jdwp(1, 7, b"", 1)
        >> Reply(1, SIZES)
        << Jdwp(1, 4, b"", 2)
        >> Reply(2, (5).to_bytes(4, "big"))  # five ids announced, none sent
        << Log("vm.protocol_error", "warning", {"error": error})
        << Changed()  # the poll ended with what it had: no threads
    )
    assert error.value.startswith("thread list: AllThreads reply")


def test_a_new_connection_starts_the_ids_again() -> None:
    h = Harness()
    first_poll(h)
    h.threads.reset()
    assert h.book() >> Poll() << Jdwp(1, 7, b"", 10)  # IDSizes again
    assert h.threads.live_ids() == 0
