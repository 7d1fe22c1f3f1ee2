"""/metrics: the collector over live state, parsed with prometheus-client's own parser; the
counters move when a debugger session relays packets through a real daemon (sim VM + scripted
debugger) and never go down when the VM leaves."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
import prometheus_client
import trio
from prometheus_client.parser import text_string_to_metric_families

from ddmd.control.app import create_app
from ddmd.control.events import EventHub
from ddmd.control.metrics import DaemonCollector, RelayTotals, make_registry, metrics_route
from ddmd.protocol.jdwp import CommandSet, ReplyPacket, VirtualMachineCommand, encode
from ddmd.session.model import DebuggerSnapshot
from tests.actors.fakepeers import FakeDebugger
from tests.actors.rawpeers import free_port_range, monitor, wait_until

from .fakes import FakeVm
from .fakes import make_registry as make_vm_registry

CAP = 20
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> tuple[Samples, dict[str, str]]:
    """Samples by (name, sorted labels), and each family's type."""
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, types


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


@dataclass
class CountingVm:
    bridge: dict[str, int] = field(default_factory=dict)
    timeouts: int = 0

    def bridge_statistics(self) -> dict[str, int]:
        return dict(self.bridge)

    def statistics(self) -> Any:
        @dataclass
        class Stats:
            requests_timed_out: int

        return Stats(self.timeouts)


async def test_collector_reads_live_state():
    jvm, app = (
        FakeVm.plain_jvm(),
        FakeVm.android(
            debugger="127.0.0.1:5005 via current",
            debuggers=(DebuggerSnapshot("127.0.0.1:5005", "current", 8700, 1700000000.0),),
        ),
    )
    registry = make_vm_registry(jvm, app, FakeVm.android("emulator-5554/9", ddm=None))
    live = [
        CountingVm(
            {
                "packets_to_vm": 3,
                "packets_to_debugger": 4,
                "bytes_to_vm": 33,
                "bytes_to_debugger": 44,
                "answered_cache": 5,
                "answered_speculation": 6,
                "speculation_wasted": 7,
            },
            timeouts=1,
        )
    ]
    retired = RelayTotals(packets_to_vm=10, bytes_to_vm=100, reconnects=2, slow_debuggers=1)
    hub = EventHub()
    collector = DaemonCollector(
        registry, vms=lambda: live, retired=retired, scan_probes=lambda: 41, hub=hub
    )
    app_ = create_app(registry, extra_routes=[metrics_route(make_registry(collector))])
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app_), base_url="http://127.0.0.1"
    ) as client:
        with hub.subscribe():
            r = await client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=")
    samples, types = parse(r.text)
    assert types["ddmd_vms"] == "gauge"
    assert types["ddmd_relayed_packets"] == "counter"
    assert value(samples, "ddmd_vms", source="tcp", ddm="no") == 1
    assert value(samples, "ddmd_vms", source="adb", ddm="yes") == 1
    assert value(samples, "ddmd_vms", source="adb", ddm="unknown") == 1
    assert value(samples, "ddmd_vms", source="tcp", ddm="yes") == 0
    assert value(samples, "ddmd_debuggers_attached") == 1
    assert value(samples, "ddmd_relayed_packets_total", direction="to_vm") == 13
    assert value(samples, "ddmd_relayed_packets_total", direction="to_debugger") == 4
    assert value(samples, "ddmd_relayed_bytes_total", direction="to_vm") == 133
    assert value(samples, "ddmd_relayed_bytes_total", direction="to_debugger") == 44
    assert value(samples, "ddmd_ddm_request_timeouts_total") == 1
    assert value(samples, "ddmd_vm_reconnects_total") == 2
    assert value(samples, "ddmd_foresight_answered_total", source="cache") == 5
    assert value(samples, "ddmd_foresight_answered_total", source="speculation") == 6
    assert value(samples, "ddmd_foresight_wasted_total") == 7
    assert value(samples, "ddmd_scan_probes_total") == 41
    assert value(samples, "ddmd_debuggers_dropped_slow_total") == 1
    assert value(samples, "ddmd_event_stream_subscribers") == 1
    assert value(samples, "ddmd_event_stream_dropped_total") == 0
    assert ("ddmd_info", (("version", __import__("ddmd").__version__),)) in samples
    # Nothing went to the process-wide registry.
    assert prometheus_client.REGISTRY.get_sample_value("ddmd_scan_probes_total") is None


def test_retiring_a_vm_keeps_the_counters():
    vm = CountingVm({"packets_to_vm": 5, "bytes_to_debugger": 7, "slow_debuggers": 1}, timeouts=2)
    retired = RelayTotals()
    before = retired.plus([vm])
    retired.add(vm)  # the supervisor, as the VM leaves...
    after = retired.plus([])  # ...and no longer lists it
    assert (
        before
        == after
        == RelayTotals(packets_to_vm=5, bytes_to_debugger=7, slow_debuggers=1, requests_timed_out=2)
    )


# ------------------------------------------------------------------------------ real daemon


async def scrape(client: httpx.AsyncClient) -> Samples:
    r = await client.get("/metrics")
    assert r.status_code == 200, r.text
    return parse(r.text)[0]


COUNTERS = [
    ("ddmd_relayed_packets_total", {"direction": "to_vm"}),
    ("ddmd_relayed_packets_total", {"direction": "to_debugger"}),
    ("ddmd_relayed_bytes_total", {"direction": "to_vm"}),
    ("ddmd_relayed_bytes_total", {"direction": "to_debugger"}),
    ("ddmd_vm_reconnects_total", {}),
    ("ddmd_ddm_request_timeouts_total", {}),
    ("ddmd_scan_probes_total", {}),
    ("ddmd_debuggers_dropped_slow_total", {}),
]


def assert_not_lower(later: Samples, earlier: Samples) -> None:
    for name, labels in COUNTERS:
        assert value(later, name, **labels) >= value(earlier, name, **labels), name


async def test_counters_move_when_a_debugger_session_relays(tmp_path):
    (port,) = free_port_range(1)
    vm_id = f"tcp:{port}"
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            await h.start_sim(port, pid=5150, threads=4)
            await h.wait_vm(vm_id, lambda v: v["state"] == "ready" and v["debugger_port"])
            before = await scrape(h.client)
            assert value(before, "ddmd_vms", source="tcp", ddm="yes") == 1
            assert value(before, "ddmd_debuggers_attached") == 0
            assert value(before, "ddmd_scan_probes_total") >= 1

            stream = await trio.open_tcp_stream("127.0.0.1", h.started.current_port)
            debugger = FakeDebugger(stream)
            await debugger.handshake()
            await h.wait_event("debugger.attached", vm=vm_id)
            sent = 0
            for packet_id in range(1, 6):
                # ClassPaths: answered by the VM each time (Version and IDSizes are cached).
                await debugger.command(
                    packet_id, CommandSet.VIRTUAL_MACHINE, VirtualMachineCommand.CLASS_PATHS
                )
                sent += 11
            replies = []
            for _ in range(5):
                packet = await debugger.receive()
                assert isinstance(packet, ReplyPacket)
                replies.append(packet)
            during = await scrape(h.client)
            assert value(during, "ddmd_debuggers_attached") == 1
            moved = {
                (name, tuple(labels.items())): value(during, name, **labels)
                - value(before, name, **labels)
                for name, labels in COUNTERS
            }
            assert moved[("ddmd_relayed_packets_total", (("direction", "to_vm"),))] >= 5
            assert moved[("ddmd_relayed_packets_total", (("direction", "to_debugger"),))] >= 5
            assert moved[("ddmd_relayed_bytes_total", (("direction", "to_vm"),))] >= sent
            assert moved[("ddmd_relayed_bytes_total", (("direction", "to_debugger"),))] >= sum(
                len(encode(r)) for r in replies
            )
            assert_not_lower(during, before)

            await stream.aclose()
            await h.wait_event("debugger.detached", vm=vm_id)

            async def detached() -> Samples | None:
                samples = await scrape(h.client)
                return samples if value(samples, "ddmd_debuggers_attached") == 0 else None

            after = await wait_until(detached, 5, what="no debugger attached")
            assert_not_lower(after, during)

            # The VM goes away: its counts stay in the totals.
            h.peers.cancel_scope.cancel()
            await wait_until(lambda: vm_id not in h.started.registry, 5, what="VM gone")
            gone = await scrape(h.client)
            assert value(gone, "ddmd_vms", source="tcp", ddm="yes") == 0
            assert_not_lower(gone, after)
