"""The thread poll alone (``session/poll.py``), against a fake host: THST at a fixed rate while
someone watches the VM (a refresh leases the polls), missed ticks skipped, one request at a
time; a plain JVM polled over JDWP instead (a stand-in for ``JvmThreads`` here).

After every input the poll runs at the script's time, as the session runs it; ``Tick(t)``
moves the time, ``Refresh()`` is a ``RefreshThreads`` call handed over by ``Calls``.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from ddmd.protocol import ddm
from ddmd.protocol.expect import Expect
from ddmd.session.commands import Changed
from ddmd.session.host import Own
from ddmd.session.inputs import Tick
from ddmd.session.lifecycle import Lifecycle
from ddmd.session.poll import ThreadPoll
from ddmd.session.settings import SessionSettings
from tests.session.parts import Answer, Ask, FakeHost, Silence, Unsupported

THREADS = ddm.ThreadStatus((ddm.ThreadInfo(1, 1, 4242, 10, 2, False),))
THST = ddm.ThreadStatusRequest()


@dataclass(frozen=True)
class Refresh:
    pass


@dataclass(frozen=True)
class JvmPoll:
    """The stand-in ``JvmThreads`` was asked to poll."""


class FakeJvmThreads:
    def __init__(self, host: FakeHost) -> None:
        self.host = host
        self.own = Own(None, "jvm threads", "THREADS", Expect.REPLY)

    def poll(self) -> Own:
        self.host.emit(JvmPoll())  # type: ignore[arg-type]
        return self.own


class Harness:
    def __init__(self, **settings: Any) -> None:
        settings.setdefault("thread_poll_interval", 0.5)
        settings.setdefault("thread_lease", 5.0)
        self.host = FakeHost(settings=SessionSettings(**settings))
        self.host.model.ddm = True
        self.lifecycle = Lifecycle("vm-1")
        self.lifecycle.goto("connected")
        self.lifecycle.identify()
        self.router = SimpleNamespace(ready=True)
        self.poll = ThreadPoll(
            self.host,
            self.lifecycle,
            self.router,  # type: ignore[arg-type]
            FakeJvmThreads(self.host),  # type: ignore[arg-type]
        )
        self.now = 0.0
        self.refreshed: list[Own | None] = []

    def feed(self, item: Any) -> None:
        if isinstance(item, Tick):
            self.now = item.now
        elif isinstance(item, Refresh):
            self.refreshed.append(self.poll.refresh(self.now))
        else:
            raise AssertionError(f"no such input {item!r}")

    def book(self, **kw: Any) -> Any:
        return self.host.book(self.feed, after=lambda: self.poll.poll(self.now), **kw)


def test_nobody_watching_means_no_polls() -> None:
    h = Harness()
    assert h.book() >> Tick(1.0) >> Tick(2.0)
    assert h.poll.next_deadline() is None


def test_a_refresh_polls_at_once_then_at_the_rate_while_its_lease_lasts() -> None:
    h = Harness()
    assert (
        h.book()
        >> Refresh()
        << Ask(THST)  # the refresh's own request, the poll's too
        >> Answer("THST", THREADS)
        << Changed()  # the rows applied to the model
        >> Tick(0.4)
        >> Tick(0.5)
        << Ask(THST)
        >> Answer("THST", THREADS)  # the same rows: nothing changed
    )
    assert h.poll.next_deadline() == 1.0
    assert (
        h.book()
        >> Tick(4.9)  # missed ticks are skipped, not made up for
        << Ask(THST)
        >> Tick(5.0)  # the lease ended
    )
    assert h.poll.next_deadline() is None


def test_one_request_at_a_time() -> None:
    h = Harness()
    assert h.book() >> Refresh() << Ask(THST) >> Tick(0.5) >> Tick(1.0) >> Refresh()
    first, second = h.refreshed
    assert first is second  # the refresh waits for the request under way


def test_always_poll_threads_needs_no_refresh() -> None:
    h = Harness(always_poll_threads=True, poll_phase=0.5)
    assert h.book() >> Tick(0.0) >> Tick(0.25) << Ask(THST)  # the VM's place in the interval


def test_silence_to_thst_marks_it_missing_and_stops_the_polls() -> None:
    h = Harness()
    assert (
        h.book()
        >> Refresh()
        << Ask(THST)
        >> Silence("THST")
        << Unsupported(
            "THST", "no answer within 5 s; newer Android versions removed the thread handlers"
        )
        >> Tick(0.5)
        >> Refresh()
    )
    assert h.refreshed[-1] is None  # nothing to wait for
    assert h.poll.next_deadline() is None


def test_a_plain_jvm_is_polled_over_jdwp() -> None:
    h = Harness()
    h.host.model.ddm = False
    assert (
        h.book()
        >> Refresh()
        << JvmPoll()  # the refresh's
        << JvmPoll()  # the poll's, at once (``JvmThreads`` shares the poll under way)
        >> Tick(0.5)
        << JvmPoll()
    )


def test_no_polls_while_the_connection_is_not_usable() -> None:
    h = Harness()
    h.router.ready = False
    assert h.book() >> Refresh() >> Tick(0.5)
    assert h.refreshed == [None]


def test_the_connection_ending_forgets_the_request_under_way() -> None:
    h = Harness()
    assert h.book() >> Refresh() << Ask(THST)
    h.poll.drop()
    assert h.book() >> Tick(0.5) << Ask(THST)  # a new one: the old died with its connection
