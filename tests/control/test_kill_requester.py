"""Issue 20, friction 13: ``vm.kill_requested`` names who asked.

Over the control API's unix socket the server reads the peer's credentials (``SO_PEERCRED``)
once per connection and hands them to every request in the ASGI scope's extensions; the kill
route logs the asker's user, uid and pid. Checked with the real daemon (``rawpeers.monitor``)
and a ``SimVm``, killed through the unix socket by httpx and by ``ddmd kill`` itself, and over
TCP (the client's address, as before); and ``serve_control`` alone with a small ASGI app.
"""

from __future__ import annotations

import os
import pwd
import socket
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio
from click.testing import CliRunner

from ddmd.control.server import (
    PEER_CREDENTIALS,
    PeerCredentials,
    peer_credentials,
    scope_peer,
    serve_control,
)
from tests.actors.rawpeers import Harness, free_port_range, monitor

CAP = 20
APP = "com.example.mail"
PID = 3101


def me() -> str | None:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return None


async def start_vm(h: Harness, port: int) -> str:
    await h.start_sim(port, pid=PID, app_name=APP, package_name=APP)
    vm = f"tcp:{port}"
    await h.wait_vm(vm, lambda v: v["state"] == "ready")
    return vm


def unix_client(path: Path) -> httpx.AsyncClient:
    # The Host header names loopback, as the CLI's does through the socket (the API's rule).
    return httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(uds=os.fspath(path)),
        base_url="http://127.0.0.1",
        trust_env=False,
        timeout=10.0,
    )


async def test_a_kill_over_the_unix_socket_names_the_askers_user_uid_and_pid(tmp_path):
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            vm = await start_vm(h, port)
            assert h.started.control_socket is not None
            async with unix_client(h.started.control_socket) as client:
                response = await client.post(f"/api/v1/vms/{vm}/kill?status=7")
            assert response.status_code == 200, response.text
            asked = await h.wait_event("vm.kill_requested", vm=vm)
            await h.wait_event("vm.gone", vm=vm)
    user = me()
    assert asked["requester_uid"] == os.getuid()
    assert asked["requester_pid"] == os.getpid()
    assert asked["requester_user"] == user
    who = f"{user} (uid {os.getuid()})" if user else f"uid {os.getuid()}"
    assert asked["requester"] == f"{who}, pid {os.getpid()}"
    assert "unknown" not in asked["requester"]
    assert asked["status"] == 7
    # The VM's own pid stays the VM's (the asker's is requester_pid).
    assert (asked["app"], asked["pid"]) == (APP, PID)


async def test_ddmd_kill_goes_through_the_socket_and_is_named(tmp_path):
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            vm = await start_vm(h, port)
            socket_path = h.started.control_socket
            assert socket_path is not None
            config = tmp_path / "cli.toml"
            config.write_text(
                f'[control]\nport = {h.started.control[1]}\nsocket = "{socket_path}"\n'
            )
            from ddmd.cli import main

            argv = ["kill", vm, "--yes", "--config", str(config)]
            result = await trio.to_thread.run_sync(partial(CliRunner().invoke, main, argv))
            assert result.exit_code == 0, result.output
            asked = await h.wait_event("vm.kill_requested", vm=vm)
    assert (asked["requester_uid"], asked["requester_pid"]) == (os.getuid(), os.getpid())


async def test_a_kill_over_tcp_names_the_clients_address(tmp_path):
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            vm = await start_vm(h, port)
            response = await h.client.post(f"/api/v1/vms/{vm}/kill")
            assert response.status_code == 200, response.text
            asked = await h.wait_event("vm.kill_requested", vm=vm)
    host, _, client_port = asked["requester"].rpartition(":")
    assert host == "127.0.0.1"
    assert client_port.isdigit()
    assert "requester_uid" not in asked


# ------------------------------------------------------------------------------ the server


def test_peer_credentials_of_a_unix_socket_and_none_for_tcp():
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with left, right:
        peer = peer_credentials(trio.socket.from_stdlib_socket(left))
    assert peer is not None
    assert (peer.pid, peer.uid, peer.gid) == (os.getpid(), os.getuid(), os.getgid())
    assert peer.user == me()
    with socket.socket() as tcp:
        assert peer_credentials(trio.socket.from_stdlib_socket(tcp.dup())) is None
    assert scope_peer({"type": "http"}) is None
    assert scope_peer({"extensions": {PEER_CREDENTIALS: peer}}) is peer


async def test_every_request_on_a_unix_connection_carries_the_peer(tmp_path):
    seen: list[PeerCredentials | None] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        seen.append(scope_peer(scope))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    path = tmp_path / "run" / "control.sock"
    with trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(
                partial(serve_control, app, tcp=("127.0.0.1", 0), unix=path)
            )
            async with unix_client(path) as client:
                for _ in range(2):  # one keep-alive connection, two requests
                    assert (await client.get("/")).text == "ok"
            host, port = bound.tcp
            async with httpx.AsyncClient(base_url=f"http://{host}:{port}") as client:
                assert (await client.get("/")).text == "ok"
            nursery.cancel_scope.cancel()
    first, second, over_tcp = seen
    assert first is not None
    assert (first.uid, first.pid) == (os.getuid(), os.getpid())
    assert second == first
    assert over_tcp is None
