"""/metrics: the collector over live state, parsed with prometheus-client's own parser; every
series has the ``host`` label and every family is in FAMILIES; the counters move when a debugger
session relays packets through a real daemon (sim VM + scripted debugger) and never go down when
the VM leaves."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import prometheus_client
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from ddmd.config import parse_config
from ddmd.control.app import create_app
from ddmd.control.events import EventHub
from ddmd.control.metrics import (
    FAMILIES,
    DaemonCollector,
    RelayTotals,
    make_registry,
    metrics_route,
)
from ddmd.errors import ConfigError
from ddmd.front.stats import FrontStatistics
from ddmd.protocol.jdwp import CommandSet, ReplyPacket, VirtualMachineCommand, encode
from ddmd.registry import VmRegistry
from ddmd.session.model import DebuggerSnapshot, ForesightSnapshot
from tests.actors.fakepeers import FakeDebugger
from tests.actors.rawpeers import free_port_range, monitor, wait_until

from .fakes import FakeVm, sample_heap_info
from .fakes import make_registry as make_vm_registry

CAP = 20
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str, host: str | None = None) -> tuple[Samples, dict[str, str]]:
    """Samples by (name, sorted labels but ``host``), and each family's type. Every sample must
    have the ``host`` label (``host`` when given), and every family be in FAMILIES."""
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            labels = dict(s.labels)
            got = labels.pop("host", "")
            assert got, s
            assert host is None or got == host, s
            assert FAMILIES.get(s.name) == family.type, s.name
            samples[(s.name, tuple(sorted(labels.items())))] = s.value
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
        registry, vms=lambda: live, retired=retired, scan_probes=lambda: 41, hub=hub, host="lab-7"
    )
    app_ = create_app(registry, extra_routes=[metrics_route(make_registry(collector))])
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app_), base_url="http://127.0.0.1"
    ) as client:
        with hub.subscribe():
            r = await client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=")
    samples, types = parse(r.text, "lab-7")
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


# ------------------------------------------------------------------------------ per VM

NOW = 1_800_000_000.0  # the collector's wall clock in these tests


def scrape_collector(collector: DaemonCollector, host: str = "lab-7") -> Samples:
    """What /metrics would say, through prometheus-client's own text encoder and parser."""
    return parse(prometheus_client.generate_latest(make_registry(collector)).decode(), host)[0]


def vm_series(samples: Samples, vm: str) -> dict[str, dict[str, str]]:
    """The ddmd_vm_* series of VM ``vm``: name -> its labels (but ``vm``)."""
    return {
        name: dict(labels)
        for (name, labels), _ in samples.items()
        if name.startswith("ddmd_vm_") and ("vm", vm) in labels
    }


def collector_of(registry, **kw: Any) -> DaemonCollector:
    return DaemonCollector(
        registry, vms=list, retired=RelayTotals(), host="lab-7", clock=lambda: NOW, **kw
    )


def test_each_vm_has_its_series_with_device_app_and_vm_labels():
    heaps = (*sample_heap_info(), replace(sample_heap_info()[0], heap_id=2, size=100))
    app = FakeVm.android(
        "emulator-5554/1234",
        vm_ident="Dalvik v2.1.0",
        heaps=heaps,
        connected_at=NOW - 90,
        debuggers=(
            DebuggerSnapshot("127.0.0.1:1", "vm-port", 8600, NOW - 60, suspended_since=NOW - 12.5),
            DebuggerSnapshot("127.0.0.1:2", "current", 8700, NOW - 30, suspended_since=NOW - 2),
            DebuggerSnapshot("adb", "front", None, NOW - 5, debugging=False),
        ),
        foresight=ForesightSnapshot(True, 0.004, 0, 0, 0, 0),
    )
    jvm = FakeVm.plain_jvm("tcp:8000", threads=None)
    samples = scrape_collector(collector_of(make_vm_registry(app, jvm)))
    labels = {"device": "emulator-5554", "app": "com.example.app", "vm": "emulator-5554/1234"}
    info = {**labels, "source": "adb", "kind": "ART", "ddm": "yes"}
    assert value(samples, "ddmd_vm_info", **info) == 1
    size = sum(h.size for h in heaps)
    assert value(samples, "ddmd_vm_heap_size_bytes", **labels) == size
    allocated = sum(h.bytes_allocated for h in heaps)
    assert value(samples, "ddmd_vm_heap_allocated_bytes", **labels) == allocated
    assert value(samples, "ddmd_vm_heap_max_bytes", **labels) == sum(h.max_size for h in heaps)
    assert value(samples, "ddmd_vm_threads", **labels) == 3
    assert value(samples, "ddmd_vm_debuggers", **labels) == 2  # the DDM-only client is none
    assert value(samples, "ddmd_vm_suspended_seconds", **labels) == 12.5  # the longest hold
    assert value(samples, "ddmd_vm_round_trip_seconds", **labels) == 0.004
    assert value(samples, "ddmd_vm_connected_seconds", **labels) == 90

    # A plain JVM on a local port: device "local", named as everywhere else; no heap, no
    # threads known, no round trip, never connected: those series are absent, not 0.
    local = {"device": "local", "app": "JVM pid 4242", "vm": "tcp:8000"}
    kind = {"source": "tcp", "kind": "OpenJDK 17.0.9", "ddm": "no"}
    assert value(samples, "ddmd_vm_info", **local, **kind) == 1
    assert set(vm_series(samples, "tcp:8000")) == {
        "ddmd_vm_info",
        "ddmd_vm_debuggers",
        "ddmd_vm_suspended_seconds",
    }
    assert value(samples, "ddmd_vm_suspended_seconds", **local) == 0
    assert value(samples, "ddmd_vm_debuggers", **local) == 0


def test_a_gone_vms_series_go_with_it_and_nothing_is_kept():
    app, other = FakeVm.android(), FakeVm.android("R58M/77", app="org.other", package=None)
    registry = make_vm_registry(app, other)
    collector = collector_of(registry)
    before = scrape_collector(collector)
    assert vm_series(before, "emulator-5554/1234")
    assert value(before, "ddmd_vms", source="adb", ddm="yes") == 2
    registry.remove("emulator-5554/1234")
    after = scrape_collector(collector)
    assert vm_series(after, "emulator-5554/1234") == {}
    assert vm_series(after, "R58M/77") == vm_series(before, "R58M/77")
    # A change shows at the next scrape (the snapshots are read each time, never cached).
    other.update(threads=())
    assert (
        value(
            scrape_collector(collector),
            "ddmd_vm_threads",
            device="R58M",
            app="org.other",
            vm="R58M/77",
        )
        == 0
    )


def test_the_front_series_while_it_listens():
    stats = FrontStatistics(
        port=5038,
        connections=9,
        relayed=40,
        jdwp_served=3,
        jdwp_relayed=1,
        forwards=3,
        forwards_by_device={"emulator-5554": 2, "R58M": 1},
        forward_connections=5,
        forward_refused=2,
        kills_refused=1,
        bad_requests=4,
        timeouts=6,
        upstream_failures=7,
    )
    running: list[FrontStatistics | None] = [stats]
    samples = scrape_collector(collector_of(VmRegistry(), front=lambda: running[0]))
    assert value(samples, "ddmd_front_connections_total") == 9
    assert value(samples, "ddmd_front_forwards", device="emulator-5554") == 2
    assert value(samples, "ddmd_front_forwards", device="R58M") == 1
    assert value(samples, "ddmd_front_forward_connections_total") == 5
    refused = {
        "bad_request": 4,
        "timeout": 6,
        "no_server": 7,
        "kill": 1,
        "no_vm": 2,
    }
    for reason, n in refused.items():
        assert value(samples, "ddmd_front_requests_refused_total", reason=reason) == n
    assert value(samples, "ddmd_front_requests_relayed_total") == 40
    assert value(samples, "ddmd_front_jdwp_connections_total", served_by="ddmd") == 3
    assert value(samples, "ddmd_front_jdwp_connections_total", served_by="adb") == 1
    running[0] = None  # the front stopped (or never listened): no front series
    after = scrape_collector(collector_of(VmRegistry(), front=lambda: running[0]))
    assert not [name for name, _ in after if name.startswith("ddmd_front_")]


def test_the_host_label_defaults_to_this_machines_name():
    samples = parse(
        prometheus_client.generate_latest(
            make_registry(DaemonCollector(VmRegistry(), vms=list, retired=RelayTotals()))
        ).decode(),
        socket.gethostname() or "localhost",
    )[0]
    assert value(samples, "ddmd_vm_reconnects_total") == 0


#: Series of one VM that ddmd knows everything about (docs/metrics.md counts with it).
SERIES_PER_VM = 9


def test_how_many_series_vms_make():
    def count(n: int) -> int:
        vms = [
            FakeVm.android(
                f"emulator-5554/{1000 + i}",
                app=f"com.example.app{i}",
                connected_at=NOW - 1,
                foresight=ForesightSnapshot(True, 0.01, 0, 0, 0, 0),
            )
            for i in range(n)
        ]
        return len(scrape_collector(collector_of(make_vm_registry(*vms))))

    none = count(0)
    assert count(1) - none == SERIES_PER_VM
    assert count(500) - none == 500 * SERIES_PER_VM


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ("", None),
        ("lab-3", None),
        ("Lab 3 (rack B) \u00e9", None),
        ("h" * 253, None),
        ("h" * 254, "is 254 characters long; at most 253"),
        ("   ", "must not be only spaces"),
        ("lab\t3", "must be printable"),
        ("lab\n3", "must be printable"),
        (3, "expected a string, got an integer"),
    ],
)
def test_metrics_host_in_the_config(given: object, problem: str | None):
    data = {"metrics": {"host": given}}
    if problem is None:
        host = parse_config(data, source="t.toml").metrics.host
        assert host == (given or socket.gethostname() or "localhost")
        return
    with pytest.raises(ConfigError) as caught:
        parse_config(data, source="t.toml")
    assert problem in str(caught.value)
    assert "[metrics] host" in str(caught.value)


def test_families_are_named_by_the_rules():
    for name, kind in FAMILIES.items():
        assert name.startswith("ddmd_"), name
        assert kind in ("counter", "gauge"), name
        assert name.endswith("_total") == (kind == "counter"), name


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
    # Foresight off: on a busy machine the round trip may pass its threshold, and then ddmd
    # answers repeated ClassPaths itself instead of relaying them.
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path, debugger={"speculate": "off"}) as h:
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


async def test_the_daemon_reads_the_running_fronts_counters():
    # The daemon's wiring (daemon._front_statistics) against a front serving a fake adb server.
    from ddmd.daemon import _front_statistics
    from tests.front.test_front_fake import SERIAL, ask, fake_rig, forward, wire

    collector = collector_of(VmRegistry(), front=_front_statistics)
    async with fake_rig() as rig:
        rig.hub.hold(SERIAL, 4242)
        await ask(rig.port, wire("host:version"))
        await ask(rig.port, b"0000")
        await forward(rig.port, "host:forward:tcp:0;jdwp:4242")
        samples = scrape_collector(collector)
    assert value(samples, "ddmd_front_connections_total") == 3
    assert value(samples, "ddmd_front_forwards", device=SERIAL) == 1
    assert value(samples, "ddmd_front_requests_refused_total", reason="bad_request") == 1
    assert value(samples, "ddmd_front_requests_relayed_total") == 1
    gone = scrape_collector(collector)  # the front stopped with its rig
    assert not [name for name, _ in gone if name.startswith("ddmd_front_")]
