"""Soak: a day of churn, compressed. ddmd's memory, open files and tasks must stay flat.

Run: ``.venv/bin/python bench/soak.py [--minutes 60]``; ``--minutes 3`` is the short mode (not
part of the test suite: it takes three minutes and asserts nothing).

It starts the real daemon (``python -m ddmd run --config FILE --log-format json``, a separate
process with its own temp config: adb off, a small scan range, scan every second, thread polls
at 2 Hz) and, from this process, throws at it until the last stretch of the run:

- **VMs coming and going**: a simulated VM (``ddmd.sim.SimVm``, what ``ddmd sim`` runs) on a
  free port of the scan range every 2-4 s, living 10-40 s; the apps are six names, and half of
  the VMs that end come back at once on the same port as the same app with a new pid (an app
  restarting); at most ten at once;
- **debuggers attaching and leaving**, one every 0.5-1.5 s on a live VM's own port or the
  current-VM port, raw JDWP clients of three kinds: polite ones (handshake, Version, IDSizes,
  AllThreads, AllClasses, Dispose, close), killed ones (handshake, a command, then a reset
  without reading: what ``kill -9`` leaves), slow readers (a 4 KiB receive buffer, 50
  commands sent and no reply read for 5-15 s; three in ten send 2000, and ddmd drops them as
  slow consumers);
- **API clients**: one keeping its connection, one opening a connection per request, one
  through the unix socket; VM list, health, current VM, metrics, thread lists of random VMs,
  ``select``, now and then a GC;
- **event stream readers**: two at a time, each stream read for 3-20 s then dropped.

Every 10 s it samples ddmd's RSS (``VmRSS`` of /proc/PID/status), its open file descriptors
(/proc/PID/fd) and its trio task count (``ddmd_trio_tasks`` in /metrics: the daemon's task
tree walked at scrape time). The sample taken before anything starts is the baseline; in the
last stretch (10 % of the run, between 30 s and 2 min) nothing happens: every VM, debugger and
client has left. It prints the samples, the least-squares slope of each per hour over the
samples of the churn after the warm-up (20 % of the run, between 1 and 10 min), and PASS
when:

- RSS grows by less than 5 MB per hour after the warm-up;
- open files and tasks at the end are back at their baseline (the smallest of twenty readings
  0.3 s apart, for the baseline and the end; three for the other samples: a scan round or an
  HTTP connection in flight holds a socket and a task or two for a moment, and the scrape's own
  connection counts one task more about half of the time, hypercorn's idle timer for that
  connection, still winding down when the count is taken, even with nothing else running);
- no VM and no debugger is left at the end.

A run with less than 30 minutes of churn after its warm-up (so, shorter than about 42
minutes) shows the RSS slope but does not judge it. RSS moves by whole MB while the load runs:
the allocator takes memory for a burst of API answers or events and gives it back later
(under tracemalloc, a 14-minute run kept the Python heap within 29.4-30.4 MB throughout), so a
slope over a few minutes means little; the 60-minute run is the one that decides. Each sample
also shows RssAnon (the heap's part of the RSS) for reading such steps.
``--without vms|debuggers|api|streams`` (repeatable) leaves one kind of churn out, to find
which one makes something grow.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import httpx
import structlog
import trio
from rig import HOST, ROOT
from rig.daemon import ddmd_argv, scan_config, write_config
from rig.jdwp import HANDSHAKE, HEADER, REPLY
from rig.ports import Layout
from rig.proc import status_kb

from ddmd.sim import SimConfig, SimVm

RSS_SLOPE_LIMIT_MB_H = 5.0
#: Seconds of churn after the warm-up below which the RSS slope is shown but not judged.
RSS_MIN_WINDOW = 30 * 60.0
SAMPLE_EVERY = 10.0
EDGE_READINGS = 20  # readings for the baseline and the end (see the docstring)
APPS = tuple(f"com.example.soak{i}" for i in range(6))
MAX_VMS = 10


# --------------------------------------------------------------------------------------------
# Ports and the daemon


def config(path: Path, layout: Layout) -> Path:
    """ddmd's config: the scan range every second, threads polled at 2 Hz when asked."""
    sections = scan_config(layout, path.parent / "ports.json", 1.0, backoff_max=10.0)
    sections["monitor"] = {"thread_poll_interval": 0.5}
    return write_config(path, sections)


# --------------------------------------------------------------------------------------------
# Samples


@dataclass(frozen=True, slots=True)
class Sample:
    t: float
    rss_mb: float
    fds: int
    tasks: int
    vms: int
    debuggers: int
    anon_mb: float = 0.0  # RssAnon: the heap's part of the RSS (shown; the rule reads VmRSS)


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    return status_kb(pid, field) / 1024


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def metric_values(text: str) -> dict[str, float]:
    """Unlabelled metrics, and labelled ones summed by name."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.split("{", 1)[0]
        values[name] = values.get(name, 0.0) + float(value)
    return values


async def sample(pid: int, base: str, t: float, readings: int = 3) -> Sample:
    """One sample; fds and tasks are the smallest of `readings` readings 0.3 s apart."""
    fds: list[int] = []
    tasks: list[int] = []
    values: dict[str, float] = {}
    for i in range(readings):
        if i:
            await trio.sleep(0.3)
        fds.append(fd_count(pid))  # before the request: its own connection is not counted
        async with httpx.AsyncClient(base_url=base, trust_env=False, timeout=10) as client:
            response = await client.get("/metrics", headers={"Connection": "close"})
        values = metric_values(response.text)
        tasks.append(int(values.get("ddmd_trio_tasks", -1)))
    return Sample(
        t,
        rss_mb(pid),
        min(fds),
        min(tasks),
        int(values.get("ddmd_vms", 0)),
        int(values.get("ddmd_debuggers_attached", 0)),
        rss_mb(pid, "RssAnon"),
    )


def slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, value), in value per hour."""
    if len(points) < 3:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return None
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return cov / var * 3600


# --------------------------------------------------------------------------------------------
# Churn


@dataclass
class Counts:
    vms: int = 0
    restarts: int = 0
    debuggers: dict[str, int] = field(default_factory=lambda: {"polite": 0, "killed": 0, "slow": 0})
    debuggers_turned_away: int = 0
    requests: int = 0
    request_errors: int = 0
    streams: int = 0
    events: int = 0


async def vm_churn(layout: Layout, counts: Counts) -> None:
    """Until cancelled: a new VM every 2-4 s; some come back as the same app with a new pid."""
    busy: set[int] = set()
    pids = itertools.count(random.randrange(2000, 20000))

    async def life(port: int, app: str) -> None:
        try:
            while True:
                counts.vms += 1
                config = SimConfig(
                    port=port,
                    pid=next(pids),
                    app_name=app,
                    package_name=app,
                    churn_interval=2.0,
                    gc_interval=3.0,
                    heap_mb=1,
                    seed=port,
                )
                with trio.move_on_after(random.uniform(10, 40)):
                    await SimVm(config).run()
                if random.random() >= 0.5:
                    return
                counts.restarts += 1  # the app restarts: same port and name, a new pid
        finally:
            busy.discard(port)

    async with trio.open_nursery() as nursery:
        while True:
            free = [p for p in layout.scan if p not in busy]
            if free and len(busy) < MAX_VMS:
                port = random.choice(free)
                busy.add(port)
                nursery.start_soon(life, port, random.choice(APPS))
            await trio.sleep(random.uniform(2, 4))


def command(packet_id: int, command_set: int, number: int) -> bytes:
    return HEADER.pack(11, packet_id, 0, command_set, number)


async def read_exactly(stream: trio.SocketStream, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = await stream.receive_some(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


async def read_reply(stream: trio.SocketStream) -> None:
    header = await read_exactly(stream, 11)
    length = REPLY.unpack(header)[0]
    await read_exactly(stream, length - 11)


async def debugger(port: int, kind: str, counts: Counts) -> None:
    with trio.move_on_after(30):
        sock = trio.socket.socket()
        if kind == "slow":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            await sock.connect((HOST, port))
        except OSError:
            sock.close()
            return
        stream = trio.SocketStream(sock)
        try:
            await stream.send_all(HANDSHAKE)
            if await read_exactly(stream, len(HANDSHAKE)) != HANDSHAKE:
                return
            counts.debuggers[kind] += 1
            if kind == "polite":
                for i, (cs, cmd) in enumerate([(1, 1), (1, 7), (1, 4), (1, 3)], start=1):
                    await stream.send_all(command(i, cs, cmd))
                    await read_reply(stream)
                await stream.send_all(command(99, 1, 6))  # Dispose
                await read_reply(stream)
            elif kind == "killed":
                await stream.send_all(command(1, 1, 4))
                stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            else:
                # Most stop reading with a few replies owed; some owe so many that ddmd drops
                # them as slow consumers.
                count = 2000 if random.random() < 0.3 else 50
                burst = b"".join(command(i, 1, 4 if i % 2 else 3) for i in range(1, count + 1))
                with trio.move_on_after(5):
                    await stream.send_all(burst)
                await trio.sleep(random.uniform(5, 15))
        except (EOFError, OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            counts.debuggers_turned_away += 1
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()


async def debugger_churn(layout: Layout, base: str, counts: Counts) -> None:
    async with (
        httpx.AsyncClient(base_url=base, trust_env=False, timeout=10) as client,
        trio.open_nursery() as nursery,
    ):
        while True:
            await trio.sleep(random.uniform(0.5, 1.5))
            try:
                vms = (await client.get("/api/v1/vms")).json()
            except httpx.HTTPError:
                continue
            ports = [vm["debugger_port"] for vm in vms if vm.get("debugger_port")]
            if not ports:
                continue
            port = random.choice([*ports, layout.current])
            kind = random.choices(["polite", "killed", "slow"], weights=[6, 2, 2])[0]
            nursery.start_soon(debugger, port, kind, counts)


async def api_client(client: httpx.AsyncClient, counts: Counts, *, fresh: bool) -> None:
    """Until cancelled: the requests the CLI and the web page make."""
    headers = {"Connection": "close"} if fresh else {}

    async def get(path: str, method: str = "GET") -> httpx.Response | None:
        counts.requests += 1
        try:
            return await client.request(method, path, headers=headers)
        except httpx.HTTPError:
            counts.request_errors += 1
            return None

    while True:
        for path in ("/api/v1/vms", "/api/v1/health", "/api/v1/current", "/metrics"):
            await get(path)
        response = await get("/api/v1/vms")
        vms = response.json() if response is not None and response.is_success else []
        if vms:
            vm = random.choice(vms)["id"]
            await get(f"/api/v1/vms/{vm}/threads")
            await get(f"/api/v1/vms/{vm}/heap")
            if random.random() < 0.2:
                await get(f"/api/v1/vms/{vm}/select", "POST")
            if random.random() < 0.05:
                await get(f"/api/v1/vms/{vm}/gc", "POST")
        await trio.sleep(random.uniform(0.3, 1.0))


async def stream_reader(base: str, counts: Counts) -> None:
    while True:
        async with httpx.AsyncClient(base_url=base, trust_env=False, timeout=30) as client:
            counts.streams += 1
            with trio.move_on_after(random.uniform(3, 20)):
                try:
                    async with client.stream("GET", "/api/v1/events") as response:
                        async for line in response.aiter_lines():
                            if line.startswith("event:"):
                                counts.events += 1
                except httpx.HTTPError:
                    counts.request_errors += 1
        await trio.sleep(random.uniform(0.2, 2))


KINDS = ("vms", "debuggers", "api", "streams")


async def churn(
    layout: Layout, base: str, sock: Path, counts: Counts, without: frozenset[str]
) -> None:
    async with (
        httpx.AsyncClient(base_url=base, trust_env=False, timeout=30) as keep,
        httpx.AsyncClient(base_url=base, trust_env=False, timeout=30) as fresh,
        httpx.AsyncClient(
            base_url=f"http://{HOST}",
            transport=httpx.AsyncHTTPTransport(uds=str(sock)),
            trust_env=False,
            timeout=30,
        ) as unix,
        trio.open_nursery() as nursery,
    ):
        if "vms" not in without:
            nursery.start_soon(vm_churn, layout, counts)
        if "debuggers" not in without:
            nursery.start_soon(debugger_churn, layout, base, counts)
        if "api" not in without:
            nursery.start_soon(partial(api_client, keep, counts, fresh=False))
            nursery.start_soon(partial(api_client, fresh, counts, fresh=True))
            nursery.start_soon(partial(api_client, unix, counts, fresh=False))
        if "streams" not in without:
            nursery.start_soon(stream_reader, base, counts)
            nursery.start_soon(stream_reader, base, counts)


# --------------------------------------------------------------------------------------------
# The run


async def wait_healthy(base: str, proc: trio.Process, log: Path) -> None:
    with trio.fail_after(30):
        while True:
            if proc.returncode is not None:
                raise RuntimeError(f"ddmd exited ({proc.returncode}); see {log}")
            try:
                async with httpx.AsyncClient(base_url=base, trust_env=False, timeout=2) as c:
                    if (await c.get("/api/v1/health")).is_success:
                        return
            except httpx.HTTPError:
                pass
            await trio.sleep(0.2)


def show(s: Sample) -> None:
    print(
        f"{s.t / 60:7.2f} min  rss {s.rss_mb:7.2f} MB (anon {s.anon_mb:6.2f})  fds {s.fds:4d}  "
        f"tasks {s.tasks:4d}  "
        f"vms {s.vms:3d}  debuggers {s.debuggers:3d}",
        flush=True,
    )


async def soak(minutes: float, without: frozenset[str]) -> int:
    total = minutes * 60
    tail = max(30.0, min(120.0, total * 0.1))
    warmup = max(60.0, min(600.0, total * 0.2))
    work = Path(tempfile.mkdtemp(prefix="ddmd-soak-"))
    layout = Layout.find(16, 48, random.randrange(20000, 28000))
    config_path = config(work / "config.toml", layout)
    run_dir = work / "run"
    env = {**os.environ, "XDG_RUNTIME_DIR": str(run_dir), "PYTHONUNBUFFERED": "1"}
    log = work / "ddmd.log"
    base = f"http://{HOST}:{layout.control}"
    sock = run_dir / "ddmd" / f"control-{layout.control}.sock"
    print(
        f"soak: {minutes:g} min (churn {(total - tail) / 60:.1f} min, quiet tail {tail:.0f} s, "
        f"warm-up {warmup / 60:.1f} min); scan {layout.scan[0]}-{layout.scan[-1]}, "
        f"control {layout.control}; files in {work}",
        flush=True,
    )
    counts = Counts()
    samples: list[Sample] = []
    with log.open("w") as log_file:
        proc = await trio.lowlevel.open_process(
            ddmd_argv("run", "--config", str(config_path), "--log-format", "json"),
            cwd=str(ROOT),
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        try:
            await wait_healthy(base, proc, log)
            await trio.sleep(5)
            started = trio.current_time()
            samples.append(await sample(proc.pid, base, 0.0, readings=EDGE_READINGS))
            show(samples[-1])
            async with trio.open_nursery() as nursery:
                churn_scope = trio.CancelScope(deadline=started + total - tail)

                async def churning() -> None:
                    with churn_scope:
                        await churn(layout, base, sock, counts, without)

                nursery.start_soon(churning)
                next_at = started + SAMPLE_EVERY
                while next_at <= started + total:
                    await trio.sleep_until(next_at)
                    if proc.returncode is not None:
                        raise RuntimeError(f"ddmd exited ({proc.returncode}); see {log}")
                    last = next_at + SAMPLE_EVERY > started + total
                    samples.append(
                        await sample(
                            proc.pid,
                            base,
                            next_at - started,
                            readings=EDGE_READINGS if last else 3,
                        )
                    )
                    show(samples[-1])
                    next_at += SAMPLE_EVERY
        finally:
            # Shielded: a run stopped by a signal (a cancelled scope) still stops its daemon.
            with trio.CancelScope(shield=True):
                if proc.returncode is None:
                    proc.send_signal(signal.SIGTERM)
                    with trio.move_on_after(15):
                        await proc.wait()
                    if proc.returncode is None:
                        proc.kill()
                        await proc.wait()
    return report(samples, counts, warmup, total - tail, log)


async def soak_until_stopped(minutes: float, without: frozenset[str]) -> int:
    """`soak`, ended early by SIGTERM or SIGINT (kill, a CI timeout, Ctrl-C) with its daemon
    stopped: trio's own Ctrl-C handling is absent where SIGINT is ignored, as it is for a job
    started in the background by a script or under nohup."""
    stopped_by: list[int] = []
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                async for signum in signals:
                    print(f"soak: {signal.Signals(signum).name}: stopping", flush=True)
                    stopped_by.append(signum)
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(stop_on_signal)
            code = await soak(minutes, without)
            nursery.cancel_scope.cancel()
            return code
    return 128 + stopped_by[0]


def report(
    samples: list[Sample], counts: Counts, warmup: float, churn_end: float, log: Path
) -> int:
    print()
    print(
        f"churn: {counts.vms} VMs started ({counts.restarts} app restarts with a new pid); "
        f"debuggers {counts.debuggers} (+{counts.debuggers_turned_away} cut short); "
        f"{counts.requests} API requests ({counts.request_errors} failed); "
        f"{counts.streams} event streams, {counts.events} events read"
    )
    # The slopes cover the churn after the warm-up: the quiet tail would pull them down.
    after = [s for s in samples if warmup <= s.t <= churn_end]
    base, end = samples[0], samples[-1]
    verdicts: list[bool] = []
    for name, value in (("rss MB", "rss_mb"), ("fds", "fds"), ("tasks", "tasks")):
        slope = slope_per_hour([(s.t, float(getattr(s, value))) for s in after])
        text = "n/a" if slope is None else f"{slope:+.2f}/h"
        print(f"slope during the churn after the warm-up ({len(after)} samples), {name}: {text}")
    rss_slope = slope_per_hour([(s.t, s.rss_mb) for s in after])
    window = churn_end - warmup
    judged = window >= RSS_MIN_WINDOW
    ok = rss_slope is not None and rss_slope < RSS_SLOPE_LIMIT_MB_H
    if judged:
        verdicts.append(ok)
        verdict = "ok" if ok else "TOO MUCH"
    else:
        verdict = (
            f"not judged: {window / 60:.1f} min of churn after the warm-up is too short for a "
            f"slope per hour (at least {RSS_MIN_WINDOW / 60:g} min; run --minutes 60)"
        )
    print(
        f"rss: {base.rss_mb:.1f} MB at start, {end.rss_mb:.1f} MB at the end; growth after "
        f"warm-up {'n/a' if rss_slope is None else f'{rss_slope:+.2f}'} MB/h "
        f"(limit {RSS_SLOPE_LIMIT_MB_H:g}): {verdict}"
    )
    for name, start_value, end_value in (
        ("fds", base.fds, end.fds),
        ("tasks", base.tasks, end.tasks),
    ):
        back = end_value <= start_value
        verdicts.append(back)
        print(
            f"{name}: {start_value} at the baseline, {end_value} at the end: "
            f"{'back at the baseline' if back else 'NOT back'}"
        )
    problems: dict[str, int] = {}
    for line in log.read_text(errors="replace").splitlines():
        if '"level": "error"' in line or '"level": "critical"' in line:
            event = line.split('"event": "', 1)[-1].split('"', 1)[0]
            problems[event] = problems.get(event, 0) + 1
    if problems:
        print(f"errors in ddmd's log: {problems}")
    passed = all(verdicts) and end.vms == 0 and end.debuggers == 0
    if not passed:
        print("FAIL")
    elif judged:
        print("PASS")
    else:
        print("PASS (open files, tasks; RSS not judged in a run this short)")
    return 0 if passed else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="length of the run (60)")
    parser.add_argument(
        "--without",
        action="append",
        choices=KINDS,
        default=[],
        help="leave one kind of churn out (to find what grows); may be repeated",
    )
    args = parser.parse_args()
    if args.minutes < 2:
        parser.error("--minutes must be at least 2")
    # The simulated VMs run in this process: their log lines would drown the samples.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    sys.exit(trio.run(soak_until_stopped, args.minutes, frozenset(args.without)))


if __name__ == "__main__":
    main()
