"""The control API, in-process through httpx.ASGITransport under trio, plus one real socket."""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import AsyncIterator

import httpx
import pytest
import trio
from structlog.testing import capture_logs

from ddmd import __version__
from ddmd.config import ControlConfig
from ddmd.control.app import create_app, serve
from ddmd.control.safety import control_middleware
from ddmd.errors import DdmFailed, RequestTimedOut, VmGone, VmRequestError
from tests.contract import CLIENT_KEYS

from .fakes import (
    HPSG_BY_KIND,
    HPSG_FREE,
    HPSG_LARGEST_FREE,
    HPSG_RUNS,
    HPSG_UNITS,
    HPSG_USED,
    FakeVm,
    make_registry,
    standard_vms,
)

TIMEOUT = 10  # absolute cap on every test that waits on I/O


@pytest.fixture
def vms() -> dict[str, FakeVm]:
    return standard_vms()


@pytest.fixture
async def client(vms: dict[str, FakeVm]) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(make_registry(*vms.values()), version="9.9.9")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        yield c


# ------------------------------------------------------------------------------ health, lists


async def test_health(client):
    r = await client.get("/api/v1/health")
    assert r.status_code == 200
    # pid: a second `ddmd run` names the daemon that already runs.
    assert r.json() == {"status": "ok", "version": "9.9.9", "vms": 4, "pid": os.getpid()}


async def test_health_default_version():
    app = create_app(make_registry())
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
    ) as c:
        r = await c.get("/api/v1/health")
    assert r.json() == {"status": "ok", "version": __version__, "vms": 0, "pid": os.getpid()}


async def test_health_carries_what_the_daemon_adds():
    adb = {"enabled": "off", "config": "/home/u/.config/ddmd/config.toml"}
    app = create_app(make_registry(), version="1.0", health={"adb": adb})
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
    ) as c:
        r = await c.get("/api/v1/health")
        devices = await c.get("/api/v1/devices")
    assert r.json() == {"status": "ok", "version": "1.0", "vms": 0, "pid": os.getpid(), "adb": adb}
    assert devices.json() == []  # the device list keeps its shape: a plain list


async def test_vms_lists_every_snapshot(client, vms):
    r = await client.get("/api/v1/vms")
    assert r.status_code == 200
    body = r.json()
    assert body == [{**vm.snap.to_json(), "kind": "VM"} for vm in vms.values()]
    app = next(v for v in body if v["id"] == "emulator-5554/1234")
    assert set(app) >= CLIENT_KEYS
    assert app["threads"] == 3
    assert app["current"] is True


# ------------------------------------------------------------------------------ targets


@pytest.mark.parametrize(
    ("target", "query", "expected"),
    [
        ("tcp:8000", "", "tcp:8000"),  # id
        ("4242", "", "tcp:8000"),  # pid
        ("emulator-5554/1234", "", "emulator-5554/1234"),  # adb id with a slash
        ("R58M/1234", "", "R58M/1234"),
        ("org.other", "", "R58M/1234"),  # app == package
        ("com.example.app:remote", "", "emulator-5554/2000"),  # app
        ("2000", "", "emulator-5554/2000"),
        ("1234", "?device=emulator-5554", "emulator-5554/1234"),  # pid narrowed by device
        ("1234", "?device=R58M", "R58M/1234"),
    ],
)
async def test_vm_by_target(client, target, query, expected):
    r = await client.get(f"/api/v1/vms/{target}{query}")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["vm"]["id"] == expected
    assert set(body) == {"vm", "threads"}


async def test_vm_includes_its_thread_list(client, vms):
    r = await client.get("/api/v1/vms/emulator-5554/1234")
    threads = r.json()["threads"]
    assert [t["id"] for t in threads] == [1, 2, 9]
    assert threads[0] == vms["app"].snap.threads[0].to_json()
    r = await client.get("/api/v1/vms/4242")
    assert r.json()["threads"] is None


async def test_unknown_target_404_lists_every_vm(client):
    r = await client.get("/api/v1/vms/nope")
    assert r.status_code == 404
    body = r.json()
    assert body["error"] == "no VM matches 'nope'"
    assert body["target"] == "nope"
    assert len(body["candidates"]) == 4
    assert any(c.startswith("emulator-5554/1234 ") for c in body["candidates"])


async def test_unknown_target_on_sub_resources(client):
    for method, path in [
        ("GET", "/api/v1/vms/nope/threads"),
        ("GET", "/api/v1/vms/nope/heap"),
        ("POST", "/api/v1/vms/nope/gc"),
        ("GET", "/api/v1/vms/nope/threads/1/stack"),
        ("GET", "/api/v1/vms/no/such/vm/threads"),
    ]:
        r = await client.request(method, path)
        assert r.status_code == 404, path
        assert r.json()["candidates"], path


@pytest.mark.parametrize(("target", "count"), [("1234", 2), ("com.example.app", 2)])
async def test_ambiguous_target_409_lists_the_matches(client, target, count):
    r = await client.get(f"/api/v1/vms/{target}")
    assert r.status_code == 409
    body = r.json()
    assert body["error"] == f"{target!r} matches several VMs"
    assert len(body["candidates"]) == count


async def test_device_filter_can_leave_nothing(client):
    r = await client.get("/api/v1/vms/2000?device=R58M")
    assert r.status_code == 404


async def test_empty_target(client):
    r = await client.get("/api/v1/vms/")
    assert r.status_code == 404
    assert "candidates" in r.json()


# ------------------------------------------------------------------------------ threads


async def test_threads_refreshes(client, vms):
    r = await client.get("/api/v1/vms/emulator-5554/1234/threads")
    assert r.status_code == 200
    body = r.json()
    assert body["supported"] is True
    assert body["vm"]["id"] == "emulator-5554/1234"
    assert [t["name"] for t in body["threads"]] == ["main", "HeapTaskDaemon", "Binder:1234_1"]
    assert vms["app"].refresh_count == 1


async def test_threads_without_a_list_are_unsupported(client, vms):
    # The real actor answers a VM without DDM with its snapshot, not with an error.
    vms["jvm"].unsupported = frozenset()
    r = await client.get("/api/v1/vms/4242/threads")
    assert r.status_code == 200
    assert r.json()["supported"] is False
    assert vms["jvm"].refresh_count == 1


async def test_threads_unsupported_is_not_an_error(client):
    r = await client.get("/api/v1/vms/4242/threads")
    assert r.status_code == 200
    assert r.json()["supported"] is False
    assert r.json()["threads"] is None


@pytest.mark.parametrize(
    ("failure", "status"),
    [
        (RequestTimedOut("emulator-5554/1234 did not answer within 5 s"), 504),
        (VmGone("the VM is gone", vm="emulator-5554/1234"), 410),
        (DdmFailed("THST failed"), 502),
        (VmRequestError("no usable answer"), 502),
        (ExceptionGroup("nursery", [VmGone("gone")]), 410),  # a nursery's wrapping
    ],
)
async def test_threads_errors(client, vms, failure, status):
    vms["app"].failures["refresh_threads"] = failure
    r = await client.get("/api/v1/vms/emulator-5554/1234/threads")
    assert r.status_code == status
    body = r.json()
    assert body["target"] == "emulator-5554/1234"
    assert body["error"]


# ------------------------------------------------------------------------------ heap


async def test_heap_without_a_dump(client):
    r = await client.get("/api/v1/vms/emulator-5554/1234/heap")
    assert r.status_code == 200
    body = r.json()
    assert body["images"] == []
    assert body["heaps"][0]["max_size"] == 64 * 1024 * 1024
    assert body["heaps"][0]["objects_allocated"] == 12345
    assert "run_fields" not in body


async def test_heap_segments_dump(client, vms):
    r = await client.get("/api/v1/vms/emulator-5554/1234/heap?segments=1")
    assert r.status_code == 200
    body = r.json()
    assert vms["app"].segment_requests == 1
    assert body["run_fields"] == ["address", "units", "kind", "solidity"]
    assert body["kinds"]["2"] == "array_1"
    assert body["solidities"]["0"] == "free"
    [image] = body["images"]
    assert image["complete"] is True
    assert image["data_kind"] == "HPSG"
    summary = image["summary"]
    assert summary["bytes_used"] == HPSG_USED
    assert summary["bytes_free"] == HPSG_FREE
    assert summary["largest_free_run"] == HPSG_LARGEST_FREE
    assert summary["free_run_count"] == 2
    assert summary["bytes_by_kind"] == HPSG_BY_KIND
    assert summary["fragmentation"] == pytest.approx(1 - 40 / 56)
    [segment] = image["segments"]
    assert segment["units"] == HPSG_UNITS
    assert segment["runs"] == HPSG_RUNS

    # The plain heap route now shows the summary of the last dump, without segments.
    r = await client.get("/api/v1/vms/emulator-5554/1234/heap")
    [image] = r.json()["images"]
    assert image["summary"]["bytes_used"] == HPSG_USED
    assert "segments" not in image
    assert vms["app"].segment_requests == 1


@pytest.mark.parametrize("value", ["true", "yes", "ON"])
async def test_heap_segments_flag_spellings(client, vms, value):
    r = await client.get(f"/api/v1/vms/emulator-5554/1234/heap?segments={value}")
    assert r.status_code == 200
    assert vms["app"].segment_requests == 1


async def test_heap_segments_zero_means_no(client, vms):
    r = await client.get("/api/v1/vms/emulator-5554/1234/heap?segments=0")
    assert r.status_code == 200
    assert vms["app"].segment_requests == 0


async def test_heap_bad_flag_400(client):
    r = await client.get("/api/v1/vms/emulator-5554/1234/heap?segments=maybe")
    assert r.status_code == 400
    assert "segments" in r.json()["error"]


async def test_heap_segments_unsupported_501(client):
    r = await client.get("/api/v1/vms/4242/heap?segments=1")
    assert r.status_code == 501
    assert "heap_segments" in r.json()["error"]


async def test_heap_segments_timeout_504(client, vms):
    vms["app"].failures["heap_segments"] = RequestTimedOut("no heap segment dump arrived")
    r = await client.get("/api/v1/vms/emulator-5554/1234/heap?segments=1")
    assert r.status_code == 504
    assert r.json()["error"] == "no heap segment dump arrived"


# ------------------------------------------------------------------------------ gc


async def test_gc(client, vms):
    r = await client.post("/api/v1/vms/emulator-5554/1234/gc")
    assert r.status_code == 200
    assert r.json()["gc"] == "done"
    assert r.json()["vm"]["id"] == "emulator-5554/1234"
    assert vms["app"].gc_count == 1


async def test_gc_needs_post(client, vms):
    r = await client.get("/api/v1/vms/emulator-5554/1234/gc")
    assert r.status_code == 405
    assert r.json() == {"error": "Method Not Allowed"}
    assert r.headers["allow"] == "POST"
    r = await client.post("/api/v1/vms/emulator-5554/1234/threads")
    assert r.status_code == 405
    assert r.json() == {"error": "Method Not Allowed"}
    assert vms["app"].gc_count == 0


async def test_gc_unsupported_501(client):
    r = await client.post("/api/v1/vms/4242/gc")
    assert r.status_code == 501


# ------------------------------------------------------------------------------ stack


async def test_stack(client):
    r = await client.get("/api/v1/vms/emulator-5554/1234/threads/1/stack")
    assert r.status_code == 200
    body = r.json()
    assert body["thread_id"] == 1
    assert body["frames"][0] == {
        "class_name": "java.lang.Object",
        "method_name": "wait",
        "file_name": "",
        "line": -2,
    }
    assert body["frames"][1]["line"] == 42


async def test_stack_of_unknown_thread_404_lists_the_known_threads(client, vms):
    r = await client.get("/api/v1/vms/emulator-5554/1234/threads/77/stack")
    assert r.status_code == 404
    body = r.json()
    assert body["error"] == "no thread 77 in VM emulator-5554/1234"
    assert body["thread"] == "77"
    assert body["candidates"] == ["1 main", "2 HeapTaskDaemon", "9 Binder:1234_1"]
    assert vms["app"].stacks.keys() == {1}  # nothing was asked of the VM


async def test_stack_of_a_thread_the_vm_does_not_list_502(client, vms):
    # Without a thread list ddmd cannot check the id: the VM is asked, and says no.
    vms["app"].update(threads=None)
    r = await client.get("/api/v1/vms/emulator-5554/1234/threads/77/stack")
    assert r.status_code == 502
    assert "no thread 77" in r.json()["error"]


@pytest.mark.parametrize("thread", ["4294967296", "99999999999999999999"])
async def test_stack_bad_thread_id_400(client, thread):
    r = await client.get(f"/api/v1/vms/emulator-5554/1234/threads/{thread}/stack")
    assert r.status_code == 400
    assert thread in r.json()["error"]


@pytest.mark.parametrize("thread", ["abc", "-1", "1.5"])
async def test_stack_unknown_thread_name_404(client, thread):
    r = await client.get(f"/api/v1/vms/emulator-5554/1234/threads/{thread}/stack")
    assert r.status_code == 404
    assert r.json()["error"] == f"no thread named {thread!r} in VM emulator-5554/1234"


async def test_stack_unsupported_501(client):
    r = await client.get("/api/v1/vms/4242/threads/1/stack")
    assert r.status_code == 501


# ------------------------------------------------------------------------------ other errors


async def test_unknown_route_is_json_404(client):
    r = await client.get("/api/v2/nothing")
    assert r.status_code == 404
    assert r.json() == {"error": "Not Found"}


async def test_unexpected_exception_500_and_server_keeps_answering(client, vms):
    vms["app"].failures["cause_gc"] = RuntimeError("boom")
    with capture_logs() as logs:
        r = await client.post("/api/v1/vms/emulator-5554/1234/gc")
    assert r.status_code == 500
    assert "RuntimeError" in r.json()["error"]
    assert "boom" not in r.json()["error"]  # details stay in the log
    [event] = [e for e in logs if e["event"] == "control.request_failed"]
    assert event["log_level"] == "error"
    assert event["method"] == "POST"
    assert event["path"] == "/api/v1/vms/emulator-5554/1234/gc"
    assert event["error"] == "RuntimeError: boom"

    r = await client.get("/api/v1/health")
    assert r.status_code == 200
    del vms["app"].failures["cause_gc"]
    r = await client.post("/api/v1/vms/emulator-5554/1234/gc")
    assert r.status_code == 200


async def test_snapshot_raising_gives_500(client, vms):
    def broken():
        raise KeyError("snapshot")

    vms["jvm"].snapshot = broken  # type: ignore[method-assign]
    with capture_logs() as logs:
        r = await client.get("/api/v1/vms")
    assert r.status_code == 500
    assert [e["event"] for e in logs] == ["control.request_failed"]


# ------------------------------------------------------------------------------ token


@pytest.fixture
async def token_client(vms) -> AsyncIterator[httpx.AsyncClient]:
    # The daemon's token check: control.safety, configured from [control] as `ddmd run` does.
    token = control_middleware(ControlConfig(host="127.0.0.1", port=8710, token="s3cret"))
    app = create_app(make_registry(*vms.values()), middleware=token)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
    ) as c:
        yield c


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "s3cret"},
        {"Authorization": "Basic s3cret"},
        {"Authorization": "Bearer s3cret2"},
    ],
)
async def test_token_required(token_client, headers):
    for path in ("/api/v1/health", "/api/v1/vms", "/api/v1/vms/4242", "/api/v2/nothing"):
        r = await token_client.get(path, headers=headers)
        assert r.status_code == 401, path
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert r.json()["error"]
    r = await token_client.post("/api/v1/vms/4242/gc", headers=headers)
    assert r.status_code == 401


async def test_token_accepted(token_client, vms):
    auth = {"Authorization": "Bearer s3cret"}
    r = await token_client.get("/api/v1/health", headers=auth)
    assert r.status_code == 200
    r = await token_client.post("/api/v1/vms/emulator-5554/1234/gc", headers=auth)
    assert r.status_code == 200
    assert vms["app"].gc_count == 1


# ------------------------------------------------------------------------------ real socket


async def test_serve_on_a_real_socket(nursery):
    app = create_app(make_registry(FakeVm.android()), version="1.2.3")
    with trio.fail_after(TIMEOUT):
        with capture_logs() as logs:
            host, port = await nursery.start(serve, app, "127.0.0.1", 0)
        assert host == "127.0.0.1"
        assert port > 0
        assert {
            "event": "control.listening",
            "host": host,
            "port": port,
            "log_level": "info",
        } in logs
        async with httpx.AsyncClient(base_url=f"http://{host}:{port}", trust_env=False) as c:
            r = await c.get("/api/v1/health")
            assert r.json() == {"status": "ok", "version": "1.2.3", "vms": 1, "pid": os.getpid()}
            r = await c.get("/api/v1/vms/emulator-5554/1234/threads/1/stack")
            assert r.json()["frames"][1]["file_name"] == "Worker.java"
    nursery.cancel_scope.cancel()


async def test_serve_returns_on_shutdown_trigger():
    app = create_app(make_registry())
    stop = trio.Event()
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(serve, app, "127.0.0.1", 0, stop.wait)
            async with httpx.AsyncClient(base_url=f"http://{host}:{port}", trust_env=False) as c:
                assert (await c.get("/api/v1/health")).status_code == 200
            stop.set()
    # serve() returned by itself (the nursery closed without a cancel); nobody listens now.
    with trio.socket.socket() as s, pytest.raises(OSError):
        await s.connect(("127.0.0.1", port))


async def test_port_in_use_is_a_plain_oserror():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    app = create_app(make_registry())
    try:
        with trio.fail_after(TIMEOUT):
            # Directly, and through nursery.start() as the daemon calls it.
            with pytest.raises(OSError) as direct:
                await serve(app, "127.0.0.1", port)
            async with trio.open_nursery() as nursery:
                with pytest.raises(OSError) as started:
                    await nursery.start(serve, app, "127.0.0.1", port)
    finally:
        taken.close()
    for info in (direct, started):
        assert not isinstance(info.value, BaseExceptionGroup)
        assert info.value.errno == errno.EADDRINUSE
