"""The event stream: EventHub fan-out, registry notices -> events, GET /api/v1/events (in-process
through httpx.ASGITransport and over a real socket), and ``ddmd events``."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import click
import httpx
import pytest
import trio
import trio.testing
from click.testing import CliRunner, Result
from starlette.responses import Response
from starlette.routing import Route

from ddmd.cli import client as cli_client
from ddmd.cli import events as cli_events
from ddmd.cli.client import EXIT_API_ERROR, EXIT_NO_DAEMON
from ddmd.cli.format import format_event
from ddmd.control.app import create_app, serve
from ddmd.control.events import (
    EVENTS_PATH,
    EventHub,
    RegistryEvents,
    StreamEvent,
    events_route,
    make_event,
)
from ddmd.logs import Event
from ddmd.protocol.sse import SseDecoder, event_frame
from ddmd.registry import VmRegistry
from ddmd.session.model import DebuggerSnapshot
from tests.actors.rawpeers import wait_until

from .fakes import FakeVm, heap_image, make_registry, sample_heap_info, sample_threads

CAP = 10  # absolute cap on every test that waits on I/O


def drain(receive: trio.MemoryReceiveChannel[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every event queued on ``receive`` right now (never waits)."""
    out = []
    while True:
        try:
            out.append(receive.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return out


def names(events: list[dict[str, Any]]) -> list[str]:
    return [e["event"] for e in events]


def parse_sse(body: str) -> list[dict[str, Any]]:
    decoder = SseDecoder()
    out = []
    for line in body.splitlines():
        event = decoder.feed(line)
        if event is not None:
            data = json.loads(event.data)
            assert data["event"] == event.name
            out.append(data)
    return out


# ------------------------------------------------------------------------------ EventHub


async def test_publish_reaches_every_subscriber_in_order():
    hub = EventHub(clock=lambda: "T")
    hub.publish(make_event("nobody.listens"))  # no subscriber: dropped, no error
    with hub.subscribe() as a, hub.subscribe() as b:
        for i in range(3):
            hub.emit("test.event", vm=f"tcp:{i}")
        got_a, got_b = drain(a), drain(b)
    expected = [{"event": "test.event", "ts": "T", "vm": f"tcp:{i}"} for i in range(3)]
    assert got_a == got_b == expected
    assert hub.statistics().subscribers == 0


async def test_slow_subscriber_is_dropped_with_a_final_overflow_event():
    hub = EventHub(buffer=4)
    with hub.subscribe() as slow, hub.subscribe() as fast:
        for i in range(4):
            hub.emit("test.event", n=i)
        assert [e["n"] for e in drain(fast)] == [0, 1, 2, 3]
        # `slow` read nothing: the fifth event finds its buffer full. publish() does not wait.
        hub.emit("test.event", n=4)
        hub.emit("test.event", n=5)
        got = drain(slow)
        assert names(got) == ["test.event"] * 4 + ["overflow"]
        assert "fell 4 events behind" in got[-1]["reason"]
        with pytest.raises(trio.EndOfChannel):
            slow.receive_nowait()
        # The fast one keeps going.
        assert [e["n"] for e in drain(fast)] == [4, 5]
        stats = hub.statistics()
        assert (stats.subscribers, stats.dropped, stats.published) == (1, 1, 6)


async def test_close_sends_the_final_event_and_ends_every_stream():
    hub = EventHub()
    with hub.subscribe() as events:
        hub.emit("test.event")
        hub.close(hub.event(StreamEvent.DAEMON_STOPPING))
        hub.emit("test.after_close")
        assert names(drain(events)) == ["test.event", "daemon.stopping"]
        with pytest.raises(trio.EndOfChannel):
            await events.receive()
    with hub.subscribe() as late, pytest.raises(trio.EndOfChannel):
        await late.receive()


async def test_a_closed_receiver_is_removed_on_publish():
    hub = EventHub()
    with hub.subscribe() as events:
        events.close()
        hub.emit("test.event")
        assert hub.statistics().subscribers == 0


async def test_first_subscriber_callback():
    hub = EventHub()
    calls = []
    hub.on_first_subscriber(lambda: calls.append(1))
    with hub.subscribe(), hub.subscribe():
        pass
    with hub.subscribe():
        pass
    assert calls == [1, 1]


def test_stream_names_shared_with_the_log_are_the_logs_names():
    log_names = {e.value for e in Event}
    for name in (
        "vm.found",
        "vm.renamed",
        "vm.waiting_for_debugger",
        "debugger.attached",
        "debugger.detached",
        "current.changed",
        "threads.updated",
        "heap.info",
        "daemon.stopping",
    ):
        assert name in log_names
        assert name in {e.value for e in StreamEvent}


# ------------------------------------------------------------------------------ RegistryEvents


@pytest.fixture
def world() -> Iterator[tuple[VmRegistry, EventHub, dict[str, FakeVm]]]:
    vms = {
        "jvm": FakeVm.plain_jvm(),
        "app": FakeVm.android(threads=None, heaps=(), debugger_port=None),
    }
    registry = make_registry(*vms.values())
    hub = EventHub(clock=lambda: "T")
    source = RegistryEvents(registry, hub)
    with registry.subscribe(source):
        yield registry, hub, vms


def attached(peer: str, via: str) -> dict[str, Any]:
    """Snapshot fields of a VM with one debugger attached."""
    return {
        "debugger": f"{peer} via {via}",
        "debuggers": (DebuggerSnapshot(peer, via, 8700, 1700000000.0),),
    }


async def test_registry_notices_become_events(world):
    registry, hub, vms = world
    app = vms["app"]
    with hub.subscribe() as events:
        new = FakeVm.android("tcp:8001", app="com.example.new", package="com.example.new")
        registry.add(new)
        got = drain(events)
        assert names(got) == ["vm.found"]
        assert got[0]["vm"] == "tcp:8001"
        assert got[0]["snapshot"] == new.snap.to_json()

        app.update(**attached("127.0.0.1:5005", "current"))
        registry.changed(app.vm_id)
        got = drain(events)
        assert names(got) == ["vm.changed", "debugger.attached"]
        assert got[0]["changed"] == ["debugger", "debuggers"]
        assert got[0]["snapshot"]["debugger"] == "127.0.0.1:5005 via current"
        assert got[1] == {
            "event": "debugger.attached",
            "ts": "T",
            "vm": app.vm_id,
            "debugger": "127.0.0.1:5005 via current",
            "details": {
                "peer": "127.0.0.1:5005",
                "via": "current",
                "tool": None,
                "pid": None,
                "debugging": True,
                "port": 8700,
                "since": 1700000000.0,
                "packets_in": 0,
                "packets_out": 0,
                "suspensions": 0,
                "suspended_since": None,
            },
        }

        app.update(debugger=None, debuggers=())
        registry.changed(app.vm_id)
        got = drain(events)
        assert names(got) == ["vm.changed", "debugger.detached"]
        assert got[1]["debugger"] == "127.0.0.1:5005 via current"

        app.update(threads=sample_threads())
        registry.changed(app.vm_id)
        got = drain(events)
        assert names(got) == ["vm.changed", "threads.updated"]  # the count changed too
        assert got[1]["threads"] == [t.to_json() for t in sample_threads()]
        # A state change alone: threads.updated, but the snapshot JSON (count) is the same.
        first, *rest = sample_threads()
        app.update(threads=(replace(first, state="wait", status=4), *rest))
        registry.changed(app.vm_id)
        got = drain(events)
        assert names(got) == ["threads.updated"]
        assert got[0]["threads"][0]["state"] == "wait"

        app.update(heaps=sample_heap_info())
        registry.changed(app.vm_id)
        assert names(drain(events)) == ["vm.changed", "heap.info"]

        app.images = (heap_image(),)
        registry.changed(app.vm_id)
        got = drain(events)
        assert names(got) == ["heap.dumped"]
        (dumped,) = got[0]["heaps"]
        assert dumped["heap_id"] == 1
        assert dumped["bytes_used"] > 0
        registry.changed(app.vm_id)  # nothing new
        assert drain(events) == []

        app.update(app="com.example.renamed", package="com.example.renamed")
        registry.key_changed(app.vm_id)
        got = drain(events)
        assert names(got) == ["vm.changed", "vm.renamed"]
        assert got[1]["previous_app"] == "com.example.app"
        assert got[1]["app"] == "com.example.renamed"

        app.update(waiting_for_debugger=True)
        registry.changed(app.vm_id)
        assert names(drain(events)) == ["vm.changed", "vm.waiting_for_debugger"]

        vms["jvm"].selection_key = lambda: "|127.0.0.1:8000"  # type: ignore[attr-defined]
        registry.select("tcp:8000")
        got = drain(events)
        assert got == [{"event": "current.changed", "ts": "T", "vm": "tcp:8000", "previous": None}]

        registry.remove("tcp:8001")
        got = drain(events)
        assert names(got) == ["vm.gone"]
        assert got[0]["vm"] == "tcp:8001"
        assert got[0]["snapshot"]["app"] == "com.example.new"


async def test_without_subscribers_nothing_is_computed_and_nothing_missed(world):
    registry, hub, vms = world
    app = vms["app"]
    calls = 0
    original = app.snapshot

    def counting() -> Any:
        nonlocal calls
        calls += 1
        return original()

    app.snapshot = counting  # type: ignore[method-assign]
    registry.changed(app.vm_id)
    registry.changed(app.vm_id)
    assert calls == 0
    # A debugger attaches to a VM that sent no notice since the subscriber arrived: the first
    # subscriber took every VM's snapshot, so the difference is still seen.
    with hub.subscribe() as events:
        app.update(**attached("127.0.0.1:5005", "vm-port"))
        registry.changed(app.vm_id)
        assert "debugger.attached" in names(drain(events))


async def test_device_notices(world):
    registry, hub, _ = world
    with hub.subscribe() as events:
        registry.set_device("emulator-5554", "device", model="sdk_gphone64")
        registry.set_device("emulator-5554", "device", model="sdk_gphone64")  # no change
        registry.remove_device("emulator-5554")
        got = drain(events)
    assert names(got) == ["device.changed", "device.gone"]
    assert got[0]["device"] == "emulator-5554"
    assert got[0]["state"] == "device"
    assert got[0]["model"] == "sdk_gphone64"


# ------------------------------------------------------------------------------ SSE, in-process


def events_app(registry: VmRegistry, hub: EventHub, **kw: Any) -> Any:
    source = RegistryEvents(registry, hub)
    registry._listeners.append(source)  # as registry.subscribe() does, for the test's lifetime
    return create_app(registry, extra_routes=[events_route(hub, source, **kw)])


async def test_sse_over_asgi_transport():
    vm = FakeVm.android()
    registry = make_registry(vm)
    hub = EventHub()
    app = events_app(registry, hub)
    result: dict[str, httpx.Response] = {}

    async def get() -> None:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
        ) as client:
            result["r"] = await client.get(EVENTS_PATH)

    with trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(get)
            await trio.testing.wait_all_tasks_blocked()
            assert hub.statistics().subscribers == 1
            vm.update(**attached("127.0.0.1:5005", "current"))
            registry.changed(vm.vm_id)
            registry.add(FakeVm.plain_jvm())
            # ASGITransport hands the body over only when the response ends: end it.
            hub.close(hub.event(StreamEvent.DAEMON_STOPPING))
    response = result["r"]
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"
    body = response.text
    assert body.startswith("retry: 2000\n\n: ddmd event stream\n\n")
    events = parse_sse(body)
    assert names(events) == [
        "stream.opened",
        "vm.changed",
        "debugger.attached",
        "vm.found",
        "current.changed",  # two VMs: the only VM is no longer current by default
        "daemon.stopping",
    ]
    opened = events[0]
    assert opened["current"] == vm.vm_id
    assert [v["id"] for v in opened["vms"]] == [vm.vm_id]
    for event in events:
        assert set(event) >= {"event", "ts"}
        assert event["ts"].endswith("Z")
    assert events[2]["vm"] == vm.vm_id
    assert events[3]["vm"] == "tcp:8000"
    assert events[4] == {**events[4], "vm": None, "previous": vm.vm_id}
    assert hub.statistics().subscribers == 0


async def test_sse_keepalive_every_15_seconds(autojump_clock):
    registry = make_registry()
    hub = EventHub()
    app = events_app(registry, hub)
    result: dict[str, httpx.Response] = {}

    async def get() -> None:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
        ) as client:
            result["r"] = await client.get(EVENTS_PATH)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(get)
        await trio.sleep(46)  # virtual time
        hub.close()
    body = result["r"].text
    assert body.count(": keepalive\n\n") == 3
    assert names(parse_sse(body)) == ["stream.opened"]


async def test_sse_reader_that_falls_behind_gets_overflow():
    registry = make_registry()
    hub = EventHub(buffer=3)
    app = events_app(registry, hub)
    result: dict[str, httpx.Response] = {}

    async def get() -> None:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
        ) as client:
            result["r"] = await client.get(EVENTS_PATH)

    with trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(get)
            await trio.testing.wait_all_tasks_blocked()
            for i in range(10):  # all at once: the stream's task gets no turn in between
                hub.emit("test.event", n=i)
    events = parse_sse(result["r"].text)
    # The first event goes straight to the waiting reader, three more fill its buffer.
    assert names(events) == ["stream.opened"] + ["test.event"] * 4 + ["overflow"]
    assert hub.statistics().subscribers == 0
    assert hub.statistics().dropped == 1


async def test_sse_head_answers_at_once():
    hub = EventHub()
    app = events_app(make_registry(), hub)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
    ) as client:
        with trio.fail_after(CAP):
            r = await client.head(EVENTS_PATH)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    assert hub.statistics().subscribers == 0


def test_event_frame_is_one_data_line():
    frame = event_frame({"event": "vm.changed", "text": "two\nlines"}).decode()
    lines = frame.split("\n")
    assert lines[0] == "event: vm.changed"
    assert lines[1].startswith("data: {")
    assert lines[2:] == ["", ""]
    with pytest.raises(ValueError, match="line break"):
        event_frame({"event": "bad\nname"})


def test_sse_decoder():
    decoder = SseDecoder()
    lines = [": comment", "retry: 10", "event: a", "data: 1", "data:2", "", "", "data: x", ""]
    got = [e for e in map(decoder.feed, lines) if e is not None]
    assert [(e.name, e.data) for e in got] == [("a", "1\n2"), ("message", "x")]


# ------------------------------------------------------------------------------ SSE, real socket


async def test_sse_over_a_real_socket_streams_live_and_cleans_up():
    registry = make_registry(FakeVm.android())
    hub = EventHub()
    app = events_app(registry, hub)
    with trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(serve, app, "127.0.0.1", 0)
            async with (
                httpx.AsyncClient(base_url=f"http://{host}:{port}", trust_env=False) as client,
                client.stream("GET", EVENTS_PATH) as response,
            ):
                assert response.status_code == 200
                decoder = SseDecoder()
                lines = response.aiter_lines()

                async def next_event() -> dict[str, Any]:
                    async for line in lines:
                        event = decoder.feed(line)
                        if event is not None:
                            return dict(json.loads(event.data))
                    raise AssertionError("the stream ended")

                assert (await next_event())["event"] == "stream.opened"
                # Live: the event arrives while the response is still open.
                registry.add(FakeVm.plain_jvm("tcp:8123"))
                found = await next_event()
                assert (found["event"], found["vm"]) == ("vm.found", "tcp:8123")
            # The client went away: the server notices and drops the subscription.
            await wait_until(lambda: not hub.statistics().subscribers, 5, what="unsubscribed")
            nursery.cancel_scope.cancel()


# ------------------------------------------------------------------------------ ddmd events


@pytest.fixture(autouse=True)
def no_user_config(monkeypatch, tmp_path):
    monkeypatch.delenv("DDMD_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path))


SAMPLE = [
    make_event("stream.opened", ts="2024-05-01T12:00:00.000001Z", current=None, vms=[]),
    make_event(
        "vm.found",
        ts="2024-05-01T12:00:01.5Z",
        vm="tcp:8000",
        snapshot=FakeVm.android("tcp:8000", pid=5150, app="com.example.mail").snap.to_json(),
    ),
    make_event(
        "vm.changed",
        ts="2024-05-01T12:00:02Z",
        vm="tcp:8000",
        snapshot={"state": "ready", "pid": 5150, "heaps": [1, 2]},
        changed=["state", "heaps"],
    ),
    make_event(
        "debugger.attached",
        ts="2024-05-01T12:00:03Z",
        vm="tcp:8000",
        debugger="127.0.0.1:5005 via current",
    ),
    make_event(
        "threads.updated",
        ts="2024-05-01T12:00:04Z",
        vm="tcp:8000",
        threads=[t.to_json() for t in sample_threads()],
    ),
    make_event("current.changed", ts="2024-05-01T12:00:05Z", vm="tcp:8000", previous=None),
]


def canned_stream(
    monkeypatch, events: list[dict[str, Any]], *, status: int = 200, vms: tuple[Any, ...] = ()
) -> None:
    """Route the CLI to an app whose event stream is ``events`` (then it ends), and whose
    VM list is ``vms`` (FakeVms: what a TARGET is checked against)."""
    body = b"retry: 2000\n\n: hello\n\n" + b"".join(event_frame(e) for e in events)

    async def endpoint(request: Any) -> Response:
        if status != 200:
            return Response(json.dumps({"error": "nope"}), status, media_type="application/json")
        assert request.headers["accept"] == "text/event-stream"
        return Response(body, media_type="text/event-stream")

    app = create_app(make_registry(*vms), extra_routes=[Route(EVENTS_PATH, endpoint)])
    monkeypatch.setattr(cli_client, "make_transport", lambda: httpx.ASGITransport(app=app))


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli_events.events, list(args), catch_exceptions=False)


def test_events_human_lines(monkeypatch):
    canned_stream(monkeypatch, [*SAMPLE, make_event("daemon.stopping", ts="2024-05-01T12:00:06Z")])
    result = invoke()
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == len(SAMPLE) + 1
    assert lines[0].split() == ["12:00:00", "stream.opened", "0", "VMs,", "current", "VM", "none"]
    assert lines[1].startswith("12:00:01 vm.found")
    assert lines[1].endswith("com.example.mail (tcp:8000, pid 5150)")
    # Once the stream has named the VM, its app is named next to its id.
    assert lines[2].endswith("tcp:8000 (com.example.mail): state=ready, heaps")
    assert lines[3].endswith("tcp:8000 (com.example.mail): 127.0.0.1:5005 via current")
    assert lines[4].endswith("tcp:8000 (com.example.mail): 3 threads (native 1, running 1, wait 1)")
    assert lines[5].endswith("tcp:8000 (com.example.mail) (was none)")
    assert lines[6].startswith("12:00:06 daemon.stopping")


def test_events_json_lines(monkeypatch):
    canned_stream(monkeypatch, [*SAMPLE, make_event("daemon.stopping")])
    result = invoke("--json")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [json.loads(line) for line in lines[:-1]] == SAMPLE
    assert all("\n" not in line and line.startswith("{") for line in lines)


def test_events_stream_that_ends_without_stopping_is_an_error(monkeypatch):
    canned_stream(monkeypatch, SAMPLE[:1])
    result = invoke()
    assert result.exit_code == EXIT_API_ERROR
    assert "closed the event stream" in result.stderr


def test_events_overflow_is_an_error(monkeypatch):
    canned_stream(monkeypatch, [make_event("overflow", reason="fell 512 events behind")])
    result = invoke()
    assert result.exit_code == EXIT_API_ERROR
    assert "overflow" in result.stdout
    assert result.stderr.strip() == "ddmd events: the daemon dropped this stream: it fell behind"


def test_events_api_error(monkeypatch):
    canned_stream(monkeypatch, [], status=403)
    result = invoke()
    assert result.exit_code == EXIT_API_ERROR
    assert result.stderr.strip() == "ddmd events: nope"


def test_events_no_daemon():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = invoke("--control", f"127.0.0.1:{port}")
    assert result.exit_code == EXIT_NO_DAEMON
    assert result.stderr.strip() == (
        f"ddmd events: no daemon is answering at http://127.0.0.1:{port} "
        "(start it with 'ddmd run', or pass --control HOST:PORT)"
    )
    assert len(result.stderr.splitlines()) == 1


def test_events_ctrl_c_exits_0(monkeypatch):
    async def interrupted(*args: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_events, "_tail_events", interrupted)
    result = invoke()
    assert result.exit_code == 0


def test_format_event_unknown_names_show_their_fields():
    line = format_event(make_event("x.y", ts="2024-05-01T12:00:00Z", vm="tcp:1", n=2))
    assert line == '12:00:00 x.y                      tcp:1 {"n": 2}'


def test_events_is_a_registered_command():
    from ddmd.cli import main

    assert isinstance(main.get_command(click.Context(main), "events"), click.Command)


# ------------------------------------------------------------------------------ the real daemon


async def test_daemon_stream_follows_a_sim_vm_and_a_debugger(tmp_path):
    from tests.actors.fakepeers import FakeDebugger
    from tests.actors.rawpeers import free_port_range, monitor

    (port,) = free_port_range(1)
    vm_id = f"tcp:{port}"
    seen: list[dict[str, Any]] = []

    with trio.fail_after(20):
        async with monitor([port], tmp_path) as h:
            assert h.started.hub is not None
            async with h.client.stream("GET", EVENTS_PATH) as response:
                assert response.status_code == 200
                decoder = SseDecoder()
                lines = response.aiter_lines()

                def matches(
                    event: dict[str, Any], name: str, match: dict[str, object], check: Any
                ) -> bool:
                    return (
                        event["event"] == name
                        and all(event.get(k) == v for k, v in match.items())
                        and check(event)
                    )

                async def until(
                    name: str, check: Any = lambda e: True, **match: object
                ) -> dict[str, Any]:
                    """The first event so far, or from now on, named ``name`` with ``match``."""
                    for event in seen:
                        if matches(event, name, match, check):
                            return event
                    async for line in lines:
                        sse_event = decoder.feed(line)
                        if sse_event is None:
                            continue
                        event = dict(json.loads(sse_event.data))
                        seen.append(event)
                        if matches(event, name, match, check):
                            return event
                    raise AssertionError(f"stream ended before {name}; saw {names(seen)}")

                await until("stream.opened")
                await h.start_sim(port, pid=5150, threads=4)
                found = await until("vm.found", vm=vm_id)
                assert found["snapshot"]["id"] == vm_id
                ready = await until("vm.changed", vm=vm_id)
                assert "state" in ready["changed"]
                await until("current.changed", vm=vm_id)
                # Watching the threads (as the page and `ddmd threads --watch` do) polls THST.
                r = await h.client.get(f"/api/v1/vms/{vm_id}/threads")
                assert r.status_code == 200
                # THCR pushes first (names), then a THST poll (states for every thread).
                await until(
                    "threads.updated",
                    vm=vm_id,
                    check=lambda e: (
                        len(e["threads"]) >= 4 and all(t["state"] for t in e["threads"])
                    ),
                )

                stream = await trio.open_tcp_stream("127.0.0.1", h.started.current_port)
                debugger = FakeDebugger(stream)
                await debugger.handshake()
                attached = await until("debugger.attached", vm=vm_id)
                assert attached["debugger"].endswith("via current")
                await stream.aclose()
                await until("debugger.detached", vm=vm_id)

                # `ddmd events` against the real daemon, while this stream stays open.
                result = await h.cli("events", "--json", "--count", "1")
                assert result.exit_code == 0, result.output
                (line,) = result.stdout.splitlines()
                assert json.loads(line)["event"] == "stream.opened"
                assert [v["id"] for v in json.loads(line)["vms"]] == [vm_id]

                h.started.stop()
                await until("daemon.stopping")
                async for _ in lines:
                    raise AssertionError("nothing after daemon.stopping")
    for event in seen:
        if event["event"].startswith(("vm.", "debugger.", "threads.", "heap.")):
            assert event["vm"] == vm_id, event
