"""A `DdmClient` found by the real daemon's port scan (``ddmd.daemon.run`` in-process, scanning
the client's port): listed in /api/v1/vms and by ``ddmd clients`` with its own name and pid,
its pushes arrive, and ddmd sends it nothing but DDM."""

from __future__ import annotations

import json

import trio

from ddmd.client import VM_IDENT, DdmClient
from tests.actors.rawpeers import free_port_range, monitor, wait_until

CAP = 20  # seconds: absolute cap on every test


async def test_the_daemon_lists_a_client_with_its_name_and_pid(tmp_path) -> None:
    (port,) = free_port_range(1)
    vm_id = f"tcp:{port}"
    client = DdmClient("com.example.client", port=port, pid=5151, package_name="com.example")
    connected: list[int] = []

    @client.on_chunk("ECHO")
    def echo(data: bytes) -> tuple[str, bytes]:
        return ("ECHO", data[::-1])

    @client.on_connected
    async def hello() -> None:
        connected.append(1)
        await client.send_chunk("NOTE", b"hello")

    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            async with trio.open_nursery() as mine:
                await mine.start(client.serve)
                vm = await h.wait_vm(vm_id, lambda v: v["app"] == "com.example.client")
                assert vm["pid"] == 5151
                assert vm["package"] == "com.example"
                assert vm["vm_ident"] == VM_IDENT
                assert vm["ddm"] is True
                assert vm["name"] == "com.example.client"
                vm = await h.wait_vm(vm_id, lambda v: v["features"] == ["ECHO"])
                assert vm["source"] == "tcp"
                assert vm["address"] == f"127.0.0.1:{port}"
                # The push reached the daemon (a type it has no use for: logged once).
                pushed = await h.wait_event("ddm.chunk_unknown", vm=vm_id, type="NOTE")
                assert pushed["length"] == len(b"hello")

                result = await h.cli("clients", "--json")
                assert result.exit_code == 0, result.output
                (listed,) = json.loads(result.output)
                assert (listed["id"], listed["app"], listed["pid"]) == (
                    vm_id,
                    "com.example.client",
                    5151,
                )

                stats = client.statistics()
                assert stats.connections == len(connected) == 1
                assert stats.ddm_requests >= 2  # HELO, FEAT, then what ddmd asks of every VM
                # ddmd sends a DDM peer no JDWP command of its own.
                assert stats.refused_commands == 0

                # The client stops: the daemon drops it.
                mine.cancel_scope.cancel()
            await h.wait_event("vm.disconnected", vm=vm_id)

            async def gone() -> bool:
                return await h.vm(vm_id) is None

            await wait_until(gone, 5, what="the client gone from /api/v1/vms")
