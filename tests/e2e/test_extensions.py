"""Chunk-handler plugins (``ddmd.ext``), installed for real: a small package with its own
``pyproject.toml`` and a ``ddmd.handlers`` entry point is pip-installed into a directory put on
``sys.path``, and the daemon finds it through ``importlib.metadata`` as it finds any plugin.

Shown here: ``connected`` is called; the plugin's own request gets its own reply (and no one
else's); pushes of its types arrive; what it publishes is served at ``/api/v1/vms/ID/ext`` and
sent as ``ext.updated``; a plugin that raises on every chunk leaves the VM, its thread table and
a real jdb session through the current-VM port working; a plugin that fails to import is listed
by ``ddmd extensions`` with its error. And a DDM client written with ``ddmd.client`` answers a
plugin's request, and its pushes reach the plugin.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from ddmd.client import DdmClient
from tests.actors.rawpeers import free_port_range, monitor, wait_until
from tests.e2e.test_bridge_jvm import WAIT, jdb_session, select, vm_id

pytestmark = pytest.mark.jvm

CAP = 60

PLUGIN = '''\
"""A test plugin: records what it sees and publishes it."""

from ddmd.ext import ChunkHandler


class Recorder(ChunkHandler):
    name = "recorder"
    chunk_types = ("THCR", "XPNG")

    def connected(self, vm):
        vm.data["connected"] = vm.data.get("connected", 0) + 1
        vm.data["asked"] = [vm.send_chunk("HELO", bytes([0, 0, 0, 1]))]
        if vm.snapshot().get("app") == "echo-client":
            vm.data["asked"].append(vm.send_chunk("XPNG", b"ping"))
        vm.data["replies"] = []
        vm.data["pushes"] = []
        self._publish(vm)

    def handle_chunk(self, vm, chunk_type, data, is_reply, msg_id):
        if is_reply:
            vm.data["replies"].append([chunk_type, msg_id, data.hex()])
        else:
            vm.data["pushes"].append(chunk_type)
        self._publish(vm)

    def _publish(self, vm):
        vm.publish({
            "connected": vm.data["connected"],
            "asked": vm.data["asked"],
            "replies": vm.data.get("replies", []),
            "push_types": sorted(set(vm.data.get("pushes", []))),
            "pushes": len(vm.data.get("pushes", [])),
        })


class Broken(ChunkHandler):
    name = "broken"
    chunk_types = ("*",)

    def connected(self, vm):
        raise RuntimeError("broken on purpose")

    def handle_chunk(self, vm, chunk_type, data, is_reply, msg_id):
        raise RuntimeError("broken on purpose")


def make_recorder():
    return Recorder()


def make_broken():
    return Broken()
'''

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "ddmd-test-plugin"
version = "0.1"

[project.entry-points."ddmd.handlers"]
recorder = "ddmd_test_plugin:make_recorder"
broken = "ddmd_test_plugin:make_broken"
missing = "ddmd_test_plugin_that_is_not_there:make"
"""


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The plugin package, pip-installed into a directory on ``sys.path`` for this module."""
    root = tmp_path_factory.mktemp("plugin")
    source = root / "src"
    source.mkdir()
    (source / "pyproject.toml").write_text(PYPROJECT)
    (source / "ddmd_test_plugin.py").write_text(PLUGIN)
    site = root / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(site),
            str(source),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    try:
        yield site
    finally:
        sys.path.remove(str(site))
        sys.modules.pop("ddmd_test_plugin", None)
        importlib.invalidate_caches()


async def ext_of(h: Any, vm: str) -> dict[str, Any]:
    response = await h.client.get(f"/api/v1/vms/{vm}/ext")
    if response.status_code == 404:  # not found yet
        return {}
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body["ext"]


async def test_a_plugin_sees_its_own_replies_and_pushes_and_publishes(plugin_site, tmp_path):
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path, extensions={"disabled": ["broken"]}) as h:
            hub = h.started.hub
            assert hub is not None
            with hub.subscribe() as events:
                await h.start_sim(port, threads=6, churn_interval=0.0)
                vm = vm_id(port)

                async def recorded() -> dict[str, Any] | None:
                    ext = (await ext_of(h, vm)).get("recorder")
                    return ext if ext and ext["replies"] and ext["pushes"] else None

                ext = await wait_until(recorded, WAIT, what="the plugin's reply and pushes")
                assert ext["connected"] == 1
                # Its HELO request got exactly one answer, the HELO reply, under its own id;
                # ddmd's own HELO, FEAT, THEN... replies never reached it.
                (helo_id,) = ext["asked"]
                assert [r[:2] for r in ext["replies"]] == [["HELO", helo_id]]
                # Pushes: only its types (the sim's thread-creation burst).
                assert ext["push_types"] == ["THCR"]
                update = None
                while update is None:
                    event = await events.receive()
                    if event["event"] == "ext.updated" and event["vm"] == vm:
                        update = event
                assert "recorder" in update["ext"]
            # `ddmd extensions`: loaded, disabled by the config, and the one that cannot import.
            result = await h.cli("extensions", "--json")
            assert result.exit_code == 0, result.output
            listing = json.loads(result.output)
            assert [x["name"] for x in listing["loaded"]] == ["recorder", "sysmon"]
            assert listing["disabled"] == ["broken"]
            (missing,) = listing["failed"]
            assert missing["name"] == "missing"
            assert "ddmd_test_plugin_that_is_not_there" in missing["error"]
            text = await h.cli("extensions")
            assert "failed to load" in text.output
            assert "ModuleNotFoundError" in text.output
            assert h.events("ext.load_failed", handler="missing")


async def test_a_plugin_that_always_raises_harms_nothing(plugin_site, jdk, tmp_path):
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path, extensions={"disabled": ["recorder"]}) as h:
            sim = await h.start_sim(port, threads=7, churn_interval=0.0)
            vm = vm_id(port)
            await h.wait_vm(vm, lambda v: v["state"] == "ready", timeout=WAIT)
            await h.wait_event("ext.handler_disabled", handler="broken", vm=vm, timeout=WAIT)
            assert h.events("ext.handler_failed", handler="broken", vm=vm)
            # The thread table still comes in, in full.
            response = await h.client.get(f"/api/v1/vms/{vm}/threads")
            assert response.status_code == 200
            assert len(response.json()["threads"]) == 7
            # The plugin's failures cost the VM nothing: still its first connection.
            assert sim.statistics().connections_accepted == 1
            # A real jdb through the current-VM port works.
            await select(h, vm)
            async with jdb_session(jdk, h.started.current_port, "J") as jdb:
                await jdb.attached()
                listing = await jdb.command("threads", "main")
                assert "main" in listing
                assert await jdb.quit() == 0, jdb.transcript
            # (After jdb leaves, ddmd may release the VM by reconnecting: that is the release,
            # not the plugin, so connections are not counted past this point.)
            assert not h.events("vm.crashed")


async def test_a_ddm_client_answers_a_plugin_and_its_pushes_reach_it(plugin_site, tmp_path):
    (port,) = free_port_range(1)
    client = DdmClient("echo-client", port=port, pid=4321)

    @client.on_chunk("XPNG")
    def pong(data: bytes) -> tuple[str, bytes]:
        return ("XPNG", b"pong:" + data)

    @client.on_connected
    async def push_some() -> None:
        # Unasked pushes, now and then, for as long as the connection lasts (a push before
        # ddmd has identified the client reaches no handler: they are told on identification).
        while True:
            await trio.sleep(0.2)
            await client.send_chunk("XPNG", b"unasked")

    with trio.fail_after(CAP):
        async with monitor([port], tmp_path, extensions={"disabled": ["broken"]}) as h:
            h.peers.start_soon(client.serve)
            vm = vm_id(port)

            async def answered() -> dict[str, Any] | None:
                ext = (await ext_of(h, vm)).get("recorder")
                if ext and any(r[0] == "XPNG" for r in ext["replies"]) and ext["pushes"]:
                    return ext
                return None

            ext = await wait_until(answered, WAIT, what="the client's answer and push")
            asked_ping = ext["asked"][1]
            assert ["XPNG", asked_ping, b"pong:ping".hex()] in ext["replies"]
            assert "XPNG" in ext["push_types"]
            vms = await h.vms()
            assert [v["pid"] for v in vms if v["id"] == vm] == [4321]
