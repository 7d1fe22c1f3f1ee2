"""ddmd's model fed alone (``session/feed.py``), against a fake host: the built-in handler of
the VM's pushes (after the profiling part's capture check) and of the chunks in replies.

``Pushed(chunk)`` is a whole chunk the VM pushed, as the handler host gives it; ``attached``
stands for the router's set of attached debuggers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ddmd.protocol import ddm
from ddmd.session.commands import Changed, Log, SelectMe
from ddmd.session.feed import ModelFeed
from ddmd.session.settings import SessionSettings
from tests.session.parts import FakeHost
from tests.session.playbook import Placeholder

WAIT = ddm.WaitForDebugger(0)
NAME = ddm.AppName("com.example.mail", 0, "com.example.mail")


@dataclass(frozen=True)
class Pushed:
    chunk: ddm.Chunk


@dataclass(frozen=True)
class PushedBytes:
    chunk_type: int
    data: bytes


class Harness:
    def __init__(self, **settings: Any) -> None:
        self.host = FakeHost(settings=SessionSettings(**settings))
        self.attached: tuple[int, ...] = ()
        self.feed = ModelFeed(self.host, lambda: self.attached)

    def handle(self, item: Any) -> None:
        if isinstance(item, Pushed):
            chunk_type = int(item.chunk.chunk_type)
            assert self.feed.handle_raw(chunk_type, item.chunk.encode_data(), 7)  # taken
        elif isinstance(item, PushedBytes):
            assert self.feed.handle_raw(item.chunk_type, item.data, 7)
        else:
            raise AssertionError(f"no such input {item!r}")

    def book(self, **kw: Any) -> Any:
        return self.host.book(self.handle, **kw)


def test_a_pushed_name_changes_the_snapshot_and_maybe_its_key() -> None:
    h = Harness()
    assert h.book() >> Pushed(NAME) << Changed(renamed=True)
    assert h.host.model.app == "com.example.mail"


def test_a_vm_that_waits_for_a_debugger_asks_to_be_the_current_vm_while_none_is_attached() -> None:
    h = Harness()
    assert h.book() >> Pushed(WAIT) << SelectMe("waiting for a debugger") << Changed()
    assert h.host.model.waiting


def test_no_select_while_a_debugger_is_attached_or_when_switched_off() -> None:
    h = Harness()
    h.attached = (1,)
    assert h.book() >> Pushed(WAIT) << Changed()
    h = Harness(auto_select_waiting=False)
    assert h.book() >> Pushed(WAIT) << Changed()


def test_a_chunk_that_does_not_decode_is_logged() -> None:
    h = Harness()
    error = Placeholder("error")
    assert (
        h.book(logs=True)
        >> PushedBytes(int(ddm.ChunkType.THCR), b"\x00")  # a thread id cut short
        << Log("ddm.chunk_malformed", "warning", {"error": error, "id": 7})
    )


def test_chunks_carried_in_replies_are_applied_the_same_way() -> None:
    h = Harness()
    h.feed.apply(NAME)
    assert h.host.take() == [
        Log("vm.renamed", "info", {"app": "com.example.mail", "package": "com.example.mail"}),
        Changed(renamed=True),
    ]
