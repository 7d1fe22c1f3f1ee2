"""The conversation part alone (``session/conversation.py``), against a fake host:
identification (HELO, then FEAT, THEN and heap info; a plain JVM's VirtualMachine.Version) and
the heap-info probe, rule by rule.

Stand-ins: the release (``Released`` marks where the conversation ends a release under way)
and the handler host (``PluginsConnected`` marks where the plugins are connected). ``Identify``
is a new connection. The lifecycle is the real one, in ``identifying``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ddmd.protocol import ddm
from ddmd.protocol.jdwp import CommandSet, VirtualMachineCommand
from ddmd.session.commands import Changed, Log
from ddmd.session.conversation import Conversation
from ddmd.session.lifecycle import Lifecycle
from tests.session.parts import Answer, Applied, Ask, FakeHost, Jdwp, Silence, Unsupported
from tests.session.playbook import Placeholder

APP = "com.example.mail"
HELO = ddm.HeloReply(
    1, 4242, "Dalvik v2.1.0", APP, 0, "64-bit (arm64)", "CheckJNI=false", False, APP
)
FEAT = ddm.FeatReply(("hprof-heap-dump", "method-trace-profiling"))
HEAP_INFO = ddm.HeapInfo((ddm.HeapInfoEntry(1, 1_700_000_000_000, 1, 256 << 20, 16 << 20, 1, 2),))
THREAD = ddm.ThreadCreated(1, "main")


def jstring(text: str) -> bytes:
    data = text.encode()
    return len(data).to_bytes(4, "big") + data


@dataclass(frozen=True)
class Identify:
    pass


@dataclass(frozen=True)
class Released:
    how: str


@dataclass(frozen=True)
class PluginsConnected:
    pass


class FakeRelease:
    def __init__(self, host: FakeHost) -> None:
        self.host = host
        self.under_way = False

    def released(self, how: str) -> None:
        self.host.emit(Released(how))  # type: ignore[arg-type]


class FakeHandlers:
    def __init__(self, host: FakeHost) -> None:
        self.host = host

    def connected(self) -> None:
        self.host.emit(PluginsConnected())  # type: ignore[arg-type]


class Harness:
    def __init__(self) -> None:
        self.host = FakeHost(name=APP)
        self.lifecycle = Lifecycle("vm-1")
        self.lifecycle.goto("connected")
        self.release = FakeRelease(self.host)
        self.conversation = Conversation(
            self.host,
            self.lifecycle,
            self.release,  # type: ignore[arg-type]
            FakeHandlers(self.host),  # type: ignore[arg-type]
        )

    def feed(self, item: Any) -> None:
        if isinstance(item, Identify):
            self.conversation.identify()
        else:
            raise AssertionError(f"no such input {item!r}")

    def book(self, **kw: Any) -> Any:
        return self.host.book(self.feed, **kw)


def identified(h: Harness) -> None:
    assert (
        h.book()
        >> Identify()
        << Ask(ddm.HeloRequest(1))
        >> Answer("HELO", HELO)
        << Released("its connection was reopened")
        << Changed(renamed=True)
        << Ask(ddm.FeatRequest())
        << Ask(ddm.ThreadNotify(True))
        << Ask(ddm.HeapInfoRequest(3))  # at every GC
        << Ask(ddm.HeapInfoRequest(1))  # now: the probe
        << PluginsConnected()  # their set-up requests go out after ddmd's own
    )


def test_hello_identifies_the_vm_then_ddmd_asks_for_features_threads_and_heap_info() -> None:
    h = Harness()
    identified(h)
    assert h.lifecycle.state == "ready"
    assert h.host.model.ddm is True
    assert h.conversation.hello == HELO
    assert h.conversation.heap_info_subscribed


def test_the_features_are_kept_for_the_model_and_for_consumers_that_ask_again() -> None:
    h = Harness()
    identified(h)
    assert h.book() >> Answer("FEAT", FEAT) << Changed()
    assert h.conversation.feat == FEAT
    assert h.host.model.features == FEAT.features


def test_chunks_in_the_answers_go_to_the_model() -> None:
    h = Harness()
    identified(h)
    assert h.book() >> Answer("THEN", THREAD) << Applied(THREAD)


def test_the_heap_probe_answered_with_heap_info_keeps_heap_info() -> None:
    h = Harness()
    identified(h)
    assert h.book() >> Answer("HPIF", HEAP_INFO) << Applied(HEAP_INFO)
    assert h.host.model.heap_info_seq == 1
    assert "HPIF" not in h.host.model.unsupported


def test_no_heap_info_at_all_after_the_probe_means_none_and_no_heap_segments() -> None:
    h = Harness()
    identified(h)
    assert (
        h.book()
        >> Answer("HPIF")  # the subscription: an empty reply (ART 5-8)
        >> Answer("HPIF")  # the probe: an empty reply, and no heap info came
        << Unsupported("HPIF", "no answer within 5 s; Android 12 removed the heap handlers")
        << Unsupported("HPSG", "it reports no heap information; Android 12 removed both")
    )
    assert not h.conversation.heap_info_subscribed


def test_a_jdwp_error_to_hello_is_a_plain_jvm_asked_its_version_once() -> None:
    h = Harness()
    version = (
        jstring("Java Debug Wire Protocol (Reference Implementation) version 17.0")
        + (17).to_bytes(4, "big")
        + bytes(4)
        + jstring("17.0.9")
        + jstring("OpenJDK 64-Bit Server VM")
    )
    reason = Placeholder("reason")
    assert (
        h.book(logs=True)
        >> Identify()
        << Ask(ddm.HeloRequest(1))
        >> Answer("HELO", error=99)
        << Log("vm.not_ddm", "info", {})
        << Log(
            "vm.feature_unsupported",
            "debug",  # how a plain JVM is told apart: not news
            {
                "feature": "HELO",
                "what": Placeholder(),
                "reason": reason,
            },
        )
        << Changed()
        << Jdwp(CommandSet.VIRTUAL_MACHINE, VirtualMachineCommand.VERSION, b"", 1)
        << Released("its connection was reopened")
        << Changed(renamed=True)
        >> Answer("VERSION", raw=version)
        << Log(
            "vm.version",
            "info",
            {"description": "Java Debug Wire Protocol (Reference Implementation) version 17.0"},
        )
        << Changed()
    )
    assert reason.value.startswith("it answered: JDWP error 99")
    assert h.host.model.ddm is False
    assert h.lifecycle.identified


def test_silence_to_hello_keeps_the_vm_identified_without_ddm() -> None:
    h = Harness()
    assert (
        h.book()
        >> Identify()
        << Ask(ddm.HeloRequest(1))
        >> Silence("HELO")
        << Unsupported("HELO", Placeholder())
        << Released("its connection was reopened")
        << Changed(renamed=True)
    )
    assert h.lifecycle.state == "ready"


def test_a_vm_known_not_to_speak_ddm_is_identified_at_once_on_a_new_connection() -> None:
    h = Harness()
    h.host.model.ddm = False
    assert (
        h.book() >> Identify() << Released("its connection was reopened") << Changed(renamed=True)
    )


def test_the_hello_of_a_connection_reopened_for_a_release_is_a_step_at_debug_level() -> None:
    h = Harness()
    h.host.model.apply_hello(HELO)  # the same VM as before the release
    h.release.under_way = True
    book = h.book(logs=True, ignore=(Ask, Changed, Released, PluginsConnected))
    assert book >> Identify() >> Answer("HELO", HELO) << Log("vm.hello", "debug", Placeholder())
